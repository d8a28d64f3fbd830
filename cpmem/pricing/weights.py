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
  are replicated;
- multi-token prediction (``ModelGeometry.mtp_depths``) on the last pipeline stage, per
  depth built (one where the depths share their weights): its layers, the embedding's
  and the hidden state's norms, ``eh_proj`` (``2H -> H``, column-parallel, no bias) and a
  final norm (megatron-core's ``MultiTokenPredictionLayer``: ``enorm``, ``hnorm``,
  ``eh_proj``, ``mtp_model_layer``, ``final_layernorm``; Hugging Face's DeepSeek-V3
  checkpoint layer 61 and Qwen3.5's ``mtp.*``: ``enorm``/``pre_fc_norm_embedding``,
  ``hnorm``/``pre_fc_norm_hidden``, ``eh_proj``/``fc``, the layers, ``shared_head.norm``/
  ``norm``). The MTP stage holds the word embedding too (``gpt_model.py:173``,
  ``language_module.py:352-354``): a copy where it is not the first stage.

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
from cpmem.model.quantization import Quantization
from cpmem.plan.layout import ParallelLayout
from cpmem.pricing.kinds import mixer_spec, mlp_spec
from cpmem.pricing.layer_parameters import LayerParameters, norm_parameters, norm_tensors
from cpmem.pricing.quantized import layers_stored, mtp_stored

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


def mtp_depth_parameters(geometry: ModelGeometry) -> LayerParameters:
    """One MTP depth's parameters: its layers (their kinds' specs), ``eh_proj`` sharded
    over TP, ``enorm``, ``hnorm`` and the final norm replicated."""
    h = geometry.hidden
    sharded = 2 * h * h  # eh_proj
    experts = 0
    replicated = 3 * norm_parameters(geometry, h)  # enorm, hnorm, final_layernorm
    for mixer, mlp in zip(geometry.mtp_mixers, geometry.mtp_mlps, strict=True):
        for part in (mixer_parameters(geometry, mixer), mlp_parameters(geometry, mlp)):
            sharded += part.sharded
            experts += part.experts
            replicated += part.replicated
    return LayerParameters(sharded, experts, replicated)


def mtp_depths_built(geometry: ModelGeometry) -> int:
    """The MTP depths that hold weights: one where every depth shares them."""
    return min(geometry.mtp_depths, 1) if geometry.mtp_shared else geometry.mtp_depths


@dataclass(frozen=True)
class Weights:
    """The bytes of one rank's frozen weights by part."""

    embedding: int
    output_layer: int
    layers: int
    final_norm: int
    mtp: int = 0

    @property
    def total(self) -> int:
        return self.embedding + self.output_layer + self.layers + self.final_norm + self.mtp


def rank_weights(
    geometry: ModelGeometry,
    layout: ParallelLayout,
    layers: Sequence[int] | None = None,
    *,
    first: bool = True,
    last: bool = True,
    param_bytes: int = WEIGHT_BYTES,
    quantized: Quantization | None = None,
) -> Weights:
    """One rank's frozen base weights, ``param_bytes`` each (the step's dtype: 2 for bf16
    and fp16, 4 for fp32). ``layers``: the layers this rank holds (all by default);
    ``first`` / ``last``: whether it is the first / last pipeline stage, which holds the
    embedding / the output layer, the final norm and any MTP depths (tied embeddings, or
    MTP: megatron keeps a copy of the embedding on the last stage). ``quantized``: the
    checkpoint's quantization, its converted linears held as stored
    (``cpmem.pricing.quantized``), the rest in ``param_bytes``."""
    tp, ep, etp, b = layout.tp, layout.ep, layout.etp, param_bytes
    held = tuple(range(geometry.layers) if layers is None else layers)
    params = _layer_parameters(geometry, tp, ep, etp, held)
    matrix = padded_vocab(geometry, tp) // tp * geometry.hidden * b
    positions = geometry.learned_position_rows * geometry.hidden * b
    tied = geometry.tied_embeddings
    mtp = mtp_depths_built(geometry) if last else 0
    mtp_params = mtp * mtp_depth_parameters(geometry).on_rank(tp, ep, etp)
    layer_bytes, mtp_bytes = int(params) * b, int(mtp_params) * b
    if quantized is not None:
        stored = layers_stored(geometry, quantized, tp, ep, etp, held)
        layer_bytes += stored.bytes - stored.elements * b
        if mtp:
            one = mtp_stored(geometry, quantized, tp, ep, etp)
            mtp_bytes += mtp * (one.bytes - one.elements * b)
    return Weights(
        embedding=(matrix if first or (last and (tied or mtp)) else 0)
        + (positions if first else 0),
        output_layer=matrix if last and not tied else 0,
        layers=layer_bytes,
        final_norm=norm_parameters(geometry, geometry.hidden) * b if last else 0,
        mtp=mtp_bytes,
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
    dense_matrices: tuple[bool, ...] = ()
    """Whether each ``dense`` tensor is a matrix Muon steps (a 2-D weight that is neither
    the embedding nor the output layer: ``_is_muon_excluded``, emerging_optimizers.py);
    the tied copy never is (the output layer's weight)."""
    expert_matrices: tuple[bool, ...] = ()
    """Whether each ``experts`` tensor is a matrix (a weight, not a bias)."""
    dense_shapes: tuple[tuple[int, int], ...] | None = None
    """The ``(rows, cols)`` of each dense matrix (``dense_matrices``), in the order the
    model registers them (the embedding's position table, the layers', the MTP depths');
    None where a layer kind of the stage lists no shapes (``TrainedTensors.shapes``)."""
    expert_shapes: tuple[tuple[int, int], ...] = ()
    """The ``(rows, cols)`` of each routed-expert matrix (``expert_matrices``), in order."""


def layer_tensors(geometry: ModelGeometry, layer: int, tp: int) -> list[int]:
    """Element counts of layer ``layer``'s dense parameters on one TP rank (every tensor
    but the routed experts'), as its mixer's and its feed-forward block's specs give them:
    both kinds' weights, then their norms, then their biases, then their per-head norms,
    the order megatron's distributed-optimizer buffer pads tensor by tensor. Their sum is
    ``mixer_parameters`` + ``mlp_parameters`` on the rank (a test holds it)."""
    return kind_tensors(geometry, geometry.mixers[layer], geometry.mlps[layer], tp)


def kind_tensors(geometry: ModelGeometry, mixer_kind: str, mlp_kind: str, tp: int) -> list[int]:
    """``layer_tensors`` of a layer of the kinds ``mixer_kind`` and ``mlp_kind``."""
    mixer = mixer_spec(mixer_kind).trained_tensors(geometry, tp)
    mlp = mlp_spec(mlp_kind).trained_tensors(geometry, tp)
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


def kind_matrix_flags(
    geometry: ModelGeometry, mixer_kind: str, mlp_kind: str, tp: int
) -> list[bool]:
    """Whether each of ``kind_tensors`` is a matrix Muon steps, in the same order."""
    mixer = mixer_spec(mixer_kind).trained_tensors(geometry, tp)
    mlp = mlp_spec(mlp_kind).trained_tensors(geometry, tp)
    m, f = mixer.matrix_flags(), mlp.matrix_flags()
    roles = []
    start_m = start_f = 0
    for mixer_count, mlp_count in (
        (len(mixer.weights), len(mlp.weights)),
        (len(mixer.norms), len(mlp.norms)),
        (len(mixer.biases), len(mlp.biases)),
        (len(mixer.extra), len(mlp.extra)),
    ):
        roles += m[start_m : start_m + mixer_count] + f[start_f : start_f + mlp_count]
        start_m += mixer_count
        start_f += mlp_count
    return roles


def kind_matrix_shapes(
    geometry: ModelGeometry, mixer_kind: str, mlp_kind: str, tp: int
) -> list[tuple[int, int]] | None:
    """The shapes of ``kind_tensors``' matrices in the order megatron-core registers them
    (the mixer's, then the MLP's: ``TrainedTensors.shapes``), or None where either kind
    lists none."""
    mixer = mixer_spec(mixer_kind).trained_tensors(geometry, tp)
    mlp = mlp_spec(mlp_kind).trained_tensors(geometry, tp)
    if mixer.shapes is None or mlp.shapes is None:
        return None
    return [*mixer.shapes, *mlp.shapes]


def expert_tensors(geometry: ModelGeometry, layer: int, ep: int, etp: int) -> list[int]:
    """Element counts of layer ``layer``'s routed experts on one rank (its feed-forward
    kind's spec; empty for a block without routed experts)."""
    return mlp_spec(geometry.mlps[layer]).expert_tensors(geometry, ep, etp)


def mtp_tensors(geometry: ModelGeometry, tp: int) -> list[int]:
    """One MTP depth's dense tensors on one TP rank, in megatron-core's order: ``enorm``,
    ``hnorm``, ``eh_proj`` (``2H x H / TP``), its layers', the final norm."""
    g, h = geometry, geometry.hidden
    out = norm_tensors(g, h) + norm_tensors(g, h) + [2 * h * h // tp]
    for mixer, mlp in zip(g.mtp_mixers, g.mtp_mlps, strict=True):
        out += kind_tensors(g, mixer, mlp, tp)
    return out + norm_tensors(g, h)


def mtp_matrix_flags(geometry: ModelGeometry, tp: int) -> list[bool]:
    """Whether each of ``mtp_tensors`` is a matrix Muon steps (``eh_proj`` and its layers'
    weights; the norms are vectors)."""
    g = geometry
    norm = [False] * len(norm_tensors(g, g.hidden))
    out = norm + norm + [True]
    for mixer, mlp in zip(g.mtp_mixers, g.mtp_mlps, strict=True):
        out += kind_matrix_flags(g, mixer, mlp, tp)
    return out + norm


def mtp_expert_tensors(geometry: ModelGeometry, ep: int, etp: int) -> list[int]:
    """One MTP depth's routed experts on one rank (its MoE layers')."""
    return [n for m in geometry.mtp_mlps for n in mlp_spec(m).expert_tensors(geometry, ep, etp)]


def stage_tensors(
    geometry: ModelGeometry,
    layout: ParallelLayout,
    layers: Sequence[int],
    *,
    first: bool,
    last: bool,
) -> StageTensors:
    """The stage's parameters tensor by tensor: its layers', the embedding (and a learned
    position table) on the first stage, the final norm, any MTP depths and the output
    layer on the last (with tied embeddings or MTP on a last stage that is not the first,
    megatron's copy of the embedding, in a bucket of its own: ``language_module.py``'s
    ``shared_embedding_or_output_weight``, ``setup_embeddings_and_output_layer``)."""
    g, h, tp, ep, etp = geometry, geometry.hidden, layout.tp, layout.ep, layout.etp
    dense: list[int] = []
    matrices: list[bool] = []
    experts: list[int] = []
    expert_matrices: list[bool] = []
    shapes: list[tuple[int, int]] | None = []
    expert_shapes: list[tuple[int, int]] = []

    def add_shapes(more: list[tuple[int, int]] | None) -> None:
        nonlocal shapes
        shapes = None if shapes is None or more is None else shapes + more

    for i in layers:
        dense += layer_tensors(g, i, tp)
        matrices += kind_matrix_flags(g, g.mixers[i], g.mlps[i], tp)
        add_shapes(kind_matrix_shapes(g, g.mixers[i], g.mlps[i], tp))
        experts += expert_tensors(g, i, ep, etp)
        expert_matrices += mlp_spec(g.mlps[i]).expert_matrix_flags(g, ep, etp)
        expert_shapes += mlp_spec(g.mlps[i]).expert_shapes(g, ep, etp)
    vocab_shard = padded_vocab(g, tp) // tp * h
    if first:
        dense.append(vocab_shard)
        matrices.append(False)  # the word embedding: is_embedding_or_output_parameter
        if g.learned_position_rows:
            dense.append(g.learned_position_rows * h)
            matrices.append(True)  # the position table: a 2-D weight, not tagged
            # registered before the layers (GPTModel's embedding comes first)
            shapes = None if shapes is None else [(g.learned_position_rows, h), *shapes]
    tied: list[int] = []
    if last:
        final = [h, h] if g.norm == "layernorm" else [h]
        dense += final
        matrices += [False] * len(final)
        depths = mtp_depths_built(g)
        for _ in range(depths):
            dense += mtp_tensors(g, tp)
            matrices += mtp_matrix_flags(g, tp)
            add_shapes([(h // tp, 2 * h)])  # eh_proj: column-parallel 2H -> H
            for mixer, mlp in zip(g.mtp_mixers, g.mtp_mlps, strict=True):
                add_shapes(kind_matrix_shapes(g, mixer, mlp, tp))
            experts += mtp_expert_tensors(g, ep, etp)
            expert_matrices += [
                flag for m in g.mtp_mlps for flag in mlp_spec(m).expert_matrix_flags(g, ep, etp)
            ]
            expert_shapes += [s for m in g.mtp_mlps for s in mlp_spec(m).expert_shapes(g, ep, etp)]
        if not g.tied_embeddings:
            dense.append(vocab_shard)
            matrices.append(False)  # the output layer: is_embedding_or_output_parameter
        if (g.tied_embeddings or depths) and not first:
            tied.append(vocab_shard)
    return StageTensors(
        tuple(dense),
        tuple(tied),
        tuple(experts),
        tuple(matrices),
        tuple(expert_matrices),
        None if shapes is None else tuple(shapes),
        tuple(expert_shapes),
    )


def total_parameters(geometry: ModelGeometry, *, mtp: bool = True) -> int:
    """Every parameter of the model once (no vocabulary padding, no copy of a shared
    embedding), its MTP depths' included unless ``mtp`` is False: the figure model cards
    publish is the model without them (DeepSeek-V3's "671B", its checkpoint's 685B with
    the 14B MTP module; Qwen3.5-35B-A3B's "35B")."""
    params = sum(
        mixer_parameters(geometry, m).on_rank(1, 1) + mlp_parameters(geometry, f).on_rank(1, 1)
        for m, f in zip(geometry.mixers, geometry.mlps, strict=True)
    )
    if mtp:
        params += mtp_depths_built(geometry) * mtp_depth_parameters(geometry).on_rank(1, 1)
    embeddings = geometry.vocab * geometry.hidden * (1 if geometry.tied_embeddings else 2)
    return int(params) + embeddings + norm_parameters(geometry, geometry.hidden)
