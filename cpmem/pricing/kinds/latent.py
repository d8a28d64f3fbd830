"""Latent attention's weights (megatron-core 0.16 ``MLASelfAttention``, HF
``DeepseekV3Attention``): its parameters on a rank and the tensors full training steps,
read by the attention kind's spec (``cpmem.pricing.kinds.attention``) where the model's
attention is latent."""

from __future__ import annotations

from cpmem.model.geometry import ModelGeometry
from cpmem.pricing.kinds.spec import TrainedTensors
from cpmem.pricing.layer_parameters import LayerParameters


def mla_parameters(g: ModelGeometry, norms: int) -> LayerParameters:
    """Multi-head latent attention (megatron-core 0.16 ``MLASelfAttention``, HF
    ``DeepseekV3Attention``): the query's down projection ``H x r_q`` and its norm (or a
    plain ``H x heads·d`` query projection without ``q_lora_rank``), the KV down
    projection to ``r_kv + d_rope`` and its norm, both replicated over TP; the query's and
    KV's up projections (``r x heads·d``, ``r_kv x heads·(d_nope + d_v)``) and the output
    projection sharded."""
    h, heads = g.hidden, g.q_heads
    q_up_in = g.q_lora_rank or h
    sharded = q_up_in * heads * g.head_dim
    sharded += g.kv_lora_rank * heads * (g.qk_nope_head_dim + g.v_head_dim)
    sharded += g.attention_output_width * h
    replicated = norms + h * (g.kv_lora_rank + g.qk_rope_head_dim) + g.kv_lora_rank
    if g.q_lora_rank:
        replicated += h * g.q_lora_rank + g.q_lora_rank
    return LayerParameters(sharded, 0, replicated)


def mla_weight_shapes(g: ModelGeometry, tp: int) -> tuple[tuple[int, int], ...]:
    """Each of latent attention's weight matrices on the rank as megatron-core holds it,
    ``[out, in]``, in ``mla_tensors``' ``weights`` order: the query's down projection
    ``[r_q, H]`` (where ``q_lora_rank`` is set) and up projection ``[heads x d / TP, r_q]``
    (a plain ``[heads x d / TP, H]`` without it), the KV's down projection
    ``[r_kv + d_rope, H]`` and up projection ``[heads x (d_nope + d_v) / TP, r_kv]``, the
    output projection ``[H, heads x d_v / TP]``. Every one is a Transformer Engine linear
    in the TE layer spec (``cpmem.pricing.kinds.fp8.latent_fp8_width``)."""
    h, heads = g.hidden, g.q_heads
    q_down = ((g.q_lora_rank, h),) if g.q_lora_rank else ()
    return (
        *q_down,
        (heads * g.head_dim // tp, g.q_lora_rank or h),
        (g.kv_lora_rank + g.qk_rope_head_dim, h),
        (heads * (g.qk_nope_head_dim + g.v_head_dim) // tp, g.kv_lora_rank),
        (h, g.attention_output_width // tp),
    )


def mla_tensors(g: ModelGeometry, tp: int) -> TrainedTensors:
    """Latent attention's trained tensors (megatron-core ``MLASelfAttention``): the
    query's projection (its up projection from ``q_lora_rank``, or a plain one from
    ``H``), the KV's up projection and the output projection sharded over TP; the query's
    and the KV's down projections and their norms replicated (``mla_parameters``)."""
    h, heads = g.hidden, g.q_heads
    q_up = (g.q_lora_rank or h) * heads * g.head_dim // tp
    kv_up = g.kv_lora_rank * heads * (g.qk_nope_head_dim + g.v_head_dim) // tp
    kv_down = h * (g.kv_lora_rank + g.qk_rope_head_dim)
    q_down = (h * g.q_lora_rank,) if g.q_lora_rank else ()
    q_norm = (g.q_lora_rank,) if g.q_lora_rank else ()
    *projections, proj = mla_weight_shapes(g, tp)
    return TrainedTensors(
        weights=(*q_down, q_up, kv_down, kv_up, g.attention_output_width // tp * h),
        norms=(h, *((h,) if g.sandwich_norms else ())),
        extra=(*q_norm, g.kv_lora_rank),
        # linear_proj first (Attention.__init__), then MLASelfAttention's
        shapes=(proj, *projections),
    )
