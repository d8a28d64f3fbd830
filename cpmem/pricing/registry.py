"""The policy registry: a policy registers itself by name; ``price`` looks it up.

This module imports no policy (``cpmem.pricing``'s ``__init__`` imports the built-in
ones), so a policy may import the registry without an import circle.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

from cpmem.errors import InputError
from cpmem.pricing.accumulation import price_accumulation
from cpmem.pricing.device_budget import device_budget
from cpmem.pricing.estimate import Estimate
from cpmem.pricing.pipeline import price_pipeline
from cpmem.pricing.static import rank_stage, static_memory
from cpmem.step.step import Step

Policy = Callable[[Step], Estimate]
POLICIES: dict[str, Policy] = {}
RUNTIME_POLICIES: dict[str, str] = {"art": "reference", "megatron-lm": "tight"}
"""The policy a step is priced with where none is named, by its runtime: ART's published
LoRA formula (``reference``) for ART's trainer; ``tight`` for Megatron-LM's runs, the one
layer-by-layer model its recordings check (``reference`` and ``global`` refuse them)."""


def default_policy(step: Step) -> str:
    """The policy ``price`` uses for ``step`` where none is named (``RUNTIME_POLICIES``)."""
    return RUNTIME_POLICIES[step.settings.runtime.name]


IGNORES: dict[str, dict[str, str]] = {}
"""Per policy: the step options it does not read, each with the reason."""


def register_policy(
    name: str, ignores: Mapping[str, str] | None = None
) -> Callable[[Policy], Policy]:
    """Register ``name``; ``ignores``: the options of a step (``SETTABLE`` names) this
    policy does not price, each with a one-line reason, listed on every estimate that
    sets one (``Estimate.ignored_options``)."""
    unknown = set(ignores or {}) - set(SETTABLE)
    if unknown:
        raise ValueError(f"policy {name!r} ignores unknown options {sorted(unknown)}")

    def wrap(fn: Policy) -> Policy:
        POLICIES[name] = fn
        IGNORES[name] = dict(ignores or {})
        return fn

    return wrap


SETTABLE: dict[str, Callable[[Step], bool]] = {
    "compiled": lambda s: s.compiled,
    "moe_routing": lambda s: s.moe_routing != "concentrated",
    "profiles": lambda s: bool(s.profiles),
    "attention_backend": lambda s: s.settings.runtime.attention_backend != "fused",
}
"""The options a policy may leave unpriced, each with whether a step sets it (away from
its default)."""


def inapplicable_options(step: Step) -> list[str]:
    """Options set on ``step`` that no policy prices for it, each with the reason, and the
    parts of the model's checkpoint no policy prices (``ModelGeometry.unpriced_parts``)."""
    g, layout, settings = step.geometry, step.plan.layout, step.settings
    out = []
    if step.moe_routing != "concentrated" and not g.is_moe:
        out.append(f"moe_routing: {g.name} has no routed experts")
    if layout.ep > 1 and not g.is_moe:
        out.append(f"ep: {g.name} has no routed experts to shard")
    runtime_comm = "p2p" if settings.runtime.name == "megatron-lm" else "all_gather"
    if step.cp_comm != runtime_comm and layout.cp == 1:
        out.append("cp_comm: cp is 1, attention exchanges nothing")
    art = settings.runtime.name == "art"
    if layout.dp > 1 and not settings.optimizer.distributed and art:
        out.append("dp: only the distributed optimizer's shards read it")
    if settings.output_bytes is not None and not step.head.returns_hidden:
        out.append(f"output_bytes: the {step.head.label} head returns no hidden states")
    out.extend(g.unpriced_parts)
    return out


def ignored_options(step: Step, policy: str) -> tuple[str, ...]:
    """Every option set on ``step`` that ``policy`` does not price (``option: reason``)."""
    declared = [
        f"{option}: {reason}"
        for option, reason in IGNORES.get(policy, {}).items()
        if SETTABLE[option](step)
    ]
    named = {d.partition(":")[0] for d in declared}
    return tuple(
        declared + [o for o in inapplicable_options(step) if o.partition(":")[0] not in named]
    )


def price(inputs: Step, policy: str | None = None) -> Estimate:
    """Price ``inputs`` with the named policy (None: its runtime's, ``default_policy``);
    the static memory (and the device's budget, where the step names a device) beside its
    activations, the same for every policy."""
    if policy is None:
        policy = default_policy(inputs)
    try:
        fn = POLICIES[policy]
    except KeyError:
        raise InputError(
            "policy", policy, f"unknown policy; choose one of {sorted(POLICIES)}"
        ) from None
    if inputs.settings.pipeline.active:
        est = price_pipeline(inputs, fn)
    elif inputs.microbatches:  # gradient accumulation: one micro-batch after another
        est = price_accumulation(inputs, fn)
    else:
        est = fn(inputs)
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
    return replace(
        est,
        stage_statics=statics,
        answered_stage=answered if statics else None,
        ignored_options=ignored_options(inputs, policy),
        static=static,
        device_budget=None if device is None else device_budget(device, static),
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
