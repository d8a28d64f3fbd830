"""The policy registry: a policy registers itself by name; ``price`` looks it up.

This module imports no policy (``cpmem.pricing``'s ``__init__`` imports the built-in
ones), so a policy may import the registry without an import circle.
"""

from __future__ import annotations

from collections.abc import Callable

from cpmem.errors import InputError
from cpmem.pricing.estimate import Estimate
from cpmem.step.step import Step

Policy = Callable[[Step], Estimate]
POLICIES: dict[str, Policy] = {}


def register_policy(name: str) -> Callable[[Policy], Policy]:
    def wrap(fn: Policy) -> Policy:
        POLICIES[name] = fn
        return fn

    return wrap


def price(inputs: Step, policy: str = "reference") -> Estimate:
    """Price ``inputs`` with the named policy."""
    try:
        fn = POLICIES[policy]
    except KeyError:
        raise InputError(
            "policy", policy, f"unknown policy; choose one of {sorted(POLICIES)}"
        ) from None
    return fn(inputs)


def policy_names() -> list[str]:
    return sorted(POLICIES)
