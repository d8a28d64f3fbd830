"""The gate's request-path check: measured cells planned from their requests.

Expected busiest counts and peaks are the recorded ones (golden/cells.csv); the check
must fail for a planner that under-places the busiest rank (the attention-work planner
puts 4,096 where the runtime put 5,120).
"""

from __future__ import annotations

import pytest

from cpmem.gate.estimator import Estimator
from cpmem.gate.request_path import cell_request, request_path, runtime_prefix
from cpmem.gate.run import run_gate
from cpmem.golden.cells import load_cells
from cpmem.reports.gate_render import render

CELLS = load_cells()
BY_ID = {c.cell_id: c for c in CELLS}
PAIR_1_7B = "cp:attention-selective:4096+4096"


@pytest.mark.parametrize("policy", ["reference", "global"])
def test_every_measured_cell_is_covered_from_its_request(policy: str) -> None:
    report = request_path(CELLS, Estimator.for_policy(policy))
    assert report["passed"], report["failing"]
    assert report["cells"] == sum(1 for c in CELLS if not c.refused)
    assert (report["cp_cells"], report["busiest_matching"]) == (13, 13)
    for row in report["rows"]:
        if row["cp"] > 1:
            recorded = BY_ID[row["cell_id"]].retained_tokens
            assert row["planned_busiest_tokens"] == row["recorded_busiest_tokens"] == recorded
        assert row["planned_packed_tokens"] == BY_ID[row["cell_id"]].packed_tokens


def test_the_old_attention_default_fails_the_check_on_the_1_7b_pair() -> None:
    """attention-work plans 4,096 on the busiest rank: 12.409 GiB against a 13.93 GiB peak."""
    report = request_path(CELLS, Estimator.for_policy("reference"), planner="attention-work")
    assert not report["passed"]
    assert PAIR_1_7B in report["failing"]
    assert PAIR_1_7B in report["busiest_differing"]
    (row,) = [r for r in report["rows"] if r["cell_id"] == PAIR_1_7B]
    assert (row["planned_busiest_tokens"], row["recorded_busiest_tokens"]) == (4096, 5120)
    assert round(row["estimate_bytes"] / 2**30, 3) == 12.409
    assert row["estimate_bytes"] < BY_ID[PAIR_1_7B].forward_peak_bytes


def test_the_request_shares_the_prefix_only_where_the_runtime_did() -> None:
    shared = BY_ID[PAIR_1_7B]  # 4096+4096 sharing 1,228: packed 6,964
    assert runtime_prefix(shared) == 1228
    assert cell_request(shared).real_tokens == 6964
    unshared = BY_ID["cp:4b-selective:2048+2048"]  # 614 recorded, packed 4,096
    assert runtime_prefix(unshared) == 0
    assert cell_request(unshared).real_tokens == 4096


def test_the_gate_runs_the_check_and_reports_planned_against_recorded() -> None:
    report = run_gate("reference")
    check = report["checks"]["request_path"]
    assert check["passed"]
    assert "request path: 74/74 covered, busiest 13/13 CP cells as recorded" in report["summary"]
    text = render(report)
    assert "request_path  PASS" in text
    assert "request path: planned (default planner) vs recorded busiest tokens:" in text
    line = next(ln for ln in text.splitlines() if ln.startswith(PAIR_1_7B))
    assert line.split()[1:4] == ["chunked", "5,120", "5,120"]
