"""The tokens one simulated rank holds: plain counts handed in by the caller.

The oracle never plans. A caller (cpmem's planner through ``__main__``, the golden
cell's recorded layout in ``validation``, or the user's ``--rank-tokens``) says how
many tokens each CP rank runs in attention layers and in GDN layers, and how the
simulated rank's GDN tokens split into prefix-tree segment pieces.
"""

from __future__ import annotations

from dataclasses import dataclass

from oracles.rank_sim.geometry import SimInputError


@dataclass(frozen=True)
class GdnPiece:
    """A run of one segment on this rank. ``parent`` is the index of the local piece
    whose final recurrent state it starts from; None when the state is a fresh one
    (a root segment, or a state received from another rank)."""

    tokens: int
    parent: int | None = None


@dataclass(frozen=True)
class RankLayout:
    """Per-CP-rank token counts (TP padding included) and the simulated rank's pieces."""

    tp: int
    cp: int
    rank: int  # CP coordinate of the simulated rank
    attention_tokens: tuple[int, ...]  # per CP rank
    gdn_tokens: tuple[int, ...]  # per CP rank (equal to attention_tokens for dense models)
    gdn_pieces: tuple[GdnPiece, ...]  # the simulated rank's GDN segment pieces, in order
    logical_tokens: int  # tokens the step returns (shared prefixes unpacked)
    sequence_parallel: bool = True
    tp_rank: int = 0

    @property
    def sp(self) -> bool:
        return self.sequence_parallel and self.tp > 1

    @property
    def attn_local(self) -> int:
        return self.attention_tokens[self.rank]

    @property
    def gdn_local(self) -> int:
        return self.gdn_tokens[self.rank]

    @property
    def packed_tokens(self) -> int:
        return sum(self.attention_tokens)

    def check(self, hybrid: bool) -> None:
        """Raise SimInputError naming the field that does not add up."""
        if self.cp < 1:
            raise SimInputError("cp", self.cp, "must be >= 1")
        if len(self.attention_tokens) != self.cp:
            raise SimInputError(
                "rank_tokens",
                list(self.attention_tokens),
                f"needs one count per CP rank ({self.cp})",
            )
        if len(self.gdn_tokens) != self.cp:
            raise SimInputError("gdn_tokens", list(self.gdn_tokens), "needs one count per CP rank")
        if not 0 <= self.rank < self.cp:
            raise SimInputError("rank", self.rank, f"outside 0..{self.cp - 1}")
        if not 0 <= self.tp_rank < self.tp:
            raise SimInputError("tp_rank", self.tp_rank, f"outside 0..{self.tp - 1}")
        for name, counts in (
            ("rank_tokens", self.attention_tokens),
            ("gdn_tokens", self.gdn_tokens),
        ):
            if any(c < 1 for c in counts):
                raise SimInputError(name, list(counts), "every CP rank needs >= 1 token")
            if self.sp and any(c % self.tp for c in counts):
                raise SimInputError(name, list(counts), f"not multiples of TP={self.tp} (SP)")
        if sum(self.gdn_tokens) != sum(self.attention_tokens):
            raise SimInputError(
                "gdn_tokens",
                sum(self.gdn_tokens),
                f"!= {sum(self.attention_tokens)} attention tokens",
            )
        if hybrid:
            total = sum(p.tokens for p in self.gdn_pieces)
            if total != self.gdn_local:
                raise SimInputError("segments", total, f"!= the rank's {self.gdn_local} GDN tokens")
            for i, p in enumerate(self.gdn_pieces):
                if p.tokens < 1 or (p.parent is not None and not 0 <= p.parent < i):
                    raise SimInputError(
                        "segments", p, "bad piece (tokens < 1 or parent not earlier)"
                    )
        if self.logical_tokens < 1:
            raise SimInputError("logical_tokens", self.logical_tokens, "must be >= 1")


def row_segments(
    lengths: tuple[int, ...] | list[int], shared_prefix: int, packed: int
) -> list[tuple[int, int | None]]:
    """(tokens, parent index) of a packed row in pre-order: the shared prefix stored once
    when ``packed`` says it was shared, then each completion; padding as 1-token roots."""
    p = shared_prefix
    shared = p > 0 and packed < sum(lengths)
    segs: list[tuple[int, int | None]] = (
        [(p, None)] + [(n - p, 0) for n in lengths] if shared else [(n, None) for n in lengths]
    )
    pad = packed - sum(t for t, _ in segs)
    if pad < 0:
        raise SimInputError("packed_tokens", packed, f"fewer than the {packed - pad} row tokens")
    return segs + [(1, None)] * pad


def rank_pieces(segs: list[tuple[int, int | None]], lo: int, hi: int) -> tuple[GdnPiece, ...]:
    """Pieces of the row's tokens [lo, hi): a piece continues from a local parent piece."""
    pieces: list[GdnPiece] = []
    local: dict[int, int] = {}  # segment index -> index of its piece on this rank
    start = 0
    for i, (tokens, parent) in enumerate(segs):
        a, b = max(start, lo), min(start + tokens, hi)
        if a < b:
            src = local.get(parent) if (a == start and parent is not None) else None
            local[i] = len(pieces)
            pieces.append(GdnPiece(b - a, src))
        start += tokens
    return tuple(pieces)


def contiguous_layout(
    segs: list[tuple[int, int | None]],
    attention_tokens: tuple[int, ...],
    gdn_tokens: tuple[int, ...],
    *,
    tp: int,
    rank: int,
    logical_tokens: int,
    sp: bool = True,
) -> RankLayout:
    """Ranks own contiguous runs of the row in rank order (GDN pieces cut from the GDN
    counts); the caller's counts are taken as given."""
    lo = sum(gdn_tokens[:rank])
    pieces = rank_pieces(segs, lo, lo + gdn_tokens[rank]) if 0 <= rank < len(gdn_tokens) else ()
    return RankLayout(
        tp, len(attention_tokens), rank, attention_tokens, gdn_tokens, pieces, logical_tokens, sp
    )
