"""Integrity of the golden layer: measured values are the published bytes, and stay so.

The source CSVs are parsed here with the csv module on their own, never through
the importer, so that a mapping mistake in the importer cannot hide itself.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from cpmem.golden import GOLDEN_EXTRA_HINT
from cpmem.golden import cli as golden_cli
from cpmem.golden.cells import MeasuredCell, load_cells, load_frame
from cpmem.golden.files import (
    CELLS_FILE,
    GOLDEN_DIR,
    MANIFEST_FILE,
    GoldenDataError,
    default_golden_dir,
)
from cpmem.golden.importer import append_rows, import_sources
from cpmem.golden.manifest import verify, verify_manifest, write_manifest
from cpmem.golden.schema import COLUMN_NAMES, COLUMNS, CellsModel, schema_bytes
from tests.golden.shared_dir import shared_dir

SOURCES = GOLDEN_DIR / "sources"
CP_FILE = "art_recompute_memory_cp.csv"
TP_FILE = "art_recompute_memory.csv"
SHARED_SOURCES = shared_dir() / "golden-sources"

# Source column -> cells column, written out independently of cpmem.golden.
CP_MAP = {
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
TP_MAP = {
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
# Source columns deliberately not copied one-to-one (checked separately below).
CP_OTHER = {"case"}
TP_OTHER = {"finite_loss_all", "finite_gradients_all", "min_estimate_to_forward_ratio"}
PEAKS = (
    "forward_peak_bytes",
    "first_forward_peak_bytes",
    "repeat_forward_peak_bytes",
    "retained_max_bytes",
    "forward_backward_peak_bytes",
)
# Layers / GDN layers of the CP models, from the sources README geometry table.
CP_LAYERS = {"Qwen/Qwen3.8-27B": ("64", "48"), "Qwen/Qwen3.5-4B": ("32", "24"),
             "Qwen/Qwen3-1.7B": ("28", "0")}  # fmt: skip


def raw_rows(name: str, sources: Path = SOURCES) -> list[dict[str, str]]:
    with (sources / name).open(newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def cells_rows(golden_dir: Path = GOLDEN_DIR) -> list[dict[str, str]]:
    with (golden_dir / CELLS_FILE).open(newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def readme_commit(name: str) -> str:
    text = (SOURCES / "README.md").read_text(encoding="utf-8")
    (line,) = [ln for ln in text.splitlines() if ln.startswith(f"| `{name}`")]
    match = re.search(r"OpenPipe/ART `([^`]+)` @ ([0-9a-f]{40})", line)
    assert match, line
    return match.group(2)


def snapshot(directory: Path) -> dict[str, str]:
    return {
        p.relative_to(directory).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def golden_copy(tmp_path: Path) -> Path:
    dst = tmp_path / "golden"
    shutil.copytree(GOLDEN_DIR, dst)
    return dst


def replace_in_cell(golden_dir: Path, cell_id: str, column: str, new: str) -> str:
    """Rewrite one field of one row of a copy's cells.csv; return the old value."""
    rows = cells_rows(golden_dir)
    header = list(rows[0])
    (target,) = [r for r in rows if r["cell_id"] == cell_id]
    old = target[column]
    target[column] = new
    with (golden_dir / CELLS_FILE).open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=header, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return old


# ----------------------------------------------------------------------------- content


def test_one_row_per_source_data_row() -> None:
    cells = cells_rows()
    assert len(raw_rows(CP_FILE)) == 13
    assert len(raw_rows(TP_FILE)) == 63
    assert len(cells) == 76
    keys = {(c["source_file"], int(c["source_row"])) for c in cells}
    expected = {(CP_FILE, i) for i in range(1, 14)} | {(TP_FILE, i) for i in range(1, 64)}
    assert keys == expected
    assert len({c["cell_id"] for c in cells}) == 76


@pytest.mark.parametrize(
    ("name", "mapping", "other"), [(CP_FILE, CP_MAP, CP_OTHER), (TP_FILE, TP_MAP, TP_OTHER)]
)
def test_every_source_column_is_accounted_for(
    name: str, mapping: dict[str, str], other: set[str]
) -> None:
    header = list(raw_rows(name)[0])
    assert set(header) == set(mapping) | other


def test_measured_values_equal_source_bytes() -> None:
    raws = {CP_FILE: raw_rows(CP_FILE), TP_FILE: raw_rows(TP_FILE)}
    compared = 0
    for cell in cells_rows():
        raw = raws[cell["source_file"]][int(cell["source_row"]) - 1]
        mapping = CP_MAP if cell["source_file"] == CP_FILE else TP_MAP
        for src, dst in mapping.items():
            assert cell[dst] == raw[src], (cell["cell_id"], dst)
            compared += 1
        assert cell["source_commit"] == readme_commit(cell["source_file"])
        assert cell["source_repository"] == "OpenPipe/ART"
        assert cell["unit"] == "bytes"
        assert cell["device"] == "NVIDIA H200"
        assert cell["dtype"] == "bf16"
        assert cell["logical_tokens"] == str(sum(int(x) for x in cell["lengths"].split("+")))
    assert compared == 13 * len(CP_MAP) + 63 * len(TP_MAP)


def test_cp_rows_carry_the_readme_layout() -> None:
    for cell in cells_rows():
        if cell["source_file"] != CP_FILE:
            continue
        raw = raw_rows(CP_FILE)[int(cell["source_row"]) - 1]
        assert cell["cell_id"] == f"cp:{raw['case']}:{raw['lengths']}"
        assert (cell["campaign"], cell["phase"]) == ("cp", "final")
        assert (cell["tp"], cell["cp"], cell["ep"], cell["etp"]) == ("1", "2", "1", "1")
        assert cell["sequence_parallel"] == "False"
        assert (cell["layers"], cell["gdn_layers"]) == CP_LAYERS[cell["model"]]
        for col in ("first_forward_peak_bytes", "baseline_min_bytes", "recorded_covers_forward"):
            assert cell[col] == ""  # not recorded by the CP file, never invented


def test_tp_finite_combines_loss_and_gradients() -> None:
    for cell in cells_rows():
        if cell["source_file"] != TP_FILE:
            continue
        raw = raw_rows(TP_FILE)[int(cell["source_row"]) - 1]
        pair = (raw["finite_loss_all"], raw["finite_gradients_all"])
        expected = "True" if pair == ("True", "True") else "False" if "False" in pair else ""
        assert cell["finite"] == expected
        assert (cell["campaign"], cell["cp"], cell["retained_tokens"]) == ("tp", "1", "")


def test_dropped_ratio_is_derivable_from_kept_columns() -> None:
    """min_estimate_to_forward_ratio is estimate / forward peak, so dropping it loses nothing."""
    checked = 0
    for raw in raw_rows(TP_FILE):
        if raw["min_estimate_to_forward_ratio"]:
            ratio = int(raw["estimate_bytes"]) / int(raw["forward_peak_max_bytes"])
            assert ratio == pytest.approx(float(raw["min_estimate_to_forward_ratio"]), rel=1e-12)
            checked += 1
    assert checked == 61


@pytest.mark.skipif(not SHARED_SOURCES.is_dir(), reason=f"no {SHARED_SOURCES} here")
def test_provenance_copies_are_byte_identical_to_shared_sources() -> None:
    for name in ("README.md", CP_FILE, TP_FILE):
        assert (SOURCES / name).read_bytes() == (SHARED_SOURCES / name).read_bytes(), name


def test_refused_cells_have_empty_peaks() -> None:
    cells = load_cells()
    refused = [c for c in cells if c.refused_rank_samples > 0]
    assert {c.cell_id for c in refused} == {
        "tp:before_segment_states:Qwen3.8-27B:tp4:none:-:compiled:19221+19222",
        "tp:final:Qwen3.8-27B:tp4:selective:core_attn:compiled:19221+19222",
    }
    for c in refused:
        assert c.refused and c.measured_rank_samples == 0
        assert all(getattr(c, col) is None for col in PEAKS)
        assert c.finite is None and c.recorded_estimate_bytes is not None
    assert not any(c.refused for c in cells if c.refused_rank_samples == 0)


def test_negative_control_rows_are_kept() -> None:
    raw_phases = [r["phase"] for r in raw_rows(TP_FILE)]
    cells = load_cells()
    for phase in set(raw_phases):
        kept = sum(c.phase == phase for c in cells if c.source_file == TP_FILE)
        assert kept == raw_phases.count(phase), phase
    controls = [c for c in cells if c.is_negative_control]
    assert len(controls) == 8
    # Deliberately broken estimators: their recorded estimate fails to cover the peak.
    for c in controls:
        assert c.recorded_covers_forward is False
        assert c.recorded_estimate_bytes is not None and c.forward_peak_bytes is not None
        assert c.recorded_estimate_bytes < c.forward_peak_bytes


def test_measured_cell_fields_follow_the_columns() -> None:
    names = [f.name for f in dataclasses.fields(MeasuredCell)]
    with (GOLDEN_DIR / CELLS_FILE).open(newline="", encoding="utf-8") as fh:
        header = next(csv.reader(fh))
    assert names == header == list(COLUMN_NAMES)
    cell = next(c for c in load_cells() if c.cell_id == "cp:27b-selective:2048+2048")
    assert cell.forward_peak_bytes == 33842017792
    assert cell.lengths_list == (2048, 2048)
    assert cell.compiled is False and cell.concentrated_routing is None


def test_golden_dir_env_override(monkeypatch: pytest.MonkeyPatch, golden_copy: Path) -> None:
    monkeypatch.setenv("CPMEM_GOLDEN_DIR", str(golden_copy))
    assert default_golden_dir() == golden_copy
    replace_in_cell(golden_copy, "cp:4b-none:256+256", "phase", "bogus")
    with pytest.raises(GoldenDataError, match="bogus"):
        load_cells()


# ----------------------------------------------------------------------------- schema


def test_schema_validation_passes_on_the_repo() -> None:
    assert len(load_cells()) == 76
    assert verify() == []


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("forward_peak_bytes", "33842017792.5"),  # wrong type: not an integer
        ("compiled", "yes"),  # wrong type: not a bool
        ("phase", "finalish"),  # not in the closed set
        ("mode", "partial"),
        ("source_commit", "e8128ba"),  # not a full sha
        ("layers", ""),  # not nullable
    ],
)
def test_tampered_value_is_rejected_naming_column_and_value(
    golden_copy: Path, column: str, value: str
) -> None:
    replace_in_cell(golden_copy, "cp:27b-selective:2048+2048", column, value)
    with pytest.raises(GoldenDataError) as info:
        load_cells(golden_copy / CELLS_FILE)
    message = str(info.value)
    assert repr(column) in message and repr(value) in message and "row 1" in message
    assert info.value.column == column and info.value.value == value


REFUSED = "tp:final:Qwen3.8-27B:tp4:selective:core_attn:compiled:19221+19222"
TP_CELL = "tp:final:Qwen3.5-4B:tp2:selective:core_attn+mlp:compiled:64+64"
CP_CELL = "cp:27b-selective:2048+2048"


def row_of(cell_id: str) -> int:
    return next(i for i, r in enumerate(cells_rows(), start=1) if r["cell_id"] == cell_id)


# Every rule of CellsModel corrupted once: (cell, column, new value, what the error says).
RULES = [
    pytest.param(CP_CELL, "layers", "64.0", "integer written in plain decimal", id="type-int"),
    pytest.param(CP_CELL, "compiled", "yes", "True or False", id="type-bool"),
    pytest.param(CP_CELL, "gdn_layers", "", "must not be empty", id="null-int"),
    pytest.param(CP_CELL, "device", "", "must not be empty", id="null-str"),
    pytest.param(CP_CELL, "sequence_parallel", "", "must not be empty", id="null-bool"),
    pytest.param(CP_CELL, "phase", "finalish", "allowed values", id="closed-set-phase"),
    pytest.param(CP_CELL, "modules", "mlp", "allowed values", id="closed-set-modules"),
    pytest.param(CP_CELL, "dtype", "fp16", "allowed values", id="closed-set-dtype"),
    pytest.param(CP_CELL, "source_commit", "e8128ba", "does not match", id="pattern-sha"),
    pytest.param(CP_CELL, "cell_id", "cp 27b", "does not match", id="pattern-id"),
    pytest.param(CP_CELL, "lengths", "2048,2048", "does not match", id="pattern-lengths"),
    pytest.param(CP_CELL, "tp", "-1", "must be >= 0", id="minimum"),
    pytest.param(
        "cp:27b-selective:4096+4096", "cell_id", CP_CELL, "duplicate cell_id (first at row 1)",
        id="unique-id",
    ),
    pytest.param(CP_CELL, "logical_tokens", "4097", "sum of lengths", id="rule-logical-tokens"),
    pytest.param(
        "cp:4b-none:256+256", "modules", "core_attn", "empty when mode is none", id="rule-none"
    ),
    pytest.param(CP_CELL, "modules", "", "when mode is selective", id="rule-selective"),
    pytest.param(
        REFUSED, "retained_max_bytes", "1", "no measured rank-sample", id="rule-refused-peak"
    ),
    pytest.param(
        TP_CELL, "forward_peak_bytes", "999999999999", "maximum of the first and the repeat",
        id="rule-forward-max",
    ),
    pytest.param(
        TP_CELL, "recorded_covers_forward", "False", "recorded_estimate_bytes >=",
        id="rule-covers-forward",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("cell_id", "column", "value", "reason"), RULES)
def test_each_rule_refuses_a_corrupted_cell(
    golden_copy: Path, cell_id: str, column: str, value: str, reason: str
) -> None:
    row = row_of(cell_id)
    replace_in_cell(golden_copy, cell_id, column, value)
    for loader in (load_frame, load_cells):
        with pytest.raises(GoldenDataError) as info:
            loader(golden_copy / CELLS_FILE)
        err = info.value
        assert (err.column, err.row, err.value) == (column, row, value)
        message = str(err)
        assert reason in message
        assert f"row {row}" in message and repr(column) in message and repr(value) in message
    problems = verify(golden_copy)  # the gate's golden check sees the same refusal
    assert any(reason in p and repr(column) in p for p in problems)


def test_every_rule_of_the_model_is_corrupted_by_a_test() -> None:
    """RULES exercises every cross-column rule and every kind of column check."""
    schema = CellsModel.to_schema()
    rules = {str(c.error) for c in schema.checks}
    reasons = {p.values[3] for p in RULES}
    assert all(any(r in rule for r in reasons) for rule in rules), rules
    kinds = {c.name for col in schema.columns.values() for c in col.checks}
    assert kinds == {"isin", "str_matches", "greater_than_or_equal_to"}
    assert {c.type for c in COLUMNS} == {"int", "str", "bool"}


def test_header_must_follow_the_model(golden_copy: Path) -> None:
    path = golden_copy / CELLS_FILE
    lines = path.read_text().splitlines(keepends=True)
    lines[0] = lines[0].replace("layers,gdn_layers", "gdn_layers,layers")
    path.write_text("".join(lines))
    with pytest.raises(GoldenDataError, match="differs from the schema's columns"):
        load_frame(path)


def test_load_frame_types_and_nulls() -> None:
    frame = load_frame()
    assert list(frame.columns) == list(COLUMN_NAMES)
    assert list(frame.index) == list(range(1, 77)) and frame.index.name == "row"
    kinds = {c.name: c.type for c in COLUMNS}
    for name in frame.columns:
        dtype = frame[name].dtype
        expected = {"int": "Int64", "bool": "boolean"}.get(kinds[name])
        assert (str(dtype) == expected) if expected else pd.api.types.is_string_dtype(dtype)
    refused = frame[frame["refused_rank_samples"] > 0]
    assert len(refused) == 2 and refused["forward_peak_bytes"].isna().all()
    none = frame[frame["mode"] == "none"]
    assert len(none) > 0 and none["modules"].isna().all()  # '' in the CSV, <NA> here
    cells = load_cells()
    assert [c.cell_id for c in cells] == frame["cell_id"].tolist()
    for c, (_, row) in zip(cells, frame.iterrows(), strict=True):
        for spec in COLUMNS:
            got, want = getattr(c, spec.name), row[spec.name]
            if pd.isna(want):
                assert got == ("" if spec.type == "str" else None)
            else:
                assert type(got) is {"int": int, "bool": bool, "str": str}[spec.type]
                assert got == want


def test_schema_json_is_generated_from_the_model(golden_copy: Path) -> None:
    assert (GOLDEN_DIR / "schema.json").read_bytes() == schema_bytes()
    path = golden_copy / "schema.json"
    path.write_bytes(path.read_bytes().replace(b'"cell_id"', b'"cell_key"'))
    assert any(p.startswith("schema.json: differs") for p in verify(golden_copy))
    import_sources(golden_copy / "sources", golden_copy)  # regenerates it
    assert path.read_bytes() == schema_bytes()


def test_peak_on_a_refused_cell_is_rejected(golden_copy: Path) -> None:
    cid = "tp:final:Qwen3.8-27B:tp4:selective:core_attn:compiled:19221+19222"
    replace_in_cell(golden_copy, cid, "forward_peak_bytes", "1")
    with pytest.raises(GoldenDataError, match=r"forward_peak_bytes.*no measured rank-sample"):
        load_cells(golden_copy / CELLS_FILE)


def tamper_source(sources: Path, row_no: int, column: str, new: str) -> str:
    """Rewrite one field of one data row of a copied TP source file; return the old value."""
    path = sources / TP_FILE
    with path.open(newline="", encoding="utf-8") as fh:
        table = list(csv.reader(fh))
    col = table[0].index(column)
    old = table[row_no][col]
    table[row_no][col] = new
    with path.open("w", newline="", encoding="utf-8") as fh:
        csv.writer(fh, lineterminator="\n").writerows(table)
    return old


@pytest.mark.parametrize(
    ("column", "new", "source_row"),
    [
        ("min_estimate_to_forward_ratio", "1.2633813310934773", None),  # the ratio itself
        ("forward_peak_max_bytes", "336145409", None),  # a peak the ratio does not match
        ("min_estimate_to_forward_ratio", "1.0", "refused"),  # a ratio without a peak
    ],
)
def test_tampered_source_ratio_is_refused_on_import(
    golden_copy: Path, tmp_path: Path, column: str, new: str, source_row: str | None
) -> None:
    sources = tmp_path / "incoming"
    shutil.copytree(golden_copy / "sources", sources)
    raws = raw_rows(TP_FILE)
    if source_row == "refused":
        row_no = next(i for i, r in enumerate(raws, 1) if not r["forward_peak_max_bytes"])
    else:
        row_no = int(cells_rows()[row_of(TP_CELL) - 1]["source_row"])
        assert raws[row_no - 1]["min_estimate_to_forward_ratio"] == "1.2633813310934772"
    tamper_source(sources, row_no, column, new)
    before = snapshot(golden_copy)
    with pytest.raises(GoldenDataError) as info:
        import_sources(sources, golden_copy)
    err = info.value
    assert err.file == f"sources/{TP_FILE}" and err.row == row_no
    assert err.column == "min_estimate_to_forward_ratio"
    assert "estimate_bytes / forward_peak_max_bytes" in str(err)
    assert snapshot(golden_copy) == before


# ----------------------------------------------------------------------------- the extra


def _run_without(modules: tuple[str, ...], code: str) -> subprocess.CompletedProcess[str]:
    blocked = "".join(f"sys.modules[{m!r}] = None; " for m in modules)
    return subprocess.run(
        [sys.executable, "-c", f"import sys; {blocked}{code}"],
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.mark.parametrize("missing", ["pandas", "pandera"])
@pytest.mark.parametrize(
    "argv", [["gate"], ["golden", "verify"], ["golden", "export"], ["report"], ["diff"]]
)
def test_suite_commands_name_the_extra_when_it_is_missing(
    missing: str, argv: list[str], tmp_path: Path
) -> None:
    code = f"from cpmem.cli import main; sys.exit(main({argv!r}))"
    proc = _run_without((missing,), code)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and GOLDEN_EXTRA_HINT in lines[0] and missing in lines[0], lines
    assert "Traceback" not in proc.stderr


def test_the_estimator_core_needs_no_pandas() -> None:
    """model, plan, pricing, admission and api import and price without the extra."""
    code = (
        "import cpmem.model, cpmem.plan, cpmem.pricing, cpmem.admission, cpmem.api, cpmem.cli; "
        "from cpmem.api import estimate; "
        "print(estimate('qwen3.5-27b', [4096, 4096], shared_prefix=1228, cp=2, head='hidden', "
        "step='first').estimate_bytes); "
        "assert not {'pandas', 'pandera'} & {m.split('.')[0] for m in sys.modules if sys.modules[m]}"
    )
    proc = _run_without(("pandas", "pandera"), code)
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout) == 74651231846
    proc = _run_without(
        ("pandas", "pandera"),
        "from cpmem.cli import main; sys.exit(main(['estimate', '--model', 'qwen3.5-4b', "
        "'--lengths', '2048,2048', '--cp', '2']))",
    )
    assert proc.returncode == 0, proc.stderr


# ----------------------------------------------------------------------------- manifest


def test_manifest_verifies() -> None:
    assert verify_manifest(GOLDEN_DIR) == []
    listed = (GOLDEN_DIR / MANIFEST_FILE).read_text().splitlines()
    paths = {ln.split("  ", 1)[1] for ln in listed}
    megatron = {p for p in paths if p.startswith("megatron/")}
    # the Megatron-LM recordings: the table, the upstream manifest, every case's
    # arguments and the CI recipes (cpmem golden import-megatron)
    assert {"megatron/recordings.csv", "megatron/MANIFEST.tsv"} <= megatron
    assert sum(p.endswith("/model_config.yaml") for p in megatron) == 162
    assert paths - megatron == {
        "cells.csv",
        "schema.json",
        "sources/README.md",
        f"sources/{CP_FILE}",
        f"sources/{TP_FILE}",
        "controls/controls.csv",
        "controls/controls.meta.json",
        "controls/last_diff.md",
    }


def test_manifest_flags_a_one_digit_change(golden_copy: Path) -> None:
    path = golden_copy / CELLS_FILE
    data = path.read_bytes()
    assert data.count(b",33842017792,") == 1
    path.write_bytes(data.replace(b",33842017792,", b",33842017793,"))
    problems = verify_manifest(golden_copy)
    assert len(problems) == 1 and problems[0].startswith("cells.csv:")


def test_manifest_flags_changed_source_and_unlisted_file(golden_copy: Path) -> None:
    src = golden_copy / "sources" / CP_FILE
    src.write_bytes(src.read_bytes().replace(b"33842017792", b"33842017793"))
    (golden_copy / "controls").mkdir(exist_ok=True)
    (golden_copy / "controls" / "extra.csv").write_text("a\n1\n")
    problems = "\n".join(verify_manifest(golden_copy))
    assert f"sources/{CP_FILE}" in problems and "controls/extra.csv" in problems
    write_manifest(golden_copy)
    assert verify_manifest(golden_copy) == []


# ----------------------------------------------------------------------------- import


def test_reimport_is_byte_identical(golden_copy: Path, tmp_path: Path) -> None:
    before = snapshot(golden_copy)
    sources = tmp_path / "incoming"
    shutil.copytree(golden_copy / "sources", sources)
    for src in (golden_copy / "sources", sources):
        report = import_sources(src, golden_copy)
        assert report.imported == () and len(report.skipped) == 76 and report.written == ()
    assert snapshot(golden_copy) == before


def test_fresh_import_reproduces_the_committed_files(tmp_path: Path) -> None:
    fresh = tmp_path / "fresh"
    report = import_sources(SOURCES, fresh)
    assert len(report.imported) == 76
    for name in (CELLS_FILE, "schema.json", "sources/README.md", f"sources/{TP_FILE}"):
        assert (fresh / name).read_bytes() == (GOLDEN_DIR / name).read_bytes(), name
    write_manifest(fresh)
    manifest = MANIFEST_FILE
    committed = [
        ln
        for ln in (GOLDEN_DIR / manifest).read_text().splitlines()
        # controls are recorded by the gate and the Megatron-LM recordings imported by
        # `cpmem golden import-megatron`: neither by `cpmem golden import`
        if "  controls/" not in ln and "  megatron/" not in ln
    ]
    assert (fresh / manifest).read_text().splitlines() == committed


def test_modified_source_value_is_refused_and_nothing_changes(
    golden_copy: Path, tmp_path: Path
) -> None:
    sources = tmp_path / "incoming"
    shutil.copytree(golden_copy / "sources", sources)
    path = sources / TP_FILE
    rows = raw_rows(TP_FILE, sources)
    row_no = next(
        i for i, r in enumerate(rows, 1)
        if r["phase"] == "final" and r["model"] == "Qwen/Qwen3.5-4B" and r["lengths"] == "64+64"
    )  # fmt: skip
    # a figure no cross-column rule ties to another (a lone change of the forward peak
    # breaks the ratio and the max-of-repetitions rules: test_tampered_source_*)
    old = rows[row_no - 1]["forward_backward_peak_max_bytes"]
    new = str(int(old) + 1)
    lines = path.read_text().splitlines(keepends=True)
    assert lines[row_no].count(f",{old},") == 1
    lines[row_no] = lines[row_no].replace(f",{old},", f",{new},")
    path.write_text("".join(lines))
    before = snapshot(golden_copy)
    with pytest.raises(GoldenDataError) as info:
        import_sources(sources, golden_copy)
    message = str(info.value)
    cid = "tp:final:Qwen3.5-4B:tp2:selective:core_attn+mlp:compiled:64+64"
    assert repr(cid) in message and "'forward_backward_peak_bytes'" in message
    assert repr(old) in message and repr(new) in message
    assert snapshot(golden_copy) == before
    assert not list(golden_copy.rglob(".*.tmp"))


def test_changed_provenance_copy_is_refused(golden_copy: Path, tmp_path: Path) -> None:
    sources = tmp_path / "incoming"
    shutil.copytree(golden_copy / "sources", sources)
    (sources / "README.md").write_text((sources / "README.md").read_text() + "\nnote\n")
    before = snapshot(golden_copy)
    with pytest.raises(GoldenDataError, match=r"sources/README\.md"):
        import_sources(sources, golden_copy)
    assert snapshot(golden_copy) == before


# ----------------------------------------------------------------------------- append


def synthetic_row(**changes: str) -> dict[str, str]:
    base = next(r for r in cells_rows() if r["cell_id"] == "cp:4b-none:2048+2048")
    base.update(
        cell_id="native:4b-none:cp2:2048+2048",
        source_file="native_2025.csv",
        source_row="1",
        source_repository="cpmem",
        source_path="golden/campaigns/native_2025.csv",
        campaign="native",
        forward_peak_bytes="10417242000",
        imported_by="",
    )
    base.update(changes)
    return base


def test_append_rows_appends_and_is_idempotent(golden_copy: Path) -> None:
    provenance = {"campaign": "native", "driver": "gpu_tests/native_driver.py"}
    report = append_rows([synthetic_row()], golden_copy, provenance)
    assert report.imported == ("native:4b-none:cp2:2048+2048",)
    assert "cells.csv" in report.written
    cells = load_cells(golden_copy / CELLS_FILE)
    assert len(cells) == 77
    assert cells[-1].campaign == "native" and cells[-1].imported_by == "cpmem golden append"
    assert cells_rows(golden_copy)[:76] == cells_rows(GOLDEN_DIR)  # existing rows untouched
    assert (golden_copy / "campaigns" / "native.provenance.json").is_file()
    before = snapshot(golden_copy)
    again = append_rows([synthetic_row()], golden_copy, provenance)
    assert again.imported == () and again.skipped == ("native:4b-none:cp2:2048+2048",)
    assert snapshot(golden_copy) == before
    assert any("campaigns/native.provenance.json" in p for p in verify_manifest(golden_copy))


def test_append_rows_refuses_a_conflicting_row(golden_copy: Path) -> None:
    provenance = {"campaign": "native"}
    append_rows([synthetic_row()], golden_copy, provenance)
    before = snapshot(golden_copy)
    with pytest.raises(GoldenDataError) as info:
        append_rows([synthetic_row(forward_peak_bytes="10417242001")], golden_copy, provenance)
    message = str(info.value)
    assert "'native:4b-none:cp2:2048+2048'" in message and "'forward_peak_bytes'" in message
    assert "'10417242000'" in message and "'10417242001'" in message
    with pytest.raises(GoldenDataError, match="'cp:4b-none:2048\\+2048'"):
        append_rows([synthetic_row(cell_id="cp:4b-none:2048+2048")], golden_copy, provenance)
    with pytest.raises(GoldenDataError, match="campaign"):
        append_rows([synthetic_row()], golden_copy, {"campaign": "other"})
    assert snapshot(golden_copy) == before


# ----------------------------------------------------------------------------- CLI


def test_cli_import_verify_manifest(golden_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert golden_cli.main(["import", "--golden", str(golden_copy)]) == 0
    assert "0 cells imported, 76 skipped" in capsys.readouterr().out
    assert golden_cli.main(["verify", "--golden", str(golden_copy)]) == 0
    assert "76 cells ok" in capsys.readouterr().out
    replace_in_cell(golden_copy, "cp:4b-none:256+256", "forward_peak_bytes", "1478316033")
    assert golden_cli.main(["verify", "--golden", str(golden_copy)]) == 1
    err = capsys.readouterr().err
    assert "cells.csv: sha256" in err and "'1478316033'" in err and "'1478316032'" in err
    assert golden_cli.main(["manifest", "--golden", str(golden_copy)]) == 0
    assert verify_manifest(golden_copy) == []


def test_normalised_sources_follow_the_files_bytes(tmp_path: Path) -> None:
    """``normalize_sources`` gives a directory read before its rows again (by the bytes'
    hash): a changed byte is read anew, and a caller's edit of the rows it got reaches no
    later caller."""
    from cpmem.golden.sources import normalize_sources

    sources = tmp_path / "sources"
    shutil.copytree(GOLDEN_DIR / "sources", sources)
    first = normalize_sources(sources)
    first[0]["model"] = "edited by a caller"
    again = normalize_sources(sources)
    assert (
        again == normalize_sources(GOLDEN_DIR / "sources")
        and again[0]["model"] != first[0]["model"]
    )
    path = sources / "art_recompute_memory.csv"
    text = path.read_text(encoding="utf-8")
    assert text.count("Qwen/Qwen3.8-27B") > 1
    path.write_text(text.replace("Qwen/Qwen3.8-27B", "Qwen/Qwen3.9-27B", 1), encoding="utf-8")
    changed = normalize_sources(sources)
    moved = [(a["cell_id"], a["model"]) for a, b in zip(again, changed, strict=True) if a != b]
    assert [model for _, model in moved] == ["Qwen/Qwen3.8-27B"]
