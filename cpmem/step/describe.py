"""``describe_step``: the one way from user-level arguments to a ``Step``.

The API (``cpmem.api.estimate``), the CLI (through the API), admission, width
selection, the gate's conversions of golden cells and simulated rows, the external
estimators' export and the tests all build what they price here, so an option given
anywhere reaches pricing the same way, with the same checks and warnings.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Unpack, cast

from cpmem.errors import InputError
from cpmem.model.geometry import ModelGeometry
from cpmem.model.load import load_model
from cpmem.plan.layout import ParallelLayout, round_up
from cpmem.plan.plan import Plan, explicit_plan
from cpmem.plan.request import Request
from cpmem.step.backend_choice import container_named
from cpmem.step.cp_comm_rules import default_cp_comm
from cpmem.step.cuda_graphs import CudaGraphs
from cpmem.step.device import resolve_device
from cpmem.step.fp8 import Fp8
from cpmem.step.offload import Offload
from cpmem.step.pipeline import Pipeline, stage_layer_counts
from cpmem.step.profiles import ProfileStore
from cpmem.step.ranks import parse_rank
from cpmem.step.recompute import Mode, Recompute
from cpmem.step.routing import check_routing
from cpmem.step.runtime import (
    ATTENTION_BACKENDS,
    AttentionBackend,
    Runtime,
    check_quantized_weights,
    check_training,
)
from cpmem.step.settings import DEFAULTS, SETTINGS
from cpmem.step.settings import SettingsArguments as SettingsArguments
from cpmem.step.step import (
    FP32_BYTES,
    STEP_KINDS,
    Step,
    StepKind,
    StepSettings,
)
from cpmem.step.trainer import (
    Adapter,
    Head,
    Optimizer,
    check_cp_comm,
    check_optimizer,
    parse_targets,
)
from cpmem.units import counted


class StepArguments(SettingsArguments, total=False):
    """``describe_step``'s keywords: the settings and what the step holds."""

    shared_prefix: int
    request: Request | None
    plan: Plan | None
    logical_tokens: int | None
    packed_tokens: int | None
    rank_tokens: Sequence[int] | None
    busiest_tokens: int | None
    segments: int | None
    gdn_rank_tokens: Sequence[int] | None
    microbatch_requests: Sequence[Request | Sequence[int]] | None


def describe_settings(
    model: str | ModelGeometry | None = None, **given: Unpack[SettingsArguments]
) -> StepSettings:
    """How a step runs: the model (a preset name or Hugging Face id, a ``config``, or a
    geometry), the layout (SP defaults to on when TP > 1, as Megatron runs it), the
    recompute setting, the execution flags, which of the process's steps (``step``:
    ``steady``, any step after the first, by default; ``first``, the first of a freshly
    started process, as the calibration harness measured it), learned ``profiles`` (a
    store or the path of its JSON file), the planner (None: the model's default), and
    what a trainer's step holds beyond the harness (``cpmem.step.trainer``): the ``head``
    (``logits`` by default, megatron's output layer and its cross entropy; ``hidden``, the
    harness's returned hidden states; ``fused``, ``chunked:N``, ``linear-ce``), the
    adapters' ``lora_rank``,
    ``lora_dropout`` and ``lora_targets`` (``all``, ``attention``, ``mlp`` or projection
    names), and the attention's ``cp_comm`` (``all_gather``, ``p2p``, ``a2a``); how the
    adapters are trained (``optimizer``: ``adam``, ``sgd``, ``none``; a
    ``distributed_optimizer`` over the ``dp`` x ``cp`` ranks, as megatron-core shards it), and the ``device`` (a
    preset name, ``cpmem.step.device.DEVICES``) or its ``device_total_bytes``; pipeline
    stages (``pp``, ``vpp`` virtual stages, ``microbatches`` per step, the stages' layers:
    even, megatron's ``first_stage_layers`` / ``last_stage_layers``, or ``stage_layers``
    per stage or per virtual stage; the interleaved schedule's ``microbatch_group``; the
    micro-batches whose output-layer weight gradient waits for the drain, ``deferred_wgrad``;
    ``cpmem.step.pipeline``); the process (``runtime``:
    ``art`` or ``megatron-lm``, or a ``Runtime``; ``cpmem.step.runtime``), what it trains
    (``training``: ``lora`` or ``full``), the ``rank`` answered (``busiest``, ``last`` or a
    global rank), the experts' tensor parallelism (``etp``: by default Megatron-LM's TP for
    its runtime, 1 for ART's trainer), the parameters'
    ``dtype`` (``bf16``, ``fp16``, ``fp32``) and the gradient buffer's element
    (``grad_bytes``: fp32 by default, the parameters' own under fp16 and under Torch
    FSDP2), and the
    ``attention_backend`` (``flash``, ``fused``, ``unfused``, ``local``). Where the runtime
    is Megatron-LM's, ``fused_swiglu`` defaults to its fused SwiGLU, ``recompute`` to its ``none`` (ART's: ``selective``, or
    wherever ``modules`` are named), ``cp_comm`` to its ``p2p`` (ART's: ``all_gather``; where
    Transformer Engine runs the model's attention under another type only, the first it
    runs: ``default_cp_comm``) and ``attention_backend`` to its ``auto``: the backend Transformer Engine's selection
    picks in ``container`` (``dev``, ``ngc-24.10`` or ``ngc-24.01``, ``backend_choice``; its
    PyTorch also prices the fused head, ``torch_build``), resolved when the step is planned,
    for its longest sequence (ART's default: the measured ``fused``; an fp32 step's, ``auto``
    on either runtime, since Transformer Engine runs flash and fused on bf16/fp16 only). An
    unknown ``container`` is refused whether or not anything reads it; one nothing reads is
    named in ``ignored_options``."""
    unknown = sorted(set(given) - set(SETTINGS))
    if unknown:
        raise InputError("settings", unknown, f"are not settings; one of {sorted(SETTINGS)}")
    a = cast(SettingsArguments, {**DEFAULTS, **given})
    runtime = a["runtime"]
    process = runtime if isinstance(runtime, Runtime) else Runtime.named(runtime)
    fused_swiglu = a["fused_swiglu"]
    fused_swiglu_asked = fused_swiglu is not None
    if fused_swiglu is None:  # the runtime's (Megatron-LM's --bias-swiglu-fusion) or the model's
        fused_swiglu = process.fuses_swiglu
    geometry = load_model(model, config=a["config"], fused_swiglu=fused_swiglu)
    if not process.builds_mtp:  # the runtime builds no MTP layers: priced without them
        geometry = geometry.without_mtp()
    tp, sp, etp = a["tp"], a["sp"], a["etp"]
    layout = ParallelLayout(
        tp=tp,
        cp=a["cp"],
        sp=(tp > 1) if sp is None else sp,
        ep=a["ep"],
        dp=a["dp"],
        etp=_default_etp(geometry, process, tp) if etp is None else etp,
    )
    profiles = a["profiles"]
    store = ProfileStore.load(profiles) if isinstance(profiles, str | Path) else profiles
    rc = _recompute(a["recompute"], a["modules"], process)
    dtype = a["dtype"]
    dtype_bytes = check_dtype(dtype)
    container, attention_backend = a["container"], a["attention_backend"]
    container_named(container)  # an unknown container is refused wherever it is given
    if attention_backend is None and not isinstance(runtime, Runtime):
        # the runtime's default: ART's measured fused backend; Megatron-LM's own auto; under
        # fp32 Transformer Engine's own choice, as flash and fused run bf16/fp16 only
        auto = process.default_backend == "auto" or dtype_bytes == FP32_BYTES
        attention_backend = "auto" if auto else None
    if not isinstance(runtime, Runtime):
        process = replace(process, container=container)
    if attention_backend == "auto":
        process = process.pending_auto(container)
    elif attention_backend is not None:
        process = process.with_backend(
            check_backend(attention_backend), attention_backend, process.backend_spread
        )
    cp_comm = a["cp_comm"]
    if cp_comm is None:
        cp_comm = default_cp_comm(geometry, process.default_cp_comm)
    grad_bytes = a["grad_bytes"]
    if grad_bytes is None:  # Torch FSDP2 reduces in the parameters' dtype (no policy)
        own = dtype == "fp16" or (a["fsdp"] == "torch_fsdp2" and dtype == "bf16")
        grad_bytes = 2 if own else 4
    pp, vpp = a["pp"], a["vpp"]
    return StepSettings(
        geometry=geometry,
        layout=layout,
        recompute=rc,
        compiled=a["compiled"],
        moe_routing=check_routing(a["moe_routing"]),
        cold=check_step_kind(a["step"]) == "first",
        profiles=store,
        planner=a["planner"],
        output_bytes=a["output_bytes"],
        allow_long=a["allow_long"],
        head=Head.parse(a["head"]),
        adapter=Adapter(a["lora_rank"], a["lora_dropout"], parse_targets(a["lora_targets"])),
        cp_comm=check_cp_comm(cp_comm),
        dtype_bytes=dtype_bytes,
        optimizer=Optimizer(
            check_optimizer(a["optimizer"]),
            a["distributed_optimizer"],
            grad_bytes,
            a["optimizer_instances"],
            a["fsdp"],
            fsdp_buffers=a["fsdp_buffers"],
            muon_layout=a["muon_layout"],
        ),
        device=resolve_device(a["device"], a["device_total_bytes"]),
        pipeline=Pipeline(
            pp,
            vpp,
            a["microbatches"],
            stage_layer_counts(
                geometry.layers,
                pp,
                vpp,
                first=a["first_stage_layers"],
                last=a["last_stage_layers"],
                explicit=a["stage_layers"],
            ),
            a["microbatch_group"],
            a["deferred_wgrad"],
        ),
        runtime=process,
        training=check_training(a["training"]),
        quantized_weights=check_quantized_weights(a["quantized_weights"]),
        rank=parse_rank(a["rank"]),
        fp8=Fp8.parse(a["fp8"]),
        cuda_graphs=CudaGraphs.parse(a["cuda_graphs"]),
        tp_comm_overlap=bool(a["tp_comm_overlap"]),
        offload=Offload.parse(a["offload"]),
        fused_swiglu_asked=fused_swiglu_asked,
    )


DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": FP32_BYTES}


def _recompute(
    recompute: str | Recompute | None, modules: str | Sequence[str] | None, process: Runtime
) -> Recompute:
    """The recompute setting: the runtime's default where neither a mode nor a module is
    named, selective wherever modules are named; modules beside a ready ``Recompute`` (a
    Megatron-LM run's own) replace its selective modules. Modules beside a mode that
    checkpoints none by module are refused, not dropped."""
    if isinstance(recompute, Recompute):
        if modules is None:
            return recompute
        if recompute.mode is not Mode.SELECTIVE:
            raise InputError(
                "modules",
                modules,
                f"names selective recompute's modules; the run recomputes {recompute.label} "
                "(give --recompute selective beside them)",
            )
        return Recompute.parse("selective", modules)
    if recompute is None:  # the runtime's default, selective wherever modules are named
        recompute = process.default_recompute if modules is None else "selective"
    rc = Recompute.parse(recompute, modules)
    text = modules if isinstance(modules, str) or modules is None else "+".join(modules)
    if text and text.replace(",", "+").strip("+ ") and rc.mode is not Mode.SELECTIVE:
        raise InputError(
            "modules",
            text,
            f"names selective recompute's modules; --recompute {rc.mode} checkpoints none by "
            "module (give --recompute selective, or no --modules)",
        )
    return rc


def check_dtype(dtype: str) -> int:
    """The bytes of one parameter and activation element of ``dtype``."""
    if dtype not in DTYPE_BYTES:
        raise InputError("dtype", dtype, f"must be one of {list(DTYPE_BYTES)}")
    return DTYPE_BYTES[dtype]


def check_backend(backend: str) -> AttentionBackend:
    """An attention backend named explicitly (``auto`` is resolved by the runtime's
    reader, which knows what Transformer Engine's selection reads)."""
    if backend not in ATTENTION_BACKENDS:
        raise InputError("attention_backend", backend, f"must be one of {list(ATTENTION_BACKENDS)}")
    return backend


def _default_etp(geometry: ModelGeometry, runtime: Runtime, tp: int) -> int:
    """The experts' tensor parallelism where none is given (``Runtime.experts_follow_tp``:
    Megatron-LM's TP, ART's 1)."""
    return tp if geometry.is_moe and runtime.experts_follow_tp else 1


def check_step_kind(step: str) -> StepKind:
    """``first`` or ``steady`` (``cpmem.step.step.StepKind``)."""
    if step not in STEP_KINDS:
        raise InputError("step", step, f"must be one of {list(STEP_KINDS)}")
    return step


def describe_step(
    model: str | ModelGeometry | None = None,
    lengths: Sequence[int] | None = None,
    *,
    shared_prefix: int = 0,
    request: Request | None = None,
    plan: Plan | None = None,
    logical_tokens: int | None = None,
    packed_tokens: int | None = None,
    rank_tokens: Sequence[int] | None = None,
    busiest_tokens: int | None = None,
    segments: int | None = None,
    gdn_rank_tokens: Sequence[int] | None = None,
    microbatch_requests: Sequence[Request | Sequence[int]] | None = None,
    **settings: Unpack[SettingsArguments],
) -> Step:
    """One step, from exactly one of:

    - ``lengths`` (+ ``shared_prefix``) or a ``request``: planned by the settings'
      planner, refused when a sequence is longer than the model's positions (unless
      ``allow_long``) or a CP rank is left empty;
    - the counts of a plan the runtime fixed: ``logical_tokens``, ``packed_tokens`` and
      ``segments``, with ``rank_tokens`` (one per CP rank) or ``busiest_tokens`` (the
      other ranks share the rest evenly), and ``gdn_rank_tokens`` where GDN layers are cut
      differently; with ``lengths`` too (a recorded cell), ``packed_tokens`` says whether
      the shared prefix was stored once and ``segments`` defaults to that request's;
    - a ready ``plan``.

    ``settings`` are ``describe_settings``'s keywords (model layout, recompute, execution
    flags, profiles, planner, outputs). ``microbatch_requests`` gives every micro-batch
    of the step its own request (a ``Request`` or sequence lengths), in place of one
    request repeated ``microbatches`` times: over pipeline stages, or one after another
    at ``pp = 1`` (gradient accumulation, priced at its largest micro-batch); with it,
    the step's own request, prefix or plan counts are refused.
    """
    counts = {
        "logical_tokens": logical_tokens,
        "packed_tokens": packed_tokens,
        "rank_tokens": rank_tokens,
        "busiest_tokens": busiest_tokens,
        "gdn_rank_tokens": gdn_rank_tokens,
    }
    if microbatch_requests is not None:
        given = {**counts, "segments": segments, "plan": plan}
        also = [n for n, v in given.items() if v is not None]
        also += ["shared_prefix"] if shared_prefix else []
        if also:
            raise InputError(
                "microbatch_requests",
                "+" + "+".join(also),
                "every micro-batch's request is its own (lengths and shared_prefix each); "
                f"give them or {', '.join(also)}, not both",
            )
        return _microbatched(model, lengths, request, microbatch_requests, settings)
    s = describe_settings(model, **settings)
    explicit = any(v is not None for v in counts.values())
    sources = [
        n for n, v in (("lengths", lengths), ("request", request), ("plan", plan)) if v is not None
    ]
    if explicit:
        sources.append("plan counts")
    if len(sources) > 1 and sources != ["lengths", "plan counts"]:
        raise InputError(
            "request", "+".join(sources), "give lengths, a request, a plan or a plan's counts"
        )
    if segments is not None and not explicit:
        raise InputError(
            "segments",
            segments,
            "is an explicit plan's count: give it with --packed-tokens (a planned request "
            "counts its own segments)",
        )
    if plan is not None:
        return s.step_for_plan(plan)
    if explicit:
        return _explicit_step(s, lengths, shared_prefix, segments, counts)
    if request is None:
        if lengths is None:
            raise InputError("lengths", None, "give lengths, a request or a plan")
        request = Request.shared(list(lengths), shared_prefix)
    return s.step(request)


def _microbatched(
    model: str | ModelGeometry | None,
    lengths: Sequence[int] | None,
    request: Request | None,
    given: Sequence[Request | Sequence[int]],
    settings: SettingsArguments,
) -> Step:
    """A pipeline step whose micro-batches each have a request (the first is the step's)."""
    if lengths is not None or request is not None:
        raise InputError(
            "microbatch_requests", "+lengths", "give the micro-batches' requests or one request"
        )
    if not given:
        raise InputError("microbatch_requests", [], "needs at least one request")
    requests = tuple(r if isinstance(r, Request) else Request.shared(list(r), 0) for r in given)
    count = settings.get("microbatches")
    if count is not None and count not in (1, len(requests)):
        raise InputError(
            "microbatches",
            count,
            f"differs from the {counted(len(requests), 'micro-batch request')}",
        )
    each: SettingsArguments = {**settings, "microbatches": len(requests)}
    s = describe_settings(model, **each)
    return s.step(requests[0], microbatches=requests if len(requests) > 1 else ())


def _explicit_step(
    s: StepSettings,
    lengths: Sequence[int] | None,
    shared_prefix: int,
    segments: int | None,
    counts: dict[str, Any],
) -> Step:
    """A plan from a runtime's counts; with the sequence ``lengths`` behind them, the
    request as the runtime packed it fills in the real tokens and segments."""
    packed = counts["packed_tokens"]
    if packed is None:
        raise InputError("packed_tokens", None, "required for an explicit plan")
    packed_as = None
    if lengths is not None:
        packed_as = Request.as_packed(list(lengths), shared_prefix, packed, s.layout.tp)
        logical = counts["logical_tokens"]
        if logical is not None and logical != packed_as.logical_tokens:
            raise InputError(
                "logical_tokens", logical, f"differs from sum(lengths) = {packed_as.logical_tokens}"
            )
        counts["logical_tokens"] = packed_as.logical_tokens
        if segments is None:
            segments = packed_as.grad_segments
    if counts["logical_tokens"] is None:
        raise InputError("logical_tokens", None, "required for an explicit plan")
    if segments is None:
        raise InputError("segments", None, "required for an explicit plan")
    rank_tokens = counts["rank_tokens"]
    if rank_tokens is not None and len(rank_tokens) != s.layout.cp:
        raise InputError(
            "rank_tokens", list(rank_tokens), f"gives {len(rank_tokens)} ranks; cp is {s.layout.cp}"
        )
    one_rank = s.layout.cp == 1 and counts["busiest_tokens"] is None
    if rank_tokens is None and one_rank and packed_as is not None:
        # the one rank holds the real tokens the runtime padded to TP
        real = packed_as.real_tokens
        rank_tokens = [real if round_up(real, s.layout.tp) == packed else packed]
    plan = explicit_plan(
        s.layout,
        logical_tokens=counts["logical_tokens"],
        packed_tokens=packed,
        grad_segments=segments,
        rank_tokens=rank_tokens,
        busiest_tokens=counts["busiest_tokens"],
        gdn_rank_tokens=counts["gdn_rank_tokens"],
    )
    return Step(s, plan, None, ())
