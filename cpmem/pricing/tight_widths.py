"""The ``tight`` policy's layer physics: elements per token each layer kind keeps, and
what one layer holds at a time (forward transients, no-grad passes, backward buffers),
by recompute path, execution mode and parallel layout (docs/tight.md). Every constant
names the saved set it counts and where it comes from (the saved-tensor oracle, the
rank simulator, megatron-core's source or a measured cell); none is fitted.
``cpmem.pricing.tight`` composes these widths into the policy's components.
"""

from __future__ import annotations

from dataclasses import dataclass

from cpmem.model.geometry import ModelGeometry
from cpmem.pricing.gathered import gathered_kv_width
from cpmem.pricing.inputs import MoeRouting, PricingInput
from cpmem.pricing.widths import LayerWidths, common_width, moe_rows_per_token, sp_divisor

GDN_SMALL_PER_HEAD = 66
"""GDN per value-head small terms (fp32 gate cumsum, beta, WY matrix A): 66·Vh."""


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
on Qwen3.5-4B), which tight prices as that checkpoint's transient since issue 13's third
round (``forward_transient_width``; it priced the saved set ``H + cF`` while the
reference's ``2n`` segment states kept the 4B TP2 64+64 ``core_attn+mlp`` cell at 20.5%
with ``6F``, over its then 20% short-cell bound; docs/tight.md "Known limits")."""


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


UNGATED_GROUP_COPY_Q = 1
"""Q-multiples of the query's per-group copy on ungated attention where the rank holds
more than one query group: megatron-core 0.16's ``get_query_key_value_tensors`` splits
the per-group QKV projection and reshapes the query to heads, which copies when the
groups interleave (one group per rank: a view). The rank simulator keeps it
(Qwen3-32B-style, 4,096 tokens, ``core_attn``: ``3Q + 3KV`` + this at TP1, ``3Q + 3KV``
at TP8, one group per rank); every measured ungated cell (Qwen3-1.7B TP2 and CP2: 4 and
8 groups per rank) holds it and ``UNGATED_RUNTIME_Q`` besides. Not priced on gated
attention: the measured 4B cells with more than one group per rank hold less than the
simulator's copy (``GATE_SIGMOID_Q``)."""


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
    tp1: bool = False,
) -> TightWidths:
    """One model's tight widths at the plan's TP/SP (at TP 1 for ``tp1``: the power
    study's mutant that forgets TP sharding)."""
    layout = inputs.plan.layout
    tp, sp = layout.tp, layout.sp
    if tp1:
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
    (``GATE_SIGMOID_Q``) -> ``7Q + 3KV``; the simulator also copies the query across a
    rank's query groups, which tight does not price on gated attention (see
    ``GATE_SIGMOID_Q``). Ungated: the oracle's CPU flash kernel keeps ``3Q + 3KV``, the
    measured runtime two more Q-wide copies (eager and compiled alike: the 1.7B
    compiled/eager gap is exactly the SwiGLU's ``2F/t``) where the rank holds more than
    one query group -> ``5Q + 3KV``: the per-group query copy the simulator keeps too
    (``UNGATED_GROUP_COPY_Q``; a view with one group per rank) and one Q beyond it
    (``UNGATED_RUNTIME_Q``). Eager gated
    attention outside a ``core_attn`` checkpoint also keeps ``EAGER_NONE_GATED``. With
    fewer KV groups than TP ranks the replicated-QKV LoRA path adds the rest of the
    full-width projection."""
    q, kv = geometry.q_width, geometry.kv_width
    gated = geometry.attention_output_gate
    if gated:
        g = 5 + GATE_SIGMOID_Q
    else:
        groups_per_rank = geometry.kv_groups // tp if geometry.kv_groups >= tp else 1
        g = 3 + UNGATED_RUNTIME_Q + (UNGATED_GROUP_COPY_Q if groups_per_rank > 1 else 0)
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
    checkpoint's forward, full recompute, no-grad) beside its residual input (which a
    selective checkpoint keeps; under full recompute it is mid-layer, live beside the
    kept layer inputs): its norm output and SP-gathered LoRA input (``common`` less the
    layer input) and the gate‖up projection formed as base + LoRA delta + sum
    (``LORA_SUM_COPIES x 2F/t``), or the SwiGLU's own set where wider. Rank simulator, Qwen3.5-4B ``core_attn+mlp``,
    8,192 tokens, the ``mlp`` component's rise at the forward peak: 57,856 elements per
    token at TP1 (``H + 6F``), 31,488 at TP2 (``H + H/2 + 6F/2``)."""
    c = max(LORA_SUM_COPIES * 2, swiglu_saved(geometry, compiled=False))
    return w.common - w.layer_input + c * geometry.ffn // tp


def attention_nograd_width(geometry: ModelGeometry, w: TightWidths, inputs: PricingInput) -> int:
    """One attention mixer's peak without gradients, beside the kept layer inputs: its
    SP-gathered (or, at TP 1, plain) norm output ``H``, the local norm output being freed
    once gathered and nothing being saved; then the larger of two moments: the QKV
    projection formed as base + LoRA delta + sum (``LORA_SUM_COPIES x projection/t``),
    and, with fewer KV groups than TP ranks, megatron's all-gather of the projection to
    full width (the gather buffer and its concatenation, two full-width copies, beside
    the local projection). Under CP the gathered K/V on top. Rank simulator, full
    recompute, 8,192 tokens, the attention layer's forward peak per token (a test holds
    them): Qwen3.5-4B TP8 24,320 = ``H + proj/t + 2 proj``; Qwen3.5-27B TP8 35,584;
    Qwen3-Next-style TP4 22,784. Until issue 11's last round tight priced the layer's
    ``common`` (the local norm output and its residual input too) and three LoRA copies
    at the gather: +5,632 on the last."""
    q, kv, tp = geometry.q_width, geometry.kv_width, w.tp
    projection = (2 if geometry.attention_output_gate else 1) * q + 2 * kv
    moment = LORA_SUM_COPIES * projection // tp
    if geometry.kv_groups < tp:
        moment = max(moment, projection // tp + 2 * projection)
    gathered = gathered_kv_width(inputs, inputs.plan.layout.cp - 1)
    return geometry.hidden + moment + gathered


def gdn_nograd_width(geometry: ModelGeometry, w: TightWidths, tp: int) -> int:
    """One GDN mixer's peak without gradients, bounded by its saved set plus the chunked
    kernel's forward workspace (``GDN_FORWARD_WORKSPACE_V`` value-width tensors and one
    ``dk x dv`` state per chunk and value head). An envelope: the rank simulator's
    fla-shaped kernel peaks below it (Qwen3-Next-style full recompute, 8,192 tokens, TP1:
    57,824 elements per token where this is 63,552; TP2: 29,936 and 33,824), the
    saved-tensor oracle's CPU kernel, with its fp32 temporaries, above it
    (tests/oracle/test_tight_widths.py)."""
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
            # the MLP's residual input is mid-layer: no checkpoint keeps it
            candidates.append(mlp_nograd_width(geometry, w, tp) + w.layer_input)
        if geometry.is_hybrid:
            candidates.append(gdn_nograd_width(geometry, w, tp))
        return max(candidates)
    width = 0
    if geometry.moe_layers and not (rc.mode == "selective" and "moe" in rc.modules):
        width += moe_dispatch_width(geometry, w, inputs)
    if rc.mode == "selective":
        if "mlp" in rc.modules and "dense" in geometry.mlps:
            # the checkpointed MLP's forward runs without gradients: its peak is the
            # LoRA'd gate-up projection as base + delta + sum (mlp_nograd_width,
            # LORA_SUM_COPIES) beside the residual input the checkpoint keeps
            width += mlp_nograd_width(geometry, w, tp)
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


def last_layer_backward_width(geometry: ModelGeometry, w: TightWidths, inputs: PricingInput) -> int:
    """Elements per token the first layer backward visits (the model's last) holds on
    top of the retained set and the incoming gradient, or under full recompute the
    widest layer's recompute and backward (``full_backward_width``). Its FFN's backward
    runs first and frees what it recomputed before the mixer's starts, so the larger of
    the two phases: a dense MLP's backward buffers (``MLP_BACKWARD_COPIES x F/t``) with,
    under an ``mlp`` checkpoint, the MLP's recomputed set beyond its kept input; an
    attention mixer's flash backward (``flash_backward_width``: dq, its fp32 accumulator,
    dk/dv expanded over every CP rank's tokens) with, under ``core_attn``, the recomputed
    core. Rank simulator, Qwen3.5-4B TP1 ``core_attn+mlp`` (8,192 tokens): 60,419
    elements per token of backward buffers = ``2H + 6F`` + 3; the dense CP 8 grid rows
    without recompute peak in the flash backward. Until issue 11's last round the
    checkpointed modules' recomputes were summed and neither workspace was priced (12
    grid rows short in forward+backward)."""
    rc = inputs.recompute
    mixer, ffn = geometry.mixers[-1], geometry.mlps[-1]
    if rc.mode == "full":
        return full_backward_width(geometry, w, inputs)
    selective = rc.modules if rc.mode == "selective" else ()
    ffn_phase = 0  # the FFN's backward runs first and frees its recompute
    if ffn == "dense":
        ffn_phase = MLP_BACKWARD_COPIES * geometry.ffn // w.tp
        if "mlp" in selective:
            ffn_phase += w.mlp - w.layer_input
    if "moe" in selective and ffn == "moe":
        ffn_phase = w.moe - w.common
    mixer_phase = 0
    if mixer == "attention":
        mixer_phase = flash_backward_width(inputs, w.tp)
        if "core_attn" in selective:
            mixer_phase += w.attention_core
    return max(ffn_phase, mixer_phase)
