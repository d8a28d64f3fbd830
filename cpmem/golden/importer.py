"""Append-only import: sources and driver rows merged into ``cells.csv``; a cell already
present with other values is refused (naming cell, column, both values); nothing is
written unless every row passed."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cpmem.golden.cells import read_cells_rows
from cpmem.golden.files import (
    APPENDED_BY,
    CAMPAIGNS_SUBDIR,
    CELLS_FILE,
    SCHEMA_FILE,
    SOURCES_SUBDIR,
    GoldenDataError,
    atomic_write,
    csv_bytes,
)
from cpmem.golden.schema import COLUMN_NAMES, ROW_SCHEMA, schema_bytes
from cpmem.golden.sources import SOURCES_README, normalize_sources, read_provenance
from cpmem.golden.validation import validate_frame


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


def existing_rows(golden_dir: Path) -> list[dict[str, str]]:
    path = golden_dir / CELLS_FILE
    if not path.exists():
        return []
    return read_cells_rows(path)


def _commit(golden_dir: Path, writes: Sequence[tuple[Path, bytes]]) -> tuple[str, ...]:
    """Write the files whose bytes change (each atomically); return their golden paths."""
    written: list[str] = []
    for path, data in writes:
        if path.exists() and path.read_bytes() == data:
            continue
        atomic_write(path, data)
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
    if campaign_rows:
        validate_frame(campaign_rows, where="campaign_rows", schema=ROW_SCHEMA)
    for i, extra in enumerate(campaign_rows or (), start=1):
        incoming.append((f"campaign_rows[{i}]", extra))
    merged, imported, skipped = _merge(existing_rows(golden_dir), incoming)

    copies: list[tuple[Path, bytes]] = []
    names = [SOURCES_README, *(info.file for info in read_provenance(sources_dir))]
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
            (golden_dir / SCHEMA_FILE, schema_bytes()),
            (golden_dir / CELLS_FILE, csv_bytes(merged, COLUMN_NAMES)),
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
    prepared = [{**given, "imported_by": given.get("imported_by") or APPENDED_BY} for given in rows]
    if prepared:
        validate_frame(prepared, where="append_rows", schema=ROW_SCHEMA)
    incoming: list[tuple[str, Mapping[str, str]]] = []
    for i, row in enumerate(prepared, start=1):
        if row["campaign"] != campaign:
            raise GoldenDataError(
                f"campaign differs from provenance campaign {campaign!r}",
                file="append_rows",
                row=i,
                column="campaign",
                value=row["campaign"],
            )
        incoming.append((f"append_rows[{i}]", row))
    merged, imported, skipped = _merge(existing_rows(golden_dir), incoming)
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
        writes.append((golden_dir / SCHEMA_FILE, schema_bytes()))
    writes.append((golden_dir / CELLS_FILE, csv_bytes(merged, COLUMN_NAMES)))
    written = _commit(golden_dir, writes)
    return ImportReport(tuple(imported), tuple(skipped), written)
