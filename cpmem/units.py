"""Byte units. GiB = 2**30 bytes, as the measurements report them."""

from __future__ import annotations

GIB = 1 << 30
MIB = 1 << 20


def gib(n_bytes: int | float) -> float:
    return n_bytes / GIB


def fmt_gib(n_bytes: int | float | None, digits: int = 3) -> str:
    """Bytes as GiB text, ``digits`` decimals (``"12.345"``), ``"-"`` when missing; the
    one byte formatter of the human outputs (those that print the unit append it)."""
    return "-" if n_bytes is None else f"{n_bytes / GIB:.{digits}f}"
