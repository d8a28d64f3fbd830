"""Rows of text -> a typed frame validated against :class:`~cpmem.golden.schema.CellsModel`;
a violation becomes one GoldenDataError naming file, row, column and the value as written."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
import pandera.pandas as pa
from pandera.errors import SchemaErrors

from cpmem.golden.files import CELLS_FILE, GoldenDataError
from cpmem.golden.schema import CELLS_SCHEMA, COLUMN_NAMES, COLUMNS, RAW_SCHEMA, ROW_SCHEMA


def raw_frame(
    rows: Sequence[Mapping[str, str]], names: Sequence[str], index: Sequence[int]
) -> pd.DataFrame:
    """Rows of text as a frame of Python strings, an empty field as None (<NA>)."""
    data = {n: [r[n] if r[n] != "" else None for r in rows] for n in names}
    return pd.DataFrame(
        data, index=pd.Index(list(index), name="row"), columns=list(names), dtype=object
    )


def _typed(raw: pd.DataFrame) -> pd.DataFrame:
    """The raw text (already checked by RAW_SCHEMA) in the model's dtypes."""
    out: dict[str, Any] = {}
    for spec in COLUMNS:
        values = raw[spec.name].tolist()
        dtype = CELLS_SCHEMA.columns[spec.name].dtype.type
        if spec.type == "int":
            values = [None if v is None else int(v) for v in values]
        elif spec.type == "bool":
            values = [None if v is None else v == "True" for v in values]
        elif spec.type == "float":
            values = [None if v is None else float(v) for v in values]
        out[spec.name] = pd.array(values, dtype=dtype)
    return pd.DataFrame(out, index=raw.index)


def validate_frame(
    rows: Sequence[Mapping[str, str]],
    *,
    where: str = CELLS_FILE,
    index: Sequence[int] | None = None,
    schema: pa.DataFrameSchema = CELLS_SCHEMA,
    report_row: bool = True,
) -> pd.DataFrame:
    """Rows of text, validated against the model, as a typed frame indexed by row number.

    ``index`` numbers the rows (default 1, 2, ...); an error names that number unless
    ``report_row`` is false. Raises GoldenDataError on the first failure (by row, then
    column order), naming file, row, column and the value as written.
    """
    names = list(COLUMN_NAMES)
    idx = list(index) if index is not None else list(range(1, len(rows) + 1))
    for row_no, row in zip(idx, rows, strict=True):
        missing = [n for n in names if n not in row]
        extra = [k for k in row if k not in names]
        if missing or extra:
            raise GoldenDataError(
                f"missing columns {missing}" if missing else f"unknown columns {extra}",
                file=where,
                row=row_no if report_row else None,
            )
    raw = raw_frame(rows, names, idx)
    check(RAW_SCHEMA, raw, raw, where, report_row)
    typed = _typed(raw)
    check(schema, typed, raw, where, report_row)
    return typed


def validate_row(
    row: Mapping[str, str],
    *,
    where: str = CELLS_FILE,
    row_no: int | None = None,
) -> None:
    """Check one row of text against CellsModel (GoldenDataError on a violation)."""
    validate_frame(
        [row], where=where, index=[row_no or 1], schema=ROW_SCHEMA, report_row=row_no is not None
    )


def check(
    schema: pa.DataFrameSchema,
    frame: pd.DataFrame,
    raw: pd.DataFrame,
    where: str,
    report_row: bool = True,
) -> None:
    """Validate ``frame`` with ``schema``; a failure becomes a GoldenDataError naming the
    file, the row (the frame's index), the column and the value as written in ``raw``."""
    try:
        schema.validate(frame, lazy=True)
    except SchemaErrors as exc:
        raise _golden_error(schema, exc.failure_cases, frame, raw, where, report_row) from None


def _reason(schema: pa.DataFrameSchema, case: Mapping[str, Any], column: str | None) -> str:
    number = case["check_number"]
    check_name = str(case["check"])
    if check_name == "not_nullable":
        return "must not be empty"
    found: pa.Check | None = None
    if number is not None and not pd.isna(number):
        if case["schema_context"] == "Column" and column in schema.columns:
            found = schema.columns[column].checks[int(number)]
        elif case["schema_context"] == "DataFrameSchema":
            found = schema.checks[int(number)]
    if found is None:
        return check_name
    stats: dict[str, Any] = found.statistics or {}
    if found.name == "isin" and "allowed_values" in stats:
        return f"not one of the allowed values {list(stats['allowed_values'])}"
    if found.name == "str_matches" and "pattern" in stats:
        return f"does not match {stats['pattern']}"
    if found.name == "greater_than_or_equal_to" and "min_value" in stats:
        return f"must be >= {stats['min_value']}"
    return str(found.error or found.name)


def _text(raw: pd.DataFrame, row: int, column: str) -> str | None:
    """The value as written in the file ('' for an empty field); None if no such cell."""
    if column not in raw.columns or row not in raw.index:
        return None
    text: Any = raw.at[row, column]
    return text if isinstance(text, str) else ""


def _golden_error(
    schema: pa.DataFrameSchema,
    cases: pd.DataFrame,
    frame: pd.DataFrame,
    raw: pd.DataFrame,
    where: str,
    report_row: bool,
) -> GoldenDataError:
    order = {name: i for i, name in enumerate(raw.columns)}
    found: list[tuple[tuple[int, int], int | None, str | None, str]] = []
    rules_failed = False
    column: str | None
    for record in cases.to_dict("records"):
        case = {str(k): v for k, v in record.items()}
        row = None if case["index"] is None or pd.isna(case["index"]) else int(case["index"])
        failure = case["failure_case"]
        if isinstance(failure, dict):  # a cross-column rule: placed below, from its verdict
            rules_failed = True
            continue
        if case["schema_context"] == "Column":
            column = str(case["column"])
        else:  # a column missing, unknown or out of order
            column = str(failure)
        reason = _reason(schema, case, column)
        if case["check"] == "field_uniqueness" and column is not None and row is not None:
            first = min(int(i) for i in raw.index[raw[column] == _text(raw, row, column)])
            if first == row:
                continue
            reason = f"duplicate {column} (first at row {first})"
        key = (-1 if row is None else row, order.get(column or "", -1))
        found.append((key, row, column, reason))
    if rules_failed or not found:
        # a cross-column rule's verdict is a frame: False where it blames (row, column),
        # an empty (<NA>) field included, which pandera's own failure cases leave out
        for rule in schema.checks:
            verdict = rule(frame).check_output
            if not isinstance(verdict, pd.DataFrame):
                continue
            for name in verdict.columns:
                for label in verdict.index[~verdict[name].astype(bool)]:
                    key = (int(label), order.get(str(name), -1))
                    found.append((key, int(label), str(name), str(rule.error)))
    if not found:  # pandera reported nothing that names a row and column
        return GoldenDataError(f"schema validation failed:\n{cases}", file=where)
    found.sort(key=lambda f: f[0])
    _, row, column, reason = found[0]
    value = None if row is None or column is None else _text(raw, row, column)
    more = len(found) - 1
    if more:
        reason += f" ({more} other failure{'s' if more > 1 else ''} in {where})"
    return GoldenDataError(
        reason, file=where, row=row if report_row else None, column=column, value=value
    )
