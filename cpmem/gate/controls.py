"""Recorded estimates: the one snapshot of what every built-in policy prices.

Controls are recorded outputs of the estimator, baselines and not measurements.
``golden/controls/controls.csv`` records, to the byte, every built-in policy's estimate,
forward+backward figure, busiest rank and components for three kinds of step: a fixed
grid of requests (``shape`` pair / pair-shared / independent: the paths nobody measured,
full recompute, no-grad, MoE, other TP sizes, lengths, request shapes), every golden cell
as it was recorded (``shape`` ``cell``) and every simulated grid row (``shape`` ``row``),
so the gate notices when a change moves one. Beside the activations each row records the
step's static memory (``static_bytes`` and each of its components: ``cpmem.pricing.static``,
as ``cpmem.pricing.registry.price`` attaches it to the row's Estimate; the same for every
policy, but for a pipeline row whose policies find different busiest stages) and what the
``h200`` preset leaves the activations above it (``cpmem.pricing.device_budget``: its
total, reserve, the bytes outside PyTorch and the budget), so a change to the weights, the
static terms, the budget rule or the preset moves a control too. Re-recording is an
explicit act (``cpmem gate --record-controls``, ``cpmem.gate.controls_file``): it always
writes a diff report (every changed control, old, new, ratio; the static memory's and the
budget's old and new bytes) to stdout and to ``golden/controls/last_diff.md``.

The grid is deterministic (no randomness): a product of the four preset models,
TP 1/2/4/8 (where the heads allow), CP 1 and 2 (at TP <= 2), lengths 64..32k, three
request shapes, and the recompute modes (none, selective, full, no-grad; MoE
variants for the MoE model).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from cpmem.api import estimate
from cpmem.errors import InputError
from cpmem.golden.cells import load_cells
from cpmem.golden.files import CELLS_FILE
from cpmem.model.geometry import ModelGeometry
from cpmem.model.presets import MEASURED, PRESETS
from cpmem.pricing.device_budget import device_budget
from cpmem.pricing.estimate import Estimate
from cpmem.pricing.registry import price
from cpmem.samples.cells import cell_step
from cpmem.samples.rows import load_rows, row_step, simulated_dir
from cpmem.step.device import DEVICES
from cpmem.step.step import MoeRouting, Step

__all__ = [
    "BUDGET_DEVICE",
    "CONTROL_COLUMNS",
    "CONTROL_MODELS",
    "CONTROL_POLICIES",
    "ControlRequest",
    "RecordedStep",
    "compute_controls",
    "control_grid",
    "recorded_steps",
]

CONTROL_POLICIES = ("reference", "global", "tight")  # every built-in policy
CONTROL_MODELS = MEASURED
"""The presets the control grid prices: the measured ones (the families priced by
structure only are pinned by their simulated grid rows, which the controls record)."""

TPS = (1, 2, 4, 8)
LENGTHS = (64, 2048, 32768)
SHARED_FRACTION = 0.3  # the prefix share the measured pairs used (e.g. 614 of 2048)
SHAPES = ("pair", "pair-shared", "independent")

CONTROL_COLUMNS = (
    "control_id",
    "model",
    "tp",
    "cp",
    "sp",
    "ep",
    "mode",
    "modules",
    "moe_routing",
    "shape",
    "lengths",
    "shared_prefix",
    "logical_tokens",
    "packed_tokens",
    "priced_tokens",
    "grad_segments",
    "policy",
    "estimate_bytes",
    "per_rank_bytes",
    "forward_backward_bytes",
    "busiest_rank",
    "components",
    "forward_backward_components",
    "static_bytes",
    "static_components",
    "budget_device",
    "device_total_bytes",
    "reserve_bytes",
    "non_torch_bytes",
    "budget_bytes",
)

BUDGET_DEVICE = "h200"
"""The device preset whose budget every control records: the measured runtime's GPU."""


@dataclass(frozen=True)
class ControlRequest:
    """One control: a request and the settings it is priced under."""

    model: str
    tp: int
    cp: int
    ep: int
    mode: str
    modules: str  # "" when the mode takes none
    moe_routing: MoeRouting
    shape: str
    lengths: tuple[int, ...]
    shared_prefix: int

    @property
    def sp(self) -> bool:
        return self.tp > 1  # as Megatron runs it, and as cpmem.api defaults

    @property
    def control_id(self) -> str:
        lengths = "+".join(str(n) for n in self.lengths)
        return (
            f"ctl:{self.model}:tp{self.tp}:cp{self.cp}:ep{self.ep}:{self.mode}:"
            f"{self.modules or '-'}:{self.moe_routing}:{self.shape}:{lengths}/{self.shared_prefix}"
        )

    def columns(self) -> dict[str, str]:
        """The control's settings and request, as the CSV's leading columns."""
        return _columns(
            self.control_id,
            self.model,
            (self.tp, self.cp, self.sp, self.ep),
            (self.mode, self.modules, self.moe_routing),
            self.shape,
            self.lengths,
            self.shared_prefix,
        )

    def price(self, policy: str = "reference") -> Estimate:
        """Through the planner-facing API, so planner changes move controls too; the
        calibration harness's step (the first of its process, the hidden states
        returned), the step every measured cell ran."""
        return estimate(
            self.model,
            list(self.lengths),
            shared_prefix=self.shared_prefix,
            tp=self.tp,
            cp=self.cp,
            sp=self.sp,
            ep=self.ep,
            recompute=self.mode,
            modules=self.modules or None,
            policy=policy,
            moe_routing=self.moe_routing,
            step="first",
            head="hidden",
        )


def _shape_lengths(shape: str, n: int) -> tuple[tuple[int, ...], int]:
    if shape == "pair":
        return (n, n), 0
    if shape == "pair-shared":
        return (n, n), int(n * SHARED_FRACTION)
    # independent sequences of unequal lengths (no shared prefix)
    return (n, max(64, n // 2), max(64, n // 4)), 0


def _supports_tp(model: str, tp: int) -> bool:
    try:
        PRESETS[model].check_tp(tp)
    except InputError:
        return False
    return True


def control_grid() -> list[ControlRequest]:
    """The fixed grid, in a stable order. Changing it changes control ids (reported)."""
    out: list[ControlRequest] = []
    for name in CONTROL_MODELS:
        geometry = PRESETS[name]
        moe = geometry.is_moe
        settings: list[tuple[str, str, MoeRouting]] = [
            ("full", "", "concentrated"),
            ("no-grad", "", "concentrated"),
            ("selective", "core_attn", "concentrated"),
            ("none", "", "concentrated"),
        ]
        if moe:
            settings += [
                ("selective", "core_attn+moe", "concentrated"),
                ("selective", "core_attn", "balanced"),
            ]
        for tp in TPS:
            if not _supports_tp(name, tp):
                continue
            ep = tp if moe else 1  # the measured MoE cells ran EP = TP
            for cp in (1, 2):
                if cp == 2 and tp > 2:
                    continue
                for mode, modules, routing in settings:
                    for shape in SHAPES:
                        for n in LENGTHS:
                            lengths, prefix = _shape_lengths(shape, n)
                            out.append(
                                ControlRequest(
                                    name, tp, cp, ep, mode, modules, routing, shape, lengths, prefix
                                )
                            )
    return out


@dataclass(frozen=True)
class RecordedStep:
    """A golden cell or a simulated grid row, recorded as its step is priced."""

    control_id: str
    shape: str
    step: Step
    lengths: tuple[int, ...]
    shared_prefix: int

    def price(self, policy: str = "reference") -> Estimate:
        return price(self.step, policy)

    def columns(self) -> dict[str, str]:
        """The recorded step's settings and request, as the CSV's leading columns."""
        step, layout = self.step, self.step.plan.layout
        return _columns(
            self.control_id,
            step.geometry.name,
            (layout.tp, layout.cp, layout.sp, layout.ep),
            (str(step.recompute.mode), "+".join(step.recompute.modules), step.moe_routing),
            self.shape,
            self.lengths,
            self.shared_prefix,
        )


def recorded_steps(golden_dir: Path) -> list[RecordedStep]:
    """Every golden cell (``cell:<id>``) and simulated grid row (``row:<id>``), in file
    order: the steps the gate and the simulated tier price."""
    out = [
        RecordedStep(f"cell:{c.cell_id}", "cell", cell_step(c), c.lengths_list, c.shared_prefix)
        for c in load_cells(golden_dir / CELLS_FILE)
    ]
    sim_dir = simulated_dir(golden_dir)
    cache: dict[str, ModelGeometry] = {}
    for r in load_rows(sim_dir):
        step = row_step(r, sim_dir, cache)
        out.append(RecordedStep(f"row:{r.config_id}", "row", step, r.lengths, r.shared_prefix))
    return out


def _columns(
    control_id: str,
    model: str,
    layout: tuple[int, int, bool, int],
    recompute: tuple[str, str, str],
    shape: str,
    lengths: tuple[int, ...],
    shared_prefix: int,
) -> dict[str, str]:
    tp, cp, sp, ep = layout
    mode, modules, routing = recompute
    return {
        "control_id": control_id,
        "model": model,
        "tp": str(tp),
        "cp": str(cp),
        "sp": str(sp),
        "ep": str(ep),
        "mode": mode,
        "modules": modules,
        "moe_routing": routing,
        "shape": shape,
        "lengths": "+".join(str(n) for n in lengths),
        "shared_prefix": str(shared_prefix),
    }


def _row(req: ControlRequest | RecordedStep, est: Estimate, policy: str) -> dict[str, str]:
    return {
        **req.columns(),
        "logical_tokens": str(est.logical_tokens),
        "packed_tokens": str(est.packed_tokens),
        "priced_tokens": str(est.busiest_tokens),
        "grad_segments": str(est.grad_segments),
        "policy": policy,
        "estimate_bytes": str(est.estimate_bytes),
        "per_rank_bytes": "+".join(str(b) for b in est.per_rank_bytes),
        "forward_backward_bytes": str(est.forward_backward_bytes or ""),
        "busiest_rank": str(est.busiest_rank),
        "components": _json(est.components),
        "forward_backward_components": _json(est.forward_backward_components),
        **_static_columns(est),
    }


def _static_columns(est: Estimate) -> dict[str, str]:
    """The Estimate's own static memory and the ``BUDGET_DEVICE`` preset's budget over it
    (empty where the Estimate carries no static memory)."""
    if est.static is None:
        return dict.fromkeys(CONTROL_COLUMNS[CONTROL_COLUMNS.index("static_bytes") :], "")
    budget = device_budget(DEVICES[BUDGET_DEVICE], est.static)
    return {
        "static_bytes": str(est.static.total),
        "static_components": _json(est.static.components),
        "budget_device": BUDGET_DEVICE,
        "device_total_bytes": str(budget.device.total_bytes),
        "reserve_bytes": str(budget.reserve_bytes),
        "non_torch_bytes": str(budget.non_torch_bytes),
        "budget_bytes": str(budget.budget_bytes),
    }


def _json(components: Mapping[str, int] | None) -> str:
    return "" if components is None else json.dumps(dict(components), separators=(",", ":"))


def compute_controls(
    golden_dir: Path, policies: Iterable[str] = CONTROL_POLICIES
) -> list[dict[str, str]]:
    """Price every control, golden cell and grid row with each policy; rows in
    ``CONTROL_COLUMNS`` order, one step after another, the policies in the order given."""
    names = list(policies)
    steps: list[ControlRequest | RecordedStep] = [*control_grid(), *recorded_steps(golden_dir)]
    return [_row(req, req.price(p), p) for req in steps for p in names]
