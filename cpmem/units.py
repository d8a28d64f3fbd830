"""Byte units (GiB = 2**30 bytes, as the measurements report them), and counted nouns
for the human outputs ("1 micro-batch", "4 micro-batches")."""

from __future__ import annotations

GIB = 1 << 30
MIB = 1 << 20


def counted(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1 ("1 micro-batch", "4 micro-batches",
    "2 stages"): ``-es`` after a sibilant ending (``ch``, ``sh``, ``s``, ``x``), else
    ``-s``."""
    if n == 1:
        return f"{n:,} {noun}"
    sibilant = noun.endswith(("ch", "sh", "s", "x"))
    return f"{n:,} {noun}{'es' if sibilant else 's'}"


def gib(n_bytes: int | float) -> float:
    return n_bytes / GIB


def fmt_gib(n_bytes: int | float | None, digits: int = 3) -> str:
    """Bytes as GiB text, ``digits`` decimals (``"12.345"``), ``"-"`` when missing; the
    one byte formatter of the human outputs (those that print the unit append it)."""
    return "-" if n_bytes is None else f"{n_bytes / GIB:.{digits}f}"
