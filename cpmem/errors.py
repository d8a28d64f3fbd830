"""Typed errors. Every input error names the field and the value that was wrong."""

from __future__ import annotations

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


class ConfigError(InputError):
    """A model config.json that cpmem cannot understand."""


class UnknownModelError(InputError):
    """A model name that is neither a preset nor an alias."""


class PlanningError(CpmemError):
    """Planning failed on this rank (or, collectively, on another rank)."""

    def __init__(self, message: str, failed_rank: int | None = None) -> None:
        self.failed_rank = failed_rank
        super().__init__(message)


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
