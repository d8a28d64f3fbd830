"""The measured sources, read raw with the csv module (no cpmem code involved)."""

from __future__ import annotations

import csv
from pathlib import Path

SOURCES = Path(__file__).resolve().parents[2] / "golden" / "sources"


def read_source(name: str) -> list[dict[str, str]]:
    with open(SOURCES / name, newline="") as fh:
        return list(csv.DictReader(fh))
