"""The policy registry: a policy registers itself by name; ``price`` looks it up.

This module imports no policy (``cpmem.pricing``'s ``__init__`` imports the built-in
ones), so a policy may import the registry without an import circle.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from cpmem.errors import InputError
from cpmem.pricing.accumulation import price_accumulation
from cpmem.pricing.device_budget import device_budget
from cpmem.pricing.estimate import Estimate
from cpmem.pricing.pipeline import price_pipeline
from cpmem.pricing.static import static_memory
from cpmem.step.step import Step

Policy = Callable[[Step], Estimate]
POLICIES: dict[str, Policy] = {}


def register_policy(name: str) -> Callable[[Policy], Policy]:
    def wrap(fn: Policy) -> Policy:
        POLICIES[name] = fn
        return fn

    return wrap


def price(inputs: Step, policy: str = "reference") -> Estimate:
    """Price ``inputs`` with the named policy; the static memory (and the device's budget,
    where the step names a device) beside its activations, the same for every policy."""
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
    static = static_memory(inputs.settings, stage=est.busiest_stage)
    device = inputs.settings.device
    budget = None if device is None else device_budget(device, static)
    return replace(est, static=static, device_budget=budget)


def policy_names() -> list[str]:
    return sorted(POLICIES)
