"""The static-memory and budget checks against the measured cells, and what they catch.

Expected outcomes: the recorded baselines and budgets in golden/cells.csv; the mutants
are static models with one named fact broken, each of which a check must reject.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import cpmem.gate.static_check as sc
import cpmem.pricing.device_budget as budget_module
import cpmem.pricing.optimizer_state as optimizer_state_module
import cpmem.pricing.weights as weights_module
import cpmem.pricing.workspaces as workspaces_module
import cpmem.step.describe as describe_module
from cpmem.golden.cells import load_cells
from cpmem.golden.files import CELLS_FILE, default_golden_dir

CELLS = load_cells(default_golden_dir() / CELLS_FILE)
REPORT = Path(__file__).resolve().parents[2] / "golden" / "reports" / "static_memory.md"


def test_every_recorded_baseline_is_checked_and_within_3_percent_or_declared() -> None:
    check = sc.static_check(CELLS)
    recorded = sum(
        (c.baseline_min_bytes is not None) + (c.baseline_max_bytes is not None) for c in CELLS
    )
    assert check["passed"] and check["checked"] == recorded > 100
    outside = [r for r in check["rows"] if not r["within"]]
    # only a MoE process after a step is declared, and every such row is far outside
    assert outside and all(r["declared"] == "moe_after_step" for r in outside)
    assert all("35B-A3B" in r["layout"] and not r["before_any_step"] for r in outside)
    dense = [r for r in check["rows"] if "35B-A3B" not in r["layout"]]
    assert dense and all(abs(r["error"]) <= 0.03 for r in dense)


def test_each_process_has_one_first_cell_priced_cold() -> None:
    firsts = sc.first_cells(CELLS)
    processes = {sc.process_key(c) for c in CELLS}
    assert len(firsts) == len(processes)
    # a first cell's first baseline is its process's lowest
    for c in CELLS:
        if c.cell_id in firsts and c.baseline_min_bytes is not None:
            same = [o for o in CELLS if sc.process_key(o) == sc.process_key(c)]
            assert c.baseline_min_bytes == min(o.baseline_min_bytes or 1 << 62 for o in same)


def test_the_budget_rule_reproduces_every_recorded_budget() -> None:
    check = sc.budget_check(CELLS)
    assert check["passed"]
    assert check["checked"] == sum(c.available_bytes is not None for c in CELLS)
    assert check["max_abs_error_from_baseline"] < 0.01
    assert check["max_abs_error_from_static"] < 0.03
    without = {r["cell_id"] for r in check["rows"] if r["from_baseline_bytes"] is None}
    cp_cells = {c.cell_id for c in CELLS if c.cp > 1 and c.available_bytes is not None}
    assert cp_cells and cp_cells <= without  # the CP campaign recorded no baselines


def _padded_to_a_million(geometry: object, tp: int) -> int:
    """A vocabulary padded to a multiple of 10**6 (megatron pads to 128 x TP)."""
    return 10**6 * tp


@pytest.mark.parametrize(
    ("module", "name", "value", "check"),
    [
        (workspaces_module, "CUBLAS_THREADS", 0, "static"),  # no cuBLAS workspace kept
        (workspaces_module, "TE_WORKSPACE_HOPPER", 0, "static"),  # no TE workspace kept
        (weights_module, "padded_vocab", _padded_to_a_million, "static"),  # wild padding
        (describe_module, "DTYPE_BYTES", {"bf16": 4}, "static"),  # bf16 read as fp32
        (optimizer_state_module, "MASTER_BYTES", 400, "static"),  # a master copy far off fp32
        (budget_module, "NON_TORCH_BYTES", 0, "budget"),  # no CUDA context, no NCCL
        (budget_module, "RESERVE_FRACTION", 0.0, "budget"),  # no runtime reserve
    ],
)
def test_a_broken_static_model_is_rejected(
    monkeypatch: pytest.MonkeyPatch, module: object, name: str, value: object, check: str
) -> None:
    monkeypatch.setattr(module, name, value)
    result = sc.static_check(CELLS) if check == "static" else sc.budget_check(CELLS)
    assert not result["passed"] and result["failing"]


def test_the_kept_report_is_current() -> None:
    text, met = sc.render(CELLS)
    assert met
    assert REPORT.read_text(encoding="utf-8") == text, (
        "golden/reports/static_memory.md is stale: python -m cpmem.gate.static_check "
        "--write golden/reports/static_memory.md"
    )
