"""Width selection: how many queued requests join one forward under a budget.

Doubling, then binary search over the queue's prefixes, each priced through the same
``Pricer`` admission uses (and agreed across ranks through the communicator).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Unpack

from cpmem.admission.comm import Communicator, LocalCommunicator, collective_plan
from cpmem.admission.pricer import Figure, Pricer
from cpmem.errors import InputError, require_bytes
from cpmem.model.geometry import ModelGeometry
from cpmem.plan.layout import round_up
from cpmem.plan.plan import explicit_plan
from cpmem.plan.request import Request
from cpmem.step.describe import SettingsArguments, describe_settings
from cpmem.step.step import Step, StepSettings


@dataclass(frozen=True)
class WidthSelection:
    """How many queued requests join one forward, and what that forward costs."""

    count: int
    required_bytes: int
    exact_plans: int
    pruned: int


def select_width(
    model: str | ModelGeometry | None,
    queue: Sequence[Request],
    budget_bytes: float,
    *,
    policy: str = "reference",
    figure: Figure = "forward",
    probe: Literal["exact", "count"] = "exact",
    comm: Communicator | None = None,
    **settings: Unpack[SettingsArguments],
) -> WidthSelection:
    """Largest prefix of ``queue`` whose one forward fits: doubling, then binary search.
    ``settings`` are ``describe_settings``'s keywords (layout, recompute, execution flags,
    profiles, planner): each prefix is the step ``estimate`` prices for them.

    Under CP the exact plan is built and priced; the packed tokens split evenly over
    CP serve only as an optimistic bound that prunes widths that cannot fit.
    ``probe="count"`` prices that even split instead (cheap, no plan built, and
    optimistic under CP: for comparison).

    The search assumes cost grows with width. The greedy reference planners can
    break that by a little (one more token may move a segment to another rank), so
    the width returned always fits but may not be the very largest that would.
    """
    comm = comm or LocalCommunicator()

    def validate() -> StepSettings:
        require_bytes("budget_bytes", budget_bytes)
        if not queue:
            raise InputError("queue", [], "needs at least one request")
        return describe_settings(model, **settings)

    described = collective_plan(comm, validate)
    pricer = Pricer(policy, figure)
    available = comm.min_int(int(budget_bytes))
    stats = {"exact": 0, "pruned": 0}
    cache: dict[int, int | None] = {}

    def cost(n: int) -> int | None:
        """Required bytes of the first n requests, or None if pruned as not fitting."""
        if n in cache:
            return cache[n]
        combined = Request.combined(queue[:n])
        even = pricer.required(pricer.estimate(_even_split(described, combined)))
        result: int | None
        if probe == "count" or described.layout.cp == 1:
            result = even
        elif even > available:
            stats["pruned"] += 1
            result = None
        else:
            stats["exact"] += 1
            result = pricer.required(pricer.estimate(described.step(combined)))
        if result is not None:
            result = comm.max_int(result)
        cache[n] = result
        return result

    def fits(n: int) -> bool:
        c = cost(n)
        return c is not None and c <= available

    if not fits(1):
        c = cost(1)
        return WidthSelection(0, c if c is not None else 0, stats["exact"], stats["pruned"])
    lo, hi = 1, None
    n = 2
    while n <= len(queue):
        if fits(n):
            lo = n
            n *= 2
        else:
            hi = n
            break
    if hi is None:
        hi = len(queue) + 1
        if lo < len(queue) and fits(len(queue)):
            lo = len(queue)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return WidthSelection(lo, cost(lo) or 0, stats["exact"], stats["pruned"])


def _even_split(settings: StepSettings, request: Request) -> Step:
    """The request's packed tokens (padded to TP) split evenly over the CP ranks."""
    tp = settings.layout.tp
    plan = explicit_plan(
        settings.layout,
        logical_tokens=request.logical_tokens,
        packed_tokens=round_up(request.real_tokens, tp),
        grad_segments=request.grad_segments,
    )
    return settings.step_for_plan(plan)
