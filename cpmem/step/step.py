"""The step a policy prices: how it runs (``StepSettings``) and what it holds (``Step``).

``StepSettings`` is everything but the tokens: the model, the parallel layout, the
recompute setting, the execution flags (compiled, MoE routing, cold), learned profiles,
the planner asked for and the returned outputs' size. A ``Step`` is one forward under
those settings: its plan (who owns which tokens) and, where it was planned from one,
its request, with the warnings its checks raised. Every variant a caller prices
(admission's alternative layouts and split parts, width selection's prefixes of a
queue, a suggestion's other CP or recompute) is derived from a step or its settings
here, so each is planned and checked the one way ``describe_step`` plans and checks.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any, Literal

from cpmem.errors import InputError, refuse_all
from cpmem.model.geometry import ModelGeometry
from cpmem.plan.layout import ParallelLayout, expert_problems
from cpmem.plan.plan import Plan
from cpmem.plan.planners import check_ranks, plan_request
from cpmem.plan.request import Request
from cpmem.step.backend_choice import check_softmax_backend, choose_backend
from cpmem.step.cp_comm_rules import TE_MLA_CP_COMMS, TE_WINDOW_CP_COMMS
from cpmem.step.cuda_graphs import CudaGraphs, check_cuda_graphs
from cpmem.step.device import Device
from cpmem.step.fp8 import Fp8, check_fp8
from cpmem.step.offload import Offload
from cpmem.step.pipeline import Pipeline
from cpmem.step.profiles import ProfileSignature, ProfileStore
from cpmem.step.ranks import RankChoice, check_rank
from cpmem.step.recompute import Recompute
from cpmem.step.routing import check_routing, rows_per_token
from cpmem.step.runtime import (
    QuantizedWeights,
    Runtime,
    Training,
    check_quantized_weights,
    check_training,
)
from cpmem.step.sharding_rules import fsdp_problems, optimizer_instance_problems
from cpmem.step.trainer import Adapter, CpComm, Head, Optimizer, check_cp_comm

MoeRouting = str
"""``concentrated``, ``balanced``, ``capacity:F[:pad]`` or ``rows:N``
(``cpmem.step.routing``)."""
StepKind = Literal["first", "steady"]
STEP_KINDS: tuple[StepKind, ...] = ("first", "steady")
"""Which of a process's steps is priced. ``steady``: any step after the first, what a
trainer runs thousands of times (the optimizer's state as it stands after its first
update, the kernel workspaces its first step left); ``first``: the first step of a
freshly started process (its kernel set-up not yet paid, no optimizer moments yet), as
every measured cell of the calibration harness ran its first repetition."""
BF16_BYTES = 2
FP32_BYTES = 4
TE_HALF_BACKENDS = ("flash", "fused")
"""The attention backends Transformer Engine runs on 2-byte (bf16, fp16) tensors only."""


AUTO_DEFAULT_CAPABILITY = (9, 0)
"""The compute capability ``auto`` is resolved for where the step's device names none:
the measured runtime's H200."""


@dataclass(frozen=True)
class StepSettings:
    """How a step runs, whatever its tokens.

    ``planner`` None: the model's default planner. ``output_bytes`` None: the hidden
    states the calibration harness returns (logical tokens x hidden x dtype bytes).
    ``cold``: the step is the first of its process (``StepKind`` ``first``: its kernel
    set-up not yet paid, no optimizer moments yet); the default is a steady step, the one
    a trainer runs in steady state (``step_kind``). ``allow_long`` prices
    sequences longer than the model's ``max_position_embeddings`` with a warning.
    ``head``, ``adapter`` and ``cp_comm`` are what a trainer's step holds beyond the
    calibration harness (``cpmem.step.trainer``); their defaults are the harness.
    ``optimizer`` (with ``layout.dp``) and ``device`` price the whole device: the static
    memory under the activations (``cpmem.pricing.static``) and the budget it leaves
    (``cpmem.pricing.device_budget``); no activation figure reads them. ``runtime`` is the
    process (``cpmem.step.runtime``: ART's trainer by default, or Megatron-LM's), and
    ``training`` what it trains (``lora`` adapters, or ``full``: every parameter).
    ``rank`` is the rank answered: ``busiest`` (the stage and data-parallel rank where
    static memory and activations together are largest), ``last`` (the last global rank,
    which Megatron-LM logs) or a global rank in megatron's order (``cpmem.step.ranks``).
    """

    geometry: ModelGeometry
    layout: ParallelLayout = ParallelLayout()
    recompute: Recompute = Recompute()
    compiled: bool = False
    moe_routing: MoeRouting = "concentrated"
    cold: bool = False
    profiles: ProfileStore | None = None
    planner: str | None = None
    output_bytes: int | None = None
    allow_long: bool = False
    head: Head = Head()
    adapter: Adapter = Adapter()
    cp_comm: CpComm = "all_gather"
    dtype_bytes: int = BF16_BYTES
    optimizer: Optimizer = Optimizer()
    device: Device | None = None
    pipeline: Pipeline = Pipeline()
    runtime: Runtime = Runtime()
    training: Training = "lora"
    quantized_weights: QuantizedWeights = "dequantized"
    """How a quantized checkpoint's frozen base is held (``ModelGeometry.quantization``):
    ``dequantized`` to the step's dtype, as ART's Megatron backend loads it
    (``dequant_block_fp8_cuda``, ``dequant_mxfp4_cuda``: bf16), Megatron-Bridge imports it
    (``dequantize_fp8_blockwise``, ``dequantize_mxfp4``) and the transformers gpt-oss
    fine-tuning recipe loads it (``Mxfp4Config(dequantize=True)``), or ``stored`` as the
    checkpoint holds it (``cpmem.pricing.quantized``). Full training trains the
    dequantized weights only."""
    rank: RankChoice = "busiest"
    holds_embedding: bool = True
    """Whether the step's first layer is fed by the embedding on this rank (the first
    virtual pipeline stage's chunk, or a step without stages), which keeps its token ids."""
    fp8: Fp8 | None = None
    """FP8 training as Transformer Engine runs it (``cpmem.step.fp8``); None: the dtype's."""
    cuda_graphs: CudaGraphs | None = None
    """Per-layer CUDA graphs (``cpmem.step.cuda_graphs``); None: the step runs eagerly."""
    tp_comm_overlap: bool = False
    """Transformer Engine's TP communication overlap through userbuffers
    (``--tp-comm-overlap``): its GEMMs' cuBLASLt workspace is priced
    (``cpmem.pricing.workspaces``); the userbuffers are device memory outside PyTorch's
    allocator, named in the answer, not priced."""
    offload: Offload = Offload()
    """Activation offloading, fine-grained or whole layers (``cpmem.step.offload``;
    priced by ``cpmem.pricing.offload`` and ``cpmem.pricing.layer_offload``): none by
    default."""
    fused_swiglu_asked: bool = False
    """Whether the caller named the activation's fusion (``fused_swiglu``), rather than
    the model's or the runtime's default: a policy that does not price it on the step
    names it then (``registry.SETTABLE``)."""

    def __post_init__(self) -> None:
        refuse_all(self._layout_problems())
        check_training(self.training)
        check_quantized_weights(self.quantized_weights)
        stored = self.quantized_weights == "stored" and self.geometry.quantization is not None
        if stored and self.training == "full":
            raise InputError(
                "quantized_weights",
                "stored",
                "full training updates every weight: megatron-core trains the checkpoint "
                "dequantized (priced with --quantized-weights dequantized)",
            )
        check_rank(self.rank, self.world_size)
        if self.training == "full" and self.adapter != Adapter():
            raise InputError(
                "lora_rank",
                self.adapter.label,
                "adapters are trained under --training lora; --training full trains every "
                "parameter",
            )
        opt = self.optimizer
        if opt.kind == "muon" and opt.distributed and self.training != "full":
            raise InputError(
                "distributed_optimizer",
                True,
                "Muon's layer-wise distributed optimizer gives each rank whole tensors, "
                "priced for --training full; the adapters' assignment is not priced (give "
                "muon without --distributed-optimizer)",
            )
        self._check_fp8()
        g = self.geometry
        check_cuda_graphs(  # on the model, not on a pipeline chunk's layers
            None if g.pipeline_chunk else self.cuda_graphs,
            moe=g.is_moe,
            dense_mlp="dense" in g.mlp_kinds,
            gdn="gdn" in (*g.mixers, *g.mtp_mixers),
            mtp_shared=g.mtp_shared,
            overlap_moe_comm=self.runtime.overlap_moe_comm,
        )
        if self.tp_comm_overlap and not self.layout.sp_active:
            raise InputError(
                "tp_comm_overlap",
                True,
                "TP communication overlap runs with sequence parallelism over TP > 1 "
                "(Megatron-LM's validate_args asserts sequence_parallel under it)",
            )
        if self.pipeline.active:
            self.pipeline.virtual_layers(self.geometry.layers)  # the layers cut as asked
        deferred = self.pipeline.deferred_wgrad
        if deferred is not None and (
            self.training != "full" or self.head.kind not in ("logits", "fused")
        ):
            # only megatron's trained ColumnParallelLinear output layer keeps the buffers
            # (a frozen one runs LinearWithFrozenWeight: no weight gradient to defer)
            raise InputError(
                "deferred_wgrad",
                deferred,
                "defers the trained output layer's weight gradient: it needs --training "
                f"full and the logits or fused head (here {self.training}, {self.head.kind})",
            )
        self._check_dtype_backend()
        refuse_all(
            self.offload.layer_problems(
                self.geometry.layers,
                pipeline=self.pipeline.active,
                recompute=None if self.recompute.keeps_everything else self.recompute.label,
                fp8=self.fp8 is not None,
            )
        )
        if self.runtime.backend_resolved and self.geometry.attention_layers:
            r = self.runtime
            check_softmax_backend(r.softmax_type, r.attention_backend, self.layout.cp, self.cp_comm)
        check_cp_comm(self.cp_comm)
        if self.cp_comm == "a2a" and self.layout.cp > 1:
            self._check_a2a_heads()
        if self.layout.cp > 1:
            self._check_te_cp_comm()
        if not isinstance(self.cold, bool):
            raise InputError("cold", self.cold, "must be true or false")
        if check_routing(self.moe_routing) != self.moe_routing:
            raise InputError(
                "moe_routing", self.moe_routing, f"is spelled {check_routing(self.moe_routing)}"
            )
        if self.output_bytes is not None and (
            isinstance(self.output_bytes, bool)
            or not isinstance(self.output_bytes, int)
            or self.output_bytes < 0
        ):
            raise InputError("output_bytes", self.output_bytes, "must be an integer >= 0")

    def _fp8_kinds(self) -> tuple[str, ...]:
        """The stack's layer kinds and its MTP depths', each once, in order."""
        g = self.geometry
        kinds = (*g.mixer_kinds, *g.mlp_kinds, *g.mtp_mixers, *g.mtp_mlps)
        return tuple(dict.fromkeys(k for k in kinds if k != "none"))

    def _check_fp8(self) -> None:
        device = self.device
        major = None if device is None else device.compute_capability_major
        check_fp8(
            self.fp8,
            training=self.training,
            kinds=self._fp8_kinds(),
            transformer_te=self.runtime.transformer_impl == "transformer_engine",
            compute_capability=9 if major is None else major,
            dtype_bytes=self.dtype_bytes,
            recompute=self.recompute,
            fsdp=self.optimizer.fsdp,
            muon=self.optimizer.kind == "muon",
            layers=self.geometry.layers,
            latent=self.geometry.is_mla,
            sequence_split=self.layout.sp_active,
            grouped_gemm=self.runtime.moe_grouped_gemm,
        )

    def _layout_problems(self) -> list[InputError]:
        """Every rule the layout breaks on the model, listed together: TP on the heads
        (``ModelGeometry.check_tp``), EP and ETP on the routed experts
        (``cpmem.plan.layout.expert_problems``)."""
        problems = []
        try:
            self.geometry.check_tp(self.layout.tp)
        except InputError as exc:
            problems.append(exc)
        return (
            problems
            + expert_problems(self.geometry, self.layout)
            + optimizer_instance_problems(
                self.optimizer.instances,
                self.layout,
                self.world_size,
                self.pipeline.pp,
                self.geometry.is_moe,
            )
            + fsdp_problems(
                self.optimizer.fsdp,
                self.geometry,
                self.training,
                self.pipeline.pp,
                self.layout,
                self.optimizer.grad_bytes,
                self.dtype_bytes,
                self.fp8,
                self.runtime.gradient_accumulation_fusion,
            )
        )

    def _check_dtype_backend(self) -> None:
        """Transformer Engine runs flash and fused attention on bf16 and fp16 only
        (``get_attention_backend`` turns both off for another qkv dtype:
        ``cpmem.step.attention_backend``, utils.py:435-465 at TE v2.11): an fp32 step
        with attention layers runs unfused, so one priced under flash or fused is refused."""
        backend = self.runtime.attention_backend
        fp32 = self.dtype_bytes == FP32_BYTES
        half_only = self.runtime.backend_resolved and backend in TE_HALF_BACKENDS
        if fp32 and half_only and self.geometry.attention_layers:
            raise InputError(
                "attention_backend",
                backend,
                "Transformer Engine runs flash and fused attention on bf16 and fp16 only "
                "(get_attention_backend, utils.py:435-465 at TE v2.11); an fp32 step runs "
                "it unfused: give --attention-backend unfused or auto, or --dtype bf16",
            )

    @property
    def world_size(self) -> int:
        """The ranks of the run: TP x CP x DP x PP."""
        layout = self.layout
        return layout.tp * layout.cp * layout.dp * self.pipeline.pp

    @property
    def step_kind(self) -> StepKind:
        """``first`` for the first step of a process, ``steady`` for any later one."""
        return "first" if self.cold else "steady"

    def _check_a2a_heads(self) -> None:
        """Ulysses all-to-all splits each TP rank's heads over the CP group."""
        g, tp, cp = self.geometry, self.layout.tp, self.layout.cp
        if "attention" not in g.mixers:
            return
        q = g.q_heads // tp
        kv = g.kv_groups // tp if g.kv_groups >= tp else 1
        if q % cp or kv % cp:
            raise InputError(
                "cp_comm",
                "a2a",
                f"needs the heads per TP rank ({q} query, {kv} KV) divisible by cp={cp}",
            )

    def step(
        self,
        request: Request,
        planner: str | None = None,
        microbatches: tuple[Request, ...] = (),
    ) -> Step:
        """``request`` planned under these settings (``planner`` overrides the settings'
        planner), with the checks every planned step gets: sequences within the model's
        positions (or a warning under ``allow_long``) and no CP rank left empty (a warning
        where a rank holds less than one attention block)."""
        if not self.runtime.backend_resolved:
            return self.with_backend_for(max(request.sequence_lengths)).step(
                request, planner, microbatches
            )
        warnings = self.geometry.check_lengths(request.sequence_lengths, self.allow_long)
        chosen = self.planner if planner is None else planner
        if chosen is None:
            chosen = self.runtime.default_planner
        plan = plan_request(request, self.layout, chosen, self.geometry)
        warnings += check_ranks(plan, request.real_tokens)
        if microbatches:
            if len(microbatches) != self.pipeline.microbatches:
                raise InputError(
                    "microbatch_requests",
                    len(microbatches),
                    f"gives {len(microbatches)} requests for {self.pipeline.microbatches} "
                    "micro-batches",
                )
            if microbatches[0] != request:
                raise InputError("microbatch_requests", None, "the first must be the request")
            for other in microbatches[1:]:
                warnings += self.step(other, planner).warnings
        return Step(self, plan, request, tuple(warnings), microbatches)

    def step_for_plan(self, plan: Plan) -> Step:
        """A plan the runtime already fixed (an explicit plan), under these settings (an
        ``auto`` backend resolved for its largest forward's packed tokens)."""
        if not self.runtime.backend_resolved:
            longest = max(group.packed_tokens for group in plan.groups)
            return self.with_backend_for(longest).step_for_plan(plan)
        if plan.layout != self.layout:
            raise InputError(
                "plan", plan.layout, f"was laid out for another layout than {self.layout}"
            )
        return Step(self, plan, None, ())

    def _check_te_cp_comm(self) -> None:
        """The CP comm types Transformer Engine's CP attention runs a layer under
        (``attn_forward_func_with_cp``, context_parallel.py v2.9:3803-3815,
        v2.10/v2.11:4023-4035): sliding-window layers under ``all_gather`` or ``a2a`` only;
        latent attention (K and V of different widths) under ``p2p`` or ``a2a+p2p`` only."""
        g = self.geometry
        if g.windowed and self.cp_comm not in TE_WINDOW_CP_COMMS:
            raise InputError(
                "cp_comm",
                self.cp_comm,
                f"{g.name} has sliding-window layers, which Transformer Engine's CP attention "
                "runs only under all_gather or a2a (attn_forward_func_with_cp)",
            )
        if g.is_mla and g.v_head_dim != g.head_dim and self.cp_comm not in TE_MLA_CP_COMMS:
            raise InputError(
                "cp_comm",
                self.cp_comm,
                f"{g.name} has latent attention (K and V of different widths), which "
                "Transformer Engine's CP attention runs only under p2p or a2a+p2p "
                "(attn_forward_func_with_cp)",
            )

    def replace(self, **changes: Any) -> StepSettings:
        """These settings with some changed (checked again)."""
        return replace(self, **changes)

    def with_backend_for(self, sequence: int) -> StepSettings:
        """These settings with ``auto`` resolved: the backend Transformer Engine's
        selection picks for this model, layout, dtype and device on sequences of up to
        ``sequence`` tokens, in the runtime's container (``backend_choice``; a device of
        unknown compute capability, or none, is read as the measured runtime's H200)."""
        g, runtime = self.geometry, self.runtime
        cc = None if self.device is None else self.device.compute_capability
        value_dim = g.v_head_dim if g.is_mla else g.head_dim
        choice = choose_backend(
            "auto",
            compute_capability=AUTO_DEFAULT_CAPABILITY if cc is None else cc,
            heads=g.q_heads,
            groups=g.kv_groups,
            head_dim=g.head_dim,
            value_dim=value_dim,
            sequence=sequence,
            tp=self.layout.tp,
            cp=self.layout.cp,
            cp_comm=self.cp_comm,
            dtype="bf16" if self.dtype_bytes == 2 else "fp32",
            attention_dropout=g.attention_dropout,
            deterministic=runtime.deterministic,
            env=runtime.environment(),
            container=runtime.container,
            window=max(g.windows) if g.windows and all(g.windows) else 0,
            softmax_type=runtime.softmax_type,
        )
        resolved = runtime.with_backend(choice.backend, "auto", choice.spread)
        return self.replace(runtime=resolved)


@dataclass(frozen=True)
class Step:
    """One forward under ``settings``: its plan and, when planned from one, its request.

    Everything a policy may read. ``request`` is None for a plan the runtime fixed
    (admission then considers no other layout and no split)."""

    settings: StepSettings
    plan: Plan
    request: Request | None = None
    warnings: tuple[str, ...] = field(default=(), compare=False)
    microbatches: tuple[Request, ...] = ()
    """Under pipeline parallelism, every micro-batch's request where they differ (the
    first is ``request``); empty: ``request`` repeated ``pipeline.microbatches`` times."""

    @property
    def microbatch_steps(self) -> tuple[Step, ...]:
        """One step per micro-batch, each planned as this one is."""
        count = self.settings.pipeline.microbatches
        if not self.microbatches:
            return (self,) * count
        planner = self.plan.planner
        return tuple(self.settings.step(r, planner) for r in self.microbatches)

    @property
    def geometry(self) -> ModelGeometry:
        return self.settings.geometry

    @property
    def recompute(self) -> Recompute:
        return self.settings.recompute

    @property
    def compiled(self) -> bool:
        return self.settings.compiled

    @property
    def moe_routing(self) -> MoeRouting:
        return self.settings.moe_routing

    def expert_rows_per_token(self, tp: int | None = None, sp: bool | None = None) -> Fraction:
        """Expert rows the rank holds per token of its own in one MoE layer under the
        step's routing (``cpmem.step.routing.rows_per_token``), at the plan's TP and SP
        (or at ``tp`` / ``sp``) and its expert TP, counted at the rank's priced tokens
        (the busiest CP rank's)."""
        layout = self.plan.layout
        return rows_per_token(
            self.geometry,
            layout.ep,
            self.moe_routing,
            tp=layout.tp if tp is None else tp,
            sp=layout.sp if sp is None else sp,
            etp=layout.etp,
            tokens=self.priced_tokens,
        )

    @property
    def priced_tokens(self) -> int:
        """R: the tokens the rank's per-token widths are counted at, the busiest CP
        rank's under CP (each rank keeps only its own tokens' activations), the packed
        count without."""
        plan = self.plan
        return plan.busiest_tokens if plan.layout.cp > 1 else plan.packed_tokens

    @property
    def cold(self) -> bool:
        return self.settings.cold

    @property
    def profiles(self) -> ProfileStore | None:
        return self.settings.profiles

    @property
    def dtype_bytes(self) -> int:
        return self.settings.dtype_bytes

    @property
    def head(self) -> Head:
        return self.settings.head

    @property
    def adapter(self) -> Adapter:
        return self.settings.adapter

    @property
    def cp_comm(self) -> CpComm:
        return self.settings.cp_comm

    @property
    def outputs(self) -> int:
        """Bytes of the hidden states the forward returns: the logical tokens' (or the
        caller's ``output_bytes``) where the step ends without a head; none where a head
        ends it (its own terms are the head's, ``cpmem.pricing.head``)."""
        if not self.head.returns_hidden:
            return 0
        if self.settings.output_bytes is not None:
            return self.settings.output_bytes
        return self.plan.logical_tokens * self.geometry.hidden * self.dtype_bytes

    @property
    def signature(self) -> ProfileSignature:
        """The key of this step's learned profile: everything but its tokens that changes
        what its activations hold."""
        layout = self.plan.layout
        return ProfileSignature(
            model=self.geometry.name,
            tp=layout.tp,
            cp=layout.cp,
            mode=str(self.recompute.mode),
            modules="+".join(self.recompute.modules),
            compiled=self.compiled,
            sp=layout.sp,
            ep=layout.ep,
            head=self.head.label,
            adapter=self.adapter.label,
            cp_comm=self.cp_comm,
            dtype_bytes=self.dtype_bytes,
            step=self.settings.step_kind,
        )

    def replanned(self, planner: str) -> Step:
        """The same request laid out by ``planner`` (admission's alternative layouts)."""
        return self.settings.step(self._request("replanned"), planner, self.microbatches)

    def for_request(self, request: Request) -> Step:
        """Another request under the same settings (split parts, queue prefixes)."""
        return self.settings.step(request)

    def with_settings(self, **changes: Any) -> Step:
        """The same request planned under changed settings (another CP, recompute...)."""
        changed = self.settings.replace(**changes)
        return changed.step(self._request("with_settings"), microbatches=self.microbatches)

    def _request(self, what: str) -> Request:
        if self.request is None:
            raise InputError("request", None, f"{what}: the step has an explicit plan, no request")
        return self.request
