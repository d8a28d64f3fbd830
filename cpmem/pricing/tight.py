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
from cpmem.pricing.gathered import gathered_kv_bytes, gathered_kv_width
from cpmem.pricing.inputs import PricingInput
from cpmem.pricing.reference import segment_state_bytes
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
LORA_SUM_COPIES = 3
"""Where a LoRA'd projection forms its output, three output-wide tensors are live: the
frozen base output, the rank-1 adapter's delta ``B(Ax)`` (output-wide) and their sum. A
pass without gradients (every layer under full recompute, a no-grad forward) saves
nothing, so that moment is its peak; on the SwiGLU's gate‖up projection it is
``3 x 2F/t`` (``mlp_nograd_width``). Rank simulator (oracles/rank_sim/layers.py
``LoRAColumn``), 8,192 tokens at TP1: the full-recompute forward peak is the layer
inputs plus ``2H + 6F`` (Qwen3.5-4B: 142,848 elements per token = 33H + rope + 57,856),
where tight had priced the widest layer's saved set. The same term is the forward peak
minus the retained set under selective ``mlp`` (``H + 6F``: 38,912 on Qwen3-1.7B, 57,856
on Qwen3.5-4B), where tight still prices the checkpointed MLP's saved set ``H + cF``:
pricing ``6F`` there lifts the measured 4B TP2 64+64 ``core_attn+mlp`` cell (compiled,
cold) to 20.5% forward headroom under the refitted margin, over its 20% short-cell
target (docs/tight.md "Known limits")."""
GATE_SIGMOID_Q = 2
"""Q-multiples of the output gate's sigmoid, which gated attention keeps in fp32:
megatron-core's ``_apply_output_gate`` computes ``(out * sigmoid(gate.float())).to(bf16)``
and keeps the fp32 sigmoid for the product's backward (``2Q``; the saved-tensor oracle's
bf16 gate kept ``Q``). With the QKV+gate projection (``2Q + 2KV``), the roped q and k,
the kernel output and the bf16 gated output (``Q`` each) the layer keeps ``7Q + 3KV``.
Rank simulator, Qwen3.5-4B TP1, 8,192 tokens: 41,004 elements per token per attention
layer = ``2H + 7Q + 3KV`` + the query's per-group copy ``Q`` + the fp32 softmax
statistics. The simulator with this set matches the measured 27B TP4/TP8 cells (one
query group per rank: no copy) within 1%. The copy is not priced: on the measured 4B
(TP1 CP2, TP2: more than one group per rank) the simulator is 1.1-2.3% over the
``core_attn`` peaks (golden/reports/rank_sim_validation.md)."""
EAGER_NONE_GATED = 2
"""Q-multiples eager gated attention keeps without a ``core_attn`` checkpoint (the query
before the qk-norm and before the rope, which a compiled run fuses away). Measured: the
4B CP2 cells without recompute exceed the ``core_attn`` cells of the same shape by
8,259 (4,096+4,096) and 8,274 (2,048+2,048) elements per token per attention layer beyond
the gathered K/V, ``2Q`` = 8,192 (it was priced ``2(Q + KV)`` = 10,240). The 27B
compiled cells without recompute match ``core_attn``. Not priced on ungated attention:
no ungated cell without recompute was measured, and the rank simulator's ungated
attention keeps the same set with and without the checkpoint (Qwen3-1.7B TP1: 15,444
elements per token per layer either way, less the softmax statistics)."""
UNGATED_RUNTIME_Q = 1
"""Q-multiples the measured runtime keeps per ungated attention layer beyond the rank
simulator's structure (oracles/rank_sim/README.md "The miss": Qwen3-1.7B TP2 cells,
eager and compiled, 1,160 elements per token per layer above the simulator where
``Q/t`` = 1,024; the CP2 cell 2.8% under). Which tensor it is was not found; it is
priced on ungated attention only (the gated 27B/4B match the simulator within 1%)."""
MLP_BACKWARD_COPIES = 3
"""F-multiples the MLP's backward holds on top of its saved set: the down projection's
input gradient formed as the frozen base's gradient plus the LoRA's, summed
(``3 x F/t``, as ``LORA_SUM_COPIES``). The rank simulator under full recompute
(Qwen3.5-4B TP1, 8,192 tokens): the forward+backward peak minus the layer inputs and
the recomputed layer's saved sets is 27,657 elements per token = ``3F`` + 9."""
FLASH_BACKWARD_DQ_Q = 3
"""Q-multiples of a flash attention backward's query gradient: dq (bf16) and its fp32
accumulator (oracles/rank_sim/kernels.py ``FlashAttention.backward``, "FlashAttention-2's
contract"). With the head-expanded dk/dv over the CP-gathered tokens it is what the
simulator's full-recompute rows at CP 8 peak on (Qwen3.5-4B TP1 CP8, 16,384 tokens per
rank: 2.3% under the simulated forward+backward peak without it)."""
GDN_CHUNK = 64
"""Tokens per chunk of the chunked gated delta rule (fla-core; the oracle's A is per
chunk): one ``dk x dv`` state per chunk and value head."""
GDN_FORWARD_WORKSPACE_V = 3
"""Value-width tensors the chunked gated delta rule's forward allocates beside its
chunk states and frees before returning (``w``, ``u``, ``v_new``; fla-core 0.6.0
``chunk_gated_delta_rule_fwd`` as the rank simulator lays it out). Live in a no-grad
pass too."""
GDN_BACKWARD_WORKSPACE_V = 9
"""Value-width tensors the chunked gated delta rule's backward holds at once besides its
saved set, with two chunk-state tensors (recomputed states and their gradient): ``w``,
``u``, ``v_new``, ``dv_local``, ``dv``, ``dq``, ``dk``, ``dw`` and the incoming ``do``
(fla-core 0.6.0 ``chunk_gated_delta_rule_bwd`` as the rank simulator lays it out).
Qwen3-Next-style (dense FFN) under full recompute at TP1: the simulator's
forward+backward peak is the GDN layer's backward, 61,800 elements per token of
backward buffers on top of what remains of its saved set."""


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
    forward_factor=1.045,
    forward_allowance=4 * MIB,
    backward_allowance=0,
    cold_backward_allowance=88 * MIB,
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
    tp: int
    """The TP degree the widths are sharded by (workspaces added to them follow it)."""


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
    core = attention_core_width(geometry, tp, not comp and inputs.recompute.mode == "none")
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
        tp=tp,
    )


def attention_core_width(geometry: ModelGeometry, tp: int, eager_none: bool) -> int:
    """Elements per token one attention layer keeps beyond the common norm/LoRA input.

    Gated (megatron-core 0.16's ``SelfAttention`` as the rank simulator runs it): the
    QKV+gate projection output (``2Q + 2KV``; K and V are views of it), the roped q and k,
    the kernel output, and the output gate's fp32 sigmoid and gated output
    (``GATE_SIGMOID_Q``) -> ``7Q + 3KV``. Ungated: the oracle's CPU flash kernel keeps
    ``3Q + 3KV``, the measured runtime two more Q-wide copies (eager and compiled alike:
    the 1.7B compiled/eager gap is exactly the SwiGLU's ``2F/t``) -> ``5Q + 3KV``, one
    Q (``UNGATED_RUNTIME_Q``) beyond the rank simulator's ``4Q + 3KV``. The simulator
    also copies the query across a rank's query groups (``Q/t`` where a rank holds more
    than one group); tight does not price it (see ``GATE_SIGMOID_Q``). Eager gated
    attention outside a ``core_attn`` checkpoint also keeps ``EAGER_NONE_GATED``. With
    fewer KV groups than TP ranks the replicated-QKV LoRA path adds the rest of the
    full-width projection."""
    q, kv = geometry.q_width, geometry.kv_width
    gated = geometry.attention_output_gate
    g = 5 + GATE_SIGMOID_Q if gated else 4 + UNGATED_RUNTIME_Q
    core = (g * q + 3 * kv) // tp
    if gated and eager_none:
        core += EAGER_NONE_GATED * q // tp
    if geometry.kv_groups < tp:  # replicated-QKV LoRA path
        core += ((2 if gated else 1) * q + 2 * kv) * (tp - 1) // tp
    return core


def _layers(geometry: ModelGeometry) -> list[tuple[str, str]]:
    return list(zip(geometry.mixers, geometry.mlps, strict=True))


def mlp_nograd_width(geometry: ModelGeometry, w: TightWidths, tp: int) -> int:
    """One dense MLP's peak in a pass without gradients (a selective ``mlp``
    checkpoint's forward, full recompute, no-grad): its norm/LoRA input and residual
    (``common``) and the gate‖up projection formed as base + LoRA delta + sum
    (``LORA_SUM_COPIES x 2F/t``), or the SwiGLU's own set where wider."""
    c = max(LORA_SUM_COPIES * 2, swiglu_saved(geometry, compiled=False))
    return w.common + c * geometry.ffn // tp


def attention_nograd_width(geometry: ModelGeometry, w: TightWidths, inputs: PricingInput) -> int:
    """One attention mixer's peak without gradients: its norm/LoRA input and residual
    (``common``) and the QKV projection formed as base + LoRA delta + sum
    (``LORA_SUM_COPIES``); with fewer KV groups than TP ranks megatron all-gathers the
    projection to full width (the gather buffer and its concatenation, two full-width
    copies); under CP the gathered K/V. Rank simulator, Qwen3.5-4B TP8 (KV groups 4),
    full recompute, 22,320 tokens: the forward peak holds 24,320 elements per token in the
    last attention layer, where tight's saved set with gradients is 15,616."""
    q, kv, tp = geometry.q_width, geometry.kv_width, w.tp
    projection = (2 if geometry.attention_output_gate else 1) * q + 2 * kv
    width = w.common + LORA_SUM_COPIES * projection // tp
    if geometry.kv_groups < tp:
        width += 2 * projection
    return width + gathered_kv_width(inputs, inputs.plan.layout.cp - 1)


def gdn_nograd_width(geometry: ModelGeometry, w: TightWidths, tp: int) -> int:
    """One GDN mixer's peak without gradients, bounded by its saved set plus the chunked
    kernel's forward workspace (``GDN_FORWARD_WORKSPACE_V`` value-width tensors and one
    ``dk x dv`` state per chunk and value head)."""
    return w.gdn + _gdn_workspace(geometry, GDN_FORWARD_WORKSPACE_V, 1) // tp


def _gdn_workspace(geometry: ModelGeometry, value_tensors: int, state_tensors: int) -> int:
    states = geometry.gdn_value_heads * geometry.gdn_key_dim * geometry.gdn_value_dim
    return value_tensors * geometry.gdn_value_width + state_tensors * states // GDN_CHUNK


def kept_width(geometry: ModelGeometry, w: TightWidths, inputs: PricingInput) -> int:
    """Elements per token kept over all layers at the end of forward (what backward
    finds): every layer's saved set, less what a selective recompute drops; under full
    recompute the layer inputs its checkpoints keep; without gradients the current
    layer's input only."""
    rc = inputs.recompute
    if rc.mode == "full":
        return geometry.layers * w.layer_input
    if rc.mode == "no-grad":
        return w.layer_input
    total = sum(w.mixer(m) + w.ffn(f) for m, f in _layers(geometry))
    if rc.mode == "selective":
        dense = sum(1 for kind in geometry.mlps if kind == "dense")
        if "mlp" in rc.modules and dense:
            total -= dense * (w.mlp - w.layer_input)
        if "moe" in rc.modules and geometry.moe_layers:
            total -= geometry.moe_layers * (w.moe - w.common)
    return total


def retained_width(geometry: ModelGeometry, w: TightWidths, inputs: PricingInput) -> int:
    """Elements per token at the forward peak: the kept set plus one layer's transient."""
    return kept_width(geometry, w, inputs) + forward_transient_width(geometry, w, inputs)


def forward_transient_width(geometry: ModelGeometry, w: TightWidths, inputs: PricingInput) -> int:
    """Elements per token only one layer holds while it runs, on top of the kept set:
    a selective mlp checkpoint's no-grad working set (``mlp_nograd_width`` beyond the
    output it keeps) or the moe's saved set; under full recompute and no-grad the widest
    no-grad pass of a sub-layer (the MLP's, a GDN mixer's, an attention layer's saved
    set with the gathered K/V under CP as its envelope). Freed before backward starts."""
    rc = inputs.recompute
    tp = w.tp
    if rc.mode in ("full", "no-grad"):
        candidates = [w.moe] if geometry.moe_layers else []
        if "attention" in geometry.mixers:
            candidates.append(attention_nograd_width(geometry, w, inputs))
        if "dense" in geometry.mlps:
            candidates.append(mlp_nograd_width(geometry, w, tp))
        if geometry.is_hybrid:
            candidates.append(gdn_nograd_width(geometry, w, tp))
        return max(candidates)
    width = 0
    if rc.mode == "selective":
        if "mlp" in rc.modules and "dense" in geometry.mlps:
            # the checkpointed MLP's saved set, not its no-grad peak (mlp_nograd_width):
            # see LORA_SUM_COPIES
            width += w.mlp - w.layer_input
        if "moe" in rc.modules and geometry.moe_layers:
            width += w.moe - w.common
    return width


def full_backward_width(geometry: ModelGeometry, w: TightWidths, inputs: PricingInput) -> int:
    """Elements per token the backward of one layer holds under full recompute on top of
    the layer inputs: the layer recomputed with gradients (its whole saved set, the
    gathered K/V of an attention layer under CP) plus the MLP's backward
    (``MLP_BACKWARD_COPIES x F/t``); in a GDN layer, once the MLP is done, the mixer's
    saved set and its kernel's backward workspace. The widest layer of the model."""
    tp = w.tp
    widest = 0
    for m, f in _layers(geometry):
        mixer = w.mixer(m) + (
            gathered_kv_width(inputs, inputs.plan.layout.cp - 1) if m == "attention" else 0
        )
        ffn_backward = MLP_BACKWARD_COPIES * geometry.ffn // tp if f == "dense" else 0
        widest = max(widest, mixer + w.ffn(f) + ffn_backward)
        if m == "gdn":
            widest = max(
                widest, w.gdn + _gdn_workspace(geometry, GDN_BACKWARD_WORKSPACE_V, 2) // tp
            )
        else:
            widest = max(widest, mixer + flash_backward_width(inputs, tp))
    return widest


def flash_backward_width(inputs: PricingInput, tp: int) -> int:
    """Elements per token a flash attention backward allocates (FlashAttention-2's
    contract as the rank simulator lays it out): dq, its fp32 accumulator
    (``FLASH_BACKWARD_DQ_Q``) and dk, dv expanded to the query heads for every token the
    kernel saw, i.e. every CP rank's under CP (``2 x CP x Q/t``)."""
    q = inputs.geometry.q_width
    return (FLASH_BACKWARD_DQ_Q + 2 * inputs.plan.layout.cp) * q // tp


def last_layer_recompute_width(
    geometry: ModelGeometry, w: TightWidths, inputs: PricingInput
) -> int:
    """Elements per token the first layer backward visits (the model's last) recomputes
    on top of the retained set: its checkpointed modules, or under full recompute the
    widest layer's recompute and backward (``full_backward_width``)."""
    rc = inputs.recompute
    mixer, ffn = geometry.mixers[-1], geometry.mlps[-1]
    if rc.mode == "full":
        return full_backward_width(geometry, w, inputs)
    width = 0
    if rc.mode == "selective":
        if "core_attn" in rc.modules and mixer == "attention":
            width += w.attention_core
        if "mlp" in rc.modules and ffn == "dense":
            width += w.mlp_core
        if "moe" in rc.modules and ffn == "moe":
            width += w.moe - w.common
    return width


def busiest_priced(inputs: PricingInput) -> bool:
    """Whether the busiest CP rank's tokens are priced: under CP for dense and hybrid
    models in every recompute mode. Each rank keeps only its own tokens' activations; a
    full-recompute checkpoint keeps its own tokens' layer inputs and one layer's working
    set at its own count, and a no-grad forward likewise (the rank simulator's layout).
    MoE under CP keeps the packed count (unmeasured, the reference's rule)."""
    return inputs.plan.layout.cp > 1 and not inputs.geometry.is_moe


def priced_tokens(inputs: PricingInput) -> int:
    """R: the busiest CP rank's model tokens where ``busiest_priced``, else the packed
    count."""
    if busiest_priced(inputs):
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
    if busiest_priced(inputs) and segments and whole_segments:
        return max(1, segments - (inputs.plan.layout.cp - 1))
    return segments


def local_outputs(inputs: PricingInput) -> int:
    """The rank's share of the returned hidden states (under CP each rank's loss sees
    its own tokens; the gathered copy is a forward term)."""
    cp = inputs.plan.layout.cp
    return inputs.outputs // cp if cp > 1 else inputs.outputs


def cp_gathered_kv_bytes(inputs: PricingInput) -> int:
    """K and V of every other CP rank, all-gathered inside the core attention (padded to
    the largest rank's count, priced at the priced tokens) and saved by the flash kernel
    for backward, beyond the local K/V the widths already hold (``cpmem.pricing.gathered``:
    only where no ``core_attn`` checkpoint drops them; under full recompute one layer
    holds them at a time, priced in that layer's width). The simulated grid's dense CP 8
    rows without recompute miss by up to 7% without it (docs/simulated-grid.md). Measured
    only on the 4B CP 2 cells without recompute, where it is 0.6% of the peak."""
    return gathered_kv_bytes(inputs, priced_tokens(inputs), inputs.plan.layout.cp - 1)


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
    one_layer_passes = inputs.recompute.mode in ("full", "no-grad")
    # under full recompute a layer's segment states live only while it (re)runs
    state_layers = min(1, geometry.gdn_layers) if one_layer_passes else geometry.gdn_layers
    seg = segments * state_layers * segment_state_bytes(geometry, plan.layout.tp, b)
    outputs = inputs.outputs
    gathered_outputs = outputs if plan.layout.cp > 1 else 0
    transient = tokens * b * forward_transient_width(geometry, w, inputs)
    if one_layer_passes:
        # the outputs are formed after the last layer's pass: the forward peak is the
        # larger of the two on top of the layer inputs, not their sum
        transient = max(0, transient - outputs - gathered_outputs)
    forward = {
        "cold_setup": COLD_SETUP if inputs.cold and terms.cold_setup else 0,
        "segment_states": seg,
        "outputs": outputs,
        "gathered_outputs": gathered_outputs,
        "retained_activations": tokens * b * kept_width(geometry, w, inputs),
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
        busiest_rank=plan.busiest_rank if busiest_priced(inputs) else 0,
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
