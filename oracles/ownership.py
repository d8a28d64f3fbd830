"""CP ownership oracle: each reference planner's published rule, simulated token by token.

Why it exists: cpmem's planners compute per-rank token counts arithmetically
(round-ups, closed-form causal work, bisection). This module re-derives the same
counts the slow, obvious way, from the rule text in cpmem/plan/planners.py's docstring
and docs/pricing.md ("Layout"): it materializes the packed row as an explicit
list of tokens, each knowing its tree, its segment and how many keys it attends
to, and hands the tokens to CP ranks one at a time. It deliberately imports
nothing from cpmem, so a shared mistake would have to be made twice.

Requests are plain nested data: a tree is ``(tokens, [children...])``; a
request is a sequence of trees (one packed row per tree, rows laid end to end
in request order; segments in depth-first pre-order within a row).

The rules, as simulated here:

- ``balanced`` (Megatron's zigzag): each row padded to a multiple of 2·CP
  (2·CP·TP under SP), cut into 2·CP equal chunks; rank r takes chunks r and
  2·CP-1-r.
- ``attention-work``: all rows end to end, cut into CP contiguous runs. Cut k
  sits at the first token where the cumulative causal work reaches k/CP of the
  total, then rounded up to a 128-token block (never past the end of the row).
  A token's work is the number of keys it attends to: every token of its
  ancestor segments, plus the tokens of its own segment up to and including it.
- ``gdn-segments``: target = real tokens / CP. A subtree no larger than the
  target goes whole to the least-loaded rank; otherwise its root segment goes
  alone (cut, if longer than the target, into ceil(n / ceil(target)) near-equal
  chain pieces, larger pieces first as numpy.array_split does, each piece to the
  least-loaded rank at that moment) and its children are placed recursively in
  order. Ties go to the lowest rank. Attention tokens follow their segment.
- ``chunked`` (the measured runtime's layout, cpmem/plan/chunked.py's docstring and
  docs/layout.md): every token gets a chunk number (512 tokens a chunk; with fewer
  chunks than ranks, ``len // CP`` tokens a chunk with the last chunk running to the
  end; a row shorter than CP: one token a chunk). Each rank owns one contiguous run
  of chunks. A rank's cost is counted token by token: ``pair`` per key each of its
  tokens attends to, ``owned`` per token, ``stage`` per other rank holding a key one
  of its tokens attends to, ``fetch`` per such key position. Start: cut k at the
  first chunk edge where the running sum of chunk costs (keys and owned tokens only)
  reaches k/CP of the total, each rank keeping at least one chunk. Then up to 8
  times: the slowest rank (lowest on ties) tries handing its first chunk to the rank
  before and its last chunk to the rank after (never its only chunk); the try with
  the lower maximum cost wins (the first on ties) and is kept if it lowers the
  maximum. Hybrid: each segment in order, if it holds at most real / CP tokens, goes
  whole to the rank that minimises (largest load, its own load, its index), load =
  max(attention, GDN tokens); a longer one goes token by token to the rank holding
  that token's attention.

With CP = 1 the one rank holds all real tokens. Under SP (TP > 1 and sp on)
each rank's count is finally padded up to a multiple of TP.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

ATTENTION_BLOCK = 128
CHUNK = 512
MOVES = 8
PLANNERS = ("balanced", "attention-work", "gdn-segments", "chunked")

Tree = tuple[int, Sequence["Tree"]]


class Costs(NamedTuple):
    """The chunk planner's constants (any unit, integers: compared exactly)."""

    owned: int  # per owned token
    pair: int  # per key a token attends to
    stage: int  # per other rank holding keys a rank needs
    fetch: int  # per key position held by another rank


class Token(NamedTuple):
    """One position of the packed row. Padding tokens have segment -1 and no keys."""

    tree: int
    segment: int
    keys: int

    @property
    def is_pad(self) -> bool:
        return self.segment < 0


@dataclass(frozen=True)
class SegmentInfo:
    """A node of a prefix tree, numbered in packed-row (pre-order) order."""

    index: int
    tree: int
    tokens: int
    children: tuple[int, ...]
    subtree_tokens: int
    first_token: int  # position of its first token in the packed request


@dataclass(frozen=True)
class Ownership:
    """Per-rank token counts a planner's rule yields (padding included)."""

    planner: str
    attention: tuple[int, ...]
    gdn: tuple[int, ...]
    real: tuple[int, ...]  # real (non-padding) tokens each rank owns
    padding: int  # every padding token added: planner padding plus SP round-up
    real_tokens: int

    @property
    def busiest(self) -> int:
        return max(max(a, g) for a, g in zip(self.attention, self.gdn, strict=True))


def check_tree(tree: Tree) -> None:
    """Reject malformed input early: the oracle should not silently accept junk."""
    tokens, children = tree
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1:
        raise ValueError(f"segment tokens must be a positive int, got {tokens!r}")
    for child in children:
        check_tree(child)


def materialize(trees: Sequence[Tree]) -> tuple[tuple[Token, ...], tuple[SegmentInfo, ...]]:
    """The packed request as explicit tokens, plus the segment table. Both are immutable
    and built once per request however many planners simulate it in turn (the last few
    requests are kept: building a long row token by token is most of a simulation)."""
    if not trees:
        raise ValueError("a request needs at least one tree")
    return _materialize(tuple(_frozen(tree) for tree in trees))


def _frozen(tree: Tree) -> Tree:
    """``tree`` as nested tuples (a request given as lists is the same request)."""
    tokens, children = tree
    return (tokens, tuple(_frozen(child) for child in children))


@functools.lru_cache(maxsize=4)
def _materialize(trees: tuple[Tree, ...]) -> tuple[tuple[Token, ...], tuple[SegmentInfo, ...]]:
    tokens: list[Token] = []
    segments: list[SegmentInfo] = []

    def visit(tree_index: int, node: Tree, above: int) -> int:
        count, children = node
        index = len(segments)
        segments.append(SegmentInfo(index, tree_index, count, (), 0, len(tokens)))
        for pos in range(count):
            tokens.append(Token(tree_index, index, above + pos + 1))
        child_ids = []
        for child in children:
            child_ids.append(visit(tree_index, child, above + count))
        subtree = len(tokens) - segments[index].first_token  # pre-order: every token since is ours
        segments[index] = SegmentInfo(
            index, tree_index, count, tuple(child_ids), subtree, segments[index].first_token
        )
        return index

    for i, tree in enumerate(trees):
        check_tree(tree)
        visit(i, tree, 0)
    return tuple(tokens), tuple(segments)


def simulate(
    planner: str,
    trees: Sequence[Tree],
    cp: int,
    tp: int = 1,
    sp: bool = False,
    costs: Costs | None = None,
    hybrid: bool = False,
) -> Ownership:
    """Run ``planner``'s rule on ``trees`` for a TP x CP grid, one token at a time.

    ``chunked`` needs ``costs`` and whether the model is ``hybrid`` (has GDN layers).
    """
    if planner not in PLANNERS:
        raise ValueError(f"unknown planner {planner!r}")
    if planner == "chunked" and costs is None:
        raise ValueError("the chunked planner needs its costs")
    if cp < 1 or tp < 1:
        raise ValueError(f"cp and tp must be >= 1, got cp={cp} tp={tp}")
    sp_active = sp and tp > 1
    tokens, segments = materialize(trees)
    real_total = len(tokens)
    # owner lists: one entry per token handed to a rank (real or padding)
    held: list[list[Token]] = [[] for _ in range(cp)]
    gdn_counts: list[int] | None = None
    if cp == 1:
        held[0].extend(tokens)
    elif planner == "chunked":
        assert costs is not None
        gdn_counts = _chunked(tokens, segments, held, cp, costs, hybrid)
    elif planner == "balanced":
        _zigzag(tokens, held, cp, tp if sp_active else 1)
    elif planner == "attention-work":
        _attention_work(tokens, held, cp)
    else:
        _gdn_segments(tokens, segments, held, cp)
    if sp_active:
        for rank_tokens in held:
            while len(rank_tokens) % tp:
                rank_tokens.append(Token(-1, -1, 0))
    counts = tuple(len(h) for h in held)
    pads = tuple(sum(1 for t in h if t.is_pad) for h in held)
    real = tuple(n - p for n, p in zip(counts, pads, strict=True))
    padding = sum(pads)
    gdn = counts
    if gdn_counts is not None:
        gdn = tuple(-(-n // tp) * tp if sp_active else n for n in gdn_counts)
    return Ownership(planner, counts, gdn, real, padding, real_total)


def _zigzag(tokens: Sequence[Token], held: list[list[Token]], cp: int, pad_unit: int) -> None:
    multiple = 2 * cp * pad_unit
    rows: dict[int, list[Token]] = {}
    for t in tokens:
        rows.setdefault(t.tree, []).append(t)
    for tree in sorted(rows):
        row = list(rows[tree])
        while len(row) % multiple:
            row.append(Token(tree, -1, 0))
        chunk = len(row) // (2 * cp)
        for i, t in enumerate(row):
            c = i // chunk
            held[c if c < cp else 2 * cp - 1 - c].append(t)


def _attention_work(tokens: Sequence[Token], held: list[list[Token]], cp: int) -> None:
    total = sum(t.keys for t in tokens)
    cuts: list[int] = []
    done = 0
    for i, t in enumerate(tokens):
        done += t.keys
        # cut k: the first token count at which done / total >= k / cp
        while len(cuts) < cp - 1 and done * cp >= (len(cuts) + 1) * total:
            position = i + 1
            while position % ATTENTION_BLOCK:
                position += 1
            cuts.append(min(position, len(tokens)))
    for i, t in enumerate(tokens):
        rank = bisect.bisect_right(cuts, i)  # the cuts at or before i (they only grow)
        held[rank].append(t)


def _gdn_segments(
    tokens: Sequence[Token], segments: Sequence[SegmentInfo], held: list[list[Token]], cp: int
) -> None:
    real = len(tokens)
    piece_cap = -(-real // cp)  # ceil(target)

    def fits_target(n: int) -> bool:
        return n * cp <= real  # n <= real / cp, exactly

    def least_loaded() -> int:
        loads = [len(h) for h in held]
        return loads.index(min(loads))

    def subtree_tokens(seg: SegmentInfo) -> Sequence[Token]:
        return tokens[seg.first_token : seg.first_token + seg.subtree_tokens]

    def place(seg: SegmentInfo) -> None:
        if fits_target(seg.subtree_tokens):
            held[least_loaded()].extend(subtree_tokens(seg))
            return
        own = tokens[seg.first_token : seg.first_token + seg.tokens]
        if fits_target(len(own)):
            held[least_loaded()].extend(own)
        else:
            pieces = -(-len(own) // piece_cap)
            base, extra = divmod(len(own), pieces)
            start = 0
            for p in range(pieces):
                size = base + (1 if p < extra else 0)
                held[least_loaded()].extend(own[start : start + size])
                start += size
        for child in seg.children:
            place(segments[child])

    children = {c for s in segments for c in s.children}
    for seg in segments:
        if seg.index not in children:  # a root: one packed row, in request order
            place(seg)


def _chunked(
    tokens: Sequence[Token],
    segments: Sequence[SegmentInfo],
    held: list[list[Token]],
    cp: int,
    costs: Costs,
    hybrid: bool,
) -> list[int]:
    """Hand each rank a contiguous run of chunks; return every rank's GDN token count."""
    n = len(tokens)
    # every token's chunk number
    if -(-n // CHUNK) >= cp:
        chunk_of = [i // CHUNK for i in range(n)]
    elif n < cp:
        chunk_of = list(range(n))
    else:
        chunk_of = [min(i // (n // cp), cp - 1) for i in range(n)]
    chunks = chunk_of[-1] + 1
    first_of_chunk = [0] * (chunks + 1)
    for i in range(n - 1, -1, -1):
        first_of_chunk[chunk_of[i]] = i
    first_of_chunk[chunks] = n

    parent: dict[int, int] = {}
    for seg in segments:
        for child in seg.children:
            parent[child] = seg.index

    def ancestors(seg: int) -> list[int]:
        out = []
        while seg in parent:
            seg = parent[seg]
            out.append(seg)
        return out

    needs: dict[tuple[int, int], tuple[int, list[tuple[int, int]]]] = {}

    def need(start: int, stop: int) -> tuple[int, list[tuple[int, int]]]:
        """Keys attended by the tokens at [start, stop), and the runs of key positions
        outside it (memoised: a range's needs do not depend on the other ranks)."""
        if (start, stop) not in needs:
            keys = 0
            whole: set[int] = set()
            reach: dict[int, int] = {}
            for i in range(start, stop):
                t = tokens[i]
                keys += t.keys
                reach[t.segment] = i
            for seg in reach:  # every segment with a token in the range
                whole.update(ancestors(seg))
            needed = bytearray(n)
            for seg in whole:
                info = segments[seg]
                for p in range(info.first_token, info.first_token + info.tokens):
                    needed[p] = 1
            for seg, last in reach.items():
                for p in range(segments[seg].first_token, last + 1):
                    needed[p] = 1
            runs: list[tuple[int, int]] = []
            for p in range(n):
                if needed[p] and not start <= p < stop:
                    if runs and runs[-1][1] == p:
                        runs[-1] = (runs[-1][0], p + 1)
                    else:
                        runs.append((p, p + 1))
            needs[start, stop] = (keys, runs)
        return needs[start, stop]

    def rank_cost(start: int, stop: int, owner: list[int], me: int) -> int:
        if start == stop:
            return 0
        keys, runs = need(start, stop)
        fetched = sum(b - a for a, b in runs)
        holders = {owner[p] for a, b in runs for p in range(a, b)}
        holders.discard(me)
        return (
            costs.pair * keys
            + costs.owned * (stop - start)
            + costs.stage * len(holders)
            + costs.fetch * fetched
        )

    def evaluate(bounds: list[int]) -> list[int]:
        starts = [first_of_chunk[b] for b in bounds]
        owner = [0] * n
        for r in range(cp):
            for p in range(starts[r], starts[r + 1]):
                owner[p] = r
        return [rank_cost(starts[r], starts[r + 1], owner, r) for r in range(cp)]

    if chunks < cp:
        bounds = [min(r, chunks) for r in range(cp + 1)]
    else:
        chunk_cost = [0] * chunks
        for i, t in enumerate(tokens):
            chunk_cost[chunk_of[i]] += costs.pair * t.keys + costs.owned
        total = sum(chunk_cost)
        bounds = [0]
        for k in range(1, cp):
            running, cut = 0, chunks
            for edge in range(1, chunks):
                running += chunk_cost[edge - 1]
                if running * cp >= k * total:
                    cut = edge
                    break
            cut = max(cut, bounds[-1] + 1)
            cut = min(cut, chunks - (cp - k))
            bounds.append(cut)
        bounds.append(chunks)
        rank_costs = evaluate(bounds)
        for _ in range(MOVES):
            slowest = max(range(cp), key=lambda r: (rank_costs[r], -r))
            if bounds[slowest + 1] - bounds[slowest] <= 1:
                break
            tries = []
            if slowest > 0:
                left = list(bounds)
                left[slowest] += 1
                tries.append(left)
            if slowest < cp - 1:
                right = list(bounds)
                right[slowest + 1] -= 1
                tries.append(right)
            scored = [(max(evaluate(b)), i, b) for i, b in enumerate(tries)]
            best_max, _, best = min(scored)
            if best_max >= rank_costs[slowest]:
                break
            bounds = best
            rank_costs = evaluate(bounds)

    attention_owner = [0] * n
    for r in range(cp):
        for p in range(first_of_chunk[bounds[r]], first_of_chunk[bounds[r + 1]]):
            attention_owner[p] = r
            held[r].append(tokens[p])
    attention = [len(h) for h in held]
    if not hybrid:
        return attention
    gdn = [0] * cp
    for seg in segments:  # pre-order: packed-row order
        if seg.tokens * cp <= n:
            best_rank, best_key = 0, None
            for r in range(cp):
                loads = [
                    max(attention[q], gdn[q] + (seg.tokens if q == r else 0)) for q in range(cp)
                ]
                key = (max(loads), loads[r], r)
                if best_key is None or key < best_key:
                    best_rank, best_key = r, key
            gdn[best_rank] += seg.tokens
        else:
            for p in range(seg.first_token, seg.first_token + seg.tokens):
                gdn[attention_owner[p]] += 1
    return gdn
