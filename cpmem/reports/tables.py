"""The one table helper and the one percent formatter of every human-readable output
(the byte formatter is ``cpmem.units.fmt_gib``).

Imports nothing of cpmem: the CLI, the gate and the reports all use it."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Literal

Style = Literal["text", "rule", "markdown"]


def table(
    headers: Sequence[str] | None,
    rows: Sequence[Sequence[str]],
    *,
    right: Collection[int] = (),
    style: Style = "text",
) -> list[str]:
    """The lines of a table; ``right`` holds the indices of the right-aligned columns.

    - ``"text"``: every column as wide as its widest cell (header included), two spaces
      between columns, trailing spaces dropped; the header (if any) is just the first
      line, with no rule under it.
    - ``"rule"``: the same, with a line of dashes as wide as each column under the
      header.
    - ``"markdown"``: ``| a | b |`` lines, cells unpadded; the alignment row has
      ``---:`` for a right-aligned column and ``---`` for the others.

    Every row has as many cells as the header (as the first row, without one)."""
    if style == "markdown":
        if headers is None:
            raise ValueError("a Markdown table needs a header")
        marks = ["---:" if i in right else "---" for i in range(len(headers))]
        return [_md_row(headers), _md_row(marks), *(_md_row(r) for r in rows)]
    lines = [*([] if headers is None else [headers]), *rows]
    if not lines:
        return []
    columns = len(lines[0])
    widths = [max(len(line[i]) for line in lines) for i in range(columns)]
    out = [_text_row(line, widths, right) for line in lines]
    if style == "rule" and headers is not None:
        out.insert(1, "  ".join("-" * w for w in widths))
    return out


def _text_row(cells: Sequence[str], widths: Sequence[int], right: Collection[int]) -> str:
    return "  ".join(
        cell.rjust(w) if i in right else cell.ljust(w)
        for i, (cell, w) in enumerate(zip(cells, widths, strict=True))
    ).rstrip()


def _md_row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def pct(
    x: float | None,
    *,
    signed: bool = False,
    none: str = "-",
    digits: int = 1,
    suffix: str = "%",
) -> str:
    """A fraction as a percentage: ``pct(0.123)`` is ``"12.3%"``; ``signed`` adds
    ``+`` to the non-negative ones (``"+12.3%"``); ``none`` stands for a missing value.
    ``suffix=" pp"`` writes a difference of fractions as percentage points."""
    if x is None:
        return none
    return f"{x * 100:{'+' if signed else ''}.{digits}f}{suffix}"
