"""One golden cell -> the step it measured (``describe_step``): the conversion the
gate, the fitting, the reports and the tests all use.

Cells are priced from what was recorded, never from a planner's guess: the layout,
packed tokens, segments and (under CP) the busiest rank's tokens. The request path
(``request_path``) prices the same cells from their requests, with the same settings.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from cpmem.golden.cells import MeasuredCell, load_cells
from cpmem.step.describe import SettingsArguments, describe_step
from cpmem.step.step import MoeRouting, Step
from cpmem.units import MIB


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


def cell_settings(cell: MeasuredCell) -> SettingsArguments:
    """The settings the cell ran under, as ``describe_step``'s keywords: the harness's
    step (its returned hidden states, rank-1 adapters), first of its process or not."""
    return {
        "tp": cell.tp,
        "cp": cell.cp,
        "sp": cell.sequence_parallel,
        "ep": cell.ep,
        "recompute": cell.mode,
        "modules": cell.modules or None,
        "compiled": cell.compiled,
        "moe_routing": cell_routing(cell),
        "step": "first" if cell_was_cold(cell) else "steady",
        "head": "hidden",
    }


def cell_step(cell: MeasuredCell) -> Step:
    """The cell as it was recorded, never a planner's guess: its lengths, its packed
    tokens (which say whether the shared prefix was stored once), its segments where
    recorded (otherwise the packed request's) and, under CP, the busiest rank's tokens."""
    return describe_step(
        cell.model,
        cell.lengths_list,
        shared_prefix=cell.shared_prefix,
        packed_tokens=cell.packed_tokens,
        segments=cell.grad_segments,
        busiest_tokens=cell.retained_tokens if cell.cp > 1 else None,
        **cell_settings(cell),
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
    step: Step


def is_measured(cell: MeasuredCell) -> bool:
    """The cell ran and its forward peak was recorded (refused cells have no peak)."""
    return not cell.refused and cell.forward_peak_bytes is not None


def measured_samples(cells: Iterable[MeasuredCell] | None = None) -> list[Sample]:
    """Every cell with a measured peak (default: the golden dir's), priced by ``cell_step``."""
    out: list[Sample] = []
    for cell in load_cells() if cells is None else cells:
        if not is_measured(cell):
            continue
        assert cell.forward_peak_bytes is not None
        step = cell_step(cell)
        fb = cell.forward_backward_peak_bytes
        out.append(
            Sample(
                cell_id=cell.cell_id,
                model=step.geometry.name,
                dense=not step.geometry.is_moe,
                compiled=cell.compiled,
                routing=step.moe_routing,
                logical_tokens=cell.logical_tokens,
                forward_peak=cell.forward_peak_bytes,
                forward_backward_peak=fb if fb is not None else cell.forward_peak_bytes,
                step=step,
            )
        )
    return out
