"""What a refused step can change to fit: more CP, more recompute, shorter sequences
(``suggest``), and for an MoE step the expert capacity a runtime enforces
(``capacity_advice``).

A router without a capacity can send any share of the tokens to one rank's experts, so
an MoE step is admitted on the worst case (``Pricer``). Megatron-LM's
``--moe-expert-capacity-factor F`` bounds what each expert receives: every source rank
keeps at most ``ceil(tokens x top-k / E x F)`` copies per expert and drops the rest
(``get_capacity``, ``apply_router_token_dropping``, megatron-core 0.16 ``moe_utils.py``),
or with ``--moe-pad-expert-input-to-capacity`` pads every expert to exactly that many
(``cpmem.step.routing``). That bound is the runtime's, so a step that fits under it fits
whatever the router picks. The balanced expectation (every expert its even share) is
where a trained router's rows sit near, but nothing enforces it: the advice gives it
beside the capacity, never in place of one.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from fractions import Fraction
from functools import partial

from cpmem.admission.pricer import Pricer
from cpmem.errors import InputError
from cpmem.pricing.registry import default_policy, price, unpriced_options
from cpmem.step.recompute import Mode, Module, Recompute
from cpmem.step.routing import routing_kind
from cpmem.step.step import STEP_KINDS, Step
from cpmem.units import GIB

SUGGESTED_RECOMPUTE = (
    Recompute(Mode.SELECTIVE, (Module.CORE_ATTN, Module.MLP)),
    Recompute(Mode.FULL, ()),
)


def suggest(step: Step, available: int, pricer: Pricer) -> str:
    """A concrete way out: the first of more CP, more recompute, shorter sequences that fits."""
    layout = step.settings.layout
    tries: list[tuple[str, Callable[[], Step]]] = [
        (f"run with cp={cp}", partial(step.with_settings, layout=replace(layout, cp=cp)))
        for cp in (layout.cp * 2, layout.cp * 4)
    ]
    for rc in SUGGESTED_RECOMPUTE:
        tries.append((f"use recompute {rc.label}", partial(step.with_settings, recompute=rc)))
    for label, build in tries:
        try:
            need = pricer.required(pricer.estimate(build()))
        except InputError:
            continue
        if need <= available:
            where = ", static memory included" if pricer.whole_device else ""
            return f"{label} (predicted {need / 2**30:.3f} GiB{where})"
    assert step.request is not None
    longest = max(step.request.sequence_lengths)
    return f"shorten the sequences (longest is {longest} tokens) or add devices"


FACTOR_RESOLUTION = 100
"""Capacity factors are searched in hundredths (the largest ``n / 100`` that fits)."""


@dataclass(frozen=True)
class Capacity:
    """A capacity factor and the bytes the step requires under it (``Pricer.required``)."""

    factor: float
    pad: bool
    required_bytes: int

    @property
    def routing(self) -> str:
        """The ``--moe-routing`` that states it."""
        return f"capacity:{self.factor:g}" + (":pad" if self.pad else "")

    @property
    def megatron_flags(self) -> str:
        pad = " --moe-pad-expert-input-to-capacity" if self.pad else ""
        return f"--moe-expert-capacity-factor {self.factor:g}{pad}"

    def to_dict(self) -> dict[str, object]:
        return {
            "factor": self.factor,
            "pad": self.pad,
            "moe_routing": self.routing,
            "megatron_args": self.megatron_flags,
            "required_bytes": self.required_bytes,
        }


@dataclass(frozen=True)
class CapacityAdvice:
    """For a refused MoE step: the largest capacity factor under which it fits with token
    dropping and with padding (None where no factor down to ``1 / FACTOR_RESOLUTION``
    fits), and the balanced expectation's required bytes beside them; bytes as admission
    compares them (``Pricer.required``: static memory included where ``whole_device``)."""

    dropping: Capacity | None
    padding: Capacity | None
    balanced_bytes: int
    available_bytes: int
    whole_device: bool

    @property
    def balanced_fits(self) -> bool:
        return self.balanced_bytes <= self.available_bytes

    def text(self) -> str:
        """The advice as one line: the capacities (bounds the runtime enforces), then the
        expectation (not a bound)."""
        static = ", static memory included" if self.whole_device else ""
        drop, pad = self.dropping, self.padding
        if drop is None and pad is None:
            head = "no expert capacity factor down to 0.01 fits"
        else:
            parts = []
            if drop is not None:
                low = " (below 1 it drops tokens even when routing is balanced)"
                parts.append(
                    f"--moe-routing {drop.routing} (Megatron-LM's {drop.megatron_flags}: "
                    f"tokens beyond it dropped{low if drop.factor < 1 else ''}) fits at "
                    f"{drop.required_bytes / GIB:.3f} GiB{static}"
                )
            if pad is not None:
                parts.append(
                    f"padded, --moe-routing {pad.routing} ({pad.megatron_flags}) at "
                    f"{pad.required_bytes / GIB:.3f} GiB"
                )
            head = "state an expert capacity, a bound the runtime enforces: " + "; ".join(parts)
        fits = "fits" if self.balanced_fits else "does not fit"
        return (
            f"{head}; the balanced expectation needs {self.balanced_bytes / GIB:.3f} GiB "
            f"({fits}), an expectation, not a bound: a router without a capacity can "
            "exceed it"
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "dropping": None if self.dropping is None else self.dropping.to_dict(),
            "padding": None if self.padding is None else self.padding.to_dict(),
            "balanced_bytes": self.balanced_bytes,
            "balanced_fits": self.balanced_fits,
            "static_included": self.whole_device,
            "bound": "a capacity is a bound the runtime enforces; balanced is an expectation",
        }


def capacity_advice(step: Step, available: int, pricer: Pricer) -> CapacityAdvice | None:
    """The advice for a refused MoE step (``CapacityAdvice``), or None where a capacity
    cannot move it: no routed experts, a stated row count, or a policy that prices no
    routing (``--policy reference``)."""
    if not step.geometry.is_moe or routing_kind(step.moe_routing) == "rows":
        return None
    policy = pricer.policy if pricer.policy is not None else default_policy(step)
    if "moe_routing" in unpriced_options(step, policy):
        return None

    cache: dict[str, int] = {}

    def required(factor: float, pad: bool) -> int:
        routing = f"capacity:{factor:g}" + (":pad" if pad else "")
        if routing not in cache:
            cache[routing] = pricer.required(pricer.estimate(_routed(step, routing)))
        return cache[routing]

    found: list[Capacity | None] = []
    for pad in (False, True):
        n = _largest(partial(_fits, required, pad, available), _top(step))
        factor = None if n is None else n / FACTOR_RESOLUTION
        found.append(None if factor is None else Capacity(factor, pad, required(factor, pad)))
    expected = _expected(step, pricer)
    return CapacityAdvice(found[0], found[1], expected, available, pricer.whole_device)


def _fits(required: Callable[[float, bool], int], pad: bool, available: int, n: int) -> bool:
    """Whether a capacity of ``n / FACTOR_RESOLUTION`` (padded where ``pad``) fits."""
    return required(n / FACTOR_RESOLUTION, pad) <= available


def _routed(step: Step, routing: str) -> Step:
    return replace(step, settings=step.settings.replace(moe_routing=routing))


def _expected(step: Step, pricer: Pricer) -> int:
    """The balanced expectation's required bytes as priced (admission itself moves a
    balanced step to the worst case, ``pricer.on_a_bound``), the larger step kind."""
    balanced = _routed(step, "balanced")
    return max(
        pricer.required(
            price(replace(balanced, settings=balanced.settings.replace(cold=kind == "first")),
                  pricer.policy)
        )
        for kind in STEP_KINDS
    )  # fmt: skip


def _top(step: Step) -> int:
    """Hundredths of the factor at which a dropping capacity holds the worst case's rows:
    each source keeps its ``min(top-k, E/EP)`` copies per token for the rank's ``E/EP``
    experts at ``F = min(EP, E / top-k)``; where the worst case refuses, no larger factor
    fits (padding holds at least as many rows as dropping)."""
    g, ep = step.geometry, max(step.plan.layout.ep, 1)
    top = min(Fraction(ep), Fraction(g.num_experts, g.moe_top_k))
    return max(1, math.ceil(top * FACTOR_RESOLUTION))


def _largest(fits: Callable[[int], bool], top: int) -> int | None:
    """The largest ``n`` in ``[1, top]`` that ``fits``, by bisection (a step's bytes never
    fall as its capacity grows), or None where 1 does not."""
    if fits(top):
        return top
    lo, hi = 0, top  # fits(lo) (0: none found yet), not fits(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo or None
