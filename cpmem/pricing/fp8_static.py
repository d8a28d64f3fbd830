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
``DotProductAttention``: attention's QKV and output projections and its core attention
(latent attention's down, up and output projections and its core attention), the
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

The FP8 weights are the TE modules' (``dense_roles``, ``expert_roles``): attention's QKV
and output projections (latent attention's down, up and output projections), the dense
MLP's fc1 and fc2, an MoE block's shared expert's fc1 and fc2 and every local expert's fc1
and fc2 (the routed experts' in a ``uint8`` expert
buffer of their own under ``--fp8-param-gather``), and each MTP depth's ``eh_proj`` and
layers; the embedding, the output layer (megatron-core's own ``ColumnParallelLinear``),
the MoE router, norms and biases stay in the bf16 buffers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cpmem.model.geometry import ModelGeometry
from cpmem.pricing.fp8_blockwise import blockwise_bytes
from cpmem.pricing.kinds import mixer_spec, mlp_spec
from cpmem.pricing.kinds.latent import mla_weight_shapes
from cpmem.pricing.layer_parameters import fc1_width, norm_tensors
from cpmem.pricing.mxfp8 import mxfp8_bytes
from cpmem.pricing.weights import mtp_depths_built
from cpmem.step.fp8 import Fp8

FP8_BYTES = 1
TRANSPOSE_BEFORE_CC = 10
"""Compute capability majors below this keep each FP8 weight's transpose (Hopper's TN-only
FP8 GEMMs)."""
SCALE_INV_BYTES = 512
"""One fp32 scale inverse, in PyTorch's caching allocator's smallest block."""
BLOCK = 512


def scaling_gemms(geometry: ModelGeometry, kind: str, ep: int) -> tuple[int, ...]:
    """The GEMMs of each Transformer Engine module a layer part of ``kind`` runs under FP8:
    attention's QKV and output projections (one each) and its ``DotProductAttention``
    (three), latent attention's down, up and output projections (one each,
    ``mla_weight_shapes``: five, four without ``q_lora_rank``) and its
    ``DotProductAttention``; the dense MLP's fc1 and fc2 (one each); an MoE block's shared
    expert's fc1 and fc2 (one each, where it has one) and its routed experts' fc1 and fc2, each a
    ``GroupedLinear`` of one GEMM per local expert (``num_gemms``, TE
    ``module/grouped_linear.py:238``; megatron-core's ``TEGroupedMLP`` builds it with
    ``E / EP`` GEMMs); MTP's ``eh_proj`` (one). The router is megatron-core's own
    ``TopKRouter`` weight, outside Transformer Engine."""
    if kind == "attention" and geometry is not None and geometry.is_mla:
        return (1,) * len(mla_weight_shapes(geometry, 1)) + (3,)
    if kind == "attention":
        return (1, 1, 3)
    if kind == "dense":
        return (1, 1)
    if kind == "moe":
        shared = (1, 1) if geometry.shared_expert_ffn else ()
        local = geometry.num_experts // ep
        return (*shared, local, local)
    if kind == "eh_proj":
        return (1,)
    raise ValueError(f"no FP8 GEMMs priced for layer kind {kind!r}")


FWD_QUANTIZERS = 3
BWD_QUANTIZERS = 2
"""Quantizers per GEMM, forward (input, weight, output) and backward (the output's and the
input's gradients), ``module/base.py:979-981``."""
AMAX_BYTES = 4


def _blocks(nbytes: int) -> int:
    return -(-nbytes // BLOCK) * BLOCK


def scaling_state_bytes(
    kinds: Sequence[str], history: int, geometry: ModelGeometry | None = None, ep: int = 1
) -> int:
    """Delayed scaling's ``scale`` and ``amax_history`` tensors of the modules of the
    layer kinds in ``kinds`` (one entry per layer part, e.g. a layer's mixer and its MLP,
    ``scaling_gemms``; ``geometry`` and ``ep`` needed for an MoE part), with an amax
    history of ``history`` steps, each tensor in whole 512 B blocks."""
    total = 0
    for kind in kinds:
        if kind == "moe" and geometry is None:
            raise ValueError("an MoE part's GEMMs need the geometry")
        for gemms in scaling_gemms(geometry, kind, ep):  # type: ignore[arg-type]
            for per_gemm in (FWD_QUANTIZERS, BWD_QUANTIZERS):
                n = gemms * per_gemm
                total += _blocks(n * AMAX_BYTES) + _blocks(history * n * AMAX_BYTES)
    return total


def delayed_state_bytes(
    geometry: ModelGeometry, fp8: Fp8, layers: Sequence[int], ep: int, *, mtp: bool
) -> int:
    """``scaling_state_bytes`` of the ``layers`` in FP8 (not ``fp8.bf16_layers``) and,
    with ``mtp`` (the last stage), of each MTP depth: its ``eh_proj`` and its layers."""
    g = geometry
    kinds: list[str] = [k for i in layers if fp8.in_fp8(i) for k in (g.mixers[i], g.mlps[i])]
    if mtp:
        parts: list[str] = [k for p in zip(g.mtp_mixers, g.mtp_mlps, strict=True) for k in p]
        kinds += ["eh_proj", *parts] * mtp_depths_built(g)
    return scaling_state_bytes([k for k in kinds if k != "none"], fp8.history, g, ep)


Shape = tuple[int, int]


def _kind_roles(geometry: ModelGeometry, mixer: str, mlp: str, tp: int) -> list[Shape | None]:
    """Each of a layer's dense tensors (``weights.kind_tensors``' order: the mixer's and
    the MLP's weights, then norms, biases and the rest) as Transformer Engine holds it in
    FP8 on one TP rank, ``[out_features, in_features]``, or None where it stays in the
    parameters' dtype: attention's QKV ``[qkv_out/t, H]`` (the output gate's second Q
    included) and output projection ``[H, q_width/t]``, latent attention's five (four
    without ``q_lora_rank``) projections (``mla_weight_shapes``), the dense MLP's fc1 ``[fc1/t, H]``
    (both halves of a gated one) and fc2 ``[H, F/t]``, an MoE block's shared expert's fc1
    and fc2 as a dense MLP's (its ``SharedExpertMLP`` builds TE linears); the MoE router's
    weight and the shared expert's sigmoid gate are megatron-core's own parameters
    (``TopKRouter``, ``shared_experts.py``'s ``gate_weight``), not Transformer Engine's."""
    g, h = geometry, geometry.hidden
    roles: list[Shape | None] = []
    if mixer == "attention" and g.is_mla:  # every weight a TE linear's, in weights' order
        roles += list(mla_weight_shapes(g, tp))
    elif mixer == "attention":
        q_out = g.q_width * (2 if g.attention_output_gate else 1)
        roles += [((q_out + 2 * g.kv_width) // tp, h), (h, g.q_width // tp)]
    else:
        roles += [None] * len(mixer_spec(mixer).trained_tensors(g, tp).weights)
    if mlp == "dense":
        roles += [(fc1_width(g, g.ffn) // tp, h), (h, g.ffn // tp)]
    elif mlp == "moe":
        f = g.shared_expert_ffn
        weights = mlp_spec(mlp).trained_tensors(g, tp).weights
        te: list[Shape | None] = [(fc1_width(g, f) // tp, h), (h, f // tp)] if f else []
        roles += [None] * (len(weights) - len(te)) + te
    else:
        roles += [None] * len(mlp_spec(mlp).trained_tensors(g, tp).weights)
    a, b = mixer_spec(mixer).trained_tensors(g, tp), mlp_spec(mlp).trained_tensors(g, tp)
    others = len(a.norms) + len(b.norms) + len(a.biases) + len(b.biases)
    return roles + [None] * (others + len(a.extra) + len(b.extra))


def dense_roles(
    geometry: ModelGeometry,
    layers: Sequence[int],
    tp: int,
    bf16_layers: Sequence[int] = (),
    *,
    first: bool = False,
    last: bool = False,
) -> list[Shape | None]:
    """Each of a stage's dense tensors (``weights.stage_tensors``' order: the layers', the
    embedding and a learned position table on the first stage, the final norm, the MTP
    depths and the output layer on the last) as an FP8 weight's shape (``_kind_roles``)
    or None. The layers in ``bf16_layers`` keep none; the MTP depths run under the global
    FP8 context whatever ``--first-last-layers-bf16`` says (Megatron-LM 4828d651
    ``multi_token_prediction.py``: ``get_fp8_context(self.config)`` around ``eh_proj``
    and the depth's layer), ``eh_proj`` a TE column-parallel linear ``[H/t, 2H]``. The
    embedding, the output layer and the norms stay in the parameters' dtype."""
    g, h = geometry, geometry.hidden
    roles: list[Shape | None] = []
    for i in layers:
        kind = _kind_roles(g, g.mixers[i], g.mlps[i], tp)
        roles += [None] * len(kind) if i in bf16_layers else kind
    if first:
        roles += [None] * (2 if g.learned_position_rows else 1)
    if last:
        roles += [None] * len(norm_tensors(g, h))
        for _ in range(mtp_depths_built(g)):
            norms = [None] * len(norm_tensors(g, h))
            roles += [*norms, *norms, (h // tp, 2 * h)]
            for mixer, mlp in zip(g.mtp_mixers, g.mtp_mlps, strict=True):
                roles += _kind_roles(g, mixer, mlp, tp)
            roles += norms
        if not g.tied_embeddings:
            roles.append(None)
    return roles


def expert_roles(
    geometry: ModelGeometry,
    layers: Sequence[int],
    ep: int,
    etp: int,
    bf16_layers: Sequence[int] = (),
    *,
    last: bool = False,
) -> list[Shape | None]:
    """Each of a stage's routed-expert tensors (``stage_tensors``' ``experts``: the
    layers', then the MTP depths' on the last stage) as an FP8 weight's shape or None:
    every local expert's fc1 ``[fc1/ETP, H]`` and fc2 ``[H, F/ETP]`` (the ``weight<i>`` of
    ``TEGroupedMLP``'s two ``GroupedLinear``), not their biases, nor any of a layer in
    ``bf16_layers``."""
    g = geometry

    def kind(mlp: str, fp8: bool) -> list[Shape | None]:
        spec = mlp_spec(mlp)
        shapes = iter(spec.expert_shapes(g, ep, etp))
        flags = spec.expert_matrix_flags(g, ep, etp)
        return [next(shapes) if m and fp8 else None for m in flags]

    roles: list[Shape | None] = []
    for i in layers:
        roles += kind(g.mlps[i], i not in bf16_layers)
    if last:
        for _ in range(mtp_depths_built(g)):
            for mlp in g.mtp_mlps:
                roles += kind(mlp, True)
    return roles


def split_roles(
    tensors: Sequence[int], roles: Sequence[Shape | None]
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[Shape, ...]]:
    """``tensors`` as those left in the parameters' dtype, the FP8 weights and their
    shapes, each in order; a role's shape must hold its tensor's elements."""
    if len(tensors) != len(roles):
        raise AssertionError(f"{len(roles)} FP8 roles for {len(tensors)} tensors")
    rest: list[int] = []
    fp8: list[int] = []
    shapes: list[Shape] = []
    for n, role in zip(tensors, roles, strict=True):
        if role is None:
            rest.append(n)
            continue
        if role[0] * role[1] != n:
            raise AssertionError(f"FP8 weight shape {role} is not the tensor's {n} elements")
        fp8.append(n)
        shapes.append(role)
    return tuple(rest), tuple(fp8), tuple(shapes)


@dataclass(frozen=True)
class Fp8WeightBytes:
    """What the FP8 weights keep beyond a parameter buffer: Transformer Engine's cached
    copies of bf16 weights (``cache``, without ``--fp8-param-gather``), their columnwise
    copies (``transposes``) and their scale inverses, each allocation in whole 512 B
    blocks; and the rowwise data of FP8 parameters no buffer holds (``rowwise``: MXFP8's,
    ``MXFP8_GATHERED``), the weights themselves."""

    cache: int
    transposes: int
    scale_inverses: int
    rowwise: int = 0


MXFP8_GATHERED = ("mxfp8",)
"""The recipes whose FP8 parameters under ``--fp8-param-gather`` are Transformer Engine's
own tensors, never mapped into megatron-core's parameter buffer, whose parameter storage
is the gradient buffer's (``cpmem.step.fp8.GATHER_REASONS``'s note; Megatron-LM 4828d651
``param_and_grad_buffer.py:1102-1121``, ``:1184-1186``): the buffer adds no parameter
bytes, and each weight keeps its rowwise and columnwise data with their scales
(``fp8_weight_bytes``' ``rowwise``, ``transposes``, ``scale_inverses``)."""


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
    - ``mxfp8``: the cached copy keeps both usages (``_is_weight_workspace_valid`` asks
      for the rowwise and the columnwise data a training forward asks,
      ``module/base.py:654-658``), each a ``uint8`` tensor of the weight's shape with its
      ``uint8`` e8m0 scales, one per 32 elements, padded (``cpmem.pricing.mxfp8``;
      ``MXFP8Quantizer::create_tensor``, ``csrc/quantizer.cpp:1383-1417``); the columnwise
      copy is counted in ``transposes``. An MXFP8 parameter (``--fp8-param-gather``)
      keeps the same two usages and scales, built by ``fp8_model_init`` as a training
      weight's quantizer asks them, and its rowwise data is the weight itself, in no
      buffer (``MXFP8_GATHERED``): ``rowwise``."""
    if recipe == "mxfp8":
        each = [mxfp8_bytes(r, c, rowwise=True, columnwise=True) for r, c in shapes]
        rowwise = sum(_blocks(b.rowwise_data) for b in each)
        return Fp8WeightBytes(
            cache=rowwise if cached else 0,
            transposes=sum(_blocks(b.columnwise_data) for b in each),
            scale_inverses=sum(
                _blocks(b.rowwise_scales) + _blocks(b.columnwise_scales) for b in each
            ),
            rowwise=0 if cached else rowwise,
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
