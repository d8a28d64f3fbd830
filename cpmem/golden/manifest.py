"""``golden/MANIFEST.sha256`` pins the bytes of every data file; ``verify`` runs every
check of the data layer at once (schema, manifest, agreement with the sources)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from cpmem.golden.cells import read_cells_rows
from cpmem.golden.files import (
    CAMPAIGNS_SUBDIR,
    CELLS_FILE,
    CONTROLS_SUBDIR,
    MANIFEST_FILE,
    SCHEMA_FILE,
    SOURCES_SUBDIR,
    GoldenDataError,
    atomic_write,
    default_golden_dir,
)
from cpmem.golden.importer import existing_rows
from cpmem.golden.megatron import MEGATRON_SUBDIR, check_recordings, load_recordings
from cpmem.golden.megatron_history import RECORDED_IMAGES_FILE, load_recorded_images
from cpmem.golden.schema import COLUMN_NAMES, schema_bytes
from cpmem.golden.sources import normalize_sources

_DATA_SUBDIRS = (SOURCES_SUBDIR, CONTROLS_SUBDIR, CAMPAIGNS_SUBDIR, MEGATRON_SUBDIR)


def data_files(golden_dir: Path) -> list[str]:
    """Golden-relative paths of every data file: top-level .csv/.json, and all files
    under sources/, controls/, campaigns/ and megatron/ (hidden files and caches excluded)."""
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
    lines = [f"{_sha256(golden_dir / rel)}  {rel}\n" for rel in data_files(golden_dir)]
    path = golden_dir / MANIFEST_FILE
    atomic_write(path, "".join(lines).encode("utf-8"))
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
    for rel in data_files(golden_dir):
        if rel not in listed:
            problems.append(f"{rel}: data file not in {MANIFEST_FILE}")
    return problems


def check_sources(
    golden_dir: Path | str | None = None, rows: Sequence[Mapping[str, str]] | None = None
) -> list[str]:
    """Problems between cells.csv and the provenance copies (empty list = consistent).

    Every row of every source file must appear in cells.csv with identical values.
    ``rows``: cells.csv's rows already read and validated (read here when None).
    """
    golden_dir = Path(golden_dir) if golden_dir is not None else default_golden_dir()
    try:
        expected = normalize_sources(golden_dir / SOURCES_SUBDIR)
        rows = existing_rows(golden_dir) if rows is None else rows
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


def check_schema_file(golden_dir: Path | str | None = None) -> list[str]:
    """Problems with ``schema.json``: it must be what CellsModel generates."""
    golden_dir = Path(golden_dir) if golden_dir is not None else default_golden_dir()
    path = golden_dir / SCHEMA_FILE
    if not path.is_file():
        return [f"{SCHEMA_FILE}: missing (run `cpmem golden import`)"]
    if path.read_bytes() != schema_bytes():
        return [
            f"{SCHEMA_FILE}: differs from the schema cpmem.golden.schema.CellsModel declares "
            "(run `cpmem golden import` to regenerate it, then `cpmem golden manifest`)"
        ]
    return []


def verify(golden_dir: Path | str | None = None) -> list[str]:
    """Every check at once: schema, manifest, agreement with the sources, and the
    Megatron-LM recordings' table against the configs and provenance kept beside it."""
    golden_dir = Path(golden_dir) if golden_dir is not None else default_golden_dir()
    problems: list[str] = []
    rows: list[dict[str, str]] | None = None
    try:
        rows = read_cells_rows(golden_dir / CELLS_FILE)
    except GoldenDataError as exc:
        problems.append(str(exc))
    problems.extend(check_schema_file(golden_dir))
    problems.extend(verify_manifest(golden_dir))
    problems.extend(p for p in check_sources(golden_dir, rows) if p not in problems)
    if (golden_dir / MEGATRON_SUBDIR).is_dir():
        try:
            recordings = load_recordings(golden_dir)
            problems.extend(check_recordings(golden_dir, recordings))
            images = load_recorded_images(golden_dir)
            problems.extend(
                f"{r.recording_id}: no row in {MEGATRON_SUBDIR}/{RECORDED_IMAGES_FILE} "
                "(run `cpmem golden megatron-history`)"
                for r in recordings
                if r.recording_id not in images
            )
        except GoldenDataError as exc:
            problems.append(str(exc))
    return problems
