"""Plans: who owns which tokens. Pricing reads a plan; planners (or a runtime) write one."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cpmem.errors import InputError, require_nonnegative_int, require_positive_int
from cpmem.plan.layout import ParallelLayout, round_up


@dataclass(frozen=True)
class ForwardGroup:
    """One forward's layout: the global counts and each CP rank's token counts.

    ``attention_tokens[r]`` / ``gdn_tokens[r]`` are the tokens rank r holds in
    attention and in GDN layers (they differ when the runtime cuts the packed row
    differently for the two); padding included. ``rank_segments[r]`` bounds the
    gradient-enabled segments whose recurrent (GDN) state rank r holds: the layout's
    planner knows whether it places whole segments (``segment_bounds``); empty means
    every segment on every rank.
    """

    logical_tokens: int
    packed_tokens: int
    attention_tokens: tuple[int, ...]
    gdn_tokens: tuple[int, ...]
    grad_segments: int
    real_tokens: int
    rank_segments: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        require_positive_int("logical_tokens", self.logical_tokens)
        require_positive_int("packed_tokens", self.packed_tokens)
        require_nonnegative_int("grad_segments", self.grad_segments)
        if len(self.attention_tokens) != len(self.gdn_tokens):
            raise InputError(
                "gdn_tokens", self.gdn_tokens, "needs one count per rank, like attention_tokens"
            )
        if not self.rank_segments:
            every = (self.grad_segments,) * len(self.attention_tokens)
            object.__setattr__(self, "rank_segments", every)
        if len(self.rank_segments) != len(self.attention_tokens):
            raise InputError(
                "rank_segments",
                self.rank_segments,
                "needs one count per rank, like attention_tokens",
            )
        for name in ("attention_tokens", "gdn_tokens", "rank_segments"):
            for r, n in enumerate(getattr(self, name)):
                require_nonnegative_int(f"{name}[{r}]", n)
        for r, n in enumerate(self.rank_segments):
            if n > self.grad_segments:
                raise InputError(
                    f"rank_segments[{r}]", n, f"exceeds grad_segments ({self.grad_segments})"
                )

    def model_tokens(self, tp: int) -> tuple[int, ...]:
        """Per rank: the larger of its attention and GDN counts, rounded up to TP."""
        return tuple(
            round_up(max(a, g), tp)
            for a, g in zip(self.attention_tokens, self.gdn_tokens, strict=True)
        )


@dataclass(frozen=True)
class Plan:
    """A request's layout on the TP x CP grid, as one or more forward groups."""

    layout: ParallelLayout
    planner: str
    groups: tuple[ForwardGroup, ...]

    def __post_init__(self) -> None:
        if not self.groups:
            raise InputError("groups", self.groups, "a plan needs at least one forward group")
        for i, g in enumerate(self.groups):
            if len(g.attention_tokens) != self.layout.cp:
                raise InputError(
                    f"groups[{i}].rank_tokens",
                    list(g.attention_tokens),
                    f"needs one count per CP rank (cp={self.layout.cp})",
                )

    @property
    def logical_tokens(self) -> int:
        return sum(g.logical_tokens for g in self.groups)

    @property
    def packed_tokens(self) -> int:
        return sum(g.packed_tokens for g in self.groups)

    @property
    def grad_segments(self) -> int:
        return sum(g.grad_segments for g in self.groups)

    @property
    def rank_tokens(self) -> tuple[int, ...]:
        """Model tokens each rank holds, summed over forward groups."""
        per_group = [g.model_tokens(self.layout.tp) for g in self.groups]
        return tuple(sum(col) for col in zip(*per_group, strict=True))

    @property
    def rank_segments(self) -> tuple[int, ...]:
        """Gradient-enabled segments whose state each rank may hold, summed over groups."""
        per_group = [g.rank_segments for g in self.groups]
        return tuple(sum(col) for col in zip(*per_group, strict=True))

    @property
    def busiest_rank(self) -> int:
        ranks = self.rank_tokens
        return ranks.index(max(ranks))

    @property
    def busiest_tokens(self) -> int:
        """The reference's R under CP: the busiest rank's tokens, summed over groups."""
        return sum(max(g.model_tokens(self.layout.tp)) for g in self.groups)

    @property
    def padding_tokens(self) -> int:
        """Tokens the planner added on top of the real (shared) tokens."""
        return sum(sum(g.model_tokens(self.layout.tp)) - g.real_tokens for g in self.groups)


def segment_bounds(segments: int, cp: int, whole: bool) -> tuple[int, ...]:
    """Per CP rank, the most gradient-enabled segments whose state it can hold.

    A layout that places whole prefix-tree segments (``whole``) and has at least one
    segment per rank leaves one or more on every other rank: no rank holds more than
    ``segments - (CP - 1)``, and each holds at least one. With fewer segments than ranks
    segments must be cut, and a rank's run can hold a piece of every one (the rank
    simulator's ``qwen3.5-27b:tp2:cp8:pack4-uneven`` has pieces of two on its busiest
    rank and on its last). A layout that cuts every sequence over all ranks leaves every
    segment's state on every rank.
    """
    if whole and segments >= cp > 1:
        return (max(1, segments - (cp - 1)),) * cp
    return (segments,) * cp


def explicit_plan(
    layout: ParallelLayout,
    *,
    logical_tokens: int,
    packed_tokens: int,
    grad_segments: int,
    rank_tokens: Sequence[int] | None = None,
    busiest_tokens: int | None = None,
    gdn_rank_tokens: Sequence[int] | None = None,
    rank_segments: Sequence[int] | None = None,
) -> Plan:
    """A plan a runtime already knows: its global counts and per-rank model tokens.

    Give ``rank_tokens`` (one per CP rank) or only ``busiest_tokens``; in the
    latter case the other ranks share the remaining tokens evenly. ``rank_segments``
    (default: ``segment_bounds`` of a runtime that places whole segments, as the
    measured one does) bounds the segments whose state each rank holds.
    """
    require_positive_int("logical_tokens", logical_tokens)
    require_positive_int("packed_tokens", packed_tokens)
    require_nonnegative_int("grad_segments", grad_segments)
    cp, tp = layout.cp, layout.tp
    if packed_tokens > round_up(logical_tokens, tp):
        raise InputError(
            "packed_tokens",
            packed_tokens,
            f"exceeds logical_tokens ({logical_tokens}) rounded up to TP ({tp})",
        )
    if rank_tokens is None and busiest_tokens is None:
        rank_tokens = _even_split(packed_tokens, cp)
    elif rank_tokens is None:
        assert busiest_tokens is not None
        require_positive_int("busiest_tokens", busiest_tokens)
        floor = -(-packed_tokens // cp)
        if busiest_tokens < floor:
            raise InputError(
                "busiest_tokens",
                busiest_tokens,
                f"below ceil(packed_tokens / cp) = {floor}: the ranks could not hold "
                f"{packed_tokens} tokens",
            )
        rest = max(packed_tokens - busiest_tokens, 0)
        rank_tokens = [busiest_tokens, *_even_split(rest, cp - 1)] if cp > 1 else [busiest_tokens]
    elif busiest_tokens is not None and max(rank_tokens) != busiest_tokens:
        raise InputError(
            "busiest_tokens",
            busiest_tokens,
            f"disagrees with max(rank_tokens) = {max(rank_tokens)}",
        )
    ranks = tuple(rank_tokens)
    if len(ranks) != cp:
        raise InputError("rank_tokens", list(ranks), f"needs one count per CP rank (cp={cp})")
    for r, n in enumerate(ranks):
        require_nonnegative_int(f"rank_tokens[{r}]", n)
    if sum(ranks) < packed_tokens - (tp - 1):
        raise InputError(
            "rank_tokens",
            list(ranks),
            f"add up to {sum(ranks)}, fewer than packed_tokens ({packed_tokens})",
        )
    gdn = tuple(gdn_rank_tokens) if gdn_rank_tokens is not None else ranks
    if rank_segments is None:
        rank_segments = segment_bounds(grad_segments, cp, whole=True)
    group = ForwardGroup(
        logical_tokens=logical_tokens,
        packed_tokens=packed_tokens,
        attention_tokens=ranks,
        gdn_tokens=gdn,
        grad_segments=grad_segments,
        real_tokens=min(packed_tokens, sum(ranks)),
        rank_segments=tuple(rank_segments),
    )
    return Plan(layout=layout, planner="explicit", groups=(group,))


def _even_split(tokens: int, parts: int) -> list[int]:
    base, extra = divmod(tokens, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]
