"""The packed row cut into CP ranks, and the collectives that move tokens between them.

Why: CP attention in the torch engine is "each rank's queries against keys/values
all-gathered from every rank". Which keys a query may see (its ancestors in the
shared-prefix tree, then its own segment's head), which rope positions a rank owns,
and where a GDN state crosses a rank boundary all follow from the row layout here.
Rank r owns a contiguous run of exactly the length cpmem's default planner gives it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cpmem.errors import InputError
from cpmem.plan.request import Request

from .torchlib import load_torch


@dataclass(frozen=True)
class SegmentSpan:
    """A segment of the packed row: global start, tokens, parent and sequence offset."""

    start: int
    tokens: int
    parent: int | None
    offset: int  # tokens above it on its root-to-leaf path (rope position of its first token)

    @property
    def stop(self) -> int:
        return self.start + self.tokens


@dataclass(frozen=True)
class Piece:
    """The part of one segment that one rank owns: global [start, stop)."""

    segment: int
    start: int
    stop: int


@dataclass(frozen=True)
class RowLayout:
    """The packed row (pre-order segments, padding last) cut into contiguous rank runs."""

    segments: tuple[SegmentSpan, ...]
    rank_tokens: tuple[int, ...]

    @classmethod
    def from_plan(cls, request: Request, rank_tokens: Sequence[int]) -> RowLayout:
        spans: list[SegmentSpan] = []

        def visit(seg: Any, parent: int | None, offset: int) -> None:
            start = spans[-1].stop if spans else 0
            spans.append(SegmentSpan(start, seg.tokens, parent, offset))
            me = len(spans) - 1
            for child in seg.children:
                visit(child, me, offset + seg.tokens)

        for tree in request.trees:
            visit(tree, None, 0)
        extra = sum(rank_tokens) - spans[-1].stop
        if extra > 0:  # planner padding: a separate root that attends only to itself
            spans.append(SegmentSpan(spans[-1].stop, extra, None, 0))
        elif extra < 0:
            raise InputError("rank_tokens", list(rank_tokens), "hold fewer tokens than the row")
        return cls(tuple(spans), tuple(rank_tokens))

    @property
    def total(self) -> int:
        return self.segments[-1].stop

    def rank_range(self, rank: int) -> tuple[int, int]:
        lo = sum(self.rank_tokens[:rank])
        return lo, lo + self.rank_tokens[rank]

    def pieces(self, rank: int) -> list[Piece]:
        lo, hi = self.rank_range(rank)
        return [
            Piece(i, max(s.start, lo), min(s.stop, hi))
            for i, s in enumerate(self.segments)
            if max(s.start, lo) < min(s.stop, hi)
        ]

    def key_ranges(self, piece: Piece) -> list[tuple[int, int]]:
        """Global key ranges a piece's queries see: its ancestors, then its own head."""
        chain: list[tuple[int, int]] = []
        parent = self.segments[piece.segment].parent
        while parent is not None:
            s = self.segments[parent]
            chain.append((s.start, s.stop))
            parent = s.parent
        ranges = [*reversed(chain), (self.segments[piece.segment].start, piece.stop)]
        merged: list[tuple[int, int]] = []
        for a, b in ranges:  # contiguous ranges become one slice (a view, no copy)
            if merged and merged[-1][1] == a:
                merged[-1] = (merged[-1][0], b)
            else:
                merged.append((a, b))
        return merged

    def positions(self, rank: int) -> list[int]:
        """Rope position of every token the rank owns (position within its sequence)."""
        out: list[int] = []
        for p in self.pieces(rank):
            s = self.segments[p.segment]
            out.extend(range(s.offset + p.start - s.start, s.offset + p.stop - s.start))
        return out

    def owner_of_end(self, position: int, segment: int) -> tuple[int, int] | None:
        """(rank, index among that rank's pieces) of the piece of ``segment`` ending at
        ``position``; the GDN state there is that piece's final state."""
        for rank in range(len(self.rank_tokens)):
            for i, p in enumerate(self.pieces(rank)):
                if p.segment == segment and p.stop == position:
                    return rank, i
        return None


class Dist:
    """The process group and how to move tensors through it (CPU staging under gloo)."""

    def __init__(self, rank: int, world: int, device: Any) -> None:
        torch = load_torch()
        self.rank, self.world, self.device = rank, world, device
        self.active = world > 1 and torch.distributed.is_initialized()
        self.stage = self.active and torch.distributed.get_backend() == "gloo"

    def _out(self, t: Any) -> Any:
        return t.cpu() if self.stage else t

    def all_gather_rows(self, local: Any, counts: Sequence[int]) -> Any:
        """Rows of every rank concatenated in rank order (uneven counts padded in transit)."""
        torch = load_torch()
        width = max(counts)
        buf = local.new_zeros((width, *local.shape[1:]))
        buf[: local.shape[0]] = local
        buf = self._out(buf)
        parts = [torch.empty_like(buf) for _ in range(self.world)]
        torch.distributed.all_gather(parts, buf)
        return torch.cat([p[:n] for p, n in zip(parts, counts, strict=True)]).to(self.device)

    def all_reduce(self, t: Any) -> Any:
        torch = load_torch()
        staged = self._out(t.contiguous().clone())
        torch.distributed.all_reduce(staged)
        return staged.to(self.device)

    def broadcast(self, t: Any, src: int) -> Any:
        torch = load_torch()
        staged = self._out(t.contiguous())
        torch.distributed.broadcast(staged, src)
        return staged.to(self.device)


def gather_tokens(local: Any, counts: Sequence[int], dist: Dist) -> Any:
    """Differentiable all-gather along tokens: backward sums every rank's gradient and
    keeps this rank's slice (what a reduce-scatter would give)."""
    torch = load_torch()

    class _Gather(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any) -> Any:
            return dist.all_gather_rows(x, counts)

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            full = dist.all_reduce(grad)
            lo = sum(counts[: dist.rank])
            return full[lo : lo + counts[dist.rank]]

    return _Gather.apply(local)
