"""The schema of ``golden/cells.csv``: every column typed, with its closed value set or
pattern, and the cross-column rules a row must satisfy (``validate_row``)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from cpmem.golden.files import APPENDED_BY, CELLS_FILE, IMPORTED_BY, GoldenDataError

ColumnType = Literal["int", "str", "bool", "float"]

SCHEMA_VERSION = 1
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
BOOLEANS = ("True", "False")

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
        "booleans": list(BOOLEANS),
        "columns": [c.to_json() for c in columns],
    }


def schema_bytes(columns: Sequence[ColumnSpec] = COLUMNS) -> bytes:
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
        if value not in BOOLEANS:
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
