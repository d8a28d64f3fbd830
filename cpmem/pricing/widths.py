"""Per-token retained widths of the reference pricing model (elements per token per layer).

These are the published reference formulas (docs/pricing.md, "Per-token retained
widths"): calibrated envelopes of native kernels under rank-1 LoRA with frozen
base weights, in elements of the activation dtype. ``t`` is TP; ``s`` is TP when
sequence parallelism is on (and TP > 1), else 1.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from cpmem.model.geometry import ModelGeometry


@dataclass(frozen=True)
class LayerWidths:
    """Elements retained per token by one layer of each kind the model has, at one TP/SP
    setting: ``saved`` by kind name (``ModelGeometry.mixers`` and ``mlps``), with the
    input norm's ``common`` width and the layer input every kind shares."""

    common: int
    layer_input: int
    saved: Mapping[str, int]

    def of(self, kind: str) -> int:
        """The width of a sub-layer of ``kind`` (0 for a kind the model does not have)."""
        return self.saved.get(kind, 0)


def sp_divisor(tp: int, sp: bool) -> int:
    """s: the sequence shard factor of activations outside the TP region."""
    return tp if sp and tp > 1 else 1


def common_width(geometry: ModelGeometry, tp: int, sp: bool, lora: bool = True) -> int:
    """A sub-layer's input norm: its input and its output (``2H/s``), and under SP with
    LoRA adapters the SP-gathered adapter input the LoRA wrapper keeps (``H``); a trained
    projection (``lora`` False) saves its own sequence shard and gathers it again in
    backward (megatron's ``LinearWithGradAccumulationAndAsyncCommunication``).

    Without pre-norms (OLMo 2: the sub-layer reads the residual stream itself) the input is
    the layer input: the adapter keeps its SP-gathered copy (``H``) and nothing keeps the
    local one (the frozen base saves no input, megatron's gather keeps none), a trained
    projection its own shard (``H/s``); the post-norm's input is ``sandwich_width``'s."""
    s = sp_divisor(tp, sp)
    if not geometry.pre_norms:
        return geometry.hidden if s > 1 and lora else geometry.hidden // s
    return 2 * geometry.hidden // s + (geometry.hidden if s > 1 and lora else 0)


def sandwich_width(geometry: ModelGeometry, tp: int, sp: bool) -> int:
    """A post-sub-layer RMSNorm (post-attention, post-feed-forward: Gemma's, OLMo 2's): it
    saves its input, the sub-layer's output on the rank's sequence shard (``H/s``), before
    the residual add; 0 for the families without one."""
    return geometry.hidden // sp_divisor(tp, sp) if geometry.sandwich_norms else 0


def attention_width(geometry: ModelGeometry, tp: int, sp: bool) -> int:
    """Projections, flash-kernel inputs/outputs and (when gated) the output gate."""
    g = 7 if geometry.attention_output_gate else 5
    q, kv = geometry.q_width, geometry.kv_width
    width = common_width(geometry, tp, sp) + sandwich_width(geometry, tp, sp)
    if geometry.is_mla:
        return width + mla_core_width(geometry, tp)
    width += (g * q + 3 * kv) // tp
    if geometry.kv_groups < tp:  # replicated-QKV LoRA path
        width += ((2 if geometry.attention_output_gate else 1) * q + 2 * kv) * (tp - 1) // tp
    return width


def mla_core_width(geometry: ModelGeometry, tp: int, sp: bool = False) -> int:
    """Multi-head latent attention beyond the common norm/LoRA input, as megatron-core
    0.16's ``MLASelfAttention.get_query_key_value_tensors`` (unfused rope) keeps it: the
    flash kernel's query and key (``heads x (d_nope + d_rope)`` each, the ``torch.cat``
    outputs), its contiguous value copy and its output (``heads x d_v`` each), sharded by
    TP; the up projections' outputs are freed once split and concatenated (the unfused
    rope saves only its tables). The latent side runs on the rank's sequence shard: the
    KV down projection's output (``r_kv + d_rope``, which ``kv_layernorm`` saves through
    its view) and the norm's output (``r_kv``), SP-gathered for the up projection's
    adapter; likewise the query's ``r_q`` pair where ``q_lora_rank`` is set."""
    g = geometry
    s = sp_divisor(tp, sp)
    gathered = s > 1
    width = 2 * g.q_heads * (g.head_dim + g.v_head_dim) // tp
    width += (g.kv_lora_rank + g.qk_rope_head_dim) // s + g.kv_lora_rank // s
    width += g.kv_lora_rank if gathered else 0
    if g.q_lora_rank:
        width += 2 * g.q_lora_rank // s + (g.q_lora_rank if gathered else 0)
    return width


def gdn_width(geometry: ModelGeometry, tp: int, sp: bool) -> int:
    """Projections, conv inputs and the fused gated-delta kernel's saved set."""
    k, v = geometry.gdn_key_width, geometry.gdn_value_width
    return common_width(geometry, tp, sp) + (4 * k + 8 * v) // tp


def swiglu_factor(geometry: ModelGeometry) -> int:
    """c: 3 for a fused SwiGLU, 5 unfused; +2 with an activation clamp."""
    c = 3 if geometry.fused_swiglu else 5
    if geometry.activation_clamp is not None:
        c += 2
    return c


def mlp_width(geometry: ModelGeometry, tp: int, sp: bool) -> int:
    common = common_width(geometry, tp, sp) + sandwich_width(geometry, tp, sp)
    return common + swiglu_factor(geometry) * geometry.ffn // tp


def moe_rows_per_token(geometry: ModelGeometry, ep: int, *, tp: int) -> int:
    """The reference's expert rows per token of the rank's own (its CP rank's count):
    every token's top-k copies on the rank's experts (at most one per local expert,
    ``min(top-k, E/EP)``), times the ``EP/TP`` groups of TP ranks an EP group wider than
    TP spans (Qwen3-30B-A3B at TP2 CP2 EP4: two CP ranks' tokens, 16 rows). The
    reference keeps this published whole-row count at every layout; the runtime routes
    only the rank's sequence shard, ``EP x ETP / s x min(top-k, E/EP)`` rows per token
    (``cpmem.step.routing``, which ``tight`` prices): fewer at EP < TP, where the
    reference's count is a bound above the runtime's."""
    worst = min(geometry.moe_top_k, geometry.num_experts // max(ep, 1))
    return worst * max(1, ep // max(tp, 1))


def moe_width(geometry: ModelGeometry, tp: int, sp: bool, ep: int = 1) -> int:
    """The reference's MoE layer: per dispatched row (``moe_rows_per_token``) the
    dispatched and permuted hidden copies (2H) plus the expert SwiGLU's saved set
    (c·F_e); the shared expert as a dense MLP sharded by TP; the common norm/LoRA input.
    """
    if not geometry.is_moe:
        return 0
    c = swiglu_factor(geometry)
    rows = moe_rows_per_token(geometry, ep, tp=tp)
    routed = rows * (2 * geometry.hidden + c * geometry.expert_ffn)
    shared = c * geometry.shared_expert_ffn // tp
    return common_width(geometry, tp, sp) + sandwich_width(geometry, tp, sp) + routed + shared
