"""The ``tight`` policy: structural forward and forward+backward peaks (docs/tight.md).

Unlike ``reference`` (calibrated envelopes times 1.10), ``tight`` prices each layer
kind with the saved sets the oracles measured (``oracles/README.md``), chosen by
recompute mode and execution mode (eager/compiled, fused/unfused SwiGLU), keeps every
fixed cost as its own component, prices the backward transient, and adds one small
documented margin (a factor and a fixed allowance) fitted so that every measured
rank-sample is covered. ``TARGETS`` declares the issue-6 targets the estimator gate
checks (``cpmem gate --policy tight``). ``python -m cpmem.pricing.tight`` prints the report
(targets, per-cell table, leave-one-model-out and leave-longest-shape-out tables);
``--write PATH`` writes it (``golden/reports/tight_policy.md``), ``--check PATH``
fails when the written report is stale.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from cpmem.model.geometry import ModelGeometry
from cpmem.pricing.estimate import Estimate
from cpmem.pricing.inputs import MoeRouting as MoeRoutingT
from cpmem.pricing.inputs import PricingInput
from cpmem.pricing.reference import cp_discounted, segment_state_bytes
from cpmem.pricing.registry import register_policy
from cpmem.pricing.widths import common_width, moe_width, sp_divisor
from cpmem.units import MIB

# --- structural constants (observations, not fitted) -----------------------------
COLD_SETUP = 58 * MIB
"""Cold kernel set-up of the first forward of a process (golden/sources/README.md)."""
GDN_SMALL_PER_HEAD = 66
"""GDN per value-head small terms (fp32 gate cumsum, beta, WY matrix A): 66·Vh."""


@dataclass(frozen=True)
class Margin:
    """The policy's margin: ``factor`` on the structural sum plus a fixed allowance."""

    forward_factor: float
    forward_allowance: int
    backward_factor: float
    backward_allowance: int


# --- the fitted margin (see docs/tight.md; refit with fit_margin) ----------------
MARGIN = Margin(
    forward_factor=1.04,
    forward_allowance=16 * MIB,
    backward_factor=1.04,
    backward_allowance=236 * MIB,
)


@dataclass(frozen=True)
class TightWidths:
    """Elements per token kept by one layer of each kind (oracle saved sets)."""

    common: int
    attention_core: int
    attention: int
    gdn: int
    mlp: int
    mlp_core: int
    moe: int
    layer_input: int

    def mixer(self, kind: str) -> int:
        return self.attention if kind == "attention" else self.gdn

    def ffn(self, kind: str) -> int:
        return self.moe if kind == "moe" else self.mlp


def swiglu_saved(geometry: ModelGeometry, compiled: bool) -> int:
    """F-multiples a SwiGLU keeps: 3 fused (input gate‖up and the activation output),
    3 when torch.compile fuses an unfused SwiGLU, 5 for megatron's eager GLU; +2 with
    an activation clamp (its mask and the clamped copy)."""
    c = 3 if geometry.fused_swiglu or compiled else 5
    if geometry.activation_clamp is not None:
        c += 2
    return c


def tight_widths(
    geometry: ModelGeometry, inputs: PricingInput, compiled: bool | None = None
) -> TightWidths:
    layout = inputs.plan.layout
    tp, sp = layout.tp, layout.sp
    comp = inputs.compiled if compiled is None else compiled
    common = common_width(geometry, tp, sp)
    q, kv = geometry.q_width, geometry.kv_width
    # gated flash attention: q, k, v, output and the output gate, the head merge a view
    # of the kernel output -> 6Q + 3KV (oracle). Ungated: the oracle's CPU flash kernel
    # keeps 3Q + 3KV, but the measured ungated runtime keeps two more Q-wide copies
    # (eager and compiled alike: the 1.7B compiled/eager gap is exactly the SwiGLU's
    # 2F/t), so ungated attention keeps the reference's 5Q + 3KV.
    g = 6 if geometry.attention_output_gate else 5
    core = (g * q + 3 * kv) // tp
    if not comp and inputs.recompute.mode == "none":
        # eager attention outside a core_attn checkpoint also keeps q and k before the
        # qk-norm and before the rope (two more (Q + KV) copies); compiled runs fuse
        # them away and a core_attn checkpoint drops them.
        core += 2 * (q + kv) // tp
    if geometry.kv_groups < tp:  # replicated-QKV LoRA path
        core += ((2 if geometry.attention_output_gate else 1) * q + 2 * kv) * (tp - 1) // tp
    k, v = geometry.gdn_key_width, geometry.gdn_value_width
    gdn = 0
    if geometry.is_hybrid:
        gdn = common + (4 * k + 7 * v + GDN_SMALL_PER_HEAD * geometry.gdn_value_heads) // tp
    mlp_core = swiglu_saved(geometry, comp) * geometry.ffn // tp
    moe = moe_width(geometry, tp, sp, layout.ep, inputs.moe_routing)
    return TightWidths(
        common=common,
        attention_core=core,
        attention=common + core,
        gdn=gdn,
        mlp=common + mlp_core if "dense" in geometry.mlps else 0,
        mlp_core=mlp_core,
        moe=moe,
        layer_input=geometry.hidden // sp_divisor(tp, sp),
    )


def retained_width(geometry: ModelGeometry, w: TightWidths, inputs: PricingInput) -> int:
    """Elements per token kept over all layers at the end of forward."""
    rc = inputs.recompute
    per_layer = [w.mixer(m) + w.ffn(f) for m, f in zip(geometry.mixers, geometry.mlps, strict=True)]
    if rc.mode == "full":
        return geometry.layers * w.layer_input + max(per_layer)
    if rc.mode == "no-grad":
        return max(per_layer)
    total = sum(per_layer)
    if rc.mode == "selective":
        dense = sum(1 for kind in geometry.mlps if kind == "dense")
        if "mlp" in rc.modules and dense:
            total -= (dense - 1) * (w.mlp - w.layer_input)
        if "moe" in rc.modules and geometry.moe_layers:
            total -= (geometry.moe_layers - 1) * (w.moe - w.common)
    return total


def backward_width(geometry: ModelGeometry, w: TightWidths, inputs: PricingInput) -> int:
    """Elements per token live on top of the retained set during backward: the
    gradient of one layer's retained activations plus, under recompute, that layer's
    recomputed workspace (the widest layer)."""
    rc = inputs.recompute
    if rc.mode == "no-grad":
        return 0
    best = 0
    for mixer, ffn in zip(geometry.mixers, geometry.mlps, strict=True):
        kept = w.mixer(mixer) + w.ffn(ffn)
        recomputed = 0
        if rc.mode == "full":
            recomputed = kept
        elif rc.mode == "selective":
            if "core_attn" in rc.modules and mixer == "attention":
                recomputed += w.attention_core
            if "mlp" in rc.modules and ffn == "dense":
                recomputed += w.mlp_core
            if "moe" in rc.modules and ffn == "moe":
                recomputed += w.moe - w.common
        best = max(best, kept + recomputed)
    return best


def priced_tokens(inputs: PricingInput) -> int:
    """R: the busiest CP rank's model tokens (dense CP, gradients, partial recompute),
    else the packed count (the reference's rule)."""
    if cp_discounted(inputs):
        return inputs.plan.busiest_tokens
    return inputs.plan.packed_tokens


def rank_segments(inputs: PricingInput) -> int:
    """Gradient-enabled segments whose recurrent states the busiest rank holds.

    A layout that places whole prefix-tree segments (the ``gdn-segments`` planner, and
    explicit plans, taken to come from such a runtime as the measured one) leaves at
    least one segment on each other CP rank: the busiest holds at most
    segments - (CP - 1), and at least one. Planners that cut every sequence across all
    ranks (``balanced``, ``attention-work``) leave every segment's state on every rank.
    """
    if not inputs.recompute.keeps_gradients:
        return 0
    segments = inputs.plan.grad_segments
    whole_segments = inputs.plan.planner in ("gdn-segments", "explicit")
    if cp_discounted(inputs) and segments and whole_segments:
        return max(1, segments - (inputs.plan.layout.cp - 1))
    return segments


def structural_terms(inputs: PricingInput) -> tuple[dict[str, int], dict[str, int]]:
    """The unmargined forward components and the backward extras."""
    geometry, plan, rc = inputs.geometry, inputs.plan, inputs.recompute
    b = inputs.dtype_bytes
    w = tight_widths(geometry, inputs)
    tokens = priced_tokens(inputs)
    segments = rank_segments(inputs)
    seg = segments * geometry.gdn_layers * segment_state_bytes(geometry, plan.layout.tp, b)
    outputs = inputs.outputs
    gathered = outputs if plan.layout.cp > 1 else 0
    forward = {
        "cold_setup": COLD_SETUP,
        "segment_states": seg,
        "outputs": outputs,
        "gathered_outputs": gathered,
        "retained_activations": tokens * b * retained_width(geometry, w, inputs),
    }
    local_outputs = outputs // plan.layout.cp if plan.layout.cp > 1 else outputs
    backward = {
        "output_gradient": local_outputs if rc.keeps_gradients else 0,
        "layer_gradient_and_recompute": tokens * b * backward_width(geometry, w, inputs),
        # one GDN layer's segment states get an fp32 gradient of the same size
        "segment_state_gradient": (
            segments * segment_state_bytes(geometry, plan.layout.tp, b) if geometry.is_hybrid else 0
        ),
    }
    return forward, backward


def _with_margin(base: dict[str, int], factor: float, allowance: int) -> dict[str, int]:
    subtotal = sum(base.values())
    out = dict(base)
    out["margin_factor"] = math.ceil(subtotal * factor) - subtotal
    out["margin_allowance"] = allowance
    return out


def price_tight(inputs: PricingInput, margin: Margin = MARGIN) -> Estimate:
    forward, backward = structural_terms(inputs)
    components = _with_margin(forward, margin.forward_factor, margin.forward_allowance)
    fb_base = {**forward, **backward}
    fb_components = _with_margin(fb_base, margin.backward_factor, margin.backward_allowance)
    plan, layout = inputs.plan, inputs.plan.layout
    estimate = sum(components.values())
    fb = sum(fb_components.values())
    if fb < estimate:  # the forward peak is part of the forward+backward peak
        fb_components["forward_peak_excess"] = estimate - fb
        fb = estimate
    tokens = priced_tokens(inputs)
    return Estimate(
        policy="tight",
        estimate_bytes=estimate,
        busiest_rank=plan.busiest_rank if cp_discounted(inputs) else 0,
        busiest_tokens=tokens,
        per_rank_bytes=tuple(estimate for _ in range(layout.cp)),
        components=components,
        packed_tokens=plan.packed_tokens,
        logical_tokens=plan.logical_tokens,
        grad_segments=plan.grad_segments if inputs.recompute.keeps_gradients else 0,
        model=inputs.geometry.name,
        recompute=inputs.recompute.label,
        planner=plan.planner,
        tp=layout.tp,
        cp=layout.cp,
        sp=layout.sp,
        forward_backward_bytes=fb,
        forward_backward_components=fb_components,
        notes=(f"moe_routing={inputs.moe_routing}",) if inputs.geometry.is_moe else (),
    )


@register_policy("tight")
def tight_policy(inputs: PricingInput) -> Estimate:
    """Structural forward (admission) and forward+backward peaks with a small margin."""
    return price_tight(inputs)


# --- declared targets (issue 6), checked by the estimator gate ------------------------

Figure = Literal["forward", "forward_backward"]


@dataclass(frozen=True)
class Target:
    """A target a policy declares for the gate to check on the measured cells.

    ``selects`` picks cells by what the caller states (geometry, plan, recompute,
    execution mode, routing), never by a cell's id. ``figure`` names the priced figure
    and the peak it is held against. ``max_headroom``: every selected cell's
    ``estimate / peak - 1`` at most this. ``min_coverage``: at least this share of the
    selected cells have ``estimate >= peak``. A target that selects no measured cell is
    missed (it would prove nothing).
    """

    name: str
    selects: Callable[[PricingInput], bool]
    figure: Figure = "forward"
    max_headroom: float | None = None
    min_coverage: float | None = None

    def __post_init__(self) -> None:
        if (self.max_headroom is None) == (self.min_coverage is None):
            raise ValueError(f"target {self.name!r}: give max_headroom or min_coverage")

    @property
    def limit(self) -> str:
        """The bound as text, e.g. ``headroom <= +8.0%`` or ``coverage >= 100%``."""
        if self.max_headroom is not None:
            return f"max headroom <= {self.max_headroom:+.1%}"
        assert self.min_coverage is not None
        return f"coverage >= {self.min_coverage:.0%}"


def _is_dense(inputs: PricingInput) -> bool:
    return not inputs.geometry.is_moe


def _compiled_attention_only(inputs: PricingInput) -> bool:
    """Compiled runs of an attention-only dense model (the measured one: 1.7B)."""
    g = inputs.geometry
    return not g.is_moe and not g.is_hybrid and inputs.compiled


def _dense_long(inputs: PricingInput) -> bool:
    return (
        _is_dense(inputs)
        and not _compiled_attention_only(inputs)
        and inputs.plan.logical_tokens >= 2048
    )


def _dense_short(inputs: PricingInput) -> bool:
    return (
        _is_dense(inputs)
        and not _compiled_attention_only(inputs)
        and inputs.plan.logical_tokens < 2048
    )


def _moe_routed(routing: str) -> Callable[[PricingInput], bool]:
    return lambda inputs: inputs.geometry.is_moe and inputs.moe_routing == routing


def _4b_cp2_64_token_pair(inputs: PricingInput) -> bool:
    plan = inputs.plan
    return (
        inputs.geometry.name == "qwen3.5-4b"
        and plan.layout.cp == 2
        and plan.logical_tokens == 128
        and inputs.recompute.keeps_gradients
    )


TARGETS: tuple[Target, ...] = (
    Target("every cell, forward peak", lambda _: True, "forward", min_coverage=1.0),
    Target(
        "every cell, forward+backward peak", lambda _: True, "forward_backward", min_coverage=1.0
    ),
    Target(
        "4B CP2 64+64, forward+backward peak",
        _4b_cp2_64_token_pair,
        "forward_backward",
        min_coverage=1.0,
    ),
    Target("dense, >= 2,048 logical tokens", _dense_long, "forward", max_headroom=0.08),
    Target("dense, < 2,048 logical tokens", _dense_short, "forward", max_headroom=0.25),
    Target(
        "compiled attention-only (1.7B)", _compiled_attention_only, "forward", max_headroom=0.15
    ),
    Target("MoE, concentrated routing", _moe_routed("concentrated"), "forward", min_coverage=1.0),
    Target("MoE, balanced routing", _moe_routed("balanced"), "forward", max_headroom=0.60),
)
"""The issue-6 targets of ``tight``: the gate checks them (``gate.TARGETS``) and the
margin fit aims at them (``target_of``). The one place they are defined."""


def target_of(inputs: PricingInput) -> float:
    """Largest allowed estimate / forward peak for one cell: the strictest forward
    headroom target selecting it (inf when none bounds it, e.g. concentrated MoE)."""
    limits = [
        1 + t.max_headroom
        for t in TARGETS
        if t.figure == "forward" and t.max_headroom is not None and t.selects(inputs)
    ]
    return min(limits, default=math.inf)


# --- calibration: the measured cells, the margin fit, the tables -------------------


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


def measured_samples() -> list[Sample]:
    """Every golden cell with a measured peak, as the caller would price it."""
    from cpmem.golden.cells import load_cells
    from cpmem.model.presets import get_preset
    from cpmem.plan.layout import ParallelLayout
    from cpmem.plan.plan import explicit_plan
    from cpmem.pricing.recompute import Recompute

    out: list[Sample] = []
    for cell in load_cells():
        if cell.refused or cell.forward_peak_bytes is None:
            continue
        lengths = cell.lengths_list
        layout = ParallelLayout(cell.tp, cell.cp, sp=cell.sequence_parallel, ep=cell.ep)
        segments = cell.grad_segments
        if segments is None:
            segments = 3 if cell.packed_tokens < sum(lengths) else len(lengths)
        plan = explicit_plan(
            layout,
            logical_tokens=sum(lengths),
            packed_tokens=cell.packed_tokens,
            grad_segments=segments,
            busiest_tokens=cell.retained_tokens if cell.cp > 1 else None,
        )
        geometry = get_preset(cell.model)
        routing: MoeRoutingT = "concentrated" if cell.concentrated_routing else "balanced"
        inputs = PricingInput(
            geometry=geometry,
            plan=plan,
            recompute=Recompute.parse(cell.mode, cell.modules or None),
            compiled=cell.compiled,
            moe_routing=routing,
        )
        fb = cell.forward_backward_peak_bytes
        out.append(
            Sample(
                cell_id=cell.cell_id,
                model=geometry.name,
                dense=not geometry.is_moe,
                compiled=cell.compiled,
                routing=routing,
                logical_tokens=sum(lengths),
                forward_peak=cell.forward_peak_bytes,
                forward_backward_peak=fb if fb is not None else cell.forward_peak_bytes,
                inputs=inputs,
            )
        )
    return out


FACTOR_STEP = 0.005
ALLOWANCE_STEP = MIB


ALLOWANCE_GRID = tuple(range(0, 129 * MIB, 4 * MIB))


def _round_factor(value: float) -> float:
    return round(math.ceil(value / FACTOR_STEP - 1e-9) * FACTOR_STEP, 6)


def fit_margin(samples: Sequence[Sample]) -> Margin:
    """The margin fitted on ``samples``: for each forward allowance on a 4 MiB grid
    (0-128 MiB) the smallest factor (a multiple of 0.005) that covers every forward
    peak; keep the pair whose worst estimate / (target x peak) is smallest (ties: the
    smaller allowance). Backward uses the same factor plus the smallest whole-MiB
    allowance that covers every forward+backward peak."""
    bases = [(s, structural_terms(s.inputs)) for s in samples]
    best: tuple[float, int, float] | None = None
    for allowance in ALLOWANCE_GRID:
        factor = 1.0
        for s, (forward, _) in bases:
            factor = max(factor, (s.forward_peak - allowance) / sum(forward.values()))
        factor = _round_factor(factor)
        worst = 0.0
        for s, (forward, _) in bases:
            base = sum(forward.values())
            est = math.ceil(base * factor) + allowance
            worst = max(worst, est / (target_of(s.inputs) * s.forward_peak))
        if best is None or worst < best[0] - 1e-12:
            best = (worst, allowance, factor)
    assert best is not None
    _, fwd_allowance, factor = best
    fb_allowance = 0
    for s, (forward, backward) in bases:
        base = sum(forward.values()) + sum(backward.values())
        fb_allowance = max(fb_allowance, s.forward_backward_peak - math.ceil(base * factor))
    fb_allowance = -(-fb_allowance // ALLOWANCE_STEP) * ALLOWANCE_STEP
    return Margin(factor, fwd_allowance, factor, fb_allowance)


@dataclass(frozen=True)
class Row:
    cell_id: str
    model: str
    estimate: int
    forward_peak: int
    fb_estimate: int
    fb_peak: int

    @property
    def headroom(self) -> float:
        return self.estimate / self.forward_peak - 1

    @property
    def fb_headroom(self) -> float:
        return self.fb_estimate / self.fb_peak - 1


def evaluate(samples: Sequence[Sample], margin: Margin = MARGIN) -> list[Row]:
    rows = []
    for s in samples:
        est = price_tight(s.inputs, margin)
        assert est.forward_backward_bytes is not None
        rows.append(
            Row(
                s.cell_id,
                s.model,
                est.estimate_bytes,
                s.forward_peak,
                est.forward_backward_bytes,
                s.forward_backward_peak,
            )
        )
    return rows


@dataclass(frozen=True)
class TargetCell:
    """One measured cell as a target sees it: what was stated, what was priced, the peaks."""

    cell_id: str
    inputs: PricingInput
    estimate: Estimate
    forward_peak: int
    forward_backward_peak: int | None


@dataclass(frozen=True)
class TargetResult:
    target: Target
    cells: int
    covered: int
    max_headroom: float | None
    min_headroom: float | None
    worst_cell: str | None
    failing: tuple[str, ...]
    problem: str | None = None

    @property
    def met(self) -> bool:
        return not self.failing and self.problem is None

    @property
    def measured(self) -> str:
        """The measured worst value next to the bound."""
        if self.cells == 0:
            return "no cells"
        if self.target.max_headroom is not None:
            assert self.max_headroom is not None
            return f"max headroom {self.max_headroom:+.1%}"
        return f"covered {self.covered}/{self.cells}, min headroom {self.min_headroom:+.1%}"

    def to_dict(self) -> dict[str, Any]:
        t = self.target
        return {
            "target": t.name,
            "figure": t.figure,
            "max_headroom": t.max_headroom,
            "min_coverage": t.min_coverage,
            "bound": t.limit,
            "cells": self.cells,
            "covered": self.covered,
            "max_headroom_measured": self.max_headroom,
            "min_headroom_measured": self.min_headroom,
            "worst_cell": self.worst_cell,
            "measured": self.measured,
            "met": self.met,
            "failing": list(self.failing),
            "problem": self.problem,
        }


def measure_target(target: Target, cells: Sequence[TargetCell]) -> TargetResult:
    """Check one target on the cells it selects; ``failing`` names the cells that miss
    it (over the headroom bound, or uncovered when coverage falls short)."""
    heads: list[tuple[float, str, bool]] = []
    for c in cells:
        if not target.selects(c.inputs):
            continue
        if target.figure == "forward":
            got, peak = c.estimate.estimate_bytes, c.forward_peak
        else:
            if c.estimate.forward_backward_bytes is None:
                return TargetResult(
                    target, 0, 0, None, None, None, (), "the policy does not price backward"
                )
            if c.forward_backward_peak is None:
                continue
            got, peak = c.estimate.forward_backward_bytes, c.forward_backward_peak
        heads.append((got / peak - 1, c.cell_id, got >= peak))
    if not heads:
        return TargetResult(target, 0, 0, None, None, None, (), "selects no measured cell")
    covered = sum(1 for _, _, ok in heads if ok)
    worst = max(heads) if target.max_headroom is not None else min(heads)
    if target.max_headroom is not None:
        failing = tuple(cid for h, cid, _ in heads if h > target.max_headroom + 1e-12)
    else:
        assert target.min_coverage is not None
        short = covered < target.min_coverage * len(heads) - 1e-9
        failing = tuple(cid for _, cid, ok in heads if not ok) if short else ()
    return TargetResult(
        target,
        len(heads),
        covered,
        max(h for h, _, _ in heads),
        min(h for h, _, _ in heads),
        worst[1],
        failing,
    )


def target_cells(samples: Sequence[Sample], margin: Margin = MARGIN) -> list[TargetCell]:
    return [
        TargetCell(
            s.cell_id,
            s.inputs,
            price_tight(s.inputs, margin),
            s.forward_peak,
            s.forward_backward_peak,
        )
        for s in samples
    ]


# --- leave-out evidence --------------------------------------------------------------


@dataclass(frozen=True)
class LeaveOut:
    """The margin refitted without ``held`` samples, evaluated on them."""

    label: str
    margin: Margin
    held: tuple[Sample, ...]
    rows: tuple[Row, ...]

    @property
    def forward_covered(self) -> int:
        return sum(1 for r in self.rows if r.estimate >= r.forward_peak)

    @property
    def fb_covered(self) -> int:
        return sum(1 for r in self.rows if r.fb_estimate >= r.fb_peak)

    @property
    def over_target(self) -> int:
        return sum(
            1
            for s, r in zip(self.held, self.rows, strict=True)
            if r.estimate > target_of(s.inputs) * r.forward_peak
        )


def leave_out(label: str, samples: Sequence[Sample], held: Callable[[Sample], bool]) -> LeaveOut:
    fit = fit_margin([s for s in samples if not held(s)])
    chosen = tuple(s for s in samples if held(s))
    return LeaveOut(label, fit, chosen, tuple(evaluate(chosen, fit)))


def leave_one_model_out(samples: Sequence[Sample]) -> list[LeaveOut]:
    """For each model: every tunable constant chosen without that model's cells."""
    out = []
    for model in sorted({s.model for s in samples}):

        def held(s: Sample, m: str = model) -> bool:
            return s.model == m

        out.append(leave_out(model, samples, held))
    return out


def leave_longest_shape_out(samples: Sequence[Sample]) -> list[LeaveOut]:
    """For each model: every tunable constant chosen without the cells of that model's
    longest shape (its largest logical token count), in every phase and layout."""
    out = []
    for model in sorted({s.model for s in samples}):
        longest = max(s.logical_tokens for s in samples if s.model == model)

        def held(s: Sample, m: str = model, n: int = longest) -> bool:
            return s.model == m and s.logical_tokens == n

        out.append(leave_out(f"{model} {longest:,} tokens", samples, held))
    return out


# --- the report ------------------------------------------------------------------------

REPORT_PATH = "golden/reports/tight_policy.md"


def _gib(n: int) -> str:
    return f"{n / 2**30:.3f}"


def _md_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join(" --- " for _ in headers) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def _margin_text(m: Margin) -> str:
    return (
        f"forward factor {m.forward_factor:.3f} + {m.forward_allowance / MIB:g} MiB; "
        f"backward factor {m.backward_factor:.3f} + {m.backward_allowance / MIB:g} MiB"
    )


def _leave_out_table(results: Sequence[LeaveOut], first: str) -> list[str]:
    rows = []
    for lo in results:
        n = len(lo.rows)
        rows.append(
            [
                lo.label,
                f"{lo.margin.forward_factor:.3f}",
                f"{lo.margin.forward_allowance // MIB}",
                f"{lo.margin.backward_allowance // MIB}",
                f"{n}",
                f"{lo.forward_covered}/{n}",
                f"{lo.fb_covered}/{n}",
                f"{max(r.headroom for r in lo.rows):+.1%}",
                f"{min(r.headroom for r in lo.rows):+.1%}",
                f"{min(r.fb_headroom for r in lo.rows):+.1%}",
                f"{lo.over_target}",
            ]
        )
    headers = [
        first,
        "factor",
        "fwd MiB",
        "fb MiB",
        "held cells",
        "fwd covered",
        "fb covered",
        "max head",
        "min head",
        "min fb head",
        "over target",
    ]
    return _md_table(headers, rows)


def _misses(results: Sequence[LeaveOut]) -> list[str]:
    out = []
    for lo in results:
        for r in lo.rows:
            if r.estimate < r.forward_peak:
                out.append(f"- without {lo.label}: `{r.cell_id}` forward {r.headroom:+.1%}")
            if r.fb_estimate < r.fb_peak:
                out.append(
                    f"- without {lo.label}: `{r.cell_id}` forward+backward {r.fb_headroom:+.1%}"
                )
    return out or ["- none"]


def render_report(samples: Sequence[Sample]) -> tuple[str, bool]:
    """The markdown report and whether every cell is covered and every target met."""
    rows = evaluate(samples)
    results = [measure_target(t, target_cells(samples)) for t in TARGETS]
    uncovered = sum(1 for r in rows if r.estimate < r.forward_peak or r.fb_estimate < r.fb_peak)
    over = sum(
        1
        for s, r in zip(samples, rows, strict=True)
        if r.estimate > target_of(s.inputs) * r.forward_peak
    )
    refit = fit_margin(samples)
    lines = [
        "# The `tight` policy against the measured golden cells",
        "",
        f"Generated by `python -m cpmem.pricing.tight --write {REPORT_PATH}`; do not edit by hand",
        "(`nox -s golden` prints it and fails when it is stale). Peaks: `golden/cells.csv`,",
        "every measured cell in every phase; headroom = estimate / peak - 1.",
        "",
        f"Margin in use: {_margin_text(MARGIN)}.",
        f"Refitted on all {len(samples)} cells: {_margin_text(refit)}"
        + (" (the same)." if refit == MARGIN else " (DIFFERS from the margin in use)."),
        "",
        "## Targets (issue 6, `cpmem.pricing.tight.TARGETS`; checked by `cpmem gate --policy tight`)",
        "",
    ]
    lines += _md_table(
        ["target", "figure", "bound", "cells", "measured", "worst cell", "met"],
        [
            [
                r.target.name,
                r.target.figure,
                r.target.limit,
                f"{r.cells}",
                r.measured,
                f"`{r.worst_cell}`" if r.worst_cell else "-",
                "yes" if r.met else "NO: " + (r.problem or ", ".join(r.failing)),
            ]
            for r in results
        ],
    )
    lines += [
        "",
        f"cells: {len(rows)}, uncovered: {uncovered}, over their headroom target: {over}",
        "",
        "## Leave one model out",
        "",
        "Every tunable constant (`fit_margin`) chosen without the model's cells; coverage",
        "and headroom on the left-out model.",
        "",
    ]
    lomo = leave_one_model_out(samples)
    lines += _leave_out_table(lomo, "left out")
    lines += ["", "Held-out cells not covered:", "", *_misses(lomo), ""]
    lines += [
        "## Leave each model's longest shape out",
        "",
        "Every tunable constant chosen without the cells of the model's largest logical",
        "token count (every phase, layout and mode of that shape); evaluated on them.",
        "",
    ]
    llso = leave_longest_shape_out(samples)
    lines += _leave_out_table(llso, "left out")
    lines += ["", "Held-out cells not covered:", "", *_misses(llso), ""]
    lines += ["## Per cell (GiB)", ""]
    lines += _md_table(
        ["cell", "estimate", "fwd peak", "head", "target", "fb estimate", "fb peak", "fb head"],
        [
            [
                f"`{r.cell_id}`",
                _gib(r.estimate),
                _gib(r.forward_peak),
                f"{r.headroom:+.1%}",
                "-" if math.isinf(target_of(s.inputs)) else f"{target_of(s.inputs) - 1:+.0%}",
                _gib(r.fb_estimate),
                _gib(r.fb_peak),
                f"{r.fb_headroom:+.1%}",
            ]
            for s, r in zip(samples, rows, strict=True)
        ],
    )
    ok = uncovered == 0 and over == 0 and all(r.met for r in results)
    return "\n".join(lines) + "\n", ok


def main(argv: Sequence[str] | None = None, emit: Callable[[str], None] = print) -> int:
    """Print the report; ``--write PATH`` writes it, ``--check PATH`` compares with it.
    Non-zero when a cell is uncovered, a target missed, or the checked file is stale."""
    p = argparse.ArgumentParser(prog="python -m cpmem.pricing.tight", description=main.__doc__)
    group = p.add_mutually_exclusive_group()
    group.add_argument("--write", type=Path, metavar="PATH", help="write the report to PATH")
    group.add_argument(
        "--check", type=Path, metavar="PATH", help="fail when PATH differs from the report"
    )
    args = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    text, ok = render_report(measured_samples())
    emit(text.rstrip("\n"))
    status = 0 if ok else 1
    if args.write is not None:
        args.write.parent.mkdir(parents=True, exist_ok=True)
        args.write.write_text(text, encoding="utf-8")
        emit(f"wrote {args.write}")
    if args.check is not None:
        stored = args.check.read_text(encoding="utf-8") if args.check.is_file() else None
        if stored != text:
            emit(
                f"STALE: {args.check} differs from the report above "
                f"(regenerate: python -m cpmem.pricing.tight --write {args.check})"
            )
            status = 1
        else:
            emit(f"{args.check} is up to date")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
