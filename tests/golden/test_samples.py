"""The one conversion from a golden cell to priced inputs (``cpmem.samples.cells``).

Expected values come from ``golden/cells.csv`` read raw with the csv module.
"""

from __future__ import annotations

import csv

from cpmem.golden.cells import load_cells
from cpmem.golden.files import GOLDEN_DIR
from cpmem.samples.cells import cell_step, measured_samples

with (GOLDEN_DIR / "cells.csv").open(newline="", encoding="utf-8") as fh:
    RAW = {r["cell_id"]: r for r in csv.DictReader(fh)}


def test_rows_without_a_segment_count_are_tp_file_pairs() -> None:
    """The inference comment in ``cell_plan`` is true for every row it applies to."""
    missing = [r for r in RAW.values() if r["grad_segments"] == ""]
    assert missing, "no row lacks a segment count: the inference is dead code"
    for r in missing:
        assert r["campaign"] == "tp" and r["cp"] == "1", r["cell_id"]
        assert len(r["lengths"].split("+")) == 2, r["cell_id"]


def test_inferred_segment_counts() -> None:
    shared = "tp:eager_control:Qwen3-1.7B:tp2:selective:core_attn:eager:4096+4096"
    unshared = "tp:before_segment_states:Qwen3.8-27B:tp8:none:-:compiled:2048+2048"
    cells = {c.cell_id: c for c in load_cells()}
    assert RAW[shared]["packed_tokens"] == "6964"  # 8192 logical, the prefix stored once
    assert cell_step(cells[shared]).plan.grad_segments == 3
    assert RAW[unshared]["packed_tokens"] == "4096"  # the 614-token prefix not shared
    assert cell_step(cells[unshared]).plan.grad_segments == 2


def test_cp_cells_price_the_recorded_busiest_rank() -> None:
    for cell in load_cells():
        if cell.cp > 1:
            plan = cell_step(cell).plan
            assert plan.busiest_tokens == int(RAW[cell.cell_id]["retained_tokens"])
            assert plan.packed_tokens == int(RAW[cell.cell_id]["packed_tokens"])


def test_measured_samples_are_the_cells_with_a_peak() -> None:
    with_peak = {cid for cid, r in RAW.items() if r["forward_peak_bytes"]}
    samples = measured_samples()
    assert {s.cell_id for s in samples} == with_peak
    for s in samples:
        raw = RAW[s.cell_id]
        assert s.forward_peak == int(raw["forward_peak_bytes"])
        want_fb = raw["forward_backward_peak_bytes"] or raw["forward_peak_bytes"]
        assert s.forward_backward_peak == int(want_fb)
