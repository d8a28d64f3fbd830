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
from cpmem.pricing.inputs import MoeRouting, PricingInput
from cpmem.pricing.reference import segment_state_bytes
from cpmem.pricing.registry import register_policy
from cpmem.pricing.widths import LayerWidths, common_width, moe_rows_per_token, sp_divisor
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

MOE_ROW_EAGER_F = 6
"""F_e-multiples one routed expert row keeps in eager mode beside its H-wide input
(megatron-core 0.16's unfused probs-weighted GLU, ``bias_activation_fusion`` off, as the
rank simulator restates it in oracles/rank_sim/moe.py ``MoE.activation``): the fc1
output (``2F_e``, which ``silu`` saves), ``silu(x0)`` and ``x1 + 0`` (the GLU product's
inputs), the GLU output (saved by the fp32 probs scaling) and the scaled bf16 output
(fc2's LoRA input): ``H + 6·F_e`` per row. Simulator, Qwen3.5-35B-A3B TP4 EP4
``core_attn``, 4,096 and 8,192 tokens: concentrated minus balanced is 5,124 elements per
six rows per token and layer (``H + 6·F_e + MOE_ROW_SMALL``). It validates on the measured
eager concentrated ``core_attn`` cells within 0.974-1.007 (oracles/rank_sim/README.md,
"MoE"); the reference's ``2H + c·F_e`` keeps a second H-wide copy megatron's code does
not (7-8% over those cells in the simulator)."""
MOE_ROW_COMPILED_F = 3
"""F_e-multiples one routed expert row keeps under torch.compile: the fused
``weighted_bias_swiglu`` saved set, the fc1 output (``2F_e``), and the activation output
fc2's LoRA saves (``F_e``): ``H + 3·F_e`` (the simulator's ``--compiled``; 3,588 elements
per row with ``MOE_ROW_SMALL``)."""
MOE_COMPILED_ROW_FP32_F = 2
"""F_e-multiples (bf16 elements) the measured compiled MoE runs keep per expert row
beyond the fused set: one fp32 ``F_e`` tensor. oracles/rank_sim/README.md "MoE",
"Balanced (compiled) cells": against the measured ``core_attn+moe`` cells of the same
routing the simulator's compiled ``core_attn`` cells are short by about 2 KB per expert
row (0.5-0.7 GiB at every size), i.e. ``2·F_e`` bf16 elements at F_e = 512. Which tensor
it is (an inductor fp32 intermediate, or uneven natural routing) was not resolved; it is
priced on compiled runs only, where it was measured."""
MOE_ROW_SMALL = 4
"""bf16-equivalent elements per expert row besides the H and F_e-wide tensors: the row's
fp32 routing prob (2; saved by the probs scaling) and the two rank-1 LoRA activations
(fc1's and fc2's adapters, 1 each). Simulator (above): 5,124 = H + 6·F_e + 4."""
MOE_ROUTER_PER_TOPK = 10
"""bf16-equivalent elements per local token and routed slot the router and ``permute``
keep (megatron ``topk_routing_with_score_function`` and the unfused ``permute``, as the
simulator restates them): the fp32 top-k softmax output (2), the int64 top-k indices (4,
saved by ``topk`` and the probs ``scatter``) and the int64 sorted token indices
(``unpermute`` saves them, 4). With the transposed bool routing map (``masked_select``
saves it: ``E`` bytes, ``E/2`` elements) per local token."""

MOE_DISPATCH_ROW_H = 3
"""H-multiples per expert row an MoE layer holds at its forward peak beyond its saved set
(megatron's ``MoELayer.forward`` as oracles/rank_sim/moe.py restates it): during the
combine the experts' fc2 output, its un-sorted copy (``sort_chunks_by_idxs``) and the
dispatched all-to-all output, which ``MoELayer.forward``'s frame keeps until the layer
returns; with the dispatched fp32 probs (2 elements per row). Per local token the dense
fp32 probs (``2E``) and one H-wide buffer (the shared expert's output). Simulator,
Qwen3.5-35B-A3B TP4 EP4 SP ``core_attn``, 8,192 tokens: forward peak minus the saved
sets is 49,808 elements per token concentrated (8 rows) and 12,932 balanced (2 rows),
eager and compiled alike = ``rows·(3H + 2) + (H + 2E)/s``."""

FINAL_HIDDEN_STATES = 1
"""Layer-input-wide tensors live beside the outputs under full recompute: the last
layer's output, which no checkpoint keeps but which the output gather reads (the
checkpoints keep the L layer inputs, the embedding output the first of them). Rank
simulator, ``qwen3-1.7b:tp2:cp8:single-32k:full`` busiest rank (7,680 tokens): forward
peak = embedding 15.7 MB + rope + 440.4 MB (28 layers' outputs, the last one included)
+ the gathered and unpacked outputs; L x layer input = 440.4 MB, so one layer input
(15.7 MB) more than tight priced. Priced in ``structural_terms`` as the floor of the
full-recompute transient."""


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
    moe = moe_tight_width(geometry, tp, sp, layout.ep, inputs.moe_routing, comp)
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


def moe_tight_width(
    geometry: ModelGeometry,
    tp: int,
    sp: bool,
    ep: int,
    routing: MoeRouting,
    compiled: bool,
) -> int:
    """Elements per (global) token one MoE layer keeps: megatron-core 0.16's ``MoELayer``
    with the ``alltoall`` dispatcher as the rank simulator restates it
    (oracles/rank_sim/moe.py; oracles/rank_sim/README.md "MoE").

    - the common norm/LoRA input (``common_width``: the local norm output, the shared
      expert's SP-gathered input and the layer's output);
    - per routed row (``moe_rows_per_token``, the routing the caller states) its
      ``H``-wide dispatched input plus ``MOE_ROW_EAGER_F·F_e`` eager or
      ``(MOE_ROW_COMPILED_F + MOE_COMPILED_ROW_FP32_F)·F_e`` compiled, and
      ``MOE_ROW_SMALL``;
    - the router per local token: ``MOE_ROUTER_PER_TOPK·top_k + E/2``;
    - the shared expert: its SwiGLU's saved set (``c·F_s/t``) and the gated product's
      saved expert output (``H`` per local token).

    The reference's ``moe_width`` keeps ``2H + c·F_e`` per row (a second H-wide copy the
    simulator's megatron code has not): tight's own, the reference is unchanged.
    Simulator, Qwen3.5-35B-A3B TP4 EP4 SP, eager: 45,001.2 elements per token and layer
    concentrated, 14,257.2 balanced (this: 45,012 and 14,268)."""
    if not geometry.is_moe:
        return 0
    s = sp_divisor(tp, sp)
    h, fe = geometry.hidden, geometry.expert_ffn
    f = MOE_ROW_COMPILED_F + MOE_COMPILED_ROW_FP32_F if compiled else MOE_ROW_EAGER_F
    if geometry.activation_clamp is not None:
        f += 2
    rows = moe_rows_per_token(geometry, ep, routing)
    routed = rows * (h + f * fe + MOE_ROW_SMALL)
    router = (MOE_ROUTER_PER_TOPK * geometry.moe_top_k + geometry.num_experts // 2) // s
    shared = 0
    if geometry.shared_expert_ffn:
        shared = swiglu_saved(geometry, compiled) * geometry.shared_expert_ffn // tp + h // s
    return common_width(geometry, tp, sp) + routed + router + shared


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
    an MoE layer's dispatch and combine buffers (``moe_dispatch_width``) where no ``moe``
    checkpoint drops its saved set; a selective mlp checkpoint's no-grad working set
    (``mlp_nograd_width`` beyond the output it keeps) or the moe's saved set; under full
    recompute and no-grad the widest no-grad pass of a sub-layer (the MLP's, a GDN
    mixer's, an attention layer's saved set with the gathered K/V under CP as its
    envelope). Freed before backward starts."""
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
    if geometry.moe_layers and not (rc.mode == "selective" and "moe" in rc.modules):
        width += moe_dispatch_width(geometry, w, inputs)
    if rc.mode == "selective":
        if "mlp" in rc.modules and "dense" in geometry.mlps:
            # the checkpointed MLP's saved set, not its no-grad peak (mlp_nograd_width):
            # see LORA_SUM_COPIES
            width += w.mlp - w.layer_input
        if "moe" in rc.modules and geometry.moe_layers:
            width += w.moe - w.common
    return width


def moe_dispatch_width(geometry: ModelGeometry, w: TightWidths, inputs: PricingInput) -> int:
    """Elements per token the last MoE layer holds at its forward peak beyond its saved
    set (``MOE_DISPATCH_ROW_H``): ``rows·(3H + 2) + (H + 2E)/s``. Priced where the MoE
    layers keep their saved sets (no ``moe`` checkpoint); a checkpointed MoE's forward is
    priced by its saved set (``forward_transient_width``)."""
    layout = inputs.plan.layout
    tp, sp = w.tp, layout.sp and w.tp > 1
    rows = moe_rows_per_token(geometry, layout.ep, inputs.moe_routing)
    h = geometry.hidden
    return rows * (MOE_DISPATCH_ROW_H * h + 2) + (h + 2 * geometry.num_experts) // sp_divisor(
        tp, sp
    )


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
    """Whether the busiest CP rank's tokens are priced: under CP, in every recompute mode
    and for every model family. Each rank keeps only its own tokens' activations; a
    full-recompute checkpoint keeps its own tokens' layer inputs and one layer's working
    set at its own count, and a no-grad forward likewise (the rank simulator's layout).
    MoE too: each CP rank dispatches only its own tokens, and the rank simulator takes
    every rank of the EP group to route as many tokens as the simulated (busiest) rank
    (oracles/rank_sim/moe.py ``expert_rows``; at EP = TP the EP group is the TP ranks of
    one CP rank), so the experts' rows follow the busiest rank's count. Until the
    simulated grid's MoE rows MoE kept the packed count (the reference's rule): +109% to
    +131% over the simulator at CP 2. No MoE cell under CP was measured."""
    return inputs.plan.layout.cp > 1


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


def gathered_outputs_bytes(inputs: PricingInput, tokens: int) -> int:
    """The returned hidden states gathered over CP: every rank's rows padded to the
    largest rank's count in transit (one ``CP x R`` buffer, R the priced busiest count),
    live beside the unpacked logical copy (``outputs``). Rank simulator
    (oracles/rank_sim/runner.py, ``GatherTokens`` in kernels.py): the gather buffer is
    ``CP x max(counts)`` rows; ``qwen3-1.7b:tp2:cp8:pair-16k:full`` holds 8 x 5,632
    tokens (176 MiB) plus the 128 MiB unpacked copy at its forward peak. Until the
    simulated grid's full-recompute rows tight priced the logical count twice (up to
    3.4% under the simulator at CP 4/8). Scaled from ``outputs`` per logical token, so a
    caller's ``output_bytes`` carries over; never below the logical count (a request's
    shared prefix is repeated by the unpacking, not by the gather). 0 without CP."""
    cp = inputs.plan.layout.cp
    if cp <= 1:
        return 0
    outputs, logical = inputs.outputs, max(1, inputs.plan.logical_tokens)
    return max(outputs, -(-outputs * cp * tokens // logical))


ROPE_TABLES = 2
"""head_dim-wide bf16 tables the step's rotary embedding keeps per rank token: cos and
sin, allocated once per step and live through backward (recompute reads them). Rank
simulator (oracles/rank_sim/runner.py, label ``rope``: two ``(tokens, head_dim)`` bf16
tables; megatron's unfused ``_apply_rotary_pos_emb_bshd`` saves only the tables): 512
elements per token on Qwen3.5-35B-A3B (head_dim 256), whatever the TP degree."""


def rope_table_bytes(inputs: PricingInput, tokens: int) -> int:
    """The rope cos/sin tables (``ROPE_TABLES``) at the priced tokens, for a model with
    attention layers (GDN layers take no rope)."""
    g = inputs.geometry
    if "attention" not in g.mixers:
        return 0
    return ROPE_TABLES * g.head_dim * tokens * inputs.dtype_bytes


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
    gathered_outputs = gathered_outputs_bytes(inputs, tokens)
    transient = tokens * b * forward_transient_width(geometry, w, inputs)
    if one_layer_passes:
        # the outputs are formed after the last layer's pass: the forward peak is the
        # larger of the two on top of the layer inputs, not their sum; under full
        # recompute the last layer's output is live beside them (FINAL_HIDDEN_STATES)
        final = (
            FINAL_HIDDEN_STATES * tokens * b * w.layer_input
            if inputs.recompute.mode == "full"
            else 0
        )
        transient = max(final, transient - outputs - gathered_outputs)
    forward = {
        "cold_setup": COLD_SETUP if inputs.cold and terms.cold_setup else 0,
        "segment_states": seg,
        "outputs": outputs,
        "gathered_outputs": gathered_outputs,
        "retained_activations": tokens * b * kept_width(geometry, w, inputs),
        "layer_transient": transient,
    }
    rope = rope_table_bytes(inputs, tokens)
    if rope:  # a component only where the model has attention layers
        forward["rope_tables"] = rope
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
        + forward.get("cp_gathered_kv", 0)
        + forward.get("rope_tables", 0),
    )


@register_policy("tight")
def tight_policy(inputs: PricingInput) -> Estimate:
    """Structural forward (admission) and forward+backward peaks with a small margin."""
    return price_tight(inputs)
