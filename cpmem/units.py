"""Byte units. GiB = 2**30 bytes, as the measurements report them."""

from __future__ import annotations

GIB = 1 << 30
MIB = 1 << 20


def gib(n_bytes: int | float) -> float:
    return n_bytes / GIB


def fmt_gib(n_bytes: int | float, digits: int = 3) -> str:
    return f"{n_bytes / GIB:.{digits}f} GiB"
