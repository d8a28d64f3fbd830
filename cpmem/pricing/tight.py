"""The ``tight`` policy: structural forward and forward+backward peaks (docs/tight.md).

Unlike ``reference`` (calibrated envelopes times 1.10), ``tight`` prices each layer
kind with the saved sets the oracles measured (``oracles/README.md``), chosen by
recompute mode and execution mode (eager/compiled, fused/unfused SwiGLU), keeps every
fixed cost as its own component, prices the backward transient, and adds one small
documented margin (a factor and a fixed allowance) fitted so that every measured
rank-sample is covered. This module holds the policy only: its targets, the margin
fit, the leave-out studies and its report live in ``cpmem.gate`` (``targets``,
``fitting``, ``tight_report``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cpmem.model.geometry import ModelGeometry
from cpmem.pricing.estimate import Estimate
from cpmem.pricing.inputs import PricingInput
from cpmem.pricing.reference import cp_discounted, segment_state_bytes
from cpmem.pricing.registry import register_policy
from cpmem.pricing.widths import LayerWidths, common_width, moe_width, sp_divisor
from cpmem.units import MIB

# --- structural constants (observations, not fitted) -----------------------------
COLD_SETUP = 64 * MIB
"""Cold kernel set-up of the first forward of a process: the first forward peak minus
the repeat forward peak of the same cell is 64.0 MiB on 12 of the 16 first-in-process
golden cells (53.7-62.0 MiB on the others). Priced when ``inputs.cold``."""
GDN_SMALL_PER_HEAD = 66
"""GDN per value-head small terms (fp32 gate cumsum, beta, WY matrix A): 66·Vh."""
LOSS_BACKWARD_OUTPUTS = 6
"""The mean-square loss's backward, in multiples of the rank's bf16 outputs: the
forward+backward peak minus the bytes retained after forward is 6.00 x outputs on every
golden cell of >= 2,048 tokens that records both and whose backward transient is
smaller (12 bytes per output element: the fp32 upcast, its fp32 gradient and the bf16
gradient handed to the last layer)."""
CP_HYBRID_BACKWARD_AUTOTUNE = 256 * MIB
"""Triton's benchmark buffer (``get_empty_cache_for_benchmark``: 256 MiB, allocated
while an autotuned kernel is timed) during the first backward of a CP run of a hybrid
model, whose GDN kernels autotune there: the 4B CP2 64+64 cell's backward rises 279.5 MiB
above its forward peak where its retained set and loss explain about 24 MiB. Inferred
from that one cell and the buffer's size, not read off a trace; priced when cold."""


@dataclass(frozen=True)
class Margin:
    """The policy's fitted constants: ``forward_factor`` on each structural sum plus a
    fixed allowance for the forward, one for every backward, and one for the cold
    set-up of the first backward of a process (``cpmem.gate.fitting.fit_margin``)."""

    forward_factor: float
    forward_allowance: int
    backward_allowance: int
    cold_backward_allowance: int


# --- the fitted margin (docs/tight.md; the gate checks fit_margin reproduces it) ----
MARGIN = Margin(
    forward_factor=1.04,
    forward_allowance=10 * MIB,
    backward_allowance=1 * MIB,
    cold_backward_allowance=93 * MIB,
)


@dataclass(frozen=True)
class TightTerms:
    """Switches of the structure. The defaults are the policy; the gate's power study
    turns one off (or on) at a time, refits, and requires a target to fail."""

    backward: bool = True
    cold_setup: bool = True
    segment_states: bool = True
    fused_swiglu_on_unfused: bool = False
    tp1_widths: bool = False


@dataclass(frozen=True)
class TightWidths(LayerWidths):
    """Elements per token kept by one layer of each kind (oracle saved sets), plus the
    parts a selective recompute drops: the core attention's and the SwiGLU's."""

    attention_core: int
    mlp_core: int


def swiglu_saved(geometry: ModelGeometry, compiled: bool) -> int:
    """F-multiples a SwiGLU keeps: 3 fused (input gate‖up and the activation output),
    3 when torch.compile fuses an unfused SwiGLU, 5 for megatron's eager GLU; +2 with
    an activation clamp (its mask and the clamped copy)."""
    c = 3 if geometry.fused_swiglu or compiled else 5
    if geometry.activation_clamp is not None:
        c += 2
    return c


def tight_widths(
    geometry: ModelGeometry,
    inputs: PricingInput,
    compiled: bool | None = None,
    terms: TightTerms | None = None,
) -> TightWidths:
    layout = inputs.plan.layout
    tp, sp = layout.tp, layout.sp
    if terms is not None and terms.tp1_widths:  # a power-study mutant: no TP sharding
        tp, sp = 1, False
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


def forward_transient_width(geometry: ModelGeometry, w: TightWidths, inputs: PricingInput) -> int:
    """Elements per token of ``retained_width`` that only one layer holds while it runs:
    the working set a selective mlp/moe recompute drops after each layer, the widest
    layer's saved set under full recompute and no-grad. Freed before backward starts."""
    rc = inputs.recompute
    if rc.mode in ("full", "no-grad"):
        return max(
            w.mixer(m) + w.ffn(f) for m, f in zip(geometry.mixers, geometry.mlps, strict=True)
        )
    width = 0
    if rc.mode == "selective":
        if "mlp" in rc.modules and "dense" in geometry.mlps:
            width += w.mlp - w.layer_input
        if "moe" in rc.modules and geometry.moe_layers:
            width += w.moe - w.common
    return width


def last_layer_recompute_width(
    geometry: ModelGeometry, w: TightWidths, inputs: PricingInput
) -> int:
    """Elements per token the first layer backward visits (the model's last) recomputes
    on top of the retained set: its checkpointed modules, or the whole layer under
    full recompute."""
    rc = inputs.recompute
    mixer, ffn = geometry.mixers[-1], geometry.mlps[-1]
    if rc.mode == "full":
        return w.mixer(mixer) + w.ffn(ffn)
    width = 0
    if rc.mode == "selective":
        if "core_attn" in rc.modules and mixer == "attention":
            width += w.attention_core
        if "mlp" in rc.modules and ffn == "dense":
            width += w.mlp_core
        if "moe" in rc.modules and ffn == "moe":
            width += w.moe - w.common
    return width


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


def local_outputs(inputs: PricingInput) -> int:
    """The rank's share of the returned hidden states (under CP each rank's loss sees
    its own tokens; the gathered copy is a forward term)."""
    cp = inputs.plan.layout.cp
    return inputs.outputs // cp if cp > 1 else inputs.outputs


def cp_gathered_kv_bytes(inputs: PricingInput) -> int:
    """K and V of every CP rank, all-gathered inside the core attention (padded to the
    largest rank's count) and saved by the flash kernel for backward, beyond the local K/V
    the widths already hold: (CP - 1) x the priced tokens x 2 KV-local per attention
    layer. Only where no ``core_attn`` checkpoint drops them (no recompute, selective
    without ``core_attn``); under full recompute one layer holds them at a time.
    From the rank simulator (oracles/rank_sim/README.md: "Under CP the K/V of every rank
    are all-gathered ... so core_attn recompute keeps local K/V only"); the simulated
    grid's dense CP 8 rows without recompute miss by up to 7% without it
    (docs/simulated-grid.md). Measured only on the 4B CP 2 cells without recompute, where
    it is 0.6% of the peak."""
    layout, rc = inputs.plan.layout, inputs.recompute
    if layout.cp == 1 or not rc.keeps_gradients or rc.mode == "full":
        return 0
    if rc.mode == "selective" and "core_attn" in rc.modules:
        return 0
    g = inputs.geometry
    kv_local = g.kv_width // min(layout.tp, g.kv_groups)
    tokens = priced_tokens(inputs)
    return g.attention_layers * 2 * kv_local * (layout.cp - 1) * tokens * inputs.dtype_bytes


def structural_terms(
    inputs: PricingInput, terms: TightTerms | None = None
) -> tuple[dict[str, int], dict[str, int]]:
    """The unmargined forward components and forward+backward components.

    forward = retained set + one layer's transient; forward+backward = retained set +
    the larger of that transient and the backward's first moment (the loss's backward,
    or the last layer's recompute on top of the incoming gradient).
    """
    terms = terms or TightTerms()
    geometry = inputs.geometry
    if terms.fused_swiglu_on_unfused:  # a power-study mutant
        geometry = geometry.with_fused_swiglu(True)
    plan = inputs.plan
    b = inputs.dtype_bytes
    w = tight_widths(geometry, inputs, terms=terms)
    tokens = priced_tokens(inputs)
    segments = rank_segments(inputs) if terms.segment_states else 0
    seg = segments * geometry.gdn_layers * segment_state_bytes(geometry, plan.layout.tp, b)
    outputs = inputs.outputs
    transient = tokens * b * forward_transient_width(geometry, w, inputs)
    forward = {
        "cold_setup": COLD_SETUP if inputs.cold and terms.cold_setup else 0,
        "segment_states": seg,
        "outputs": outputs,
        "gathered_outputs": outputs if plan.layout.cp > 1 else 0,
        "retained_activations": tokens * b * retained_width(geometry, w, inputs) - transient,
        "layer_transient": transient,
    }
    gathered_kv = cp_gathered_kv_bytes(inputs)
    if gathered_kv:  # a component only where it applies (CP without core_attn recompute)
        forward["cp_gathered_kv"] = gathered_kv
    backward = 0
    if terms.backward and inputs.recompute.keeps_gradients:
        local = local_outputs(inputs)
        recompute = tokens * b * last_layer_recompute_width(geometry, w, inputs)
        backward = max(LOSS_BACKWARD_OUTPUTS * local, local + recompute)
        if cold_autotune(inputs, terms):
            # timed inside a GDN layer's backward: the loss's buffers are gone by then
            backward = max(backward, local + CP_HYBRID_BACKWARD_AUTOTUNE)
    forward_backward = {k: v for k, v in forward.items() if k != "layer_transient"}
    forward_backward["backward_transient"] = max(transient, backward)
    return forward, forward_backward


def cold_autotune(inputs: PricingInput, terms: TightTerms) -> bool:
    """The first backward of a CP run of a hybrid model times its GDN kernels."""
    return (
        inputs.cold and terms.cold_setup and inputs.plan.layout.cp > 1 and inputs.geometry.is_hybrid
    )


def cold_backward_terms(inputs: PricingInput, margin: Margin, terms: TightTerms) -> dict[str, int]:
    """What the first backward of a process adds (nothing for a warm step)."""
    if not (inputs.cold and terms.cold_setup and terms.backward):
        return {}
    return {"cold_backward_setup": margin.cold_backward_allowance}


def _with_margin(base: dict[str, int], factor: float, allowance: int) -> dict[str, int]:
    subtotal = sum(base.values())
    out = dict(base)
    out["margin_factor"] = math.ceil(subtotal * factor) - subtotal
    out["margin_allowance"] = allowance
    return out


def price_tight(
    inputs: PricingInput, margin: Margin = MARGIN, terms: TightTerms | None = None
) -> Estimate:
    terms = terms or TightTerms()
    forward, forward_backward = structural_terms(inputs, terms)
    components = _with_margin(forward, margin.forward_factor, margin.forward_allowance)
    if inputs.recompute.keeps_gradients:
        fb_components = _with_margin(
            forward_backward, margin.forward_factor, margin.backward_allowance
        )
        fb_components.update(cold_backward_terms(inputs, margin, terms))
    else:  # a no-grad forward has no backward: its whole step is its forward
        fb_components = dict(components)
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
        retained_bytes=forward["retained_activations"]
        + forward["segment_states"]
        + forward.get("cp_gathered_kv", 0),
    )


@register_policy("tight")
def tight_policy(inputs: PricingInput) -> Estimate:
    """Structural forward (admission) and forward+backward peaks with a small margin."""
    return price_tight(inputs)
