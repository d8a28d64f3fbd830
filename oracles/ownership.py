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

With CP = 1 the one rank holds all real tokens. Under SP (TP > 1 and sp on)
each rank's count is finally padded up to a multiple of TP.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

ATTENTION_BLOCK = 128
PLANNERS = ("balanced", "attention-work", "gdn-segments")

Tree = tuple[int, Sequence["Tree"]]


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


def materialize(trees: Sequence[Tree]) -> tuple[list[Token], list[SegmentInfo]]:
    """The packed request as explicit tokens, plus the segment table."""
    if not trees:
        raise ValueError("a request needs at least one tree")
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
    return tokens, segments


def simulate(
    planner: str, trees: Sequence[Tree], cp: int, tp: int = 1, sp: bool = False
) -> Ownership:
    """Run ``planner``'s rule on ``trees`` for a TP x CP grid, one token at a time."""
    if planner not in PLANNERS:
        raise ValueError(f"unknown planner {planner!r}")
    if cp < 1 or tp < 1:
        raise ValueError(f"cp and tp must be >= 1, got cp={cp} tp={tp}")
    sp_active = sp and tp > 1
    tokens, segments = materialize(trees)
    real_total = len(tokens)
    # owner lists: one entry per token handed to a rank (real or padding)
    held: list[list[Token]] = [[] for _ in range(cp)]
    if cp == 1:
        held[0].extend(tokens)
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
    real = tuple(sum(1 for t in h if not t.is_pad) for h in held)
    padding = sum(1 for h in held for t in h if t.is_pad)
    return Ownership(planner, counts, counts, real, padding, real_total)


def _zigzag(tokens: list[Token], held: list[list[Token]], cp: int, pad_unit: int) -> None:
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


def _attention_work(tokens: list[Token], held: list[list[Token]], cp: int) -> None:
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
        rank = sum(1 for c in cuts if c <= i)
        held[rank].append(t)


def _gdn_segments(
    tokens: list[Token], segments: list[SegmentInfo], held: list[list[Token]], cp: int
) -> None:
    real = len(tokens)
    piece_cap = -(-real // cp)  # ceil(target)

    def fits_target(n: int) -> bool:
        return n * cp <= real  # n <= real / cp, exactly

    def least_loaded() -> int:
        loads = [len(h) for h in held]
        return loads.index(min(loads))

    def subtree_tokens(seg: SegmentInfo) -> list[Token]:
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
