"""Typed values read from the text a user gives a setting: a list of integers, a whole
byte count. Each refuses bad text with an ``InputError`` naming the field and the value."""

from __future__ import annotations

import math

from cpmem.errors import InputError


def parse_int_list(field: str, text: str) -> list[int]:
    """``4096,4096`` (or ``4096+4096``) as integers; an empty item is an error, not
    silently dropped (``4096,,`` and ``,4096`` are not ``[4096]``)."""
    items = text.replace("+", ",").split(",")
    values = []
    for i, item in enumerate(items):
        if not item.strip():
            raise InputError(field, text, f"item {i + 1} of {len(items)} is empty")
        try:
            values.append(int(item))
        except ValueError:
            raise InputError(field, text, f"item {i + 1} ({item!r}) is not an integer") from None
    return values


def whole_bytes(field: str, value: float | None) -> int | None:
    """A byte count given as a number (``1.5e11`` included): a whole, finite one."""
    if value is None:
        return None
    if not math.isfinite(value) or value != int(value):
        raise InputError(field, value, "must be a whole number of bytes")
    return int(value)
