"""The frozen base weights one rank holds, from the geometry and the layout.

Parameters are counted the way megatron-core 0.16 builds and shards them, in the step's
dtype (``param_bytes``: bf16, the measured runtime's, by default):

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
from cpmem.pricing.kinds import mixer_spec, mlp_spec
from cpmem.pricing.layer_parameters import LayerParameters, norm_parameters

WEIGHT_BYTES = 2
"""bf16, the dtype of every measured cell's frozen base (``rank_weights``' default)."""


def padded_vocab(geometry: ModelGeometry, tp: int) -> int:
    """The vocabulary megatron allocates: padded to a multiple of ``vocab_multiple x TP``
    (``--make-vocab-size-divisible-by``, 128 by default)."""
    multiple = geometry.vocab_multiple * tp
    return -(-geometry.vocab // multiple) * multiple


def mixer_parameters(geometry: ModelGeometry, kind: str) -> LayerParameters:
    """A token mixer's parameters, with the layer's input norm (its kind's spec)."""
    return mixer_spec(kind).parameters(geometry)


def mlp_parameters(geometry: ModelGeometry, kind: str) -> LayerParameters:
    """A feed-forward block's parameters, with its pre-MLP norm (its kind's spec)."""
    return mlp_spec(kind).parameters(geometry)


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
    param_bytes: int = WEIGHT_BYTES,
) -> Weights:
    """One rank's frozen base weights, ``param_bytes`` each (the step's dtype: 2 for bf16
    and fp16, 4 for fp32). ``layers``: the layers this rank holds (all by default);
    ``first`` / ``last``: whether it is the first / last pipeline stage, which holds the
    embedding / the output layer and the final norm (tied embeddings: megatron keeps a
    copy of the embedding on the last stage for the output layer)."""
    tp, b = layout.tp, param_bytes
    held = tuple(range(geometry.layers) if layers is None else layers)
    params = _layer_parameters(geometry, tp, layout.ep, layout.etp, held)
    matrix = padded_vocab(geometry, tp) // tp * geometry.hidden * b
    positions = geometry.learned_position_rows * geometry.hidden * b
    tied = geometry.tied_embeddings
    return Weights(
        embedding=(matrix if first or (last and tied) else 0) + (positions if first else 0),
        output_layer=matrix if last and not tied else 0,
        layers=int(params) * b,
        final_norm=norm_parameters(geometry, geometry.hidden) * b if last else 0,
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
    but the routed experts'), as its mixer's and its feed-forward block's specs give them:
    both kinds' weights, then their norms, then their biases, then their per-head norms,
    the order megatron's distributed-optimizer buffer pads tensor by tensor. Their sum is
    ``mixer_parameters`` + ``mlp_parameters`` on the rank (a test holds it)."""
    mixer = mixer_spec(geometry.mixers[layer]).trained_tensors(geometry, tp)
    mlp = mlp_spec(geometry.mlps[layer]).trained_tensors(geometry, tp)
    return [
        *mixer.weights,
        *mlp.weights,
        *mixer.norms,
        *mlp.norms,
        *mixer.biases,
        *mlp.biases,
        *mixer.extra,
        *mlp.extra,
    ]


def expert_tensors(geometry: ModelGeometry, layer: int, ep: int, etp: int) -> list[int]:
    """Element counts of layer ``layer``'s routed experts on one rank (its feed-forward
    kind's spec; empty for a block without routed experts)."""
    return mlp_spec(geometry.mlps[layer]).expert_tensors(geometry, ep, etp)


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
