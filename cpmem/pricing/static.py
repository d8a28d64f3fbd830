"""Static memory: what one rank holds before and between its steps, whatever its tokens.

The activations a step's forward and backward add are priced by the policies; this
module prices what sits under them on the device, from the geometry, the layout and
how the adapters are trained (``StepSettings.optimizer``) and the parameters' dtype
(``StepSettings.dtype_bytes``: bf16, the measured runtime's, by default), each term named:

- ``base_weights``: the frozen base in the step's dtype (``cpmem.pricing.weights``), the
  last stage's MTP depths included; a quantized checkpoint's converted linears as stored
  under ``quantized_weights="stored"`` (``cpmem.pricing.quantized``);
- ``adapter_params``: the LoRA ``A`` and ``B`` of every adapted projection, in the same
  dtype (the MTP depths' layers' too, on the last stage);
- ``adapter_grads``: their gradients, megatron's ``main_grad`` buffers (fp32 unless
  ``Optimizer.grad_bytes`` is 2), allocated when the model is wrapped for data
  parallelism (before the first forward);
- ``optimizer_states``: the fp32 master copy of every trainable 2-byte parameter (none of
  fp32 parameters, which the optimizer steps itself: ``master_bytes``), made when
  megatron's optimizer is built (before the first forward), and the optimizer's moments
  (Adam: two, SGD: momentum), made at the first optimizer step;
  both divided over the data-parallel x context-parallel ranks under the distributed
  optimizer (megatron-core shards it over ``intra_dp_cp_group``:
  ``megatron/core/optimizer/__init__.py``, ``distrib_optimizer.py`` cuts each buffer into
  ``d = dp x cp`` slices). Megatron-LM's distributed-optimizer guide: 18 B per parameter
  for bf16 parameters with fp32 gradients, ``6 + 12/d`` with the distributed optimizer;
- the workspaces and buffers a process keeps once its first step has run
  (``cpmem.pricing.workspaces``: two cuBLAS workspaces, Transformer Engine's, megatron's
  global buffer), priced on a warm step only, since a cold step's activation figure
  already holds its kernel set-up (``cold_setup``);
- ``master_gradients``: where ``main_grad`` is 2-byte (fp16), the fp32 copy the optimizer
  makes of it (``master_gradient_bytes``).

Under ``training="full"`` (Megatron-LM's runs) every parameter is trained, the last
stage's MTP depths and their embedding copy included (``weights.stage_tensors``):

- ``weights``: the stage's bf16 (fp16, fp32) parameters, in megatron-core's padded buffer
  under the distributed optimizer (``cpmem.pricing.param_buffers``), as they are otherwise;
- ``gradient_buffer``: the ``main_grad`` buffer of the same layout (fp32 unless
  ``Optimizer.grad_bytes`` is 2);
- ``optimizer_states``: the fp32 master copy (of 2-byte parameters) and the moments of the
  rank's slice: the whole stage, or the real elements of its slice of every buffer under
  the distributed optimizer (dense parameters over DP x CP, the routed experts over the
  expert data-parallel group, the tied output copy in a buffer of its own);
- ``master_gradients``: where ``main_grad`` is not fp32, the fp32 copy the optimizer
  makes of it (``master_gradient_bytes``);
- under FP8 (``StepSettings.fp8``, ``cpmem.pricing.fp8_static``) the layers' Transformer
  Engine weights in FP8: with ``--fp8-param-gather`` in a ``uint8`` buffer of their own
  (1 B, in ``weights``), without it left in the bf16 buffer beside the FP8 copy TE caches
  of each (``fp8_weight_cache``); either way ``fp8_transposes`` (before compute
  capability 10) and ``fp8_scale_inverses``; under the ``delayed`` recipe,
  ``fp8_scaling_state`` (each TE module's amax histories and scales).

The measured runtime's baselines (its own rank-8 adapters, trained by megatron's
optimizer, never stepped, beside the harness's rank-1 slot) are checked against this
module by ``cpmem.gate.static_check``: every recorded baseline within 3%.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache

from cpmem.model.geometry import ModelGeometry
from cpmem.plan.layout import ParallelLayout
from cpmem.pricing.cuda_graphs import cuda_graph_bytes
from cpmem.pricing.dummy_wgrad import dummy_wgrad_bytes
from cpmem.pricing.fp8_static import (
    FP8_BYTES,
    MXFP8_GATHERED,
    SCALE_INV_BYTES,
    delayed_state_bytes,
    dense_roles,
    expert_roles,
    fp8_weight_bytes,
    split_roles,
)
from cpmem.pricing.fsdp import (
    double_buffer_bytes,
    fp8_weight_count,
    fsdp_buckets,
    fsdp_gradient_bytes,
    fsdp_sharding,
    fsdp_static,
)
from cpmem.pricing.kinds import mixer_spec, mlp_spec
from cpmem.pricing.layer_wise_static import LayoutChunk, grad_bucket_size, layer_wise_held
from cpmem.pricing.muon import (
    ADAM_STATE_BYTES,
    MUON_STATE_BYTES,
    MuonShare,
    busiest_share,
    layer_wise_share,
    whole,
)
from cpmem.pricing.optimizer_state import (
    MASTER_BYTES,
    MOMENT_BYTES,
    expert_shards,
    master_bytes,
    master_gradient_bytes,
    optimizer_shards,
    sharded_states,
)
from cpmem.pricing.param_buffers import buffer_shard
from cpmem.pricing.torch_fsdp2 import fsdp2_static, fsdp2_units
from cpmem.pricing.weights import StageTensors, mtp_depths_built, rank_weights, stage_tensors
from cpmem.pricing.workspaces import compute_capability, workspace_components
from cpmem.step.ranks import coordinates
from cpmem.step.step import Step, StepSettings
from cpmem.step.trainer import Adapter


class StaticComponent(StrEnum):
    """Where static bytes go."""

    BASE_WEIGHTS = "base_weights"
    ADAPTER_PARAMS = "adapter_params"
    ADAPTER_GRADS = "adapter_grads"
    OPTIMIZER_STATES = "optimizer_states"
    WEIGHTS = "weights"
    GRADIENT_BUFFER = "gradient_buffer"
    MASTER_GRADIENTS = "master_gradients"
    CUBLAS_WORKSPACES = "cublas_workspaces"
    TE_CUBLASLT_WORKSPACE = "te_cublaslt_workspace"
    TE_GROUPED_GEMM_WORKSPACES = "te_grouped_gemm_workspaces"
    TE_USERBUFFER_WORKSPACE = "te_userbuffer_workspace"
    FP8_WEIGHT_CACHE = "fp8_weight_cache"
    FP8_TRANSPOSES = "fp8_transposes"
    FP8_SCALE_INVERSES = "fp8_scale_inverses"
    FP8_SCALING_STATE = "fp8_scaling_state"
    GLOBAL_MEMORY_BUFFER = "global_memory_buffer"
    PIPELINE_RECEIVED = "pipeline_received"
    DUMMY_WGRAD = "dummy_wgrad"
    FSDP_KEPT_GATHERED = "fsdp_kept_gathered"
    FSDP_DOUBLE_BUFFER = "fsdp_double_buffer"
    CUDA_GRAPH_BUFFERS = "cuda_graph_buffers"


SOURCES: dict[StaticComponent, str] = {
    StaticComponent.BASE_WEIGHTS: "geometry x megatron-core 0.16 sharding (cpmem.pricing.weights)",
    StaticComponent.ADAPTER_PARAMS: "LoRA A (r x in) and B (out x r) per adapted projection, bf16",
    StaticComponent.ADAPTER_GRADS: "fp32 main_grad per trainable parameter",
    StaticComponent.OPTIMIZER_STATES: "fp32 master (built with the optimizer) + moments (first step)",
    StaticComponent.WEIGHTS: "trained parameters, megatron-core's DDP buffer layout",
    StaticComponent.GRADIENT_BUFFER: "main_grad buffer of the parameters' layout",
    StaticComponent.MASTER_GRADIENTS: "fp32 copy of a 2-byte main_grad at the optimizer step",
    StaticComponent.CUBLAS_WORKSPACES: "PyTorch cuBLAS workspace per thread (forward, backward)",
    StaticComponent.TE_CUBLASLT_WORKSPACE: "Transformer Engine's cuBLASLt workspace",
    StaticComponent.TE_GROUPED_GEMM_WORKSPACES: "TE grouped GEMM's per-stream workspaces",
    StaticComponent.TE_USERBUFFER_WORKSPACE: "TE's userbuffer GEMMs' 3-stream workspace",
    StaticComponent.FP8_WEIGHT_CACHE: "TE's cached FP8 copy of each bf16 weight (no param-gather)",
    StaticComponent.FP8_TRANSPOSES: "each FP8 weight's transpose where the GEMM needs TN",
    StaticComponent.FP8_SCALE_INVERSES: "each FP8 weight's fp32 scale inverse",
    StaticComponent.FP8_SCALING_STATE: "delayed scaling's amax histories and scales per TE module",
    StaticComponent.GLOBAL_MEMORY_BUFFER: "megatron's persistent GlobalMemoryBuffer",
    StaticComponent.PIPELINE_RECEIVED: "each chunk's last received activation and its gradient",
    StaticComponent.DUMMY_WGRAD: "the output layer's cached dummy weight gradient (fused accumulation)",
    StaticComponent.CUDA_GRAPH_BUFFERS: "per-layer CUDA graphs' static inputs and output gradients "
    "(their activations live in the graphs' pool, priced as the eager warm-up steps hold them)",
}


@dataclass(frozen=True)
class StaticMemory:
    """One rank's static bytes by component (they add up to ``total``)."""

    components: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.components.values())

    def to_dict(self) -> dict[str, object]:
        return {"static_bytes": self.total, "static_components": dict(self.components)}


def adapter_parameters(
    geometry: ModelGeometry,
    adapter: Adapter,
    layout: ParallelLayout,
    layers: Sequence[int] | None = None,
) -> int:
    """Trainable parameters of one rank's adapters: per adapted projection ``r`` times
    its input and output widths on the rank. A column-parallel base (QKV, fc1, GDN's in
    projection) shards ``B``'s output over TP and holds ``A`` whole; a row-parallel one
    (the output projections, fc2) shards ``A``'s input and holds ``B`` whole; a routed
    expert's two linears are adapted once per expert on the rank (``experts``), the
    shared expert's as an MLP's (``fc1``, ``fc2``). ``layers``: the layers the rank
    holds (all by default)."""
    held = tuple(range(geometry.layers) if layers is None else layers)
    return _adapter_parameters(geometry, adapter, layout, held)


@lru_cache(maxsize=1024)
def _adapter_parameters(
    geometry: ModelGeometry, adapter: Adapter, layout: ParallelLayout, held: tuple[int, ...]
) -> int:
    """``adapter_parameters`` over the ``held`` layers, each kind's by its spec (cached:
    every estimate prices its static memory)."""
    per_mixer = {
        k: mixer_spec(k).adapter_parameters(geometry, adapter, layout) for k in geometry.mixer_kinds
    }
    per_mlp = {
        k: mlp_spec(k).adapter_parameters(geometry, adapter, layout) for k in geometry.mlp_kinds
    }
    return sum(per_mixer[geometry.mixers[i]] + per_mlp[geometry.mlps[i]] for i in held)


def static_memory(
    settings: StepSettings,
    *,
    stepped: bool | None = None,
    stage: int | None = None,
    step: Step | None = None,
) -> StaticMemory:
    """One rank's static bytes for a step run under ``settings``, on pipeline ``stage``
    (its layers; the embedding on the first, the output layer on the last; default: the
    settings' rank's stage, the first for ``busiest``). ``stepped``: whether an optimizer
    step has run before it (by default: the step is warm), which decides whether the
    optimizer's moments exist yet. ``step``: the step whose tokens size megatron's global
    buffer (none without it)."""
    if stage is None:
        stage = rank_stage(settings)
    stepped = (not settings.cold) if stepped is None else stepped
    components: dict[str, int] = {}
    if settings.training == "full":
        parts = _full_training(settings, stage, stepped)
    else:
        parts = _adapters(settings, stage, stepped)
    components.update({str(k): v for k, v in parts.items()})
    components.update(workspace_components(settings, stage, step))
    dummy = 0 if settings.cold else dummy_wgrad_bytes(settings, stage)
    if dummy:
        components[str(StaticComponent.DUMMY_WGRAD)] = dummy
    received = pipeline_received_bytes(settings, stage, step)
    if received:
        components[str(StaticComponent.PIPELINE_RECEIVED)] = received
    graphs = cuda_graph_bytes(settings, stage, step)
    if graphs:
        components[str(StaticComponent.CUDA_GRAPH_BUFFERS)] = graphs
    return StaticMemory({k: int(v) for k, v in components.items()})


RECEIVED_KEPT = 2
"""Tensors per model chunk the pipeline leaves between steps: the activation it received
last, which megatron-core's ``TransformerBlock.set_input_tensor`` keeps as
``self.input_tensor`` until the next step's first forward sets another, and that
tensor's ``.grad`` (it is received as a leaf with ``requires_grad=True``,
``p2p_communication.py``; ``backward_step`` reads ``x.grad`` and sends it). Megatron-LM's
pipeline recordings hold 8-13 MiB between steps beyond the other tensors under 1F1B
(two [s, b, h] activations of 4 MiB and the allocator's blocks) and 24-28 MiB
interleaved over three chunks (six); their peaks hold them too (through the step each
chunk's block keeps the input it was last set and that input's gradient once its
backward ran), and Megatron-LM's 7B interleaved run over eight chunks holds 1 GiB
between steps beyond the rest on the last stage: sixteen 64 MiB activations."""


def pipeline_received_bytes(settings: StepSettings, stage: int, step: Step | None) -> int:
    """What the pipeline leaves between steps on ``stage``: ``RECEIVED_KEPT`` layer inputs
    of the step's busiest rank per model chunk that receives one (all but the first
    virtual stage's), in the activations' dtype (the ``[s/cp/(tp under SP), b, h]``
    tensor megatron sends between stages)."""
    pipe = settings.pipeline
    if not pipe.active or step is None or not settings.recompute.keeps_gradients:
        return 0
    chunks = sum(1 for c in range(pipe.vpp) if not pipe.is_first(stage, c))
    layout = step.plan.layout
    rows = step.plan.busiest_tokens // (layout.tp if layout.sp_active else 1)
    return RECEIVED_KEPT * chunks * rows * settings.geometry.hidden * settings.dtype_bytes


def rank_stage(settings: StepSettings) -> int:
    """The pipeline stage of the settings' rank (the first for ``busiest``: the caller
    compares every stage)."""
    rank = settings.rank
    if rank == "busiest":
        return 0
    if rank == "last":
        return settings.pipeline.pp - 1
    layout = settings.layout
    return coordinates(rank, layout.tp, layout.cp, layout.dp, settings.pipeline.pp).pp


def dp_slice(settings: StepSettings, shards: int, experts: bool = False) -> int:
    """Which of a buffer's ``shards`` slices the settings' rank holds: the first for
    ``busiest`` (all real elements), the last for ``last``, a global rank's own
    otherwise: its data-parallel x context-parallel index, or for the routed experts its
    index in the expert data-parallel group (the expert order is ``tp-ep-dp-pp`` with
    ETP as its TP)."""
    rank = settings.rank
    if rank == "busiest":
        return 0
    if rank == "last":
        return shards - 1
    layout = settings.layout
    if experts:
        return (rank // (layout.etp * layout.ep)) % shards
    c = coordinates(rank, layout.tp, layout.cp, layout.dp, settings.pipeline.pp)
    return (c.dp * layout.cp + c.cp) % shards


def _stage_layers(settings: StepSettings, stage: int) -> list[int]:
    pipe = settings.pipeline
    n = settings.geometry.layers
    return [i for c in range(pipe.vpp) for i in pipe.chunk_layers(n, stage, c)]


def mtp_adapter_parameters(
    geometry: ModelGeometry, adapter: Adapter, layout: ParallelLayout
) -> int:
    """Trainable parameters of the adapters on the MTP depths' layers (on the last stage;
    one set where the depths share their weights), each kind's by its spec."""
    one = sum(
        mixer_spec(m).adapter_parameters(geometry, adapter, layout)
        + mlp_spec(f).adapter_parameters(geometry, adapter, layout)
        for m, f in zip(geometry.mtp_mixers, geometry.mtp_mlps, strict=True)
    )
    return mtp_depths_built(geometry) * one


def _adapters(settings: StepSettings, stage: int, stepped: bool) -> dict[StaticComponent, int]:
    """A frozen base with trained adapters, both in the step's dtype (``dtype_bytes``)."""
    g, layout, opt = settings.geometry, settings.layout, settings.optimizer
    pipe = settings.pipeline
    p = settings.dtype_bytes
    layers = _stage_layers(settings, stage)
    trainable = adapter_parameters(g, settings.adapter, layout, layers)
    if stage == pipe.pp - 1:
        trainable += mtp_adapter_parameters(g, settings.adapter, layout)
    trains = opt.kind != "none"
    states = trainable * master_bytes(p, opt)
    states += trainable * MOMENT_BYTES[opt.kind] if stepped else 0
    out = {
        StaticComponent.BASE_WEIGHTS: rank_weights(
            g,
            layout,
            layers,
            first=stage == 0,
            last=stage == pipe.pp - 1,
            param_bytes=p,
            quantized=g.quantization if settings.quantized_weights == "stored" else None,
        ).total,
        StaticComponent.ADAPTER_PARAMS: trainable * p,
        StaticComponent.ADAPTER_GRADS: trainable * opt.grad_bytes if trains else 0,
        StaticComponent.OPTIMIZER_STATES: sharded_states(
            states, optimizer_shards(layout, opt.instances), opt
        ),
    }
    if master_gradient_bytes(opt):
        shards = optimizer_shards(layout, opt.instances)
        out[StaticComponent.MASTER_GRADIENTS] = sharded_states(
            trainable * master_gradient_bytes(opt), shards, opt
        )
    return out


def _full_training(settings: StepSettings, stage: int, stepped: bool) -> dict[StaticComponent, int]:
    """Every parameter trained: the buffers megatron-core's DDP and optimizer keep."""
    g, layout, opt = settings.geometry, settings.layout, settings.optimizer
    tensors = stage_tensors(
        g,
        layout,
        _stage_layers(settings, stage),
        first=stage == 0,
        last=stage == settings.pipeline.pp - 1,
    )
    if opt.kind == "muon":
        return _muon_training(settings, tensors, stage, stepped)
    if opt.fsdp != "none":
        return _fsdp_training(settings, stepped)
    dense = optimizer_shards(layout, opt.instances)
    p = settings.dtype_bytes
    bf16: tuple[int, ...] = tensors.dense
    experts: tuple[int, ...] = tensors.experts
    fp8: tuple[int, ...] = ()  # FP8 parameters in a uint8 buffer (the experts' their own)
    fp8_experts: tuple[int, ...] = ()
    shapes: tuple[tuple[int, int], ...] = ()  # every FP8 weight, a parameter or TE's copy
    layers = _stage_layers(settings, stage)
    if settings.fp8 is not None:
        first, last = stage == 0, stage == settings.pipeline.pp - 1
        skip = settings.fp8.bf16_layers
        roles = dense_roles(g, layers, layout.tp, skip, first=first, last=last)
        rest, fp8_dense, dense_shapes = split_roles(tensors.dense, roles)
        roles = expert_roles(g, layers, layout.ep, layout.etp, skip, last=last)
        rest_experts, fp8_routed, expert_shapes = split_roles(tensors.experts, roles)
        shapes = dense_shapes + expert_shapes
        if settings.fp8.param_gather:
            bf16, fp8 = rest, fp8_dense
            experts, fp8_experts = rest_experts, fp8_routed
    # MXFP8 parameters are Transformer Engine's own tensors, kept apart from the buffer,
    # whose parameter storage is the gradients' (cpmem.pricing.fp8_static, MXFP8_GATHERED)
    fp8_set = settings.fp8
    shared = fp8_set is not None and fp8_set.param_gather and fp8_set.recipe in MXFP8_GATHERED
    fp8_bytes = 0 if shared else FP8_BYTES
    groups = [  # (tensors, shards, experts, parameter bytes): one buffer each
        (bf16, dense, False, p),
        (fp8, dense, False, fp8_bytes),
        (tensors.tied_copy, dense, False, p),
        (experts, expert_shards(settings), True, p),
        (fp8_experts, expert_shards(settings), True, fp8_bytes),
    ]
    weights = padded = optimizer_elements = 0
    for group, shards, is_expert, param_bytes in groups:
        if not group:
            continue
        if opt.distributed:
            shard = buffer_shard(group, shards, dp_slice(settings, shards, is_expert))
            numel, real = shard.numel, shard.real
        else:
            numel = real = sum(group)
        padded += numel
        weights += param_bytes * numel
        optimizer_elements += real
    trains = opt.kind != "none"
    master = master_bytes(p, opt) * optimizer_elements
    moments = MOMENT_BYTES[opt.kind] * optimizer_elements if stepped else 0
    out = {
        StaticComponent.WEIGHTS: weights,
        StaticComponent.GRADIENT_BUFFER: opt.grad_bytes * padded if trains else 0,
        StaticComponent.OPTIMIZER_STATES: master + moments,
    }
    if shapes and settings.fp8 is not None:
        gathered, recipe = settings.fp8.param_gather, settings.fp8.recipe
        kept = fp8_weight_bytes(recipe, shapes, compute_capability(settings), cached=not gathered)
        if gathered and recipe in MXFP8_GATHERED:
            out[StaticComponent.WEIGHTS] += kept.rowwise
        elif kept.cache:
            out[StaticComponent.FP8_WEIGHT_CACHE] = kept.cache
        out[StaticComponent.FP8_TRANSPOSES] = kept.transposes
        out[StaticComponent.FP8_SCALE_INVERSES] = kept.scale_inverses
    out.update(_scaling_state(settings, layers, mtp=stage == settings.pipeline.pp - 1))
    if master_gradient_bytes(opt):
        out[StaticComponent.MASTER_GRADIENTS] = master_gradient_bytes(opt) * optimizer_elements
    return out


def _fsdp_training(settings: StepSettings, stepped: bool) -> dict[StaticComponent, int]:
    """Every parameter trained under Megatron FSDP (``cpmem.pricing.fsdp``): the rank's
    weights, gradients (``fsdp_gradient_bytes``) and fp32 main weights, each its shard of
    a bucket the strategy shards, the moments (and fp32 copies of narrower gradients) of
    the real elements it steps, and the outside-unit buckets it keeps gathered. Its shard
    is its (expert) data-parallel index (``dp_slice``); the last holds the end padding."""
    opt = settings.optimizer
    if opt.fsdp == "torch_fsdp2":
        return _torch_fsdp2_training(settings, stepped)
    sharding = fsdp_sharding(settings)
    buckets = fsdp_buckets(settings.geometry, sharding, opt.fsdp)
    index = dp_slice(settings, sharding.dp)
    expert_index = dp_slice(settings, sharding.expert_dp, experts=True)
    held = fsdp_static(buckets, sharding, opt.fsdp, index, expert_index)
    moments = MOMENT_BYTES[opt.kind] * held.stepped if stepped else 0
    gradients, copies = fsdp_gradient_bytes(held, opt, settings.dtype_bytes)
    out = {
        StaticComponent.WEIGHTS: settings.dtype_bytes * held.weights + FP8_BYTES * held.fp8_weights,
        StaticComponent.GRADIENT_BUFFER: gradients,
        StaticComponent.OPTIMIZER_STATES: MASTER_BYTES * held.main_weights + moments,
    }
    if copies:
        out[StaticComponent.MASTER_GRADIENTS] = copies
    if held.kept_gathered:
        out[StaticComponent.FSDP_KEPT_GATHERED] = settings.dtype_bytes * held.kept_gathered
    if opt.fsdp_buffers != "dynamic":
        p, g = settings.dtype_bytes, opt.grad_bytes
        out[StaticComponent.FSDP_DOUBLE_BUFFER] = double_buffer_bytes(buckets, opt.fsdp, p, g)
    if sharding.fp8:
        count = fp8_weight_count(settings.geometry, sharding)
        out[StaticComponent.FP8_SCALE_INVERSES] = SCALE_INV_BYTES * count
    out.update(_scaling_state(settings, _stage_layers(settings, 0)))
    return out


def _torch_fsdp2_training(settings: StepSettings, stepped: bool) -> dict[StaticComponent, int]:
    """Every parameter trained under Torch FSDP2 (``cpmem.pricing.torch_fsdp2``), as a
    step leaves it: the rank's padded chunk of each parameter, and on the chunk's real
    elements the optimizer's fp32 copy and moments (``master_bytes``: none for fp32
    parameters) and the fp32 copy of each 2-byte gradient (``master_gradient_bytes``,
    kept until the next ``zero_grad``), the 2-byte gradients themselves freed as they are
    copied (``model_param.grad = None``, optimizer.py:919); fp32 gradients are stepped as
    they are, their padded chunks (one reduce-scatter output per unit) kept. Where the
    2-byte gradients outgrow their fp32 copies while the next step runs, the excess is in
    flight (``fsdp.in_flight_bytes``)."""
    opt, layout = settings.optimizer, settings.layout
    ranks = layout.dp * layout.cp
    te = settings.runtime.transformer_impl == "transformer_engine"
    units = fsdp2_units(settings.geometry, layout.tp, layout.etp, output_unit=te)
    held = fsdp2_static(units, ranks, dp_slice(settings, ranks))
    p = settings.dtype_bytes
    moments = MOMENT_BYTES[opt.kind] * held.real if stepped else 0
    out = {
        StaticComponent.WEIGHTS: p * held.padded,
        StaticComponent.OPTIMIZER_STATES: master_bytes(p, opt) * held.real + moments,
    }
    if master_gradient_bytes(opt):
        out[StaticComponent.MASTER_GRADIENTS] = master_gradient_bytes(opt) * held.real
    elif opt.kind != "none":
        out[StaticComponent.GRADIENT_BUFFER] = opt.grad_bytes * held.padded
    return out


def _scaling_state(
    settings: StepSettings, layers: list[int], mtp: bool = False
) -> dict[StaticComponent, int]:
    """Delayed scaling's state of the ``layers``' Transformer Engine modules and with
    ``mtp`` the MTP depths' (``delayed_state_bytes``); none under another recipe."""
    fp8 = settings.fp8
    if fp8 is None or fp8.recipe != "delayed":
        return {}
    state = delayed_state_bytes(settings.geometry, fp8, layers, settings.layout.ep, mtp=mtp)
    return {StaticComponent.FP8_SCALING_STATE: state}


def _muon_training(
    settings: StepSettings, tensors: StageTensors, stage: int, stepped: bool
) -> dict[StaticComponent, int]:
    """Every parameter trained under Muon (``cpmem.pricing.muon``): the whole weights and
    gradient buffer (the layer-wise distributed optimizer all-reduces into an unpadded
    buffer every rank keeps), and the master copy and states of what the rank steps: every
    tensor, or under the layer-wise distributed optimizer its own whole tensors, the dense
    ones of its DP x CP group's assignment and the routed experts' of its expert
    data-parallel group's (for ``busiest``, the largest share of each)."""
    layout, opt = settings.layout, settings.optimizer
    p = settings.dtype_bytes
    master = master_bytes(p, opt)
    if opt.distributed and opt.muon_layout != "legacy":
        return _muon_precomputed(settings, stage, stepped)
    dense = (*tensors.dense, *tensors.tied_copy)
    dense_matrices = (*tensors.dense_matrices, *(False for _ in tensors.tied_copy))
    groups = [
        (dense, dense_matrices, optimizer_shards(layout), False),
        (tensors.experts, tensors.expert_matrices, expert_shards(settings), True),
    ]
    share = MuonShare(0, 0)
    for group, matrices, ranks, experts in groups:
        if not group:
            continue
        if not opt.distributed:
            share += whole(group, matrices)
        elif settings.rank == "busiest":
            share += busiest_share(group, matrices, ranks, master)
        else:
            share += layer_wise_share(group, matrices, ranks, dp_slice(settings, ranks, experts))
    elements = sum(dense) + sum(tensors.experts)
    out = {
        StaticComponent.WEIGHTS: p * elements,
        StaticComponent.GRADIENT_BUFFER: opt.grad_bytes * elements,
        StaticComponent.OPTIMIZER_STATES: master * share.elements
        + (share.state_bytes if stepped else 0),
    }
    if master_gradient_bytes(opt):
        out[StaticComponent.MASTER_GRADIENTS] = master_gradient_bytes(opt) * share.elements
    return out


def _muon_precomputed(
    settings: StepSettings, stage: int, stepped: bool
) -> dict[StaticComponent, int]:
    """Muon's layer-wise distributed optimizer with its precomputed layout
    (``cpmem.pricing.layer_wise_static``), one layout per model chunk of the stage: the
    whole buffers on every rank, and the master copy and states of the rank's share.
    ``busiest``: the data-parallel index (and the expert one) whose share costs most."""
    g, layout, opt, pipe = settings.geometry, settings.layout, settings.optimizer, settings.pipeline
    p = settings.dtype_bytes
    master = master_bytes(p, opt)
    dense_shards = optimizer_shards(layout)
    bucket = grad_bucket_size(dense_shards) if opt.muon_layout == "bucketed" else None
    chunks = [
        LayoutChunk(
            stage_tensors(
                g,
                layout,
                pipe.chunk_layers(g.layers, stage, c),
                first=pipe.is_first(stage, c),
                last=pipe.is_last(stage, c),
            ),
            # DDP buckets the first stage's first model chunk alone (dist_utils.py:360-373)
            bucket if stage == 0 and c == 0 else None,
        )
        for c in range(pipe.vpp)
    ]
    experts = expert_shards(settings)
    own = (dp_slice(settings, dense_shards), dp_slice(settings, experts, True))
    held = layer_wise_held(
        chunks,
        dense_shards,
        experts,
        None if settings.rank == "busiest" else own,
        muon_bytes=master + (MUON_STATE_BYTES if stepped else 0),
        adam_bytes=master + (ADAM_STATE_BYTES if stepped else 0),
    )
    stepped_elements = held.muon_elements + held.adam_elements
    out = {
        StaticComponent.WEIGHTS: p * held.numel,
        StaticComponent.GRADIENT_BUFFER: opt.grad_bytes * held.numel,
        StaticComponent.OPTIMIZER_STATES: master * stepped_elements
        + (MUON_STATE_BYTES * held.muon_elements + ADAM_STATE_BYTES * held.adam_elements) * stepped,
    }
    if master_gradient_bytes(opt):
        out[StaticComponent.MASTER_GRADIENTS] = master_gradient_bytes(opt) * stepped_elements
    return out
