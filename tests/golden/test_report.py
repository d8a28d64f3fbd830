"""The calibration report: a row per golden cell, and real figures."""

from __future__ import annotations

import csv
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from cpmem.golden.files import GOLDEN_DIR
from cpmem.reports import calibration as report

with (GOLDEN_DIR / "cells.csv").open(newline="", encoding="utf-8") as _fh:
    CELL_ROWS = list(csv.DictReader(_fh))


def table_rows(md: str) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the per-cell table (the one that starts with | model |)."""
    lines = md.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("| model |"))
    header = [c.strip() for c in lines[start].strip("|").split("|")]
    rows = []
    for ln in lines[start + 2 :]:
        if not ln.startswith("|"):
            break
        rows.append([c.strip() for c in ln.strip("|").split("|")])
    return header, rows


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path
    width, height = struct.unpack(">II", data[16:24])
    return width, height


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("report")
    assert report.main(["--out", str(out)]) == 0
    return out


def test_report_has_one_row_per_cell(single: Path) -> None:
    header, rows = table_rows((single / "report.md").read_text())
    assert len(rows) == len(CELL_ROWS) == 76
    assert all(len(r) == len(header) for r in rows)
    for col in ("model", "TP", "CP", "recompute", "compiled", "lengths", "packed tokens"):
        assert col in header
    for col in ("priced tokens", "estimate", "forward peak", "fwd+bwd peak", "headroom"):
        assert col in header
    refused = sum(1 for r in CELL_ROWS if int(r["refused_rank_samples"]) > 0)
    assert sum(1 for r in rows if r[header.index("forward peak")] == "refused") == refused


def test_report_values_are_gib(single: Path) -> None:
    header, rows = table_rows((single / "report.md").read_text())
    by_key = {
        (r[header.index("lengths")], r[header.index("CP")], r[header.index("phase")]): r
        for r in rows
        if r[header.index("model")] == "Qwen3.8-27B" and r[header.index("CP")] == "2"
    }
    row = by_key[("4096+4096", "2", "final")]
    # pricing.md worked example: 74,651,231,846 bytes = 69.524 GiB; peak 62.918 GiB
    assert row[header.index("estimate")] == "69.524"
    assert row[header.index("forward peak")] == "62.918"
    assert row[header.index("priced tokens")] == "4,096"
    assert row[header.index("packed tokens")] == "6,964"


def test_figures_exist_and_are_not_trivial(single: Path) -> None:
    for name in (report.SCATTER_FILE, report.HEADROOM_FILE):
        path = single / name
        width, height = png_size(path)
        assert width >= 800 and height >= 600, (name, width, height)
        assert path.stat().st_size > 30_000, name


def test_several_policies_share_one_table_and_figure(tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    assert report.main(["--policy", "reference", "--policy", "global", "--out", str(out)]) == 0
    header, rows = table_rows((out / "report.md").read_text())
    assert len(rows) == len(CELL_ROWS)
    for col in ("estimate", "headroom", "priced tokens"):
        assert f"{col} (reference)" in header and f"{col} (global)" in header
    # CP cells price the busiest rank under reference, the packed count under global
    cp_row = next(
        r
        for r in rows
        if r[header.index("lengths")] == "4096+4096"
        and r[header.index("CP")] == "2"
        and r[header.index("model")] == "Qwen3.8-27B"
    )
    assert cp_row[header.index("priced tokens (reference)")] == "4,096"
    assert cp_row[header.index("priced tokens (global)")] == "6,964"
    assert png_size(out / report.HEADROOM_FILE)[1] > 1000


def test_unknown_policy_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert report.main(["--policy", "nope", "--out", str(tmp_path / "x")]) == 2
    assert "unknown policy" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_cpmem_imports_without_matplotlib() -> None:
    code = "import sys, cpmem.reports.calibration, cpmem.gate.cli; assert 'matplotlib' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
