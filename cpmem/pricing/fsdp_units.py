"""The parameters of Megatron FSDP's units as megatron_fsdp groups them: each tensor's
elements on the rank, its row (``shape[1:]``'s elements, which decides its bucket's chunk),
whether it is a routed expert's and whether it is an FP8 weight.

megatron_fsdp (``param_and_grad_buffer.py`` at the snapshot d98e8a64, ``pgb``) makes one
parameter group per FSDP unit and per (dtype, expert, requires-grad) of its parameters
(``_get_parameter_groups``, pgb:1787-1830): a parameter is an expert's where its name holds
``.experts.`` (pgb:1787, the routed experts' ``mlp.experts.*``; the shared experts'
``mlp.shared_experts.*`` do not), and its dtype is ``float8`` where it is a Transformer
Engine ``Float8Tensor`` (pgb:1794-1797, ``--fp8-param-gather``), its own group beside the
unit's bf16 parameters. The units are the ``TransformerLayer`` s (mcore_fsdp_adapter.py:
163-173); the tensors here are each unit's in ``named_parameters`` order, from megatron-core
0.16's Transformer Engine layer spec (``gpt_layer_specs.py``): their sums are the layer
kinds' ``trained_tensors`` and ``expert_tensors`` (tests hold both).

A multi-token prediction depth (``MultiTokenPredictionLayer``, multi_token_prediction.py:
1157-1251 at d98e8a64) is no unit itself: its ``mtp_model_layer`` is a ``TransformerLayer``
built from the decoder's layer spec (:1220-1228), a unit after the decoder's (its routed
experts' names hold ``.experts.`` too), while its ``enorm``, ``hnorm``, ``eh_proj`` (a
column-parallel ``2H -> H`` linear without bias, :1174-1187) and ``final_layernorm``
(:1247-1251) belong to no unit: they join the outside-unit group, in ``named_parameters``
order between the decoder's final norm and the output layer (``gpt_model.py``: the
embedding, the decoder, ``mtp``, ``output_layer``). On one stage the depths read the
model's own embedding and output layer: no copy (``language_module.py``: the copies are
made only where the MTP stage is not the first).
"""

from __future__ import annotations

from dataclasses import dataclass

from cpmem.model.geometry import ModelGeometry
from cpmem.pricing.layer_parameters import fc1_width, qk_norm_widths, sublayer_norm_tensors
from cpmem.pricing.weights import mtp_depths_built, padded_vocab

UNIT_MIXERS = ("attention",)
UNIT_MLPS = ("dense", "moe")
"""The layer kinds whose units are laid out here (latent attention is the attention kind's)."""


@dataclass(frozen=True)
class Tensor:
    """One parameter on the rank: ``numel`` elements, rows of ``width`` (``shape[1:]``'s
    elements; 1 for a vector); a routed expert's (``expert``), an FP8 weight (``fp8``)."""

    numel: int
    width: int = 1
    expert: bool = False
    fp8: bool = False


def _attention(g: ModelGeometry, tp: int, fp8: bool) -> list[Tensor]:
    """Attention (``SelfAttention``): the output projection (row-parallel: rows of the
    rank's ``q_width / TP`` inputs) and its bias, the QKV projection's fused input norm,
    weight (rows of ``hidden``) and bias, the q/k norms."""
    h = g.hidden
    q_out = g.q_width * (2 if g.attention_output_gate else 1)
    qkv_out = q_out + 2 * g.kv_width
    out = [Tensor(h * g.q_width // tp, g.q_width // tp, fp8=fp8)]
    out += [Tensor(h)] if g.attention_bias else []
    out += [Tensor(n) for n in sublayer_norm_tensors(g)]
    out += [Tensor(qkv_out * h // tp, h, fp8=fp8)]
    out += [Tensor(qkv_out // tp)] if g.attention_bias else []
    return out + [Tensor(n) for n in qk_norm_widths(g)]


def _latent(g: ModelGeometry, tp: int, fp8: bool) -> list[Tensor]:
    """Latent attention (``MLASelfAttention``, multi_latent_attention.py:500-630, the TE
    spec's ``input_layernorm`` a norm of its own): the input norm, the output projection
    (rows of ``heads x v_head_dim / TP``), the query's down projection (rows of ``hidden``)
    and its up projection with the query's norm fused (rows of ``q_lora_rank``; a plain
    ``hidden``-row projection without it), the KV's down projection (rows of ``hidden``)
    and its up projection with the KV's norm fused (rows of ``kv_lora_rank``)."""
    h, heads = g.hidden, g.q_heads
    out = [Tensor(n) for n in sublayer_norm_tensors(g)]
    out.append(Tensor(h * g.attention_output_width // tp, g.attention_output_width // tp, fp8=fp8))
    q_up = heads * g.head_dim // tp
    if g.q_lora_rank:
        out.append(Tensor(g.q_lora_rank * h, h, fp8=fp8))
        out += [Tensor(g.q_lora_rank), Tensor(q_up * g.q_lora_rank, g.q_lora_rank, fp8=fp8)]
    else:
        out.append(Tensor(q_up * h, h, fp8=fp8))
    r = g.kv_lora_rank
    out.append(Tensor((r + g.qk_rope_head_dim) * h, h, fp8=fp8))
    kv_up = heads * (g.qk_nope_head_dim + g.v_head_dim) // tp
    return [*out, Tensor(r), Tensor(kv_up * r, r, fp8=fp8)]


def _dense(g: ModelGeometry, tp: int, fp8: bool) -> list[Tensor]:
    """The dense MLP: fc1 with its fused norm (rows of ``hidden``) and fc2 (rows of
    ``ffn / TP``), each with its bias."""
    h, fc1 = g.hidden, fc1_width(g, g.ffn)
    out = [Tensor(n) for n in sublayer_norm_tensors(g)]
    out += [Tensor(fc1 * h // tp, h, fp8=fp8)]
    out += [Tensor(fc1 // tp)] if g.mlp_bias else []
    out += [Tensor(h * g.ffn // tp, g.ffn // tp, fp8=fp8)]
    return out + ([Tensor(h)] if g.mlp_bias else [])


def _moe(g: ModelGeometry, tp: int, ep: int, etp: int, fp8: bool) -> list[Tensor]:
    """The MoE block (``MoELayer``: its pre-MLP norm, then ``router``, ``experts``,
    ``shared_experts``, moe_layer.py:260-350): the router's ``[E, H]`` weight (a plain
    parameter, never FP8) and bias, the ``E / EP`` local experts (``TEGroupedMLP``: every
    expert's fc1, rows of ``hidden``, then every expert's fc2, rows of ``expert_ffn /
    ETP``), the shared expert's fc1 (rows of ``hidden``), fc2 (rows of ``shared_ffn /
    TP``) and gate (``[1, H]``)."""
    h, f = g.hidden, g.expert_ffn
    out = [Tensor(n) for n in sublayer_norm_tensors(g)]
    out += [Tensor(g.num_experts * h, h)]
    out += [Tensor(g.num_experts)] if g.router_bias else []
    local = g.num_experts // ep
    fc1 = fc1_width(g, f)
    out += [Tensor(fc1 * h // etp, h, expert=True, fp8=fp8)] * local
    out += [Tensor(fc1 // etp, expert=True)] * local if g.mlp_bias else []
    out += [Tensor(h * f // etp, f // etp, expert=True, fp8=fp8)] * local
    out += [Tensor(h, expert=True)] * local if g.mlp_bias else []
    s = g.shared_expert_ffn
    if s:
        out += [Tensor(fc1_width(g, s) * h // tp, h, fp8=fp8)]
        out += [Tensor(fc1_width(g, s) // tp)] if g.mlp_bias else []
        out += [Tensor(h * s // tp, s // tp, fp8=fp8)]
        out += [Tensor(h)] if g.mlp_bias else []
        out += [Tensor(h, h)] if g.shared_expert_gate else []
    return out


def unit_count(g: ModelGeometry) -> int:
    """The units on the single stage: the decoder's layers, then each built MTP depth's
    (one set where the depths share their weights, ``mtp_depths_built``)."""
    return g.layers + mtp_depths_built(g) * len(g.mtp_mlps)


def unit_mlp(g: ModelGeometry, layer: int) -> str:
    """Unit ``layer``'s MLP kind: a decoder layer's, or (``layer`` >= the decoder's
    layers) its MTP depth's layer's."""
    if layer < g.layers:
        return g.mlps[layer]
    return g.mtp_mlps[(layer - g.layers) % len(g.mtp_mlps)]


def unit_tensors(
    g: ModelGeometry, layer: int, tp: int, ep: int = 1, etp: int = 1, fp8: bool = False
) -> list[Tensor]:
    """Unit ``layer``'s parameters on the rank (its mixer's, then its MLP's; a unit past
    the decoder's layers is an MTP depth's layer, ``unit_count``), their linears' weights
    FP8 where ``fp8`` (``--fp8-param-gather``: every Transformer Engine linear's; the
    router, norms and biases stay in the parameters' dtype)."""
    mixer = _latent(g, tp, fp8) if g.is_mla else _attention(g, tp, fp8)
    kind = unit_mlp(g, layer)
    mlp = _moe(g, tp, ep, etp, fp8) if kind == "moe" else _dense(g, tp, fp8)
    return mixer + mlp


def outside_tensors(g: ModelGeometry, tp: int) -> list[Tensor]:
    """The parameters outside every unit on a single stage: the word embedding (rows of
    ``hidden``), a learned position table, the final norm, each built MTP depth's
    ``enorm``, ``hnorm``, ``eh_proj`` (``[H / TP, 2H]``: rows of ``2H``) and final norm,
    an untied output layer (the embedding and megatron-core's own output
    ``ColumnParallelLinear``: never FP8)."""
    h = g.hidden
    vocab = Tensor(padded_vocab(g, tp) // tp * h, h)
    norm = [Tensor(h)] * (2 if g.norm == "layernorm" else 1)
    out = [vocab]
    if g.learned_position_rows:
        out.append(Tensor(g.learned_position_rows * h, h))
    out += norm
    for _ in range(mtp_depths_built(g)):
        out += [*norm, *norm, Tensor(h // tp * 2 * h, 2 * h), *norm]
    if not g.tied_embeddings:
        out.append(vocab)
    return out
