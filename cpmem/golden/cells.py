"""Measured cells: ``cells.csv`` loaded, validated against the schema beside it, typed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cpmem.golden.files import (
    CELLS_FILE,
    SCHEMA_FILE,
    GoldenDataError,
    default_golden_dir,
    read_csv,
)
from cpmem.golden.schema import COLUMNS, PEAK_COLUMNS, ColumnSpec, load_schema, validate_row


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


def schema_for(cells_path: Path) -> tuple[ColumnSpec, ...]:
    schema_path = cells_path.parent / SCHEMA_FILE
    return load_schema(schema_path) if schema_path.exists() else COLUMNS


def read_cells_rows(path: Path, columns: Sequence[ColumnSpec]) -> list[dict[str, str]]:
    """Rows of a cells.csv, each validated; ids must be unique."""
    header, rows = read_csv(path)
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
    columns = schema_for(cells_path)
    return [MeasuredCell.from_row(r, columns) for r in read_cells_rows(cells_path, columns)]
