"""The policy registry: a policy registers itself by name; ``price`` looks it up.

This module imports no policy (``cpmem.pricing``'s ``__init__`` imports the built-in
ones), so a policy may import the registry without an import circle.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from cpmem.errors import InputError
from cpmem.pricing.accumulation import price_accumulation, runs_combined
from cpmem.pricing.components import Component
from cpmem.pricing.device_budget import device_budget
from cpmem.pricing.estimate import Estimate
from cpmem.pricing.fsdp import backward_in_flight, in_flight_bytes, startup_notes
from cpmem.pricing.kinds.discarded import Sublayer, norm_is_module
from cpmem.pricing.layer_offload import layer_offload_notes
from cpmem.pricing.muon_step import step_transient_bytes
from cpmem.pricing.offload import offload_notes
from cpmem.pricing.optimizer_state import expert_shards, optimizer_shards
from cpmem.pricing.pipeline import price_pipeline
from cpmem.pricing.static import rank_stage, static_memory
from cpmem.step.cp_comm_rules import default_cp_comm
from cpmem.step.offload import Offload
from cpmem.step.recompute import Mode, Module
from cpmem.step.routing import routing_kind
from cpmem.step.runtime import DEV_CONTAINER
from cpmem.step.step import Step, StepSettings

Policy = Callable[[Step], Estimate]
POLICIES: dict[str, Policy] = {}


ROUTING_POLICY = "tight"
"""The policy an MoE step is priced with where none is named and its runtime's own
leaves the routing unpriced (``default_policy``)."""


def default_policy(step: Step) -> str:
    """The policy ``price`` uses for ``step`` where none is named: its runtime's
    (``Runtime.default_policy``: ART's published LoRA formula for its trainer, ``tight``
    for Megatron-LM's runs, which ``reference`` and ``global`` refuse), except on an MoE
    step where that policy prices no routing: ``ROUTING_POLICY``. ART's published formula
    charges every token's top-k rows to the rank's experts whatever the routing, so
    under it a stated routing (a capacity a runtime enforces, the balanced expectation)
    would change nothing; ``tight`` prices the routing stated, and its MoE layer is the
    one checked against the measured MoE cells, the rank simulator's MoE rows and
    Megatron-LM's MoE recordings (README, "MoE routing"). ``--policy reference`` still
    prices the published formula."""
    own = step.settings.runtime.default_policy
    if step.geometry.is_moe and "moe_routing" in unpriced_options(step, own):
        return ROUTING_POLICY
    return own


@dataclass(frozen=True)
class Ignore:
    """An option a policy does not price: why, and, where the policy prices it on some
    steps, the steps it does not price it on (``where``, a test of the rest of the step;
    None: every step)."""

    reason: str
    where: Callable[[Step], bool] | None = None

    def holds(self, step: Step) -> bool:
        return self.where is None or self.where(step)


IGNORES: dict[str, dict[str, Ignore]] = {}
"""Per policy: the step options it does not read, each with the reason."""


def register_policy(
    name: str, ignores: Mapping[str, str | Ignore] | None = None
) -> Callable[[Policy], Policy]:
    """Register ``name``; ``ignores``: the options of a step (``SETTABLE`` names) this
    policy does not price, each with a one-line reason (or an ``Ignore``: the reason and
    the steps it holds for), listed on every estimate that sets one
    (``Estimate.ignored_options``)."""
    unknown = set(ignores or {}) - set(SETTABLE)
    if unknown:
        raise ValueError(f"policy {name!r} ignores unknown options {sorted(unknown)}")
    declared = {
        option: ignore if isinstance(ignore, Ignore) else Ignore(ignore)
        for option, ignore in (ignores or {}).items()
    }

    def wrap(fn: Policy) -> Policy:
        POLICIES[name] = fn
        IGNORES[name] = declared
        return fn

    return wrap


def unpriced_options(step: Step, policy: str) -> frozenset[str]:
    """The options ``policy`` does not price on ``step``, set on it or not: what cannot
    change its figure there, so neither can it change which learned profile applies
    (``ProfileStore.floor``'s ``ignoring``)."""
    return frozenset(o for o, ignore in IGNORES.get(policy, {}).items() if ignore.holds(step))


SETTABLE: dict[str, Callable[[Step], bool]] = {
    "compiled": lambda s: s.compiled,
    "moe_routing": lambda s: s.moe_routing != "concentrated",
    "profiles": lambda s: bool(s.profiles),
    "attention_backend": lambda s: s.settings.runtime.attention_backend != "fused",
    "fused_swiglu": lambda s: s.settings.fused_swiglu_asked and s.geometry.gated_mlp,
    "recompute": lambda s: s.recompute.mode != _runtime_recompute(s),
    "cp_comm": lambda s: s.cp_comm != runtime_cp_comm(s),
    "planner": lambda s: s.settings.planner is not None,
    "offload": lambda s: s.settings.offload.active,
}
"""The options a policy may leave unpriced, each with whether a step sets it (away from
its default)."""


def _runtime_recompute(step: Step) -> Mode:
    """The recompute mode the step's runtime runs by default (``describe_settings``)."""
    return Mode(step.settings.runtime.default_recompute)


def runtime_cp_comm(step: Step) -> str:
    """The CP comm type the step's runtime runs the model under by default."""
    return default_cp_comm(step.geometry, step.settings.runtime.default_cp_comm)


def inapplicable_options(step: Step) -> list[str]:
    """Options set on ``step`` that no policy prices for it, each with the reason, and the
    parts of the model's checkpoint no policy prices (``ModelGeometry.unpriced_parts``)."""
    g, layout, settings = step.geometry, step.plan.layout, step.settings
    out = []
    if step.moe_routing != "concentrated" and not g.is_moe:
        out.append(f"moe_routing: {g.name} has no routed experts")
    if layout.ep > 1 and not g.is_moe:
        out.append(f"ep: {g.name} has no routed experts to shard")
    if step.moe_routing == "balanced" and g.is_moe and layout.ep == 1:
        out.append("moe_routing: at EP 1 every routed copy lands on this rank's experts")
    if step.cp_comm != runtime_cp_comm(step) and layout.cp == 1:
        out.append("cp_comm: cp is 1, attention exchanges nothing")
    if settings.planner is not None and layout.cp == 1:
        out.append("planner: cp is 1, one rank holds the whole request")
    rc = step.recompute
    if rc.checkpoints(Module.MLP) and "dense" not in g.mlps:
        out.append(f"modules: mlp: {g.name} has no dense MLP to checkpoint")
    if rc.checkpoints(Module.MOE) and not g.is_moe:
        out.append(f"modules: moe: {g.name} has no routed experts to checkpoint")
    if rc.checkpoints(Module.MOE_ACT) and not g.is_moe:
        out.append(f"modules: moe_act: {g.name} has no routed experts to checkpoint")
    if rc.checkpoints(Module.SHARED_EXPERTS) and not g.shared_expert_ffn:
        out.append(f"modules: shared_experts: {g.name} has no shared experts to checkpoint")
    if rc.checkpoints(Module.MLA_UP_PROJ) and not g.is_mla:
        out.append(f"modules: mla_up_proj: {g.name} has no latent attention to checkpoint")
    if rc.checkpoints(Module.LAYERNORM) and not _norm_modules(step):
        out.append(
            f"modules: layernorm: every norm of {g.name} is fused into the linear after it "
            "(Transformer Engine's layer spec): nothing to checkpoint"
        )
    if settings.quantized_weights == "stored" and g.quantization is None:
        out.append(f"quantized_weights: {g.name}'s checkpoint is not quantized")
    if layout.dp > 1 and not settings.optimizer.distributed:
        out.append("dp: only the distributed optimizer's shards read it")
    if settings.output_bytes is not None and not step.head.returns_hidden:
        out.append(f"output_bytes: the {step.head.label} head returns no hidden states")
    out.extend(_layout_unread(step))
    out.extend(_process_unread(step))
    out.extend(g.unpriced_parts)
    return out


def _norm_modules(step: Step) -> bool:
    """Whether any sub-layer's norm is a module a ``layernorm`` checkpoint covers."""
    g = step.geometry
    kinds: tuple[Sublayer, ...] = ("attention", "dense", "moe")
    present = {"attention": g.attention_layers > 0, "dense": "dense" in g.mlps, "moe": g.is_moe}
    return any(present[k] and norm_is_module(g, step, k) for k in kinds)


def _layout_unread(step: Step) -> list[str]:
    """Layout and optimizer settings the step cannot use: expert tensor parallelism
    without routed experts, sequence parallelism at TP 1, a distributed optimizer with
    nothing to shard, SGD on a first step (its momentum, like Adam's moments, is made at
    the first optimizer step), a rank whose answer is every rank's."""
    g, layout, settings = step.geometry, step.plan.layout, step.settings
    opt = settings.optimizer
    out = []
    if layout.etp > 1 and not g.is_moe:
        out.append(f"etp: {g.name} has no routed experts to split")
    if layout.sp and layout.tp == 1:
        out.append("sp: tp is 1, sequence parallelism shards nothing")
    if opt.distributed and opt.fsdp != "none":
        out.append(
            "distributed_optimizer: Megatron FSDP shards the optimizer's states itself, "
            "by its strategy (fsdp)"
        )
    elif opt.distributed and not _sharding_read(step):
        out.append(
            "distributed_optimizer: its shards change no buffer here (dp x cp is 1, or no "
            "optimizer state is kept)"
        )
    if opt.kind == "sgd" and settings.cold:
        out.append(
            "optimizer: a first step holds no moments yet; sgd keeps adam's master copy and "
            "gradients"
        )
    if opt.kind == "muon" and settings.cold and not opt.distributed:
        out.append(
            "optimizer: a first step holds no momentum yet; muon keeps adam's master copy "
            "and gradients"
        )
    if settings.rank != "busiest" and not _rank_read(settings):
        out.append(
            "rank: every rank of this run holds the same static memory (no pipeline stage, "
            "no distributed-optimizer slice of its own) and the activations priced are the "
            "busiest CP rank's"
        )
    return out


def _sharding_read(step: Step) -> bool:
    """Whether the distributed optimizer moves the step's static memory on any stage:
    its slices of the states, or its buffers' alignment padding (``param_buffers``)."""
    settings = step.settings
    unsharded = replace(settings.optimizer, distributed=False, instances=1, muon_layout="legacy")
    whole = replace(settings, optimizer=unsharded)
    stages = range(settings.pipeline.pp)
    return any(
        static_memory(settings, stage=s, step=step) != static_memory(whole, stage=s, step=step)
        for s in stages
    )


def _rank_read(settings: StepSettings) -> bool:
    """Whether the answered rank moves a figure: its pipeline stage, or its slice of a
    full-training distributed optimizer's buffers (``static.dp_slice``; adapters' states
    are divided evenly, ``static.sharded_states``). The activations are always the busiest CP
    rank's (``Estimate.busiest_rank``)."""
    if settings.pipeline.active:
        return True
    opt, layout = settings.optimizer, settings.layout
    if settings.training != "full" or not opt.distributed:
        return False
    experts = settings.geometry.is_moe and expert_shards(settings) > 1
    return optimizer_shards(layout, opt.instances) > 1 or experts


def _process_unread(step: Step) -> list[str]:
    """Process settings the step cannot use: a SwiGLU fusion asked of a model without a
    gated MLP, a container where no ``auto`` choice or fused head reads it, micro-batches that repeat
    the request one after another at PP 1, leave to price long sequences where none is."""
    g, settings = step.geometry, step.settings
    runtime, pipe = settings.runtime, settings.pipeline
    out = []
    if settings.fused_swiglu_asked and not g.gated_mlp:
        out.append(f"fused_swiglu: {g.name}'s MLP is not gated, no SwiGLU to fuse")
    fused_head = step.head.kind == "fused"  # its PyTorch compiles the fused loss
    if runtime.container != DEV_CONTAINER and runtime.backend_asked != "auto" and not fused_head:
        out.append(
            "container: only --attention-backend auto (Transformer Engine's choice) and the "
            f"fused head (its PyTorch) read it; {runtime.attention_backend} is named"
        )
    if pipe.microbatches > 1 and not pipe.active and not step.microbatches:
        out.append(
            "microbatches: at pp 1 each micro-batch (the request given) frees its activations "
            "before the next runs: one micro-batch's figure"
        )
    if settings.allow_long and not _long_sequence(step):
        limit = g.max_position_embeddings
        out.append(
            "allow_long: "
            + (
                f"no sequence is longer than {g.name}'s {limit:,} positions"
                if limit is not None and step.request is not None
                else "no sequence is checked against the model's positions on this step"
            )
        )
    return out


def _long_sequence(step: Step) -> bool:
    """Whether a sequence of the step (any micro-batch's) exceeds the model's positions."""
    limit = step.geometry.max_position_embeddings
    requests = step.microbatches or ((step.request,) if step.request is not None else ())
    lengths = [n for r in requests for n in r.sequence_lengths]
    return limit is not None and any(n > limit for n in lengths)


def ignored_options(step: Step, policy: str) -> tuple[str, ...]:
    """Every option set on ``step`` that ``policy`` does not price (``option: reason``)."""
    ignores = IGNORES.get(policy, {})
    declared = [
        f"{option}: {ignores[option].reason}"
        for option in sorted(unpriced_options(step, policy), key=list(ignores).index)
        if SETTABLE[option](step)
    ]
    named = {d.partition(":")[0] for d in declared}
    return tuple(
        declared + [o for o in inapplicable_options(step) if o.partition(":")[0] not in named]
    )


def price(inputs: Step, policy: str | None = None) -> Estimate:
    """Price ``inputs`` with the named policy (None: its runtime's, ``default_policy``);
    the static memory (and the device's budget, where the step names a device) beside its
    activations, the same for every policy; of an MoE step, the figure under every
    routing it can be priced with beside it (``Estimate.routing_figures``)."""
    if policy is None:
        policy = default_policy(inputs)
    est = _price_one(inputs, policy)
    if not inputs.geometry.is_moe or "moe_routing" in unpriced_options(inputs, policy):
        return est
    figures, factor = {}, None
    for routing in routings_of(inputs.moe_routing):
        if routing_kind(routing) == "capacity":
            factor = float(routing.split(":")[1])
        same = routing == inputs.moe_routing
        # the routing moves no token between ranks: the same plan, other rows per token
        routed = replace(inputs, settings=replace(inputs.settings, moe_routing=routing))
        other = est if same else _price_one(routed, policy)
        figures[routing_kind(routing)] = other.figure_bytes
    return replace(est, routing_figures=figures, capacity_factor=factor)


DEFAULT_CAPACITY = "capacity:1"
"""The capacity an MoE step is priced under where it states none: factor 1, each expert
at most its even share of the copies (what stating it would save, beside the worst)."""


def routings_of(routing: str) -> tuple[str, ...]:
    """The routings an MoE step is priced under beside its own: the worst case, the
    expectation, a capacity (the stated one, else factor 1) and a stated row count."""
    capacity = routing if routing_kind(routing) == "capacity" else DEFAULT_CAPACITY
    rows = (routing,) if routing_kind(routing) == "rows" else ()
    return ("concentrated", "balanced", capacity, *rows)


def _price_one(inputs: Step, policy: str) -> Estimate:
    """``price`` under the step's own routing alone."""
    try:
        fn = POLICIES[policy]
    except KeyError:
        raise InputError(
            "policy", policy, f"unknown policy; choose one of {sorted(POLICIES)}"
        ) from None
    asked = inputs
    if inputs.settings.offload.active and "offload" in unpriced_options(inputs, policy):
        # a policy whose widths name no saved tensor prices every one on the device
        inputs = replace(inputs, settings=inputs.settings.replace(offload=Offload()))
    if inputs.settings.pipeline.active:
        est = price_pipeline(inputs, fn)
    elif inputs.microbatches or runs_combined(inputs):
        # gradient accumulation: one micro-batch after another, or the combined 1F1B step
        est = price_accumulation(inputs, fn)
    else:
        est = fn(inputs)
    est = with_fsdp(est, inputs.settings)
    est = _with_optimizer_step(est, inputs.settings)
    settings = inputs.settings
    stages = settings.pipeline.pp if settings.pipeline.active else 0
    statics = tuple(static_memory(settings, stage=s, step=inputs) for s in range(stages))
    answered = None if settings.rank == "busiest" else rank_stage(settings)
    if statics:  # the stage where static memory and activations together are largest
        fullest = max(range(stages), key=lambda s: statics[s].total + est.stage_bytes[s])
        static = statics[fullest if answered is None else answered]
    else:
        static = static_memory(settings, step=inputs)
    device = settings.device
    ignored = ignored_options(asked, policy)
    return replace(
        est,
        stage_statics=statics,
        answered_stage=answered if statics else None,
        ignored_options=ignored,
        unpriced=unpriced_options(asked, policy) | {o.partition(":")[0] for o in ignored},
        static=static,
        device_budget=None if device is None else device_budget(device, static),
        notes=(*est.notes, *offload_notes(inputs), *layer_offload_notes(inputs)),
    )


def with_fsdp(est: Estimate, settings: StepSettings) -> Estimate:
    """The estimate with what Megatron FSDP holds in flight (``fsdp.in_flight_bytes``),
    the same for every policy and every rank (Megatron FSDP is priced on one pipeline
    stage): the forward's gathered buckets added to the forward figure; to the
    forward+backward figure the backward's gathered buckets, and the gradient buckets
    from the moment they exist. Megatron FSDP makes a bucket's gradients in its
    parameters' post-accumulate-grad hooks (``_grad_acc``, ``param.get_main_grad()``,
    megatron_fsdp.py:633-652, registered at 1111 at 4828d651): the outside-unit bucket's
    once the output layer's backward has run, a unit's once its layer's has; under
    ``optim_grads`` and ``optim_grads_params`` they are reduce-scattered and freed every
    backward (megatron_fsdp.py:754-775), so no micro-batch finds them made before its
    head's backward. They are charged at the layers' backward
    (``Estimate.layers_backward_bytes``, ``fsdp.backward_in_flight``), where the policy
    prices it apart, else at the whole backward."""
    flight = in_flight_bytes(settings)
    forward = flight.forward_gathered
    if not forward and not flight.gathered and not flight.gradients:
        return est
    name = str(Component.FSDP_IN_FLIGHT)
    fb, fbc = est.forward_backward_bytes, est.forward_backward_components
    backward = 0 if fb is None else backward_in_flight(flight, fb, est.layers_backward_bytes)
    return replace(
        est,
        notes=(*est.notes, *startup_notes(settings)),
        estimate_bytes=est.estimate_bytes + forward,
        per_rank_bytes=tuple(b + forward for b in est.per_rank_bytes),
        components={**est.components, name: forward},
        forward_backward_bytes=None if fb is None else fb + backward,
        forward_backward_components=None if fbc is None else {**fbc, name: backward},
    )


def _with_optimizer_step(est: Estimate, settings: StepSettings) -> Estimate:
    """The estimate with the optimizer step's own transient (``muon_step``) where it
    exceeds a stage's forward+backward figure: it is held after the backward has freed
    the activations, beside the same static memory, so each stage's figure is the larger
    of the two, the excess named (``OPTIMIZER_STEP_EXCESS``) in the forward+backward
    components of the stage they describe. The forward figure does not move."""
    fb, fbc = est.forward_backward_bytes, est.forward_backward_components
    if fb is None or fbc is None:
        return est
    name = str(Component.OPTIMIZER_STEP_EXCESS)
    stage_fb = est.stage_forward_backward_bytes
    if not stage_fb:
        excess = max(0, step_transient_bytes(settings, est.busiest_stage) - fb)
        if not excess:
            return est
        return replace(
            est,
            forward_backward_bytes=fb + excess,
            forward_backward_components={**fbc, name: excess},
        )
    transients = [step_transient_bytes(settings, s) for s in range(len(stage_fb))]
    if all(t <= b for t, b in zip(transients, stage_fb, strict=True)):
        return est
    excess = max(0, transients[est.busiest_stage] - fb)
    return replace(
        est,
        stage_forward_backward_bytes=tuple(
            max(t, b) for t, b in zip(transients, stage_fb, strict=True)
        ),
        forward_backward_bytes=fb + excess,
        forward_backward_components={**fbc, name: excess} if excess else fbc,
    )


def policy_names() -> list[str]:
    return sorted(POLICIES)


def backend_spread(inputs: Step, policy: str = "tight") -> dict[str, int]:
    """Under an attention backend Transformer Engine chose (``Runtime.backend_spread``):
    the step's ``peak_bytes`` with each backend another container would pick, the same
    step otherwise (empty where the backend was named)."""
    runtime = inputs.settings.runtime
    out: dict[str, int] = {}
    for backend in runtime.backend_spread:
        other = runtime.with_backend(backend, runtime.backend_asked, runtime.backend_spread)
        out[backend] = price(inputs.with_settings(runtime=other), policy).peak_bytes
    return out
