"""A small stderr progress counter for the long commands (``cpmem report``, ``cpmem diff``).

It draws only when stderr is a terminal and the caller did not ask for JSON, so
pipes, CI logs and ``--json`` output stay clean. No dependency: one ``\\r`` line.
"""

from __future__ import annotations

import sys
from typing import TextIO


def wanted(json_mode: bool = False, stream: TextIO | None = None) -> bool:
    """Progress is shown on a terminal only, and never in ``--json`` mode."""
    stream = sys.stderr if stream is None else stream
    if json_mode:
        return False
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty()) if isatty is not None else False
    except (ValueError, OSError):  # a closed stream
        return False


class Progress:
    """``label  done/total`` redrawn in place; a no-op when ``enabled`` is False."""

    def __init__(
        self, label: str, total: int, *, enabled: bool, stream: TextIO | None = None
    ) -> None:
        self.label = label
        self.total = total
        self.done = 0
        self.enabled = enabled
        self.stream = sys.stderr if stream is None else stream
        self._width = 0

    def _draw(self, note: str = "") -> None:
        if not self.enabled:
            return
        text = f"{self.label}  {self.done}/{self.total}" + (f"  {note}" if note else "")
        pad = " " * max(0, self._width - len(text))
        self._width = len(text)
        self.stream.write(f"\r{text}{pad}")
        self.stream.flush()

    def step(self, n: int = 1, note: str = "") -> None:
        self.done = min(self.total, self.done + n)
        self._draw(note)

    def close(self) -> None:
        """Erase the line, so whatever is printed next starts clean."""
        if self.enabled and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
        self._width = 0

    def __enter__(self) -> Progress:
        self._draw()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
