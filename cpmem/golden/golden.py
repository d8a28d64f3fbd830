"""The golden data layer: measured native GPU peaks, imported once, never edited.

``golden/cells.csv`` holds one row per measured cell, normalised from the
provenance copies under ``golden/sources/``.  Everything here exists so that a
measured value can be traced to the byte in the published file it came from,
and so that nobody (tool or person) can silently change one later:

* the importer is idempotent and append-only: a cell that is already present
  with identical values is skipped, a cell whose values differ is refused with
  an error naming the cell, the column and both values, and nothing is written
  unless every row passed (temp file + rename);
* ``golden/schema.json`` types every column, and :func:`load_cells` refuses a
  value that does not fit, naming file, row, column and value;
* ``golden/MANIFEST.sha256`` pins the bytes of every data file.

Usage: ``cpmem golden import|verify|manifest`` (see :func:`main`).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import math
import os
import re
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from cpmem.errors import CpmemError

__all__ = [
    "CELLS_FILE",
    "COLUMNS",
    "GOLDEN_DIR",
    "MANIFEST_FILE",
    "SCHEMA_FILE",
    "ColumnSpec",
    "GoldenDataError",
    "ImportReport",
    "MeasuredCell",
    "append_rows",
    "check_sources",
    "default_golden_dir",
    "import_sources",
    "load_cells",
    "load_schema",
    "main",
    "normalize_sources",
    "schema_document",
    "validate_row",
    "verify",
    "verify_manifest",
    "write_manifest",
]


def default_golden_dir() -> Path:
    """The repository's ``golden/`` directory, or ``$CPMEM_GOLDEN_DIR`` when set.

    Read at call time so that tests and tools can point cpmem at a copy.
    """
    override = os.environ.get("CPMEM_GOLDEN_DIR")
    if override:
        return Path(override)
    return Path(__file__).resolve().parents[2] / "golden"


GOLDEN_DIR: Path = default_golden_dir()
CELLS_FILE = "cells.csv"
SCHEMA_FILE = "schema.json"
MANIFEST_FILE = "MANIFEST.sha256"
SOURCES_SUBDIR = "sources"
CAMPAIGNS_SUBDIR = "campaigns"
CONTROLS_SUBDIR = "controls"
SCHEMA_VERSION = 1

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


# --------------------------------------------------------------------------------------
# Schema
# --------------------------------------------------------------------------------------

ColumnType = Literal["int", "str", "bool", "float"]

_HEX = "[0-9a-f]"


@dataclass(frozen=True)
class ColumnSpec:
    """One column of ``cells.csv``: its type, whether it may be empty, its closed set."""

    name: str
    type: ColumnType
    nullable: bool
    description: str
    unit: str | None = None
    allowed: tuple[str, ...] | None = None
    pattern: str | None = None
    minimum: int | None = None

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "name": self.name,
            "type": self.type,
            "nullable": self.nullable,
            "unit": self.unit,
            "description": self.description,
        }
        if self.allowed is not None:
            doc["allowed"] = list(self.allowed)
        if self.pattern is not None:
            doc["pattern"] = self.pattern
        if self.minimum is not None:
            doc["minimum"] = self.minimum
        return doc

    @staticmethod
    def from_json(doc: Mapping[str, Any], where: str) -> ColumnSpec:
        try:
            name = str(doc["name"])
            ctype = str(doc["type"])
            nullable = doc["nullable"]
        except KeyError as exc:
            raise GoldenDataError(f"column entry lacks key {exc.args[0]!r}", file=where) from exc
        if ctype not in ("int", "str", "bool", "float"):
            raise GoldenDataError("unknown column type", file=where, column=name, value=ctype)
        if not isinstance(nullable, bool):
            raise GoldenDataError("'nullable' must be true or false", file=where, column=name)
        allowed = doc.get("allowed")
        unit = doc.get("unit")
        pattern = doc.get("pattern")
        minimum = doc.get("minimum")
        return ColumnSpec(
            name=name,
            type=ctype,  # type: ignore[arg-type]  # checked against the Literal just above
            nullable=nullable,
            description=str(doc.get("description", "")),
            unit=None if unit is None else str(unit),
            allowed=None if allowed is None else tuple(str(a) for a in allowed),
            pattern=None if pattern is None else str(pattern),
            minimum=None if minimum is None else int(minimum),
        )


def _c(
    name: str,
    ctype: ColumnType,
    nullable: bool,
    description: str,
    *,
    unit: str | None = None,
    allowed: tuple[str, ...] | None = None,
    pattern: str | None = None,
) -> ColumnSpec:
    minimum = 0 if ctype == "int" else None
    return ColumnSpec(name, ctype, nullable, description, unit, allowed, pattern, minimum)


PHASES: tuple[str, ...] = (
    "final",
    "before_segment_states",
    "eager_control",
    "cold_workspace_negative_control",
    "segment_state_negative_control",
    "unfused_negative_control",
    "native",  # rows of cpmem's own measurement driver (gpu_tests/driver.py)
)
CAMPAIGNS: tuple[str, ...] = ("cp", "tp", "native")
MODES: tuple[str, ...] = ("selective", "none", "full")
MODULES: tuple[str, ...] = ("", "core_attn", "core_attn+mlp", "core_attn+moe")
_BOOL = ("True", "False")

COLUMNS: tuple[ColumnSpec, ...] = (
    _c(
        "cell_id",
        "str",
        False,
        "stable unique id of the measured cell",
        pattern=r"^[A-Za-z0-9_.+:/-]+$",
    ),
    _c("source_file", "str", False, "file name under golden/sources (or golden/campaigns)"),
    _c("source_row", "int", False, "1-based data row index in source_file", unit="row"),
    _c("source_repository", "str", False, "repository that published the measurement"),
    _c("source_path", "str", False, "path of the published file in source_repository"),
    _c(
        "source_commit",
        "str",
        False,
        "commit of source_repository the file was taken at",
        pattern=rf"^{_HEX}{{40}}$",
    ),
    _c("campaign", "str", False, "measurement campaign", allowed=CAMPAIGNS),
    _c("phase", "str", False, "estimator variant the cell was recorded under", allowed=PHASES),
    _c(
        "estimator_source_sha",
        "str",
        False,
        "estimator source commit, as recorded",
        pattern=rf"^{_HEX}{{7,40}}$",
    ),
    _c(
        "driver_sha256",
        "str",
        False,
        "sha256 of the measurement driver",
        pattern=rf"^{_HEX}{{64}}$",
    ),
    _c("model", "str", False, "Hugging Face model id as recorded"),
    _c("layers", "int", False, "decoder layers", unit="layers"),
    _c("gdn_layers", "int", False, "Gated DeltaNet layers among them", unit="layers"),
    _c("tp", "int", False, "tensor-parallel size", unit="ranks"),
    _c("cp", "int", False, "context-parallel size", unit="ranks"),
    _c("ep", "int", False, "expert-parallel size", unit="ranks"),
    _c("etp", "int", False, "expert tensor-parallel size", unit="ranks"),
    _c("sequence_parallel", "bool", False, "sequence parallelism on"),
    _c("compiled", "bool", False, "layers ran under torch.compile (eager otherwise)"),
    _c("concentrated_routing", "bool", True, "MoE routing concentrated on few experts"),
    _c("mode", "str", False, "recompute granularity", allowed=MODES),
    _c("modules", "str", True, "selective recompute modules ('' for mode none)", allowed=MODULES),
    _c(
        "lengths",
        "str",
        False,
        "sequence lengths, '+'-joined as recorded",
        pattern=r"^[1-9][0-9]*(\+[1-9][0-9]*)*$",
    ),
    _c("shared_prefix", "int", False, "tokens the sequences share as a prefix", unit="tokens"),
    _c("logical_tokens", "int", False, "sum of lengths", unit="tokens"),
    _c("packed_tokens", "int", False, "tokens after prefix sharing and TP padding", unit="tokens"),
    _c(
        "retained_tokens",
        "int",
        True,
        "tokens on the busiest CP rank (CP file only)",
        unit="tokens",
    ),
    _c("grad_segments", "int", True, "gradient-enabled prefix-tree segments", unit="segments"),
    _c("selected_max_depth", "int", True, "prefix-tree depth the planner selected"),
    _c("memory_minimal", "bool", True, "planner chose its memory-minimal plan"),
    _c(
        "measured_rank_samples",
        "int",
        False,
        "rank-samples the peaks aggregate",
        unit="rank-samples",
    ),
    _c(
        "refused_rank_samples",
        "int",
        False,
        "rank-samples the estimator refused",
        unit="rank-samples",
    ),
    _c(
        "recorded_estimate_bytes",
        "int",
        True,
        "reference estimate recorded with the cell",
        unit="bytes",
    ),
    _c(
        "recorded_old_estimate_bytes",
        "int",
        True,
        "estimate before busiest-rank pricing (CP file only)",
        unit="bytes",
    ),
    _c("available_bytes", "int", True, "minimum available bytes over ranks", unit="bytes"),
    _c(
        "forward_peak_bytes",
        "int",
        True,
        "forward peak, max over ranks and repetitions",
        unit="bytes",
    ),
    _c(
        "first_forward_peak_bytes",
        "int",
        True,
        "forward peak of the first (cold) repetition",
        unit="bytes",
    ),
    _c(
        "repeat_forward_peak_bytes",
        "int",
        True,
        "forward peak of the repeat (warm) repetition",
        unit="bytes",
    ),
    _c("retained_max_bytes", "int", True, "memory still held after forward", unit="bytes"),
    _c("forward_backward_peak_bytes", "int", True, "peak over forward and backward", unit="bytes"),
    _c(
        "baseline_min_bytes",
        "int",
        True,
        "pre-forward allocated bytes, min over ranks",
        unit="bytes",
    ),
    _c(
        "baseline_max_bytes",
        "int",
        True,
        "pre-forward allocated bytes, max over ranks",
        unit="bytes",
    ),
    _c("finite", "bool", True, "loss (and gradients, where recorded) were finite"),
    _c("recorded_covers_forward", "bool", True, "recorded estimate covered the forward peak"),
    _c("unit", "str", False, "unit of every *_bytes column", allowed=("bytes",)),
    _c("device", "str", False, "GPU the cell was measured on"),
    _c("dtype", "str", False, "activation dtype", allowed=("bf16",)),
    _c("imported_by", "str", False, "tool that wrote the row", allowed=(IMPORTED_BY, APPENDED_BY)),
)

COLUMN_NAMES: tuple[str, ...] = tuple(c.name for c in COLUMNS)

PEAK_COLUMNS: tuple[str, ...] = (
    "forward_peak_bytes",
    "first_forward_peak_bytes",
    "repeat_forward_peak_bytes",
    "retained_max_bytes",
    "forward_backward_peak_bytes",
)


def schema_document(columns: Sequence[ColumnSpec] = COLUMNS) -> dict[str, Any]:
    """The JSON document written to ``golden/schema.json``."""
    return {
        "schema_version": SCHEMA_VERSION,
        "file": CELLS_FILE,
        "description": (
            "One row per measured cell. *_bytes figures are incremental allocated bytes "
            "above the pre-forward baseline, maxima over ranks and repetitions. An empty "
            "field means 'not recorded'; it is never filled in."
        ),
        "booleans": list(_BOOL),
        "columns": [c.to_json() for c in columns],
    }


def _schema_bytes(columns: Sequence[ColumnSpec] = COLUMNS) -> bytes:
    return (json.dumps(schema_document(columns), indent=2) + "\n").encode("utf-8")


def load_schema(path: Path) -> tuple[ColumnSpec, ...]:
    """Read a ``schema.json``; raise GoldenDataError naming the file if it is malformed."""
    where = str(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise GoldenDataError(f"cannot read schema: {exc}", file=where) from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("columns"), list):
        raise GoldenDataError("schema must be an object with a 'columns' list", file=where)
    return tuple(ColumnSpec.from_json(c, where) for c in doc["columns"])


# --------------------------------------------------------------------------------------
# Row validation
# --------------------------------------------------------------------------------------

_INT_RE = re.compile(r"^(0|-?[1-9][0-9]*)$")


def _check_value(spec: ColumnSpec, value: str, where: str, row: int | None) -> None:
    def fail(reason: str) -> GoldenDataError:
        return GoldenDataError(reason, file=where, row=row, column=spec.name, value=value)

    if value == "":
        if spec.nullable or (spec.allowed is not None and "" in spec.allowed):
            return
        raise fail("must not be empty")
    if spec.type == "int":
        if not _INT_RE.match(value):
            raise fail("must be an integer written in plain decimal")
        if spec.minimum is not None and int(value) < spec.minimum:
            raise fail(f"must be >= {spec.minimum}")
    elif spec.type == "bool":
        if value not in _BOOL:
            raise fail("must be True or False")
    elif spec.type == "float":
        try:
            parsed = float(value)
        except ValueError:
            raise fail("must be a number") from None
        if not math.isfinite(parsed):
            raise fail("must be finite")
    if spec.allowed is not None and value not in spec.allowed:
        raise fail(f"not one of the allowed values {list(spec.allowed)}")
    if spec.pattern is not None and not re.match(spec.pattern, value):
        raise fail(f"does not match {spec.pattern}")


def validate_row(
    row: Mapping[str, str],
    columns: Sequence[ColumnSpec] = COLUMNS,
    *,
    where: str = CELLS_FILE,
    row_no: int | None = None,
) -> None:
    """Check one normalised row against the schema and the cross-column rules.

    Cross-column rules: ``logical_tokens`` is the sum of ``lengths``; mode ``none``
    has no modules and ``selective`` has some; a cell with no measured rank-sample
    has no peak (a refused cell was never run, so a peak there would be invented).
    """
    names = [c.name for c in columns]
    missing = [n for n in names if n not in row]
    if missing:
        raise GoldenDataError(f"missing columns {missing}", file=where, row=row_no)
    extra = [k for k in row if k not in names]
    if extra:
        raise GoldenDataError(f"unknown columns {extra}", file=where, row=row_no)
    for spec in columns:
        _check_value(spec, row[spec.name], where, row_no)

    def fail(column: str, reason: str) -> GoldenDataError:
        return GoldenDataError(reason, file=where, row=row_no, column=column, value=row[column])

    if "lengths" in row and "logical_tokens" in row and row["logical_tokens"]:
        total = sum(int(x) for x in row["lengths"].split("+"))
        if int(row["logical_tokens"]) != total:
            raise fail("logical_tokens", f"must equal the sum of lengths ({total})")
    if row.get("mode") == "none" and row.get("modules"):
        raise fail("modules", "must be empty when mode is none")
    if row.get("mode") == "selective" and row.get("modules") == "":
        raise fail("modules", "must name the recomputed modules when mode is selective")
    if row.get("measured_rank_samples") == "0":
        for col in PEAK_COLUMNS:
            if row.get(col):
                raise fail(col, "a cell with no measured rank-sample cannot have a peak")


# --------------------------------------------------------------------------------------
# MeasuredCell
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MeasuredCell:
    """One measured cell of ``golden/cells.csv``, typed. Field order = column order."""

    cell_id: str
    source_file: str
    source_row: int
    source_repository: str
    source_path: str
    source_commit: str
    campaign: str
    phase: str
    estimator_source_sha: str
    driver_sha256: str
    model: str
    layers: int
    gdn_layers: int
    tp: int
    cp: int
    ep: int
    etp: int
    sequence_parallel: bool
    compiled: bool
    concentrated_routing: bool | None
    mode: str
    modules: str
    lengths: str
    shared_prefix: int
    logical_tokens: int
    packed_tokens: int
    retained_tokens: int | None
    grad_segments: int | None
    selected_max_depth: int | None
    memory_minimal: bool | None
    measured_rank_samples: int
    refused_rank_samples: int
    recorded_estimate_bytes: int | None
    recorded_old_estimate_bytes: int | None
    available_bytes: int | None
    forward_peak_bytes: int | None
    first_forward_peak_bytes: int | None
    repeat_forward_peak_bytes: int | None
    retained_max_bytes: int | None
    forward_backward_peak_bytes: int | None
    baseline_min_bytes: int | None
    baseline_max_bytes: int | None
    finite: bool | None
    recorded_covers_forward: bool | None
    unit: str
    device: str
    dtype: str
    imported_by: str

    @property
    def lengths_list(self) -> tuple[int, ...]:
        """The sequence lengths as integers, in recorded order."""
        return tuple(int(x) for x in self.lengths.split("+"))

    @property
    def refused(self) -> bool:
        """The estimator refused the cell before it ran: no peak exists for it."""
        return self.refused_rank_samples > 0 and all(
            getattr(self, col) is None for col in PEAK_COLUMNS
        )

    @property
    def is_negative_control(self) -> bool:
        """A deliberately broken estimator whose recorded estimate a gate must flag."""
        return self.phase.endswith("_negative_control")

    @staticmethod
    def from_row(row: Mapping[str, str], columns: Sequence[ColumnSpec] = COLUMNS) -> MeasuredCell:
        """Convert a validated row (strings) into typed values."""
        kwargs: dict[str, Any] = {}
        for spec in columns:
            raw = row[spec.name]
            value: Any
            if spec.type == "str":
                value = raw
            elif raw == "":
                value = None
            elif spec.type == "int":
                value = int(raw)
            elif spec.type == "bool":
                value = raw == "True"
            else:
                value = float(raw)
            kwargs[spec.name] = value
        return MeasuredCell(**kwargs)


# --------------------------------------------------------------------------------------
# CSV helpers
# --------------------------------------------------------------------------------------


def _read_csv(path: Path, label: str | None = None) -> tuple[list[str], list[dict[str, str]]]:
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


def _csv_bytes(rows: Iterable[Mapping[str, str]], names: Sequence[str] = COLUMN_NAMES) -> bytes:
    buf = io.StringIO(newline="")
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(names)
    for row in rows:
        writer.writerow([row[n] for n in names])
    return buf.getvalue().encode("utf-8")


def _atomic_write(path: Path, data: bytes) -> None:
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


def _schema_for(cells_path: Path) -> tuple[ColumnSpec, ...]:
    schema_path = cells_path.parent / SCHEMA_FILE
    return load_schema(schema_path) if schema_path.exists() else COLUMNS


def _read_cells_rows(path: Path, columns: Sequence[ColumnSpec]) -> list[dict[str, str]]:
    """Rows of a cells.csv, each validated; ids must be unique."""
    header, rows = _read_csv(path)
    names = [c.name for c in columns]
    if header != names:
        raise GoldenDataError(
            f"header {header} differs from the schema's columns {names}", file=str(path)
        )
    seen: dict[str, int] = {}
    for i, row in enumerate(rows, start=1):
        validate_row(row, columns, where=str(path), row_no=i)
        cid = row["cell_id"]
        if cid in seen:
            raise GoldenDataError(
                f"duplicate cell_id (first at row {seen[cid]})",
                file=str(path),
                row=i,
                column="cell_id",
                value=cid,
            )
        seen[cid] = i
    return rows


def load_cells(path: Path | str | None = None) -> list[MeasuredCell]:
    """Load and validate ``cells.csv`` (default: the golden dir's), typed.

    Validated against the ``schema.json`` beside the file (the built-in schema if
    there is none); a violation raises GoldenDataError naming file, row, column, value.
    """
    cells_path = Path(path) if path is not None else default_golden_dir() / CELLS_FILE
    columns = _schema_for(cells_path)
    return [MeasuredCell.from_row(r, columns) for r in _read_cells_rows(cells_path, columns)]


# --------------------------------------------------------------------------------------
# Source normalisation
# --------------------------------------------------------------------------------------

SOURCES_README = "README.md"

# Layer counts (total, Gated DeltaNet) of the models the CP file names, from the
# sources README geometry table ("Qwen/Qwen3.8-27B" has the Qwen3.5-27B geometry).
# The CP file does not record them; the TP file does, and agrees.
_README_LAYERS: dict[str, tuple[int, int]] = {
    "Qwen/Qwen3.8-27B": (64, 48),
    "Qwen/Qwen3.5-4B": (32, 24),
    "Qwen/Qwen3-1.7B": (28, 0),
    "Qwen/Qwen3.5-35B-A3B": (40, 30),
}

# How the sources README says the cells were measured (constant for both files).
_DEVICE = "NVIDIA H200"
_DTYPE = "bf16"
_UNIT = "bytes"

_CP_HEADER: tuple[str, ...] = (
    "case", "source_sha", "driver_sha256", "model", "mode", "modules", "compiled", "tp",
    "cp", "lengths", "shared_prefix", "packed_tokens", "retained_tokens", "grad_segments",
    "measured_samples", "refused_samples", "old_estimate_bytes", "estimate_bytes",
    "forward_peak_bytes", "forward_backward_peak_bytes", "finite", "available_bytes_min",
)  # fmt: skip

_TP_HEADER: tuple[str, ...] = (
    "phase", "source_sha", "driver_sha256", "model", "layers", "gdn_layers", "tp", "ep",
    "etp", "sequence_parallel", "compiled", "concentrated_routing", "mode", "modules",
    "lengths", "shared_prefix", "logical_tokens", "packed_tokens", "grad_segment_count",
    "selected_max_depth", "memory_minimal", "estimate_bytes", "available_min_bytes",
    "measured_rank_samples", "refused_rank_samples", "forward_peak_max_bytes",
    "first_forward_peak_max_bytes", "repeat_forward_peak_max_bytes", "retained_max_bytes",
    "forward_backward_peak_max_bytes", "baseline_min_bytes", "baseline_max_bytes",
    "finite_loss_all", "finite_gradients_all", "estimate_covers_forward_all",
    "min_estimate_to_forward_ratio",
)  # fmt: skip

# Source column -> cells column, copied verbatim. Columns not listed are either
# combined (TP finite_*), looked up (CP layers), constant, or derived and dropped:
# TP min_estimate_to_forward_ratio = estimate_bytes / forward_peak_max_bytes.
CP_COPY: dict[str, str] = {
    "source_sha": "estimator_source_sha",
    "driver_sha256": "driver_sha256",
    "model": "model",
    "mode": "mode",
    "modules": "modules",
    "compiled": "compiled",
    "tp": "tp",
    "cp": "cp",
    "lengths": "lengths",
    "shared_prefix": "shared_prefix",
    "packed_tokens": "packed_tokens",
    "retained_tokens": "retained_tokens",
    "grad_segments": "grad_segments",
    "measured_samples": "measured_rank_samples",
    "refused_samples": "refused_rank_samples",
    "old_estimate_bytes": "recorded_old_estimate_bytes",
    "estimate_bytes": "recorded_estimate_bytes",
    "forward_peak_bytes": "forward_peak_bytes",
    "forward_backward_peak_bytes": "forward_backward_peak_bytes",
    "finite": "finite",
    "available_bytes_min": "available_bytes",
}

TP_COPY: dict[str, str] = {
    "phase": "phase",
    "source_sha": "estimator_source_sha",
    "driver_sha256": "driver_sha256",
    "model": "model",
    "layers": "layers",
    "gdn_layers": "gdn_layers",
    "tp": "tp",
    "ep": "ep",
    "etp": "etp",
    "sequence_parallel": "sequence_parallel",
    "compiled": "compiled",
    "concentrated_routing": "concentrated_routing",
    "mode": "mode",
    "modules": "modules",
    "lengths": "lengths",
    "shared_prefix": "shared_prefix",
    "logical_tokens": "logical_tokens",
    "packed_tokens": "packed_tokens",
    "grad_segment_count": "grad_segments",
    "selected_max_depth": "selected_max_depth",
    "memory_minimal": "memory_minimal",
    "estimate_bytes": "recorded_estimate_bytes",
    "available_min_bytes": "available_bytes",
    "measured_rank_samples": "measured_rank_samples",
    "refused_rank_samples": "refused_rank_samples",
    "forward_peak_max_bytes": "forward_peak_bytes",
    "first_forward_peak_max_bytes": "first_forward_peak_bytes",
    "repeat_forward_peak_max_bytes": "repeat_forward_peak_bytes",
    "retained_max_bytes": "retained_max_bytes",
    "forward_backward_peak_max_bytes": "forward_backward_peak_bytes",
    "baseline_min_bytes": "baseline_min_bytes",
    "baseline_max_bytes": "baseline_max_bytes",
    "estimate_covers_forward_all": "recorded_covers_forward",
}


@dataclass(frozen=True)
class SourceInfo:
    """Provenance of one source file, from the sources README table."""

    file: str
    repository: str
    path: str
    commit: str


_README_ROW = re.compile(
    r"^\|\s*`(?P<file>[^`]+)`\s*\|\s*(?P<repo>[\w.-]+/[\w.-]+)\s+`(?P<path>[^`]+)`\s*@\s*"
    r"(?P<commit>[0-9a-f]{40})\s*\|"
)


def _read_provenance(sources_dir: Path) -> list[SourceInfo]:
    """Parse the (file, repository, path, commit) table of the sources README."""
    readme = sources_dir / SOURCES_README
    try:
        text = readme.read_text(encoding="utf-8")
    except OSError as exc:
        raise GoldenDataError(
            f"cannot read the provenance README: {exc}", file=str(readme)
        ) from exc
    infos = [
        SourceInfo(m["file"], m["repo"], m["path"], m["commit"])
        for line in text.splitlines()
        if (m := _README_ROW.match(line.strip()))
    ]
    if not infos:
        raise GoldenDataError(
            "no '| `file` | repo `path` @ <40-hex commit> |' provenance rows", file=str(readme)
        )
    return infos


def _model_short(model: str) -> str:
    return model.rsplit("/", 1)[-1]


def _normalize_cp(raw: Mapping[str, str], info: SourceInfo, row_no: int) -> dict[str, str]:
    where = f"{SOURCES_SUBDIR}/{info.file}"
    model = raw["model"]
    if model not in _README_LAYERS:
        raise GoldenDataError(
            "model has no layer counts in the sources README geometry table",
            file=where,
            row=row_no,
            column="model",
            value=model,
        )
    layers, gdn = _README_LAYERS[model]
    out = {dst: raw[src] for src, dst in CP_COPY.items()}
    out.update(
        cell_id=f"cp:{raw['case']}:{raw['lengths']}",
        campaign="cp",
        phase="final",
        layers=str(layers),
        gdn_layers=str(gdn),
        # The sources README: TP1, CP2, eager; no expert parallelism, no SP.
        ep="1",
        etp="1",
        sequence_parallel="False",
        concentrated_routing="",
        logical_tokens=_sum_lengths(raw["lengths"], where, row_no),
        selected_max_depth="",
        memory_minimal="",
        first_forward_peak_bytes="",
        repeat_forward_peak_bytes="",
        retained_max_bytes="",
        baseline_min_bytes="",
        baseline_max_bytes="",
        recorded_covers_forward="",
    )
    return out


def _normalize_tp(raw: Mapping[str, str], info: SourceInfo, row_no: int) -> dict[str, str]:
    where = f"{SOURCES_SUBDIR}/{info.file}"
    out = {dst: raw[src] for src, dst in TP_COPY.items()}
    loss, grads = raw["finite_loss_all"], raw["finite_gradients_all"]
    for col, val in (("finite_loss_all", loss), ("finite_gradients_all", grads)):
        if val not in ("", *_BOOL):
            raise GoldenDataError(
                "must be True, False or empty", file=where, row=row_no, column=col, value=val
            )
    if "False" in (loss, grads):
        finite = "False"
    elif loss == grads == "True":
        finite = "True"
    else:
        finite = ""  # not recorded (a refused cell never ran)
    compiled = "compiled" if raw["compiled"] == "True" else "eager"
    out.update(
        cell_id=(
            f"tp:{raw['phase']}:{_model_short(raw['model'])}:tp{raw['tp']}:{raw['mode']}:"
            f"{raw['modules'] or '-'}:{compiled}:{raw['lengths']}"
        ),
        campaign="tp",
        cp="1",  # the sources README: DP=CP=PP=1
        retained_tokens="",
        recorded_old_estimate_bytes="",
        finite=finite,
    )
    return out


def _sum_lengths(lengths: str, where: str, row_no: int) -> str:
    try:
        return str(sum(int(x) for x in lengths.split("+")))
    except ValueError:
        raise GoldenDataError(
            "lengths must be '+'-joined integers",
            file=where,
            row=row_no,
            column="lengths",
            value=lengths,
        ) from None


def normalize_sources(sources_dir: Path | str) -> list[dict[str, str]]:
    """Normalise every file of the sources README table into cells rows (in table order).

    The file layout is recognised by its header (the CP or the TP campaign file);
    an unknown header is an error, never a guess.
    """
    sources_dir = Path(sources_dir)
    out: list[dict[str, str]] = []
    for info in _read_provenance(sources_dir):
        path = sources_dir / info.file
        where = f"{SOURCES_SUBDIR}/{info.file}"
        header, raws = _read_csv(path, where)
        if tuple(header) == _CP_HEADER:
            normalize = _normalize_cp
        elif tuple(header) == _TP_HEADER:
            normalize = _normalize_tp
        else:
            raise GoldenDataError(
                f"header matches neither the CP nor the TP campaign layout: {header}", file=where
            )
        rows: list[dict[str, str]] = []
        for i, raw in enumerate(raws, start=1):
            row = normalize(raw, info, i)
            row.update(
                source_file=info.file,
                source_row=str(i),
                source_repository=info.repository,
                source_path=info.path,
                source_commit=info.commit,
                unit=_UNIT,
                device=_DEVICE,
                dtype=_DTYPE,
                imported_by=IMPORTED_BY,
            )
            rows.append({n: row[n] for n in COLUMN_NAMES})
        _disambiguate(rows)
        for i, row in enumerate(rows, start=1):
            validate_row(row, where=where, row_no=i)
        out.extend(rows)
    return out


def _disambiguate(rows: list[dict[str, str]]) -> None:
    """Make ids unique within one file: a colliding id gets ':' + estimator sha (9 hex).

    Only ids that collide change, so ids of a fixed source file are stable.
    """
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["cell_id"]] = counts.get(row["cell_id"], 0) + 1
    for row in rows:
        if counts[row["cell_id"]] > 1:
            row["cell_id"] = f"{row['cell_id']}:{row['estimator_source_sha'][:9]}"
    seen: dict[str, int] = {}
    for row in rows:
        cid = row["cell_id"]
        if cid in seen:
            raise GoldenDataError(
                f"cell id not unique even with the estimator sha (rows {seen[cid]} and "
                f"{row['source_row']})",
                file=row["source_file"],
                column="cell_id",
                value=cid,
            )
        seen[cid] = int(row["source_row"])


# --------------------------------------------------------------------------------------
# Append-only merge
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ImportReport:
    """What an import or append did: ids appended, ids already present, files written."""

    imported: tuple[str, ...]
    skipped: tuple[str, ...]
    written: tuple[str, ...]

    def summary(self) -> str:
        files = ", ".join(self.written) if self.written else "none (already up to date)"
        return (
            f"{len(self.imported)} cells imported, {len(self.skipped)} skipped "
            f"(already present, identical); files written: {files}"
        )


def _merge(
    existing: list[dict[str, str]], incoming: Sequence[tuple[str, Mapping[str, str]]]
) -> tuple[list[dict[str, str]], list[str], list[str]]:
    """Append incoming rows to existing ones under the append-only rule.

    Returns (all rows, imported ids, skipped ids); raises on the first conflicting
    cell, listing every differing column with both values.
    """
    by_id = {r["cell_id"]: r for r in existing}
    merged = list(existing)
    imported: list[str] = []
    skipped: list[str] = []
    for origin, row in incoming:
        cid = row["cell_id"]
        old = by_id.get(cid)
        if old is None:
            new = {n: row[n] for n in COLUMN_NAMES}
            by_id[cid] = new
            merged.append(new)
            imported.append(cid)
            continue
        diffs = [n for n in COLUMN_NAMES if old[n] != row[n]]
        if not diffs:
            skipped.append(cid)
            continue
        first = diffs[0]
        more = "; ".join(f"{n}: golden {old[n]!r} vs incoming {row[n]!r}" for n in diffs[1:])
        exc = GoldenDataError(
            f"cell {cid!r}: column {first!r}: golden has {old[first]!r}, incoming ({origin}) "
            f"has {row[first]!r}"
            + (f" (other differing columns: {more})" if more else "")
            + ". golden is append-only: a recorded value is never changed; nothing was written."
        )
        exc.column, exc.value = first, row[first]
        raise exc
    return merged, imported, skipped


def _existing_rows(golden_dir: Path) -> list[dict[str, str]]:
    path = golden_dir / CELLS_FILE
    if not path.exists():
        return []
    return _read_cells_rows(path, _schema_for(path))


def _commit(golden_dir: Path, writes: Sequence[tuple[Path, bytes]]) -> tuple[str, ...]:
    """Write the files whose bytes change (each atomically); return their golden paths."""
    written: list[str] = []
    for path, data in writes:
        if path.exists() and path.read_bytes() == data:
            continue
        _atomic_write(path, data)
        written.append(path.relative_to(golden_dir).as_posix())
    return tuple(written)


def import_sources(
    sources_dir: Path | str,
    golden_dir: Path | str,
    *,
    campaign_rows: Sequence[Mapping[str, str]] | None = None,
) -> ImportReport:
    """Import the sources (README table + CSVs) into ``golden_dir``, append-only.

    Copies the source files into ``golden_dir/sources`` (an existing copy with
    different bytes is refused: provenance copies are never edited), writes
    ``schema.json``, and appends new cells to ``cells.csv``.  ``campaign_rows`` are
    extra rows already in the normalised schema (e.g. from a native GPU campaign)
    merged in the same all-or-nothing step.  Re-running on the same inputs changes
    no byte.  Every check runs before the first write.  The manifest is not
    touched: regenerate it explicitly with :func:`write_manifest`.
    """
    sources_dir, golden_dir = Path(sources_dir), Path(golden_dir)
    rows = normalize_sources(sources_dir)
    incoming: list[tuple[str, Mapping[str, str]]] = [
        (f"{SOURCES_SUBDIR}/{r['source_file']} row {r['source_row']}", r) for r in rows
    ]
    for i, extra in enumerate(campaign_rows or (), start=1):
        validate_row(extra, where="campaign_rows", row_no=i)
        incoming.append((f"campaign_rows[{i}]", extra))
    merged, imported, skipped = _merge(_existing_rows(golden_dir), incoming)

    copies: list[tuple[Path, bytes]] = []
    names = [SOURCES_README, *(info.file for info in _read_provenance(sources_dir))]
    for name in names:
        data = (sources_dir / name).read_bytes()
        target = golden_dir / SOURCES_SUBDIR / name
        if target.exists() and target.read_bytes() != data:
            raise GoldenDataError(
                "the provenance copy differs from the incoming source file; copies under "
                "golden/sources are never edited (add a new file instead). Nothing was written.",
                file=f"{SOURCES_SUBDIR}/{name}",
            )
        copies.append((target, data))
    written = _commit(
        golden_dir,
        [
            *copies,
            (golden_dir / SCHEMA_FILE, _schema_bytes()),
            (golden_dir / CELLS_FILE, _csv_bytes(merged)),
        ],
    )
    return ImportReport(tuple(imported), tuple(skipped), written)


_CAMPAIGN_RE = re.compile(r"^[a-z][a-z0-9_-]*$")


def append_rows(
    rows: Sequence[Mapping[str, str]],
    golden_dir: Path | str,
    provenance: Mapping[str, str],
) -> ImportReport:
    """Append rows from a measurement driver (already in the normalised schema).

    ``provenance`` must name the ``campaign`` (every row's campaign must match it)
    and may carry anything else worth keeping (driver, commit, host, date); it is
    recorded once in ``golden/campaigns/<campaign>.provenance.json``.  A row left
    without ``imported_by`` gets ``cpmem golden append``; every other column must be
    filled by the caller.  Same refusal rules and all-or-nothing write as
    :func:`import_sources`; the manifest is not touched.
    """
    golden_dir = Path(golden_dir)
    campaign = provenance.get("campaign", "")
    if not _CAMPAIGN_RE.match(campaign):
        raise GoldenDataError(
            "provenance needs a 'campaign' name ([a-z][a-z0-9_-]*)",
            column="campaign",
            value=campaign,
        )
    for key, val in provenance.items():
        if not isinstance(key, str) or not isinstance(val, str):
            raise GoldenDataError(
                "provenance keys and values must be strings", column=str(key), value=repr(val)
            )
    incoming: list[tuple[str, Mapping[str, str]]] = []
    for i, given in enumerate(rows, start=1):
        row = dict(given)
        if not row.get("imported_by"):
            row["imported_by"] = APPENDED_BY
        validate_row(row, where="append_rows", row_no=i)
        if row["campaign"] != campaign:
            raise GoldenDataError(
                f"campaign differs from provenance campaign {campaign!r}",
                file="append_rows",
                row=i,
                column="campaign",
                value=row["campaign"],
            )
        incoming.append((f"append_rows[{i}]", row))
    merged, imported, skipped = _merge(_existing_rows(golden_dir), incoming)
    writes: list[tuple[Path, bytes]] = []
    if imported:
        prov_path = golden_dir / CAMPAIGNS_SUBDIR / f"{campaign}.provenance.json"
        records: list[Any] = []
        if prov_path.exists():
            try:
                records = json.loads(prov_path.read_text(encoding="utf-8"))
            except json.JSONDecodeError as exc:
                raise GoldenDataError(f"cannot parse: {exc}", file=str(prov_path)) from exc
            if not isinstance(records, list):
                raise GoldenDataError("must hold a JSON list of records", file=str(prov_path))
        record = dict(sorted(provenance.items()))
        if record not in records:
            records.append(record)
        writes.append((prov_path, (json.dumps(records, indent=2) + "\n").encode("utf-8")))
    if not (golden_dir / SCHEMA_FILE).exists():
        writes.append((golden_dir / SCHEMA_FILE, _schema_bytes()))
    writes.append((golden_dir / CELLS_FILE, _csv_bytes(merged)))
    written = _commit(golden_dir, writes)
    return ImportReport(tuple(imported), tuple(skipped), written)


# --------------------------------------------------------------------------------------
# Manifest and verification
# --------------------------------------------------------------------------------------

_DATA_SUBDIRS = (SOURCES_SUBDIR, CONTROLS_SUBDIR, CAMPAIGNS_SUBDIR)


def _data_files(golden_dir: Path) -> list[str]:
    """Golden-relative paths of every data file: top-level .csv/.json, and all files
    under sources/, controls/ and campaigns/ (hidden files and caches excluded)."""
    found: list[str] = []
    for p in golden_dir.iterdir():
        if p.is_file() and p.suffix in (".csv", ".json") and not p.name.startswith("."):
            found.append(p.name)
    for sub in _DATA_SUBDIRS:
        base = golden_dir / sub
        if not base.is_dir():
            continue
        for p in base.rglob("*"):
            rel = p.relative_to(golden_dir)
            if not p.is_file() or any(
                part.startswith(".") or part == "__pycache__" for part in rel.parts
            ):
                continue
            found.append(rel.as_posix())
    return sorted(found)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_manifest(golden_dir: Path | str | None = None) -> Path:
    """Regenerate ``MANIFEST.sha256`` (``sha256sum -c`` format) over every data file."""
    golden_dir = Path(golden_dir) if golden_dir is not None else default_golden_dir()
    lines = [f"{_sha256(golden_dir / rel)}  {rel}\n" for rel in _data_files(golden_dir)]
    path = golden_dir / MANIFEST_FILE
    _atomic_write(path, "".join(lines).encode("utf-8"))
    return path


_MANIFEST_LINE = re.compile(r"^(?P<sha>[0-9a-f]{64})  (?P<path>\S.*)$")


def verify_manifest(golden_dir: Path | str | None = None) -> list[str]:
    """Problems with the manifest (empty list = every data file matches its hash)."""
    golden_dir = Path(golden_dir) if golden_dir is not None else default_golden_dir()
    path = golden_dir / MANIFEST_FILE
    if not path.exists():
        return [f"{MANIFEST_FILE}: missing (run `cpmem golden manifest`)"]
    problems: list[str] = []
    listed: dict[str, str] = {}
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        m = _MANIFEST_LINE.match(line)
        if not m:
            problems.append(f"{MANIFEST_FILE}: line {i} is not '<sha256>  <path>': {line!r}")
            continue
        listed[m["path"]] = m["sha"]
    for rel, want in sorted(listed.items()):
        target = golden_dir / rel
        if not target.is_file():
            problems.append(f"{rel}: listed in {MANIFEST_FILE} but missing")
            continue
        got = _sha256(target)
        if got != want:
            problems.append(f"{rel}: sha256 {got} does not match the manifest's {want}")
    for rel in _data_files(golden_dir):
        if rel not in listed:
            problems.append(f"{rel}: data file not in {MANIFEST_FILE}")
    return problems


def check_sources(golden_dir: Path | str | None = None) -> list[str]:
    """Problems between cells.csv and the provenance copies (empty list = consistent).

    Every row of every source file must appear in cells.csv with identical values.
    """
    golden_dir = Path(golden_dir) if golden_dir is not None else default_golden_dir()
    try:
        expected = normalize_sources(golden_dir / SOURCES_SUBDIR)
        rows = _existing_rows(golden_dir)
    except GoldenDataError as exc:
        return [str(exc)]
    by_id = {r["cell_id"]: r for r in rows}
    problems: list[str] = []
    for exp in expected:
        cid = exp["cell_id"]
        got = by_id.get(cid)
        if got is None:
            problems.append(f"{CELLS_FILE}: cell {cid!r} of {exp['source_file']} is missing")
            continue
        problems.extend(
            f"{CELLS_FILE}: cell {cid!r} column {n!r}: cells.csv has {got[n]!r}, "
            f"{exp['source_file']} gives {exp[n]!r}"
            for n in COLUMN_NAMES
            if got[n] != exp[n]
        )
    return problems


def verify(golden_dir: Path | str | None = None) -> list[str]:
    """Every check at once: schema, manifest, and agreement with the sources."""
    golden_dir = Path(golden_dir) if golden_dir is not None else default_golden_dir()
    problems: list[str] = []
    try:
        load_cells(golden_dir / CELLS_FILE)
    except GoldenDataError as exc:
        problems.append(str(exc))
    problems.extend(verify_manifest(golden_dir))
    problems.extend(p for p in check_sources(golden_dir) if p not in problems)
    return problems


# --------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cpmem golden", description="Import, verify and pin the measured golden cells."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_import = sub.add_parser("import", help="import source CSVs into golden/ (append-only)")
    p_import.add_argument(
        "--sources",
        type=Path,
        default=None,
        help="directory with README.md and the source CSVs (default: GOLDEN/sources)",
    )
    p_verify = sub.add_parser("verify", help="check schema, manifest and agreement with sources")
    p_manifest = sub.add_parser("manifest", help="regenerate golden/MANIFEST.sha256")
    for p in (p_import, p_verify, p_manifest):
        p.add_argument(
            "--golden",
            type=Path,
            default=None,
            help="golden directory (default: $CPMEM_GOLDEN_DIR or the repo's golden/)",
        )
    return parser


def main(argv: list[str] | None = None) -> int:
    """``cpmem golden import|verify|manifest``; returns the process exit status."""
    args = _parser().parse_args(argv)
    golden_dir: Path = args.golden if args.golden is not None else default_golden_dir()
    try:
        if args.command == "import":
            sources: Path = (
                args.sources if args.sources is not None else (golden_dir / SOURCES_SUBDIR)
            )
            report = import_sources(sources, golden_dir)
            print(report.summary())
            stale = verify_manifest(golden_dir)
            print(
                "manifest ok"
                if not stale
                else f"manifest stale ({len(stale)} problems): run `cpmem golden manifest`"
            )
            return 0
        if args.command == "manifest":
            path = write_manifest(golden_dir)
            print(f"wrote {path} ({len(_data_files(golden_dir))} files)")
            return 0
        problems = verify(golden_dir)
    except GoldenDataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if problems:
        for p in problems:
            print(f"problem: {p}", file=sys.stderr)
        return 1
    n = len(load_cells(golden_dir / CELLS_FILE))
    print(f"{n} cells ok: schema valid, manifest ok, sources agree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
