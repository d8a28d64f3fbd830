"""The margin fit's leave-out studies and the tight report kept in golden/reports/.

Expected shapes come from ``golden/cells.csv`` read raw with the csv module.
"""

from __future__ import annotations

import csv
from pathlib import Path

from cpmem.gate.fitting import leave_longest_shape_out
from cpmem.gate.samples import measured_samples
from cpmem.gate.tight_report import REPORT_PATH, main
from cpmem.golden.files import GOLDEN_DIR
from cpmem.model.presets import get_preset

ROOT = Path(__file__).resolve().parents[2]

with (GOLDEN_DIR / "cells.csv").open(newline="", encoding="utf-8") as fh:
    RAW = list(csv.DictReader(fh))


def test_leave_outs_hold_out_each_models_longest_shape() -> None:
    longest: dict[str, int] = {}
    for row in RAW:
        if row["forward_peak_bytes"]:
            m = get_preset(row["model"]).name
            longest[m] = max(longest.get(m, 0), int(row["logical_tokens"]))
    results = leave_longest_shape_out(measured_samples())
    assert {lo.label for lo in results} == {f"{m} {n:,} tokens" for m, n in longest.items()}
    for lo in results:
        assert lo.held
        model, tokens = lo.label.split(" ")[0], int(lo.label.split(" ")[1].replace(",", ""))
        assert all(s.model == model and s.logical_tokens == tokens for s in lo.held)


def test_kept_report_is_up_to_date() -> None:
    lines: list[str] = []
    assert main(["--check", str(ROOT / REPORT_PATH)], emit=lines.append) == 0
    assert lines[-1].endswith("is up to date")
    text = "\n".join(lines)
    assert "## Leave one model out" in text and "## Leave each model's longest shape out" in text
