"""Width selection: how many queued requests join one forward under a budget.

Doubling, then binary search over the queue's prefixes, each priced through the same
``Pricer`` admission uses (and agreed across ranks through the communicator).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from cpmem.admission.admission import Pricer, check_bytes
from cpmem.admission.comm import Communicator, LocalCommunicator, collective_plan
from cpmem.errors import InputError
from cpmem.model.geometry import ModelGeometry
from cpmem.plan.layout import ParallelLayout
from cpmem.plan.plan import explicit_plan
from cpmem.plan.planners import plan_request
from cpmem.plan.request import Request
from cpmem.pricing.recompute import Recompute


@dataclass(frozen=True)
class WidthSelection:
    """How many queued requests join one forward, and what that forward costs."""

    count: int
    required_bytes: int
    exact_plans: int
    pruned: int


def select_width(
    geometry: ModelGeometry,
    queue: Sequence[Request],
    layout: ParallelLayout,
    budget_bytes: float,
    *,
    recompute: Recompute | None = None,
    policy: str = "reference",
    planner: str | None = None,
    probe: Literal["exact", "count"] = "exact",
    comm: Communicator | None = None,
) -> WidthSelection:
    """Largest prefix of ``queue`` whose one forward fits: doubling, then binary search.

    Under CP the exact plan is built and priced; ceil(packed / CP) serves only as an
    optimistic bound that prunes widths that cannot fit. ``probe="count"`` prices
    the token count split evenly over CP instead (cheap, no plan built, and optimistic
    under CP: for comparison).

    The search assumes cost grows with width. The greedy reference planners can
    break that by a little (one more token may move a segment to another rank), so
    the width returned always fits but may not be the very largest that would.
    """
    comm = comm or LocalCommunicator()

    def validate() -> None:
        check_bytes("budget_bytes", budget_bytes)
        if not queue:
            raise InputError("queue", [], "needs at least one request")

    collective_plan(comm, validate)
    pricer = Pricer(geometry, recompute or Recompute(), policy)
    available = comm.min_int(int(budget_bytes))
    stats = {"exact": 0, "pruned": 0}
    cache: dict[int, int | None] = {}

    def cost(n: int) -> int | None:
        """Required bytes of the first n requests, or None if pruned as not fitting."""
        if n in cache:
            return cache[n]
        combined = Request(tuple(t for r in queue[:n] for t in r.trees))
        result: int | None
        if probe == "count" or layout.cp == 1:
            plan = explicit_plan(
                layout,
                logical_tokens=combined.logical_tokens,
                packed_tokens=-(-combined.real_tokens // layout.tp) * layout.tp,
                grad_segments=combined.grad_segments,
            )
            result = pricer.required(pricer.estimate(plan))
        else:
            bound = explicit_plan(
                layout,
                logical_tokens=combined.logical_tokens,
                packed_tokens=-(-combined.real_tokens // layout.tp) * layout.tp,
                grad_segments=combined.grad_segments,
            )
            if pricer.required(pricer.estimate(bound)) > available:
                stats["pruned"] += 1
                result = None
            else:
                stats["exact"] += 1
                plan = plan_request(combined, layout, planner, geometry)
                result = pricer.required(pricer.estimate(plan))
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
