"""The margin fit's leave-out studies and the tight report kept in golden/reports/.

Expected shapes come from ``golden/cells.csv`` read raw with the csv module.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from cpmem.calibration.crossval import leave_longest_shape_out
from cpmem.golden.files import GOLDEN_DIR
from cpmem.model.presets import get_preset
from cpmem.reports.tight_report import REPORT_PATH, main
from cpmem.samples.cells import measured_samples

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
    assert "## Cross-validation: leave one model out" in text
    assert "## Cross-validation: leave one recompute mode out" in text


def test_the_fit_reproduces_the_constants_in_the_code() -> None:
    from cpmem.calibration.fitting import fit_margin
    from cpmem.pricing.tight.calibrated import MARGIN

    assert fit_margin(measured_samples()) == MARGIN


def test_cold_setup_is_the_largest_first_step_excess_measured() -> None:
    """COLD_SETUP restates the data: the first forward peak minus the repeat forward
    peak of the cells that ran first in their process (short cells, where the set-up
    is not hidden under activations)."""
    from cpmem.pricing.cold import COLD_SETUP

    excess = [
        int(r["first_forward_peak_bytes"]) - int(r["repeat_forward_peak_bytes"])
        for r in RAW
        if r["first_forward_peak_bytes"]
        and r["repeat_forward_peak_bytes"]
        and int(r["logical_tokens"]) < 2048
        and r["model"] != "Qwen/Qwen3.5-35B-A3B"  # MoE: routing varies between the runs
    ]
    cold = [e for e in excess if e >= 2**20]
    assert len(cold) >= 10
    assert max(cold) == pytest.approx(COLD_SETUP, rel=0.002)


def test_loss_backward_is_six_outputs_on_the_long_cells() -> None:
    """LOSS_BACKWARD_OUTPUTS restates the data: forward+backward peak minus the bytes
    retained after forward, over the returned outputs (logical tokens x hidden x 2),
    on the long dense cells with a core_attn-only or no recompute (whose backward
    transient is smaller than the loss's)."""
    from cpmem.model.presets import get_preset
    from cpmem.pricing.tight.calibrated import LOSS_BACKWARD_OUTPUTS

    ratios = []
    for r in RAW:
        if not (r["retained_max_bytes"] and r["forward_backward_peak_bytes"]):
            continue
        g = get_preset(r["model"])
        if g.is_moe or int(r["logical_tokens"]) < 4096 or "mlp" in r["modules"]:
            continue
        outputs = int(r["logical_tokens"]) * g.hidden * 2
        fb, kept = int(r["forward_backward_peak_bytes"]), int(r["retained_max_bytes"])
        ratios.append((fb - kept) / outputs)
    assert len(ratios) >= 15
    assert all(r == pytest.approx(LOSS_BACKWARD_OUTPUTS, abs=0.01) for r in ratios), ratios
