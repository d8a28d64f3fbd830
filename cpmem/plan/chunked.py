"""The chunk planner: CP ranks laid out as the runtime the CP cells were measured on.

Source: the measured runtime's public planner, as docs/layout.md ("The chunk planner")
states it; what it marks *inferred* is inferred here too. ``oracles/ownership.py``
re-derives the same rule token by token.

Read in code (runtime-layout.md, "Attention layout", "GDN layout"):

- The packed row (all trees of the forward, end to end) is cut into 512-token
  chunks (four 128-token blocks; the last chunk partial). With fewer chunks than CP
  ranks the row is re-cut into CP chunks of ``len(row) // CP`` tokens (the last one
  takes the remainder, *inferred*: a partial chunk of a few tokens would be left on
  a rank of its own; a row shorter than CP: 1-token chunks, and the ranks past the
  row's end hold nothing).
- Each rank owns ONE contiguous range of chunks, chosen by a cost model of each
  rank's forward + backward time, then improved by up to ``MAX_MOVES`` = 8 moves,
  each shifting one boundary chunk of the slowest rank to its neighbour when that
  lowers the maximum. No move empties a rank.
- Hybrid models: a GDN segment is kept whole on one rank or chained (split
  across ranks following the attention layout); a rank's load is
  max(attention tokens, GDN tokens).

Inferred (runtime-layout.md gives the constants, not the code):

- A rank's cost (``ChunkCosts``), in integer femtoseconds so that this module and
  the oracle compare costs exactly:
  - causal attention work over the prefix tree: a token attends to its ancestors'
    tokens and to its own segment up to itself; each query-key pair costs
    ``pair`` = 3 * 4 * Q / 400e12 s (QK^T and PV, 2 FLOPs per element each; three
    times the forward for forward + backward; 400 TFLOP/s, the throughput the
    owned-token cost assumes). runtime-layout.md names the term, not its constant.
  - per owned token ``owned`` = 3 * (8 h^2 + 6 h f) / 400e12 s (runtime-layout.md:
    about 0.0008 ms for Qwen3-1.7B, 0.0056 ms for the 27B; one third forward, two
    thirds backward, so the sum is what a rank spends on it).
  - per remote stage ``stage`` = 1.2 ms forward + 1.2 ms backward; a rank has one
    stage per other rank that holds keys its tokens attend to.
  - per fetched token ``fetch`` = 3e-5 ms fetched in forward + 3e-5 ms reduced in
    backward, for every key position held by another rank.
- The starting split: cut k sits at the first chunk edge where the cumulative
  stand-alone chunk cost (attention work + owned tokens) reaches k/CP of the total,
  kept so every rank has at least one chunk. Moves: the slowest rank (ties: the
  lowest) tries giving its first chunk to the rank before it and its last chunk to
  the rank after it; the candidate with the lower new maximum (ties: the first) is
  taken if it lowers the maximum, else planning stops.
- GDN: a segment no longer than real tokens / CP is kept whole on the rank that
  minimises (the largest load, then that rank's own load, then its index), segments
  in packed-row order; a longer one is chained (each rank takes the part of it its
  attention range holds).

Where the recorded cells come out (``tests/unit/plan/test_chunked.py`` checks them):
the 1.7B 4096+4096 pair sharing 1,228 -> 5,120 / 1,844 (this model holds 5,120 for an
owned-token cost between about 0.00058 and 0.00083 ms; the 1.7B's is 0.00082), the
256+256 pair sharing 76 -> 218 / 218, unshared pairs one sequence per rank. For the
27B pair this model splits attention 3,584 / 3,380 where runtime-layout.md reports
4,096 / 2,868; GDN keeps the prefix with one completion, so the busiest rank holds
4,096 either way.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from cpmem.model.geometry import ModelGeometry
from cpmem.plan.request import Request, Segment

CHUNK_TOKENS = 512
MAX_MOVES = 8
FS_PER_MS = 10**12
STAGE_FS = 2 * 12 * FS_PER_MS // 10  # 1.2 ms forward + 1.2 ms backward per remote stage
FETCH_FS = 2 * 3 * FS_PER_MS // 100_000  # 3e-5 ms fetch (forward) + 3e-5 ms reduce (backward)


@dataclass(frozen=True)
class ChunkCosts:
    """The cost model's constants, in femtoseconds (integers: costs compare exactly)."""

    owned: int  # per token a rank owns (forward + backward)
    pair: int  # per causal query-key pair (forward + backward)
    stage: int = STAGE_FS  # per other rank a rank fetches keys from
    fetch: int = FETCH_FS  # per key position fetched from another rank


def chunk_costs(geometry: ModelGeometry) -> ChunkCosts:
    """The cost constants of ``geometry`` (module docstring: where each comes from).

    owned = 3 (8 h^2 + 6 h f) / 400e12 s = 7.5 (8 h^2 + 6 h f) fs; pair = 3 * 4 Q /
    400e12 s = 30 Q fs. An MoE layer's f is the routed experts' width plus the shared
    expert's (top-k * expert FFN + shared FFN).
    """
    h = geometry.hidden
    f = (
        geometry.ffn
        if geometry.ffn
        else (geometry.moe_top_k * geometry.expert_ffn + geometry.shared_expert_ffn)
    )
    return ChunkCosts(owned=15 * (8 * h * h + 6 * h * f) // 2, pair=30 * geometry.q_width)


@dataclass(frozen=True)
class _Span:
    """A segment in the packed row: where it starts, its length, tokens above it, and
    the (start, end) position ranges of its ancestors."""

    start: int
    tokens: int
    above: int
    ancestors: tuple[tuple[int, int], ...]

    @property
    def end(self) -> int:
        return self.start + self.tokens


def _spans(request: Request) -> list[_Span]:
    spans: list[_Span] = []
    pos = 0

    def visit(seg: Segment, above: int, ancestors: tuple[tuple[int, int], ...]) -> None:
        nonlocal pos
        start = pos
        spans.append(_Span(start, seg.tokens, above, ancestors))
        pos += seg.tokens
        for child in seg.children:
            visit(child, above + seg.tokens, (*ancestors, (start, start + seg.tokens)))

    for tree in request.trees:
        visit(tree, 0, ())
    return spans


def chunk_edges(real_tokens: int, cp: int) -> list[int]:
    """Chunk boundaries (positions) of a packed row of ``real_tokens`` for ``cp`` ranks."""
    n = real_tokens
    if -(-n // CHUNK_TOKENS) >= cp:
        return [*range(0, n, CHUNK_TOKENS), n]
    if n < cp:
        return list(range(n + 1))  # 1-token chunks; ranks past the end hold nothing
    size = n // cp
    return [*(size * k for k in range(cp)), n]  # the last chunk takes the remainder


class _Row:
    """The packed row's cost arithmetic for one request and one set of constants."""

    def __init__(self, request: Request, costs: ChunkCosts) -> None:
        self.spans = _spans(request)
        self.costs = costs
        self.n = request.real_tokens

    def _overlapping(self, s: int, e: int) -> list[_Span]:
        return [sp for sp in self.spans if sp.start < e and sp.end > s]

    def work(self, s: int, e: int) -> int:
        """Causal query-key pairs of the tokens at positions [s, e)."""
        total = 0
        for sp in self._overlapping(s, e):
            lo, hi = max(s, sp.start) - sp.start, min(e, sp.end) - sp.start
            total += (hi - lo) * sp.above + (hi * (hi + 1) - lo * (lo + 1)) // 2
        return total

    def chunk_work(self, edges: Sequence[int]) -> list[int]:
        """``work`` of every chunk ``[edges[k], edges[k + 1])`` at once: the spans are
        contiguous and in position order, so each span adds its pairs to the run of
        chunks it overlaps (the same integer sums as ``work`` chunk by chunk; int64
        holds them: a million-token row has about 5e11 pairs). numpy is imported here, not
        with the module: a plan that never chunks (every hybrid model's) does without it."""
        import numpy as np

        edge = np.asarray(edges, dtype=np.int64)
        starts, ends = edge[:-1], edge[1:]
        out = np.zeros(len(starts), dtype=np.int64)
        for sp in self.spans:
            first = int(np.searchsorted(ends, sp.start, side="right"))  # ends after its start
            stop = int(np.searchsorted(starts, sp.end, side="left"))  # starts before its end
            if first >= stop:
                continue
            lo = np.maximum(starts[first:stop], sp.start) - sp.start
            hi = np.minimum(ends[first:stop], sp.end) - sp.start
            out[first:stop] += (hi - lo) * sp.above + (hi * (hi + 1) - lo * (lo + 1)) // 2
        return [int(w) for w in out.tolist()]

    def needed_outside(self, s: int, e: int) -> list[tuple[int, int]]:
        """Key positions outside [s, e) that tokens in [s, e) attend to, as merged ranges."""
        ranges: list[tuple[int, int]] = []
        for sp in self._overlapping(s, e):
            ranges.extend(sp.ancestors)
            ranges.append((sp.start, min(e, sp.end)))
        outside: list[tuple[int, int]] = []
        for a, b in ranges:
            for lo, hi in ((a, min(b, s)), (max(a, e), b)):
                if lo < hi:
                    outside.append((lo, hi))
        merged: list[tuple[int, int]] = []
        for a, b in sorted(outside):
            if merged and a <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], b))
            else:
                merged.append((a, b))
        return merged

    def rank_costs(self, ranges: Sequence[tuple[int, int]]) -> list[int]:
        """Every rank's forward + backward cost for the given token ranges."""
        c = self.costs
        out = []
        for r, (s, e) in enumerate(ranges):
            if s == e:
                out.append(0)
                continue
            needed = self.needed_outside(s, e)
            fetched = sum(b - a for a, b in needed)
            stages = sum(
                1
                for q, (qs, qe) in enumerate(ranges)
                if q != r and qs < qe and any(a < qe and b > qs for a, b in needed)
            )
            out.append(
                c.pair * self.work(s, e) + c.owned * (e - s) + c.stage * stages + c.fetch * fetched
            )
        return out


def _initial_bounds(row: _Row, edges: list[int], cp: int) -> list[int]:
    """Chunk indices b_0 = 0 <= ... <= b_cp = m: rank r owns chunks [b_r, b_{r+1})."""
    m = len(edges) - 1
    if m < cp:
        return [min(r, m) for r in range(cp + 1)]
    works = row.chunk_work(edges)
    unit = [
        row.costs.pair * w + row.costs.owned * (b - a)
        for w, (a, b) in zip(works, itertools.pairwise(edges), strict=True)
    ]
    total = sum(unit)
    cum = list(itertools.accumulate(unit, initial=0))
    bounds = [0]
    for k in range(1, cp):
        # the first chunk index i in [1, m) with cum[i] * cp >= k * total (cum ascends)
        b = bisect.bisect_left(cum, -(-k * total // cp), 1, m)
        bounds.append(min(max(b, bounds[-1] + 1), m - (cp - k)))
    bounds.append(m)
    return bounds


def _attention_ranges(row: _Row, cp: int) -> list[tuple[int, int]]:
    edges = chunk_edges(row.n, cp)
    bounds = _initial_bounds(row, edges, cp)

    def ranges_of(bs: list[int]) -> list[tuple[int, int]]:
        return [(edges[bs[r]], edges[bs[r + 1]]) for r in range(cp)]

    costs = row.rank_costs(ranges_of(bounds))
    for _ in range(MAX_MOVES):
        worst = max(costs)
        slow = costs.index(worst)
        if bounds[slow + 1] - bounds[slow] < 2:
            break  # a move would empty the slowest rank
        candidates = []
        if slow > 0:
            candidates.append([*bounds[:slow], bounds[slow] + 1, *bounds[slow + 1 :]])
        if slow < cp - 1:
            candidates.append([*bounds[: slow + 1], bounds[slow + 1] - 1, *bounds[slow + 2 :]])
        best: tuple[int, list[int], list[int]] | None = None
        for cand in candidates:
            new = row.rank_costs(ranges_of(cand))
            if best is None or max(new) < best[0]:
                best = (max(new), cand, new)
        if best is None or best[0] >= worst:
            break
        _, bounds, costs = best
    return ranges_of(bounds)


def chunked_loads(
    request: Request, cp: int, costs: ChunkCosts, hybrid: bool
) -> tuple[list[int], list[int]]:
    """Per CP rank: (attention tokens, GDN tokens) of the chunk planner's layout."""
    row = _Row(request, costs)
    ranges = _attention_ranges(row, cp)
    attention = [e - s for s, e in ranges]
    if not hybrid:
        return attention, list(attention)
    gdn = [0] * cp
    for sp in row.spans:
        if sp.tokens * cp <= row.n:  # whole: fits real tokens / CP

            def key(r: int, tokens: int = sp.tokens) -> tuple[int, int, int]:
                loads = [
                    max(a, g + (tokens if q == r else 0))
                    for q, (a, g) in enumerate(zip(attention, gdn, strict=True))
                ]
                return (max(loads), loads[r], r)

            gdn[min(range(cp), key=key)] += sp.tokens
        else:  # chained along the attention layout
            for r, (s, e) in enumerate(ranges):
                gdn[r] += max(0, min(e, sp.end) - max(s, sp.start))
    return attention, gdn
