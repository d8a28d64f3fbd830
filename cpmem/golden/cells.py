"""Measured cells: ``cells.csv`` loaded as a DataFrame validated against the schema
(:class:`cpmem.golden.schema.CellsModel`), and as typed rows (:class:`MeasuredCell`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from cpmem.golden.files import CELLS_FILE, GoldenDataError, default_golden_dir, read_csv
from cpmem.golden.schema import COLUMN_NAMES, COLUMNS, PEAK_COLUMNS
from cpmem.golden.validation import validate_frame


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


def _python(value: Any, ctype: str) -> Any:
    """A frame value as the plain Python value of its column type (<NA> -> None;
    a text column's empty field -> '', as written)."""
    if value is None or value is pd.NA or (not isinstance(value, str) and pd.isna(value)):
        return "" if ctype == "str" else None
    if ctype == "int":
        return int(value)
    if ctype == "bool":
        return bool(value)
    if ctype == "float":
        return float(value)
    return str(value)


def cells_from_frame(frame: pd.DataFrame) -> list[MeasuredCell]:
    """Typed rows of a validated cells frame (``load_frame``), in frame order."""
    columns = {
        spec.name: [_python(v, spec.type) for v in frame[spec.name].tolist()] for spec in COLUMNS
    }
    return [
        MeasuredCell(**{name: columns[name][i] for name in COLUMN_NAMES}) for i in range(len(frame))
    ]


def read_cells(path: Path) -> tuple[list[dict[str, str]], pd.DataFrame]:
    """A cells.csv as written (rows of text) and as a validated frame (index: the
    1-based row number). Header, types, closed sets, patterns, cross-column rules and
    unique ids are all checked; the first violation raises GoldenDataError."""
    header, rows = read_csv(path)
    names = list(COLUMN_NAMES)
    if header != names:
        raise GoldenDataError(
            f"header {header} differs from the schema's columns {names}", file=str(path)
        )
    return rows, validate_frame(rows, where=str(path))


def read_cells_rows(path: Path) -> list[dict[str, str]]:
    """Rows of a cells.csv as text (for the append-only merge), validated."""
    return read_cells(path)[0]


def load_frame(path: Path | str | None = None) -> pd.DataFrame:
    """``cells.csv`` (default: the golden dir's) as a DataFrame validated against
    CellsModel: one row per cell, indexed by the 1-based row number, nullable dtypes
    (``Int64``, ``boolean``, strings); an empty field is <NA>. A violation raises
    GoldenDataError naming file, row, column and value."""
    cells_path = Path(path) if path is not None else default_golden_dir() / CELLS_FILE
    return read_cells(cells_path)[1]


def load_cells(path: Path | str | None = None) -> list[MeasuredCell]:
    """Load and validate ``cells.csv`` (default: the golden dir's), one typed
    MeasuredCell per row, built from :func:`load_frame`."""
    return cells_from_frame(load_frame(path))
