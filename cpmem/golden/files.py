"""The golden directory and its files: where it is, what they are called, how they are
read (ragged rows refused) and written (temp file + rename: all or nothing)."""

from __future__ import annotations

import argparse
import csv
import io
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from cpmem.errors import CpmemError


def default_golden_dir() -> Path:
    """The repository's ``golden/`` directory, or ``$CPMEM_GOLDEN_DIR`` when set.

    Read at call time so that tests and tools can point cpmem at a copy.
    """
    override = os.environ.get("CPMEM_GOLDEN_DIR")
    if override:
        return Path(override)
    return Path(__file__).resolve().parents[2] / "golden"


GOLDEN_DIR: Path = default_golden_dir()


def add_golden_argument(parser: argparse.ArgumentParser) -> None:
    """``--golden DIR``, the same for every command that reads the golden directory."""
    parser.add_argument(
        "--golden",
        type=Path,
        default=None,
        help="golden directory (default: $CPMEM_GOLDEN_DIR or the repo's golden/)",
    )


CELLS_FILE = "cells.csv"
SCHEMA_FILE = "schema.json"
MANIFEST_FILE = "MANIFEST.sha256"
SOURCES_SUBDIR = "sources"
CAMPAIGNS_SUBDIR = "campaigns"
CONTROLS_SUBDIR = "controls"

IMPORTED_BY = "cpmem golden import"
APPENDED_BY = "cpmem golden append"


class GoldenDataError(CpmemError, ValueError):
    """A golden file, source or row violates the schema or the append-only rule.

    ``file``, ``row``, ``column`` and ``value`` say where (each may be None when it
    does not apply); the message always names them.
    """

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        row: int | None = None,
        column: str | None = None,
        value: str | None = None,
    ) -> None:
        self.file = file
        self.row = row
        self.column = column
        self.value = value
        where = []
        if file is not None:
            where.append(file)
        if row is not None:
            where.append(f"row {row}")
        if column is not None:
            where.append(f"column {column!r}")
        if value is not None:
            where.append(f"value {value!r}")
        prefix = ": ".join(where)
        super().__init__(f"{prefix}: {message}" if prefix else message)


def read_csv(path: Path, label: str | None = None) -> tuple[list[str], list[dict[str, str]]]:
    """Header and rows (as strings) of a CSV; ragged rows are an error naming the row."""
    where = label or str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise GoldenDataError(f"cannot read: {exc}", file=where) from exc
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader)
    except StopIteration:
        raise GoldenDataError("empty file (no header)", file=where) from None
    if len(set(header)) != len(header):
        raise GoldenDataError(f"duplicate column names in header {header}", file=where)
    rows: list[dict[str, str]] = []
    for i, values in enumerate(reader, start=1):
        if len(values) != len(header):
            raise GoldenDataError(
                f"has {len(values)} fields, the header has {len(header)}", file=where, row=i
            )
        rows.append(dict(zip(header, values, strict=True)))
    return header, rows


def csv_bytes(rows: Iterable[Mapping[str, str]], names: Sequence[str]) -> bytes:
    buf = io.StringIO(newline="")
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(names)
    for row in rows:
        writer.writerow([row[n] for n in names])
    return buf.getvalue().encode("utf-8")


def atomic_write(path: Path, data: bytes) -> None:
    """Write via a temp file in the same directory, then rename: all or nothing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp makes 0600 files; keep the old mode, else an ordinary 0644 data file.
        os.chmod(tmp, path.stat().st_mode & 0o777 if path.exists() else 0o644)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
