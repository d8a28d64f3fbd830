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

from cpmem.errors import InputError
from cpmem.model.geometry import ModelGeometry
from cpmem.plan.layout import ParallelLayout

WEIGHT_BYTES = 2
"""bf16, the dtype of every measured cell's frozen base."""


@dataclass(frozen=True)
class LayerParameters:
    """One layer's parameters by how they are placed: ``sharded`` over TP, ``experts``
    over EP (all routed experts together), ``replicated`` on every rank."""

    sharded: int
    experts: int
    replicated: int

    def on_rank(self, tp: int, ep: int, etp: int = 1) -> float:
        return self.sharded / tp + self.experts / (ep * etp) + self.replicated


def padded_vocab(geometry: ModelGeometry, tp: int) -> int:
    """The vocabulary megatron allocates: padded to a multiple of ``vocab_multiple x TP``
    (``--make-vocab-size-divisible-by``, 128 by default)."""
    multiple = geometry.vocab_multiple * tp
    return -(-geometry.vocab // multiple) * multiple


def norm_parameters(geometry: ModelGeometry, width: int) -> int:
    """A norm's parameters over ``width``: RMSNorm's weight, LayerNorm's weight and bias."""
    return 2 * width if geometry.norm == "layernorm" else width


def mixer_parameters(geometry: ModelGeometry, kind: str) -> LayerParameters:
    """A token mixer's parameters, with the layer's input norm."""
    g, h = geometry, geometry.hidden
    sandwich = h if g.sandwich_norms else 0  # Gemma's post-attention norm
    if kind == "attention" and g.is_mla:
        return _mla_parameters(g, sandwich)
    if kind == "attention":
        q_out = g.q_width * (2 if g.attention_output_gate else 1)
        sharded = h * (q_out + 2 * g.kv_width) + g.q_width * h
        qk = 2 * norm_parameters(g, g.head_dim) if g.qk_norm else 0
        replicated = norm_parameters(g, h) + sandwich + qk  # norms
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


def fc1_width(geometry: ModelGeometry, ffn: int) -> int:
    """fc1's output width for an MLP of ``ffn``: gate and up (``2F``) where gated, ``F``
    for a plain GeLU / squared-ReLU MLP."""
    return 2 * ffn if geometry.gated_mlp else ffn


def mlp_parameters(geometry: ModelGeometry, kind: str) -> LayerParameters:
    """A feed-forward block's parameters, with its pre-MLP norm."""
    g, h = geometry, geometry.hidden
    # pre-MLP norm (and Gemma's post-MLP norm)
    norms = norm_parameters(g, h) + (h if g.sandwich_norms else 0)
    if kind == "dense":
        fc1 = fc1_width(g, g.ffn)
        bias = fc1 if g.mlp_bias else 0
        return LayerParameters((fc1 + g.ffn) * h + bias, 0, norms + (h if g.mlp_bias else 0))
    shared = (fc1_width(g, g.shared_expert_ffn) + g.shared_expert_ffn) * h
    # the shared expert's sigmoid gate, H -> 1, replicated (none on DeepSeek-V3's)
    gate = h if g.shared_expert_ffn and g.shared_expert_gate else 0
    fc1 = fc1_width(g, g.expert_ffn)
    per_expert = (fc1 + g.expert_ffn) * h + (fc1 + h if g.mlp_bias else 0)
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
    tp = layout.tp
    held = tuple(range(geometry.layers) if layers is None else layers)
    params = _layer_parameters(geometry, tp, layout.ep, layout.etp, held)
    matrix = padded_vocab(geometry, tp) // tp * geometry.hidden * WEIGHT_BYTES
    positions = geometry.learned_position_rows * geometry.hidden * WEIGHT_BYTES
    tied = geometry.tied_embeddings
    return Weights(
        embedding=(matrix if first or (last and tied) else 0) + (positions if first else 0),
        output_layer=matrix if last and not tied else 0,
        layers=int(params) * WEIGHT_BYTES,
        final_norm=norm_parameters(geometry, geometry.hidden) * WEIGHT_BYTES if last else 0,
    )


@lru_cache(maxsize=1024)
def _layer_parameters(
    geometry: ModelGeometry, tp: int, ep: int, etp: int, held: tuple[int, ...]
) -> float:
    """The parameters of the ``held`` layers on one rank (cached: every estimate prices
    its static memory, and a geometry's layers do not change)."""
    params = 0.0
    for i in held:
        params += mixer_parameters(geometry, geometry.mixers[i]).on_rank(tp, ep, etp)
        params += mlp_parameters(geometry, geometry.mlps[i]).on_rank(tp, ep, etp)
    return params


@dataclass(frozen=True)
class StageTensors:
    """One rank's trainable parameters of a pipeline stage, tensor by tensor (elements on
    the rank), as megatron-core's DDP places them in its buffers: the dense parameters,
    the tied output copy a later stage holds in a bucket of its own, and the routed
    experts' (their own expert-parallel buffer)."""

    dense: tuple[int, ...]
    tied_copy: tuple[int, ...]
    experts: tuple[int, ...]


def layer_tensors(geometry: ModelGeometry, layer: int, tp: int) -> list[int]:
    """Element counts of layer ``layer``'s dense parameters on one TP rank (every tensor
    but the routed experts'): the attention's QKV and output projections, the MLP's fc1
    and fc2 (under MoE the router's ``[E, H]`` weight and the shared experts' MLP), the
    two input norms, the biases and the q/k norms. Their sum is ``mixer_parameters`` +
    ``mlp_parameters`` on the rank (a test holds it); the order is what megatron's
    distributed-optimizer buffer pads tensor by tensor."""
    g, h = geometry, geometry.hidden
    if g.mixers[layer] != "attention" or g.is_mla or g.attention_output_gate:
        raise InputError(
            "training",
            "full",
            f"full-parameter training prices dense or MoE attention layers only "
            f"({g.name}'s layer {layer} is {g.mixers[layer]}"
            f"{', latent' if g.is_mla else ''}{', gated' if g.attention_output_gate else ''})",
        )
    if g.sandwich_norms or g.attention_sinks:
        raise InputError(
            "training", "full", f"full-parameter training does not price {g.name}'s extra norms"
        )
    qkv_out = g.q_width + 2 * g.kv_width
    tensors = [qkv_out * h // tp, h * g.q_width // tp]
    biases = [qkv_out // tp, h]  # a row-parallel bias is whole
    widths = [g.ffn] if g.mlps[layer] == "dense" else []
    if g.mlps[layer] == "moe":
        tensors.append(g.num_experts * h)
        if g.router_bias:
            biases.append(g.num_experts)
        if g.shared_expert_ffn:
            widths.append(g.shared_expert_ffn)
        if g.shared_expert_ffn and g.shared_expert_gate:
            tensors.append(h)
    for f in widths:
        tensors += [fc1_width(g, f) * h // tp, h * f // tp]
        biases += [fc1_width(g, f) // tp, h]
    norm = [h, h] if g.norm == "layernorm" else [h]
    tensors += norm + norm  # the attention's and the MLP's input norms
    if g.attention_bias:
        tensors += biases
    if g.qk_norm:
        qk = [g.head_dim] * (2 if g.norm == "layernorm" else 1)
        tensors += qk + qk
    return tensors


def expert_tensors(geometry: ModelGeometry, layer: int, ep: int, etp: int) -> list[int]:
    """Element counts of layer ``layer``'s routed experts on one rank: ``E / EP`` local
    experts, each an MLP of ``expert_ffn`` whose linears are split over ETP (megatron's
    ``SequentialMLP`` and ``TEGroupedMLP`` hold the same elements). Empty for a dense
    layer."""
    g, h = geometry, geometry.hidden
    if g.mlps[layer] != "moe":
        return []
    f, fc1 = g.expert_ffn, fc1_width(g, g.expert_ffn)
    one = [fc1 * h // etp, h * f // etp]
    if g.mlp_bias:
        one += [fc1 // etp, h]
    return one * (g.num_experts // ep)


def stage_tensors(
    geometry: ModelGeometry,
    layout: ParallelLayout,
    layers: Sequence[int],
    *,
    first: bool,
    last: bool,
) -> StageTensors:
    """The stage's parameters tensor by tensor: its layers', the embedding (and a learned
    position table) on the first stage, the final norm and the output layer on the last
    (with tied embeddings on a last stage that is not the first, megatron's copy of the
    embedding: ``language_module.py``'s ``shared_embedding_or_output_weight``)."""
    g, h, tp = geometry, geometry.hidden, layout.tp
    dense: list[int] = []
    experts: list[int] = []
    for i in layers:
        dense += layer_tensors(g, i, tp)
        experts += expert_tensors(g, i, layout.ep, layout.etp)
    vocab_shard = padded_vocab(g, tp) // tp * h
    if first:
        dense.append(vocab_shard)
        if g.learned_position_rows:
            dense.append(g.learned_position_rows * h)
    tied: list[int] = []
    if last:
        dense += [h, h] if g.norm == "layernorm" else [h]
        if not g.tied_embeddings:
            dense.append(vocab_shard)
        elif not first:
            tied.append(vocab_shard)
    return StageTensors(tuple(dense), tuple(tied), tuple(experts))


def total_parameters(geometry: ModelGeometry) -> int:
    """Every parameter of the model once (no vocabulary padding): the figure model cards
    publish."""
    params = sum(
        mixer_parameters(geometry, m).on_rank(1, 1) + mlp_parameters(geometry, f).on_rank(1, 1)
        for m, f in zip(geometry.mixers, geometry.mlps, strict=True)
    )
    embeddings = geometry.vocab * geometry.hidden * (1 if geometry.tied_embeddings else 2)
    return int(params) + embeddings + geometry.hidden
