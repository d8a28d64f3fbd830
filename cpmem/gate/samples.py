"""One golden cell -> its plan and pricing inputs: the single conversion the gate, the
fitting, the reports and the tests all use.

Cells are priced from what was recorded, never from a planner's guess: the layout,
packed tokens, segments and (under CP) the busiest rank's tokens.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from cpmem.api import load_model
from cpmem.golden.cells import MeasuredCell, load_cells
from cpmem.plan.layout import ParallelLayout, round_up
from cpmem.plan.plan import Plan, explicit_plan
from cpmem.pricing.inputs import MoeRouting, PricingInput
from cpmem.pricing.recompute import Recompute
from cpmem.units import MIB


def _unpadded_tokens(cell: MeasuredCell) -> int:
    """The real (shared) tokens behind ``packed_tokens`` when packed is them padded to TP.

    Recorded pairs do not always share their prefix in the packed row (the 2048
    pairs record a 614-token prefix and 4096 packed tokens), so the shared count
    is trusted only where padding it to TP gives exactly the recorded packed count.
    """
    lengths = cell.lengths_list
    shared = sum(lengths) - cell.shared_prefix * (len(lengths) - 1)
    if shared < cell.packed_tokens and round_up(shared, cell.tp) == cell.packed_tokens:
        return shared
    return cell.packed_tokens


def cell_plan(cell: MeasuredCell) -> Plan:
    """The recorded layout as an explicit plan (no planner involved)."""
    layout = ParallelLayout(tp=cell.tp, cp=cell.cp, sp=cell.sequence_parallel, ep=cell.ep)
    lengths = cell.lengths_list
    segments = cell.grad_segments
    if segments is None:
        # Every row without a recorded count is a two-sequence pair of the TP file
        # (CP 1; a test holds this): packed below logical means the shared prefix was
        # stored once (prefix + two completions = 3 segments), else one per sequence.
        segments = 3 if cell.packed_tokens < sum(lengths) else len(lengths)
    if cell.cp > 1:
        return explicit_plan(
            layout,
            logical_tokens=sum(lengths),
            packed_tokens=cell.packed_tokens,
            grad_segments=segments,
            busiest_tokens=cell.retained_tokens,
        )
    return explicit_plan(
        layout,
        logical_tokens=sum(lengths),
        packed_tokens=cell.packed_tokens,
        grad_segments=segments,
        rank_tokens=[_unpadded_tokens(cell)],
    )


def cell_routing(cell: MeasuredCell) -> MoeRouting:
    return "balanced" if cell.concentrated_routing is False else "concentrated"


def cell_was_cold(cell: MeasuredCell) -> bool:
    """Did the cell's measured run pay the first-step set-up of its process?

    Its peak is the maximum over a first and a repeat run in one process. Where both
    are recorded and agree to within 1 MiB the process was already warm (an earlier
    cell paid the set-up); otherwise (differing, or not recorded) the cell counts as
    cold, which is what an estimate must assume when it cannot know.
    """
    first, repeat = cell.first_forward_peak_bytes, cell.repeat_forward_peak_bytes
    if first is None or repeat is None:
        return True
    return abs(first - repeat) >= MIB


def cell_inputs(cell: MeasuredCell) -> PricingInput:
    return PricingInput(
        geometry=load_model(cell.model),
        plan=cell_plan(cell),
        recompute=Recompute.parse(cell.mode, cell.modules or None),
        compiled=cell.compiled,
        moe_routing=cell_routing(cell),
        cold=cell_was_cold(cell),
    )


@dataclass(frozen=True)
class Sample:
    """One measured (non-refused) golden cell, priced structurally."""

    cell_id: str
    model: str
    dense: bool
    compiled: bool
    routing: str
    logical_tokens: int
    forward_peak: int
    forward_backward_peak: int
    inputs: PricingInput


def is_measured(cell: MeasuredCell) -> bool:
    """The cell ran and its forward peak was recorded (refused cells have no peak)."""
    return not cell.refused and cell.forward_peak_bytes is not None


def measured_samples(cells: Iterable[MeasuredCell] | None = None) -> list[Sample]:
    """Every cell with a measured peak (default: the golden dir's), priced by ``cell_inputs``."""
    out: list[Sample] = []
    for cell in load_cells() if cells is None else cells:
        if not is_measured(cell):
            continue
        assert cell.forward_peak_bytes is not None
        inputs = cell_inputs(cell)
        fb = cell.forward_backward_peak_bytes
        out.append(
            Sample(
                cell_id=cell.cell_id,
                model=inputs.geometry.name,
                dense=not inputs.geometry.is_moe,
                compiled=cell.compiled,
                routing=inputs.moe_routing,
                logical_tokens=cell.logical_tokens,
                forward_peak=cell.forward_peak_bytes,
                forward_backward_peak=fb if fb is not None else cell.forward_peak_bytes,
                inputs=inputs,
            )
        )
    return out
