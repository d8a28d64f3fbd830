"""The schema of ``golden/cells.csv``, declared once: :class:`CellsModel`, a pandera
``DataFrameModel`` (column types, nullability, closed value sets, patterns, minimums,
and the cross-column rules). ``golden/schema.json``, the column list and the checks
of the raw text (an integer is written in plain decimal, a boolean as True / False)
are all generated from it. ``validate_frame`` / ``validate_row`` check rows of text
against it and raise GoldenDataError naming file, row, column and value.

The TP source's derived column (``min_estimate_to_forward_ratio``) is not copied into
``cells.csv``; :class:`TpRatioModel` holds it to its definition when a source is read.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pandas as pd
import pandera.pandas as pa
from pandas.api import types as ptypes
from pandera.typing import Series

from cpmem.golden.files import APPENDED_BY, CELLS_FILE, IMPORTED_BY

ColumnType = Literal["int", "str", "bool", "float"]

SCHEMA_VERSION = 1
_HEX = "[0-9a-f]"

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
# '' is the CSV's empty field (mode none); in a frame an empty field is <NA>.
MODULES: tuple[str, ...] = ("", "core_attn", "core_attn+mlp", "core_attn+moe")
BOOLEANS = ("True", "False")

PEAK_COLUMNS: tuple[str, ...] = (
    "forward_peak_bytes",
    "first_forward_peak_bytes",
    "repeat_forward_peak_bytes",
    "retained_max_bytes",
    "forward_backward_peak_bytes",
)

Int = pd.Int64Dtype
Bool = pd.BooleanDtype


def _f(
    description: str,
    *,
    unit: str | None = None,
    nullable: bool = False,
    allowed: Sequence[str] | None = None,
    pattern: str | None = None,
    unique: bool = False,
) -> Any:
    """A text or boolean column: nullability, closed set or pattern, unit (metadata)."""
    return pa.Field(
        nullable=nullable,
        unique=unique,
        isin=None if allowed is None else list(allowed),
        str_matches=pattern,
        description=description,
        metadata={"unit": unit},
    )


def _n(description: str, *, unit: str | None = None, nullable: bool = False) -> Any:
    """An integer column: every count and byte figure is at least 0."""
    return pa.Field(ge=0, nullable=nullable, description=description, metadata={"unit": unit})


def _flag(df: pd.DataFrame, ok: Mapping[str, pd.Series]) -> pd.DataFrame:
    """A frame-shaped verdict: True everywhere but where ``ok[column]`` is False, so a
    failure names its row and column. Unknown (<NA>) counts as passing: a missing
    value is the nullability check's to report."""
    out = np.ones(df.shape, dtype=bool)
    for col, verdict in ok.items():
        passed = verdict.astype("boolean").fillna(True).to_numpy(dtype=bool)
        out[:, df.columns.get_loc(col)] = passed
    return pd.DataFrame(out, index=df.index, columns=df.columns)


class CellsModel(pa.DataFrameModel):
    """One row per measured cell of ``golden/cells.csv``; column order = file order.

    An empty field means 'not recorded' (<NA> in a frame) and is never filled in.
    """

    cell_id: Series[str] = _f(
        "stable unique id of the measured cell", pattern=r"^[A-Za-z0-9_.+:/-]+$", unique=True
    )
    source_file: Series[str] = _f("file name under golden/sources (or golden/campaigns)")
    source_row: Series[Int] = _n("1-based data row index in source_file", unit="row")
    source_repository: Series[str] = _f("repository that published the measurement")
    source_path: Series[str] = _f("path of the published file in source_repository")
    source_commit: Series[str] = _f(
        "commit of source_repository the file was taken at", pattern=rf"^{_HEX}{{40}}$"
    )
    campaign: Series[str] = _f("measurement campaign", allowed=CAMPAIGNS)
    phase: Series[str] = _f("estimator variant the cell was recorded under", allowed=PHASES)
    estimator_source_sha: Series[str] = _f(
        "estimator source commit, as recorded", pattern=rf"^{_HEX}{{7,40}}$"
    )
    driver_sha256: Series[str] = _f("sha256 of the measurement driver", pattern=rf"^{_HEX}{{64}}$")
    model: Series[str] = _f("Hugging Face model id as recorded")
    layers: Series[Int] = _n("decoder layers", unit="layers")
    gdn_layers: Series[Int] = _n("Gated DeltaNet layers among them", unit="layers")
    tp: Series[Int] = _n("tensor-parallel size", unit="ranks")
    cp: Series[Int] = _n("context-parallel size", unit="ranks")
    ep: Series[Int] = _n("expert-parallel size", unit="ranks")
    etp: Series[Int] = _n("expert tensor-parallel size", unit="ranks")
    sequence_parallel: Series[Bool] = _f("sequence parallelism on")
    compiled: Series[Bool] = _f("layers ran under torch.compile (eager otherwise)")
    concentrated_routing: Series[Bool] = _f(
        "MoE routing concentrated on few experts", nullable=True
    )
    mode: Series[str] = _f("recompute granularity", allowed=MODES)
    modules: Series[str] = _f(
        "selective recompute modules ('' for mode none)", nullable=True, allowed=MODULES
    )
    lengths: Series[str] = _f(
        "sequence lengths, '+'-joined as recorded", pattern=r"^[1-9][0-9]*(\+[1-9][0-9]*)*$"
    )
    shared_prefix: Series[Int] = _n("tokens the sequences share as a prefix", unit="tokens")
    logical_tokens: Series[Int] = _n("sum of lengths", unit="tokens")
    packed_tokens: Series[Int] = _n("tokens after prefix sharing and TP padding", unit="tokens")
    retained_tokens: Series[Int] = _n(
        "tokens on the busiest CP rank (CP file only)", unit="tokens", nullable=True
    )
    grad_segments: Series[Int] = _n(
        "gradient-enabled prefix-tree segments", unit="segments", nullable=True
    )
    selected_max_depth: Series[Int] = _n("prefix-tree depth the planner selected", nullable=True)
    memory_minimal: Series[Bool] = _f("planner chose its memory-minimal plan", nullable=True)
    measured_rank_samples: Series[Int] = _n("rank-samples the peaks aggregate", unit="rank-samples")
    refused_rank_samples: Series[Int] = _n(
        "rank-samples the estimator refused", unit="rank-samples"
    )
    recorded_estimate_bytes: Series[Int] = _n(
        "reference estimate recorded with the cell", unit="bytes", nullable=True
    )
    recorded_old_estimate_bytes: Series[Int] = _n(
        "estimate before busiest-rank pricing (CP file only)", unit="bytes", nullable=True
    )
    available_bytes: Series[Int] = _n(
        "minimum available bytes over ranks", unit="bytes", nullable=True
    )
    forward_peak_bytes: Series[Int] = _n(
        "forward peak, max over ranks and repetitions", unit="bytes", nullable=True
    )
    first_forward_peak_bytes: Series[Int] = _n(
        "forward peak of the first (cold) repetition", unit="bytes", nullable=True
    )
    repeat_forward_peak_bytes: Series[Int] = _n(
        "forward peak of the repeat (warm) repetition", unit="bytes", nullable=True
    )
    retained_max_bytes: Series[Int] = _n(
        "memory still held after forward", unit="bytes", nullable=True
    )
    forward_backward_peak_bytes: Series[Int] = _n(
        "peak over forward and backward", unit="bytes", nullable=True
    )
    baseline_min_bytes: Series[Int] = _n(
        "pre-forward allocated bytes, min over ranks", unit="bytes", nullable=True
    )
    baseline_max_bytes: Series[Int] = _n(
        "pre-forward allocated bytes, max over ranks", unit="bytes", nullable=True
    )
    finite: Series[Bool] = _f("loss (and gradients, where recorded) were finite", nullable=True)
    recorded_covers_forward: Series[Bool] = _f(
        "recorded estimate covered the forward peak", nullable=True
    )
    unit: Series[str] = _f("unit of every *_bytes column", allowed=("bytes",))
    device: Series[str] = _f("GPU the cell was measured on")
    dtype: Series[str] = _f("activation dtype", allowed=("bf16",))
    imported_by: Series[str] = _f("tool that wrote the row", allowed=(IMPORTED_BY, APPENDED_BY))

    class Config:
        strict = True
        ordered = True

    # ----- cross-column rules (each names the column it blames) -----

    @pa.dataframe_check(error="must equal the sum of lengths", ignore_na=False)
    def logical_tokens_is_the_sum_of_lengths(cls, df: pd.DataFrame) -> pd.DataFrame:
        parts = df["lengths"].astype(object).str.split("+").explode()
        total = pd.to_numeric(parts, errors="coerce").groupby(level=0).sum(min_count=1)
        return _flag(df, {"logical_tokens": df["logical_tokens"] == total.reindex(df.index)})

    @pa.dataframe_check(error="must be empty when mode is none", ignore_na=False)
    def mode_none_has_no_modules(cls, df: pd.DataFrame) -> pd.DataFrame:
        return _flag(df, {"modules": ~((df["mode"] == "none") & df["modules"].notna())})

    @pa.dataframe_check(
        error="must name the recomputed modules when mode is selective", ignore_na=False
    )
    def selective_names_its_modules(cls, df: pd.DataFrame) -> pd.DataFrame:
        return _flag(df, {"modules": ~((df["mode"] == "selective") & df["modules"].isna())})

    @pa.dataframe_check(
        error="a cell with no measured rank-sample cannot have a peak", ignore_na=False
    )
    def no_peak_without_a_measured_rank_sample(cls, df: pd.DataFrame) -> pd.DataFrame:
        ran = df["measured_rank_samples"] != 0
        return _flag(df, {c: df[c].isna() | ran for c in PEAK_COLUMNS})

    @pa.dataframe_check(
        error="must be the maximum of the first and the repeat forward peaks", ignore_na=False
    )
    def forward_peak_is_the_max_of_both_repetitions(cls, df: pd.DataFrame) -> pd.DataFrame:
        both = df[["first_forward_peak_bytes", "repeat_forward_peak_bytes"]].max(
            axis=1, skipna=False
        )
        return _flag(df, {"forward_peak_bytes": df["forward_peak_bytes"] == both})

    @pa.dataframe_check(
        error="must say whether recorded_estimate_bytes >= forward_peak_bytes", ignore_na=False
    )
    def covers_forward_agrees_with_the_figures(cls, df: pd.DataFrame) -> pd.DataFrame:
        covers = df["recorded_estimate_bytes"] >= df["forward_peak_bytes"]
        return _flag(df, {"recorded_covers_forward": df["recorded_covers_forward"] == covers})


class TpRatioModel(pa.DataFrameModel):
    """The TP source file's ``min_estimate_to_forward_ratio`` (raw text): the recorded
    estimate over the forward peak, empty where no peak was measured. It is derived,
    so ``cells.csv`` does not copy it; reading the source holds it to its definition."""

    estimate_bytes: Series[Any] = pa.Field(nullable=True)
    forward_peak_max_bytes: Series[Any] = pa.Field(nullable=True)
    min_estimate_to_forward_ratio: Series[Any] = pa.Field(nullable=True)

    class Config:
        strict = False

    @pa.dataframe_check(error="must equal estimate_bytes / forward_peak_max_bytes", ignore_na=False)
    def ratio_is_estimate_over_forward_peak(cls, df: pd.DataFrame) -> pd.DataFrame:
        estimate = pd.to_numeric(df["estimate_bytes"], errors="coerce").astype(float)
        peak = pd.to_numeric(df["forward_peak_max_bytes"], errors="coerce").astype(float)
        ratio = pd.to_numeric(df["min_estimate_to_forward_ratio"], errors="coerce")
        given = df["min_estimate_to_forward_ratio"].notna()
        equal = ratio == estimate / peak  # the file writes the quotient exactly (repr)
        ok = (given & equal) | (~given & peak.isna())
        return _flag(df, {"min_estimate_to_forward_ratio": ok})


# --------------------------------------------------------------------------------------
# What is generated from the model: the column list, schema.json, the raw-text checks
# --------------------------------------------------------------------------------------

CELLS_SCHEMA: pa.DataFrameSchema = CellsModel.to_schema()
# Rows on their way in (a source file, a campaign's rows): every rule but the id's
# uniqueness, which the append-only merge judges against what is already there.
ROW_SCHEMA: pa.DataFrameSchema = CELLS_SCHEMA.update_column("cell_id", unique=False)
TP_RATIO_SCHEMA: pa.DataFrameSchema = TpRatioModel.to_schema()


@dataclass(frozen=True)
class ColumnSpec:
    """One column of ``cells.csv`` as ``schema.json`` writes it (read off CellsModel)."""

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


def _column_type(column: pa.Column) -> ColumnType:
    dtype = column.dtype.type
    if ptypes.is_bool_dtype(dtype):
        return "bool"
    if ptypes.is_integer_dtype(dtype):
        return "int"
    if ptypes.is_float_dtype(dtype):
        return "float"
    if ptypes.is_string_dtype(dtype):
        return "str"
    raise TypeError(f"column {column.name!r}: no schema.json type for dtype {dtype}")


def _spec(column: pa.Column) -> ColumnSpec:
    stats = {check.name: check.statistics for check in column.checks}
    allowed = stats.get("isin", {}).get("allowed_values")
    minimum = stats.get("greater_than_or_equal_to", {}).get("min_value")
    return ColumnSpec(
        name=str(column.name),
        type=_column_type(column),
        nullable=bool(column.nullable),
        description=str(column.description or ""),
        unit=(column.metadata or {}).get("unit"),
        allowed=None if allowed is None else tuple(str(a) for a in allowed),
        pattern=stats.get("str_matches", {}).get("pattern"),
        minimum=None if minimum is None else int(minimum),
    )


COLUMNS: tuple[ColumnSpec, ...] = tuple(_spec(c) for c in CELLS_SCHEMA.columns.values())
COLUMN_NAMES: tuple[str, ...] = tuple(c.name for c in COLUMNS)


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


_INT_TEXT = r"(0|-?[1-9][0-9]*)"


def _written_as(ctype: ColumnType, test: Any, error: str) -> pa.Check:
    """How every column of one type must be written in the CSV: one frame-level check
    over those columns (an empty field passes; nullability is the model's to judge)."""
    names = [c.name for c in COLUMNS if c.type == ctype]

    def verdict(df: pd.DataFrame) -> pd.DataFrame:
        text = df[names]
        return _flag(df, {n: text[n].isna() | test(text[n].astype(object)) for n in names})

    return pa.Check(verdict, name=f"{ctype}_text", error=error, ignore_na=False)


RAW_SCHEMA: pa.DataFrameSchema = pa.DataFrameSchema(
    {c.name: pa.Column(None, nullable=True, name=c.name) for c in COLUMNS},
    checks=[
        _written_as(
            "int",
            lambda s: s.str.fullmatch(_INT_TEXT),
            "must be an integer written in plain decimal",
        ),
        _written_as("bool", lambda s: s.isin(BOOLEANS), "must be True or False"),
        _written_as(
            "float",
            lambda s: pd.Series(np.isfinite(pd.to_numeric(s, errors="coerce")), index=s.index),
            "must be a finite number",
        ),
    ],
    strict=True,
    ordered=True,
)
