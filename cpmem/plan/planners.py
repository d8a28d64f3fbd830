"""Reference planners: who owns which tokens when no runtime supplies its layout.

The rules (docs/layout.md states them in full, and ``oracles/ownership.py``
re-derives them token by token):

- ``balanced``: Megatron's zigzag. Each packed row (one prefix tree) is padded to
  a multiple of 2·CP (2·CP·TP under SP, so each local slice is a multiple of TP),
  cut into 2·CP equal chunks, and rank r takes chunks r and 2·CP-1-r.
- ``attention-work``: the packed rows, laid end to end, cut into CP contiguous
  chunks balancing causal attention work (a token's work is the number of keys it
  attends to through the prefix tree). Cut k sits at the first token where the
  cumulative work reaches k/CP of the total, rounded up to a 128-token block.
- ``gdn-segments``: prefix-tree segments. Target = real tokens / CP. A subtree
  that fits the target goes whole to the least-loaded rank; otherwise its root
  goes alone and its children are placed recursively; a segment longer than the
  target is cut into ceil(n / ceil(target)) near-equal chain pieces, each to the
  least-loaded rank. Ties go to the lowest rank. Attention tokens stay with their
  GDN segment's owner.
- ``chunked``: the layout of the runtime the CP cells were measured on
  (``docs/layout.md``, "The chunk planner"): 512-token chunks, one contiguous range
  of chunks per rank chosen by a cost model, then up to 8 boundary moves; for
  hybrid models GDN segments kept whole or chained. The default for attention-only
  models.

``worst`` is not a layout: it plans with every planner above and keeps the plan
with the most tokens on its busiest rank, for callers who cannot name their
runtime's layout.

Under SP each rank's local slice is padded to a multiple of TP. With CP = 1 every
planner gives the one rank the whole packed row.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Literal

from cpmem.errors import InputError
from cpmem.model.geometry import ModelGeometry
from cpmem.plan.chunked import chunk_costs, chunked_loads
from cpmem.plan.layout import ParallelLayout, round_up
from cpmem.plan.plan import ForwardGroup, Plan, segment_bounds
from cpmem.plan.request import Request, Segment

PlannerName = Literal["balanced", "attention-work", "gdn-segments", "chunked"]
PLANNERS: tuple[PlannerName, ...] = ("balanced", "attention-work", "gdn-segments", "chunked")
WORST = "worst"
PLANNER_CHOICES: tuple[str, ...] = (*PLANNERS, WORST)
ATTENTION_BLOCK = 128

# Layouts a runtime is known to execute, with the runtime that does: admission's
# memory-minimal alternatives are drawn from these only.
EXECUTABLE: dict[str, str] = {
    "chunked": "the measured runtime's chunk planner (one contiguous range per rank)",
    "balanced": "Megatron's zigzag (2*CP slabs, rank r takes r and 2*CP-1-r)",
}


# Planners that place whole prefix-tree segments on a rank (``segment_bounds``).
WHOLE_SEGMENT_PLANNERS = frozenset({"gdn-segments"})


def default_planner(geometry: ModelGeometry) -> PlannerName:
    """Hybrid models follow their GDN segments; attention-only models are laid out as the
    measured runtime did (``chunked``: the recorded 1.7B counts, 5,120 and 218)."""
    return "gdn-segments" if geometry.is_hybrid else "chunked"


def plan_request(
    request: Request,
    layout: ParallelLayout,
    planner: str | None = None,
    geometry: ModelGeometry | None = None,
) -> Plan:
    """Build the plan of one forward of ``request`` with a reference planner."""
    if planner is None:
        if geometry is None:
            raise InputError("planner", None, "name a planner or give the model geometry")
        planner = default_planner(geometry)
    if planner == WORST:
        return _worst(request, layout, geometry)
    if planner not in _RANK_LOADS and planner != "chunked":
        raise InputError(
            "planner", planner, f"unknown planner; choose one of {list(PLANNER_CHOICES)}"
        )
    gdn: list[int] | None = None
    if layout.cp == 1:
        loads = [request.real_tokens]
    elif planner == "chunked":
        if geometry is None:
            raise InputError("planner", planner, "the chunked planner needs the model geometry")
        loads, gdn = chunked_loads(request, layout.cp, chunk_costs(geometry), geometry.is_hybrid)
    else:
        loads = _RANK_LOADS[planner](request, layout)
    if gdn is None:
        gdn = loads
    if layout.sp_active:
        loads = [round_up(n, layout.tp) for n in loads]
        gdn = [round_up(n, layout.tp) for n in gdn]
    group = ForwardGroup(
        logical_tokens=request.logical_tokens,
        packed_tokens=round_up(request.real_tokens, layout.tp),
        attention_tokens=tuple(loads),
        gdn_tokens=tuple(gdn),
        grad_segments=request.grad_segments,
        real_tokens=request.real_tokens,
        rank_segments=segment_bounds(
            request.grad_segments, layout.cp, whole=planner in WHOLE_SEGMENT_PLANNERS
        ),
    )
    return Plan(layout=layout, planner=planner, groups=(group,))


def check_ranks(plan: Plan, real_tokens: int) -> list[str]:
    """Refuse a CP size that leaves a rank with no tokens; warn about near-empty ranks.

    An error when the request has fewer real tokens than CP ranks (every layout leaves a
    rank empty) or when ``plan`` (a planner's, not ``worst``'s pick among planners)
    leaves one empty. A warning per the smallest rank holding fewer tokens than one
    128-token attention block.
    """
    cp = plan.layout.cp
    if cp == 1:
        return []
    if real_tokens < cp:
        raise InputError(
            "cp", cp, f"leaves ranks with no tokens: the request has only {real_tokens} tokens"
        )
    ranks = plan.rank_tokens
    empty = [r for r, n in enumerate(ranks) if n == 0]
    if empty and not plan.planner.startswith(WORST):
        raise InputError(
            "cp",
            cp,
            f"leaves {len(empty)} of {cp} ranks with no tokens under the {plan.planner} "
            f"layout of {real_tokens:,} tokens (first: rank {empty[0]})",
        )
    smallest = min(ranks)
    if smallest < ATTENTION_BLOCK:
        rank = ranks.index(smallest)
        return [
            f"cp={cp}: rank {rank} holds {smallest} tokens, fewer than one "
            f"{ATTENTION_BLOCK}-token attention block (CP this wide buys little)"
        ]
    return []


def _worst(request: Request, layout: ParallelLayout, geometry: ModelGeometry | None) -> Plan:
    """The plan with the most tokens on its busiest rank over every planner (ties: the
    first in ``PLANNERS``), named ``worst:<planner>``; every segment's state on every
    rank, the worst placement of segments too."""
    if geometry is None:
        raise InputError("planner", WORST, "the worst-case planner needs the model geometry")
    plans = [plan_request(request, layout, name, geometry) for name in PLANNERS]
    worst = max(plans, key=lambda p: p.busiest_tokens)  # max keeps the first of ties
    groups = tuple(replace(g, rank_segments=(g.grad_segments,) * layout.cp) for g in worst.groups)
    return Plan(layout=worst.layout, planner=f"{WORST}:{worst.planner}", groups=groups)


def _balanced(request: Request, layout: ParallelLayout) -> list[int]:
    cp = layout.cp
    multiple = 2 * cp * (layout.tp if layout.sp_active else 1)
    per_rank = sum(round_up(t.subtree_tokens, multiple) // cp for t in request.trees)
    return [per_rank] * cp


def _segment_spans(request: Request) -> list[tuple[int, int]]:
    """(tokens above, tokens) of every segment, in packed-row order."""
    spans: list[tuple[int, int]] = []

    def visit(seg: Segment, above: int) -> None:
        spans.append((above, seg.tokens))
        for child in seg.children:
            visit(child, above + seg.tokens)

    for tree in request.trees:
        visit(tree, 0)
    return spans


def _work(above: int, count: int) -> int:
    """Causal work of the first ``count`` tokens of a segment with ``above`` tokens before it."""
    return count * above + count * (count + 1) // 2


def _attention_work(request: Request, layout: ParallelLayout) -> list[int]:
    cp = layout.cp
    spans = _segment_spans(request)
    total = sum(_work(above, n) for above, n in spans)
    real = request.real_tokens
    cuts = [0]
    k, done_tokens, done_work = 1, 0, 0
    for above, n in spans:
        seg_work = _work(above, n)
        # every cut whose target falls inside this segment
        while k < cp and (done_work + seg_work) * cp >= k * total:
            lo, hi = 1, n  # smallest i with (done_work + work(i)) * cp >= k * total
            while lo < hi:
                mid = (lo + hi) // 2
                if (done_work + _work(above, mid)) * cp >= k * total:
                    hi = mid
                else:
                    lo = mid + 1
            cuts.append(min(round_up(done_tokens + lo, ATTENTION_BLOCK), real))
            k += 1
        done_tokens += n
        done_work += seg_work
    while len(cuts) < cp:
        cuts.append(real)
    cuts.append(real)
    return [cuts[i + 1] - cuts[i] for i in range(cp)]


def _gdn_segments(request: Request, layout: ParallelLayout) -> list[int]:
    cp = layout.cp
    target = request.real_tokens / cp
    piece_cap = math.ceil(target)
    loads = [0] * cp

    def give(tokens: int) -> None:
        loads[loads.index(min(loads))] += tokens

    def place_alone(tokens: int) -> None:
        if tokens <= target:
            give(tokens)
            return
        pieces = -(-tokens // piece_cap)
        base, extra = divmod(tokens, pieces)
        for i in range(pieces):
            give(base + (1 if i < extra else 0))

    def place(seg: Segment) -> None:
        if seg.subtree_tokens <= target:
            give(seg.subtree_tokens)
            return
        place_alone(seg.tokens)
        for child in seg.children:
            place(child)

    for tree in request.trees:
        place(tree)
    return loads


_RANK_LOADS: dict[str, Callable[[Request, ParallelLayout], list[int]]] = {
    "balanced": _balanced,
    "attention-work": _attention_work,
    "gdn-segments": _gdn_segments,
}
