"""Typed errors. Every input error names the field and the value that was wrong."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


class CpmemError(Exception):
    """Base class of every error cpmem raises on purpose."""


class InputError(CpmemError, ValueError):
    """A caller-supplied value is invalid; ``field`` and ``value`` say which."""

    def __init__(self, field: str, value: Any, reason: str) -> None:
        self.field = field
        self.value = value
        self.reason = reason
        super().__init__(f"{field}={value!r}: {reason}")


def refuse_all(problems: Sequence[InputError]) -> None:
    """Raise every problem at once: the one ``InputError`` where there is one, else one
    naming every field and value (``tp+ep``), each problem's own message after the other."""
    if not problems:
        return
    if len(problems) == 1:
        raise problems[0]
    raise InputError(
        "+".join(p.field for p in problems),
        [p.value for p in problems],
        f"{len(problems)} settings are refused: " + "; ".join(str(p) for p in problems),
    )


class ConfigError(InputError):
    """A model config.json that cpmem cannot understand."""


class UnknownModelError(InputError):
    """A model name that is neither a preset nor an alias."""


class PlanningError(CpmemError):
    """Planning failed on this rank (or, collectively, on another rank)."""

    def __init__(self, message: str, failed_rank: int | None = None) -> None:
        self.failed_rank = failed_rank
        super().__init__(message)


class CollectiveTimeoutError(CpmemError, RuntimeError):
    """An admission collective did not complete on this rank within its timeout: a peer
    of the group exited, is stuck before the collective, or its connection broke.

    The group is unusable afterwards: abort the step (docs/admission.md, "When a rank
    dies"). Not a PlanningError: nothing about the request was wrong, and no rank
    decided. A RuntimeError, as torch's own collective errors are.
    ``timeout`` is None where the process group's own timeout applied.
    """

    def __init__(
        self, collective: str, ranks: Sequence[int], rank: int, timeout: float | None, cause: str
    ) -> None:
        self.collective = collective
        self.ranks = list(ranks)
        self.rank = rank
        self.timeout = timeout
        self.cause = cause
        within = "the process group's timeout" if timeout is None else f"timeout={timeout:g} s"
        super().__init__(
            f"admission collective {collective} on group of {len(self.ranks)} ranks "
            f"{self.ranks} (this is rank {rank}) got no answer within {within}: a peer rank "
            f"exited or is stuck; the group is unusable, abort the step (torch: {cause})"
        )


def require_positive_seconds(field: str, value: Any) -> float:
    """Return ``value`` as a float if it is a finite number of seconds > 0, else raise."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(field, value, "must be a number of seconds")
    if math.isnan(value) or math.isinf(value):
        raise InputError(field, value, "must be finite")
    if value <= 0:
        raise InputError(field, value, "must be > 0")
    return float(value)


def require_positive_int(field: str, value: Any) -> int:
    """Return ``value`` as an int if it is a positive integer, else raise InputError."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(field, value, "must be a positive integer")
    if value < 1:
        raise InputError(field, value, "must be >= 1")
    return value


def require_nonnegative_int(field: str, value: Any) -> int:
    """Return ``value`` as an int if it is a non-negative integer, else raise InputError."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(field, value, "must be a non-negative integer")
    if value < 0:
        raise InputError(field, value, "must be >= 0")
    return value


def require_bytes(field: str, value: Any) -> float:
    """Return ``value`` if it is a finite, non-negative number of bytes, else raise."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(field, value, "must be a number of bytes")
    if math.isnan(value) or math.isinf(value):
        raise InputError(field, value, "must be finite")
    if value < 0:
        raise InputError(field, value, "must be >= 0")
    return value
