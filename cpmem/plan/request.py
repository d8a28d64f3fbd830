"""Requests: a forest of prefix trees of token segments.

A pair of sequences sharing a prefix is one tree: the prefix is the root and each
completion a child. Independent sequences are separate roots. Each node is a
*segment*; a gradient-enabled segment carries recurrent (GDN) state for backward.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from cpmem.errors import InputError, require_nonnegative_int, require_positive_int


@dataclass(frozen=True)
class Segment:
    """A run of tokens stored once, followed by the segments that extend it."""

    tokens: int
    children: tuple[Segment, ...] = ()
    grad: bool = True

    def __post_init__(self) -> None:
        require_positive_int("segment tokens", self.tokens)

    @property
    def subtree_tokens(self) -> int:
        return self.tokens + sum(c.subtree_tokens for c in self.children)

    def walk(self) -> Iterator[Segment]:
        """Depth-first, pre-order: the order segments are packed in a row."""
        yield self
        for child in self.children:
            yield from child.walk()

    def sequence_lengths(self, above: int = 0) -> list[int]:
        """Length of every root-to-leaf sequence through this segment."""
        here = above + self.tokens
        if not self.children:
            return [here]
        return [n for c in self.children for n in c.sequence_lengths(here)]


@dataclass(frozen=True)
class Request:
    """One forward's worth of sequences, as prefix trees (one packed row per tree)."""

    trees: tuple[Segment, ...]

    def __post_init__(self) -> None:
        if not self.trees:
            raise InputError("lengths", [], "a request needs at least one sequence")

    @property
    def sequence_lengths(self) -> list[int]:
        return [n for t in self.trees for n in t.sequence_lengths()]

    @property
    def logical_tokens(self) -> int:
        """Tokens as the caller sees them: the sum of sequence lengths."""
        return sum(self.sequence_lengths)

    @property
    def real_tokens(self) -> int:
        """Tokens after prefix sharing (each shared prefix stored once), before padding."""
        return sum(t.subtree_tokens for t in self.trees)

    @property
    def grad_segments(self) -> int:
        return sum(1 for t in self.trees for s in t.walk() if s.grad)

    @classmethod
    def independent(cls, lengths: Sequence[int]) -> Request:
        """Sequences that share nothing: one root each."""
        for i, n in enumerate(lengths):
            require_positive_int(f"lengths[{i}]", n)
        return cls(tuple(Segment(n) for n in lengths))

    @classmethod
    def shared(cls, lengths: Sequence[int], shared_prefix: int) -> Request:
        """Sequences that all share their first ``shared_prefix`` tokens (0: independent)."""
        require_nonnegative_int("shared_prefix", shared_prefix)
        if not lengths:
            raise InputError("lengths", list(lengths), "a request needs at least one sequence")
        for i, n in enumerate(lengths):
            require_positive_int(f"lengths[{i}]", n)
        if shared_prefix and len(lengths) == 1:
            raise InputError(
                "shared_prefix",
                shared_prefix,
                "one sequence shares its prefix with no other: give two or more sequences, "
                "or no shared prefix",
            )
        if shared_prefix == 0:
            return cls.independent(lengths)
        for i, n in enumerate(lengths):
            if shared_prefix >= n:
                raise InputError(
                    "shared_prefix",
                    shared_prefix,
                    f"must be shorter than every sequence (lengths[{i}] = {n})",
                )
        children = tuple(Segment(n - shared_prefix) for n in lengths)
        return cls((Segment(shared_prefix, children),))

    @classmethod
    def pair(cls, first: int, second: int, shared_prefix: int = 0) -> Request:
        """Two sequences sharing ``shared_prefix`` tokens."""
        return cls.shared([first, second], shared_prefix)

    @classmethod
    def combined(cls, requests: Sequence[Request]) -> Request:
        """Every request's sequences in one forward."""
        return cls(tuple(t for r in requests for t in r.trees))

    @classmethod
    def as_packed(
        cls, lengths: Sequence[int], shared_prefix: int, packed_tokens: int, tp: int
    ) -> Request:
        """The request a runtime packed into ``packed_tokens``: the shared prefix stored
        once where the shared row, padded to TP, is exactly ``packed_tokens``, otherwise
        the sequences unshared (sharing is the runtime's decision, docs/layout.md: the
        measured 2,048 pairs record a 614-token prefix and 4,096 packed tokens)."""
        if shared_prefix and len(lengths) > 1:
            shared = cls.shared(lengths, shared_prefix)
            if -(-shared.real_tokens // tp) * tp == packed_tokens:
                return shared
        return cls.independent(lengths)
