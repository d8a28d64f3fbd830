"""FP8 weights' static memory (``StepSettings.fp8``): which of a stage's tensors are FP8,
and what each keeps beside its bytes.

Under ``--fp8-param-gather`` every Transformer Engine linear's weight is built as a
``Float8Tensor`` (Megatron-LM 4828d651, TE b9d690e0):

- megatron-core's DDP keeps it in a buffer of its own, of ``uint8`` elements (1 B), apart
  from the bf16 one (``param_and_grad_buffer.py:866-868``: a buffer per parameter and
  gradient dtype, each padded and sharded as ``cpmem.pricing.param_buffers`` lays it
  out); its gradient keeps the nominal dtype's ``main_grad`` (``:869``) and the
  distributed optimizer an fp32 master shard, as a bf16 parameter's;
- after the parameters' all-gather TE makes each weight's transpose where the GEMM backend
  needs TN layouts (``post_all_gather_processing``, ``param_and_grad_buffer.py:303-309``;
  TE ``tensor/utils.py:952-956``, ``not is_non_tn_fp8_gemm_supported()``): before
  compute capability 10 (Hopper), not on Blackwell; 1 B per element
  (``TRANSPOSE_BEFORE_CC``);
- one fp32 ``_scale_inv`` per weight (``tensor/float8_tensor.py:318-340``), one 512 B block
  of PyTorch's caching allocator (``SCALE_INV_BYTES``).

Under the ``delayed`` recipe every Transformer Engine module that runs in FP8 keeps, per
direction, a ``DelayedScalingRecipeState`` (TE ``quantization.py:1409-1418``): ``scale``,
``[n]`` fp32, and ``amax_history``, ``[history, n]`` fp32, each a tensor of its own, with
``n`` = 3 quantizers per GEMM forward and 2 backward (``module/base.py:979-981``). A
linear (``Linear``, ``LayerNormLinear``) has one GEMM, ``LayerNormMLP`` two
(``layernorm_mlp.py:2066``), ``DotProductAttention`` three (its forward's
``prepare_forward_ctx(num_gemms=3)``, ``dot_product_attention.py:1208-1209``, which keeps
the linears' recipe unless ``NVTE_DPA_FP8_RECIPE`` is set, ``:627-631``, whether or not
attention itself runs in FP8). Megatron-LM's layers use the linears and
``DotProductAttention``: attention's QKV and output projections and its core attention, the
dense MLP's fc1 and fc2 (``SCALING_GEMMS``). ``FP8GlobalStateManager``'s reduction buffers
hold views of these tensors, no copy (``quantization.py:528-538``); the quantizers hold
views too (``:1424-1427``). Each tensor is priced in whole 512 B blocks (``BLOCK``). The
reduction concatenates the stage's forward (or backward) amaxes into one transient tensor
(``quantization.py:652``, 4 B per quantizer, freed at once), not priced.

Without ``--fp8-param-gather`` the weights stay bf16 parameters in megatron-core's bf16
buffer and Transformer Engine casts them to FP8 in each forward. megatron-core's TE
linears pass ``is_first_microbatch`` (``extensions/transformer_engine.py:671-678``: True
on a step's first micro-batch, ``set_is_first_microbatch``, ``schedules.py:404-405``;
None only under ``disable_parameter_transpose_cache``, a config field no argument sets),
so TE keeps the cast in the module's ``_fp8_workspaces["weight"]``
(``module/linear.py:1805-1809``, ``:1906-1909``; ``layernorm_linear.py`` the same),
refreshed in place on each step's first micro-batch (``module/base.py:740-750``,
``linear.py:421``) and never freed (it is cleared only when the recipe's class changes,
``base.py:1384``). The cached copy is the quantizer's tensor of the weight's shape: a
``uint8`` data tensor (1 B per element, ``cached_weight_bytes``), the transpose where
the GEMM needs TN layouts (the weight's columnwise usage, asked in training,
``linear.py:409-417``; ``_is_weight_workspace_valid``, ``base.py:642-652``) and one fp32
scale inverse: the same transposes and scale inverses as the FP8 parameters', beside a
bf16 weight rather than in place of it. The saved inputs are the same either way.

The layers' weights are the TE linears' (a layer kind's ``trained_tensors().weights``:
attention's QKV and output projections, the dense MLP's fc1 and fc2); the embedding, the
output layer (megatron-core's own ``ColumnParallelLinear``), norms and biases stay in the
bf16 buffer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cpmem.model.geometry import ModelGeometry
from cpmem.pricing.fp8_blockwise import blockwise_bytes
from cpmem.pricing.kinds import mixer_spec, mlp_spec
from cpmem.pricing.layer_parameters import fc1_width
from cpmem.pricing.mxfp8 import mxfp8_bytes

FP8_BYTES = 1
TRANSPOSE_BEFORE_CC = 10
"""Compute capability majors below this keep each FP8 weight's transpose (Hopper's TN-only
FP8 GEMMs)."""
SCALE_INV_BYTES = 512
"""One fp32 scale inverse, in PyTorch's caching allocator's smallest block."""
BLOCK = 512


SCALING_GEMMS = {"attention": (1, 1, 3), "dense": (1, 1)}
"""The GEMMs of each Transformer Engine module a layer kind runs under FP8: attention's
QKV and output projections (one each) and its ``DotProductAttention`` (three); the dense
MLP's fc1 and fc2 (one each)."""
FWD_QUANTIZERS = 3
BWD_QUANTIZERS = 2
"""Quantizers per GEMM, forward (input, weight, output) and backward (the output's and the
input's gradients), ``module/base.py:979-981``."""
AMAX_BYTES = 4


def _blocks(nbytes: int) -> int:
    return -(-nbytes // BLOCK) * BLOCK


def scaling_state_bytes(kinds: Sequence[str], history: int) -> int:
    """Delayed scaling's ``scale`` and ``amax_history`` tensors of the modules of the
    layer kinds in ``kinds`` (one entry per layer part, e.g. a layer's mixer and its MLP),
    with an amax history of ``history`` steps, each tensor in whole 512 B blocks."""
    total = 0
    for kind in kinds:
        for gemms in SCALING_GEMMS[kind]:
            for per_gemm in (FWD_QUANTIZERS, BWD_QUANTIZERS):
                n = gemms * per_gemm
                total += _blocks(n * AMAX_BYTES) + _blocks(history * n * AMAX_BYTES)
    return total


def split_fp8(
    geometry: ModelGeometry,
    dense: Sequence[int],
    layers: Sequence[int],
    tp: int,
    bf16_layers: Sequence[int] = (),
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``dense`` (a stage's dense tensors, ``weights.stage_tensors``: each layer's
    ``kind_tensors`` in turn, weights first, then the stage's other tensors) as the tensors
    left in the bf16 buffer and the FP8 weights of the layers not in ``bf16_layers``,
    each in its order."""
    rest: list[int] = []
    fp8: list[int] = []
    at = 0
    for i in layers:
        mixer = mixer_spec(geometry.mixers[i]).trained_tensors(geometry, tp)
        mlp = mlp_spec(geometry.mlps[i]).trained_tensors(geometry, tp)
        weights = len(mixer.weights) + len(mlp.weights)
        others = len(mixer.norms) + len(mlp.norms) + len(mixer.biases) + len(mlp.biases)
        others += len(mixer.extra) + len(mlp.extra)
        (rest if i in bf16_layers else fp8).extend(dense[at : at + weights])
        rest += dense[at + weights : at + weights + others]
        at += weights + others
    rest += dense[at:]
    return tuple(rest), tuple(fp8)


def fp8_weight_shapes(
    geometry: ModelGeometry, layers: Sequence[int], tp: int
) -> tuple[tuple[int, int], ...]:
    """Each FP8 weight of ``layers`` as Transformer Engine holds it on one TP rank,
    ``[rows, cols]`` = ``[out_features, in_features]``, in ``split_fp8``'s order:
    attention's QKV ``[qkv_out/t, H]`` (the output gate's second Q included) and output
    projection ``[H, q_width/t]``, the dense MLP's fc1 ``[fc1/t, H]`` (both halves of a
    gated one) and fc2 ``[H, F/t]``."""
    g, h = geometry, geometry.hidden
    q_out = g.q_width * (2 if g.attention_output_gate else 1)
    shapes: list[tuple[int, int]] = []
    for i in layers:
        if g.mixers[i] == "attention":
            shapes += [((q_out + 2 * g.kv_width) // tp, h), (h, g.q_width // tp)]
        if g.mlps[i] == "dense":
            shapes += [(fc1_width(g, g.ffn) // tp, h), (h, g.ffn // tp)]
    return tuple(shapes)


@dataclass(frozen=True)
class Fp8WeightBytes:
    """What the FP8 weights keep beyond a parameter buffer: Transformer Engine's cached
    copies of bf16 weights (``cache``, without ``--fp8-param-gather``), their columnwise
    copies (``transposes``) and their scale inverses, each allocation in whole 512 B
    blocks."""

    cache: int
    transposes: int
    scale_inverses: int


def fp8_weight_bytes(
    recipe: str, shapes: Sequence[tuple[int, int]], compute_capability: int, *, cached: bool
) -> Fp8WeightBytes:
    """The FP8 weights' ``shapes`` under ``recipe``, ``cached`` where they are
    Transformer Engine's copies of bf16 parameters.

    - ``tensorwise``, ``delayed``: a ``uint8`` copy (1 B per element), the transpose
      before compute capability ``TRANSPOSE_BEFORE_CC`` and one fp32 scale inverse
      (``SCALE_INV_BYTES``);
    - ``blockwise``: the rowwise ``uint8`` data, the columnwise copy (the transpose) on
      every device, and a rowwise and a columnwise fp32 scale tensor in 128 x 128 blocks
      (``cpmem.pricing.fp8_blockwise``; ``Float8BlockQuantizer::create_tensor``,
      ``csrc/quantizer.cpp:966-1020``, allocates the columnwise copy whenever the usage is
      asked, with no TN-layout shortcut). With ``--fp8-param-gather`` the rowwise data
      is the one mapped into the ``uint8`` buffer (``replace_raw_data``,
      ``tensor/utils.py:48-57``) and megatron-core keeps the columnwise data the
      all-gather's ``post_all_gather_processing`` makes (``_create_columnwise``,
      ``tensor/utils.py:957-959``; ``manual_post_all_gather_processing``, Megatron-LM
      ``fp8_utils.py:259-265``);
    - ``mxfp8`` (without ``--fp8-param-gather``): the cached copy keeps both usages
      (``_is_weight_workspace_valid`` asks for the rowwise and the columnwise data a
      training forward asks, ``module/base.py:654-658``), each a ``uint8`` tensor of the
      weight's shape with its ``uint8`` e8m0 scales, one per 32 elements, padded
      (``cpmem.pricing.mxfp8``; ``MXFP8Quantizer::create_tensor``,
      ``csrc/quantizer.cpp:1383-1417``); the columnwise copy is counted in
      ``transposes``."""
    if recipe == "mxfp8":  # without --fp8-param-gather only (cpmem.step.fp8)
        each = [mxfp8_bytes(r, c, rowwise=True, columnwise=True) for r, c in shapes]
        return Fp8WeightBytes(
            cache=sum(_blocks(b.rowwise_data) for b in each) if cached else 0,
            transposes=sum(_blocks(b.columnwise_data) for b in each),
            scale_inverses=sum(
                _blocks(b.rowwise_scales) + _blocks(b.columnwise_scales) for b in each
            ),
        )
    if recipe == "blockwise":
        each = [blockwise_bytes(r, c, dims=2, rowwise=True, columnwise=True) for r, c in shapes]
        return Fp8WeightBytes(
            cache=sum(_blocks(b.rowwise_data) for b in each) if cached else 0,
            transposes=sum(_blocks(b.columnwise_data) for b in each),
            scale_inverses=sum(
                _blocks(b.rowwise_scales) + _blocks(b.columnwise_scales) for b in each
            ),
        )
    data = [_blocks(r * c * FP8_BYTES) for r, c in shapes]
    return Fp8WeightBytes(
        cache=sum(data) if cached else 0,
        transposes=sum(data) if compute_capability < TRANSPOSE_BEFORE_CC else 0,
        scale_inverses=SCALE_INV_BYTES * len(shapes),
    )
