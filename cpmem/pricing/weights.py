"""The frozen base weights one rank holds, from the geometry and the layout.

Parameters are counted the way megatron-core 0.16 builds and shards them (bf16, the
measured runtime's dtype):

- the embedding and the output layer are vocabulary-parallel: ``V_pad/t x H`` each, the
  vocabulary padded to a multiple of ``128 x TP`` (megatron's
  ``make_vocab_size_divisible_by``); tied embeddings hold one of them;
- attention (``ColumnParallelLinear`` QKV, with the output gate's second Q of the
  Qwen3.5 family, and a ``RowParallelLinear`` output projection) and GDN (one in
  projection to ``2K + 2V + 2 h_v``: q, k, v, the output gate z, beta and alpha; the
  causal convolution over ``2K + V`` channels; ``dt_bias`` and ``A_log`` per value head;
  the out projection) are sharded over TP; so is the dense SwiGLU MLP (``3 H F``);
- routed experts are sharded over EP (``E/ep`` experts of ``3 H F_e`` on a rank), the
  shared expert over TP; the router (``H x E``), the shared expert's gate and every norm
  are replicated.

Checked against the published totals (Qwen3-1.7B: 1.7B parameters, 1.4B without the
embedding; Qwen3.5-35B-A3B: 35B) and against the measured runtime's allocated bytes
before its first forward (``cpmem.gate.static_check``): the bf16 weights explain 96-99%
of every recorded baseline.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from cpmem.model.geometry import ModelGeometry
from cpmem.plan.layout import ParallelLayout
from cpmem.pricing.head import VOCAB_DIVISOR

WEIGHT_BYTES = 2
"""bf16, the dtype of every measured cell's frozen base."""


@dataclass(frozen=True)
class LayerParameters:
    """One layer's parameters by how they are placed: ``sharded`` over TP, ``experts``
    over EP (all routed experts together), ``replicated`` on every rank."""

    sharded: int
    experts: int
    replicated: int

    def on_rank(self, tp: int, ep: int) -> float:
        return self.sharded / tp + self.experts / ep + self.replicated


def padded_vocab(geometry: ModelGeometry, tp: int) -> int:
    """The vocabulary megatron allocates: padded to a multiple of ``128 x TP``."""
    multiple = VOCAB_DIVISOR * tp
    return -(-geometry.vocab // multiple) * multiple


def mixer_parameters(geometry: ModelGeometry, kind: str) -> LayerParameters:
    """A token mixer's parameters, with the layer's input norm."""
    g, h = geometry, geometry.hidden
    sandwich = h if g.sandwich_norms else 0  # Gemma's post-attention norm
    if kind == "attention" and g.is_mla:
        return _mla_parameters(g, sandwich)
    if kind == "attention":
        q_out = g.q_width * (2 if g.attention_output_gate else 1)
        sharded = h * (q_out + 2 * g.kv_width) + g.q_width * h
        replicated = h + sandwich + (2 * g.head_dim if g.qk_norm else 0)  # norms
        if g.attention_bias:  # the QKV bias is sharded with its output, proj's is whole
            sharded += q_out + 2 * g.kv_width
            replicated += h
        if g.attention_sinks:
            sharded += g.q_heads
        return LayerParameters(sharded, 0, replicated)
    k, v, heads = g.gdn_key_width, g.gdn_value_width, g.gdn_value_heads
    in_proj = h * (2 * k + 2 * v + 2 * heads)
    conv = (2 * k + v) * g.gdn_conv_kernel
    sharded = in_proj + conv + 2 * heads + v * h  # + dt_bias, A_log; out projection
    return LayerParameters(sharded, 0, h + g.gdn_value_dim)  # input norm, gated out norm


def mlp_parameters(geometry: ModelGeometry, kind: str) -> LayerParameters:
    """A feed-forward block's parameters, with its pre-MLP norm."""
    g, h = geometry, geometry.hidden
    norms = h * (2 if g.sandwich_norms else 1)  # pre-MLP norm (and Gemma's post-MLP norm)
    if kind == "dense":
        bias = 2 * g.ffn if g.mlp_bias else 0
        return LayerParameters(3 * h * g.ffn + bias, 0, norms + (h if g.mlp_bias else 0))
    shared = 3 * h * g.shared_expert_ffn
    # the shared expert's sigmoid gate, H -> 1, replicated (none on DeepSeek-V3's)
    gate = h if g.shared_expert_ffn and g.shared_expert_gate else 0
    per_expert = 3 * h * g.expert_ffn + (2 * g.expert_ffn + h if g.mlp_bias else 0)
    router = h * g.num_experts + (g.num_experts if g.router_bias else 0)
    return LayerParameters(shared, g.num_experts * per_expert, norms + router + gate)


def _mla_parameters(g: ModelGeometry, sandwich: int) -> LayerParameters:
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
    replicated = h + sandwich + h * (g.kv_lora_rank + g.qk_rope_head_dim) + g.kv_lora_rank
    if g.q_lora_rank:
        replicated += h * g.q_lora_rank + g.q_lora_rank
    return LayerParameters(sharded, 0, replicated)


@dataclass(frozen=True)
class Weights:
    """The bytes of one rank's frozen weights by part."""

    embedding: int
    output_layer: int
    layers: int
    final_norm: int

    @property
    def total(self) -> int:
        return self.embedding + self.output_layer + self.layers + self.final_norm


def rank_weights(
    geometry: ModelGeometry,
    layout: ParallelLayout,
    layers: Sequence[int] | None = None,
    *,
    first: bool = True,
    last: bool = True,
) -> Weights:
    """One rank's frozen base weights. ``layers``: the layers this rank holds (all by
    default); ``first`` / ``last``: whether it is the first / last pipeline stage, which
    holds the embedding / the output layer and the final norm (tied embeddings: megatron
    keeps a copy of the embedding on the last stage for the output layer)."""
    tp, ep = layout.tp, layout.ep
    held = tuple(range(geometry.layers) if layers is None else layers)
    params = _layer_parameters(geometry, tp, ep, held)
    matrix = padded_vocab(geometry, tp) // tp * geometry.hidden * WEIGHT_BYTES
    tied = geometry.tied_embeddings
    return Weights(
        embedding=matrix if first or (last and tied) else 0,
        output_layer=matrix if last and not tied else 0,
        layers=int(params) * WEIGHT_BYTES,
        final_norm=geometry.hidden * WEIGHT_BYTES if last else 0,
    )


@lru_cache(maxsize=1024)
def _layer_parameters(geometry: ModelGeometry, tp: int, ep: int, held: tuple[int, ...]) -> float:
    """The parameters of the ``held`` layers on one rank (cached: every estimate prices
    its static memory, and a geometry's layers do not change)."""
    params = 0.0
    for i in held:
        params += mixer_parameters(geometry, geometry.mixers[i]).on_rank(tp, ep)
        params += mlp_parameters(geometry, geometry.mlps[i]).on_rank(tp, ep)
    return params


def total_parameters(geometry: ModelGeometry) -> int:
    """Every parameter of the model once (no vocabulary padding): the figure model cards
    publish."""
    params = sum(
        mixer_parameters(geometry, m).on_rank(1, 1) + mlp_parameters(geometry, f).on_rank(1, 1)
        for m, f in zip(geometry.mixers, geometry.mlps, strict=True)
    )
    embeddings = geometry.vocab * geometry.hidden * (1 if geometry.tied_embeddings else 2)
    return int(params) + embeddings + geometry.hidden
