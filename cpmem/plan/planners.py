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

Under SP each rank's local slice is padded to a multiple of TP. With CP = 1 every
planner gives the one rank the whole packed row.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

from cpmem.errors import InputError
from cpmem.model.geometry import ModelGeometry
from cpmem.plan.layout import ParallelLayout, round_up
from cpmem.plan.plan import ForwardGroup, Plan
from cpmem.plan.request import Request, Segment

PlannerName = Literal["balanced", "attention-work", "gdn-segments"]
PLANNERS: tuple[PlannerName, ...] = ("balanced", "attention-work", "gdn-segments")
ATTENTION_BLOCK = 128


def default_planner(geometry: ModelGeometry) -> PlannerName:
    """Hybrid models follow their GDN segments; attention-only models balance work."""
    return "gdn-segments" if geometry.is_hybrid else "attention-work"


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
    if planner not in _RANK_LOADS:
        raise InputError("planner", planner, f"unknown planner; choose one of {list(PLANNERS)}")
    if layout.cp == 1:
        loads = [request.real_tokens]
    else:
        loads = _RANK_LOADS[planner](request, layout)
    if layout.sp_active:
        loads = [round_up(n, layout.tp) for n in loads]
    ranks = tuple(loads)
    group = ForwardGroup(
        logical_tokens=request.logical_tokens,
        packed_tokens=round_up(request.real_tokens, layout.tp),
        attention_tokens=ranks,
        gdn_tokens=ranks,
        grad_segments=request.grad_segments,
        real_tokens=request.real_tokens,
    )
    return Plan(layout=layout, planner=planner, groups=(group,))


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
