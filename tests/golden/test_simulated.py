"""The gate's simulated tier on a fixed subset of the committed grid rows (no simulation:
the rows are read from golden/simulated/rows.csv and priced; well under a minute).

``tests/golden/data/simulated_subset.json`` names the subset (a few dozen rows across
models, TP, CP and requests) and pins, per policy and declared target, the rows that
miss it today (docs/simulated-grid.md says why). A policy change that adds a miss fails
here; one that removes a miss fails too, until the pin is shrunk
(``python -m tests.golden.test_simulated --write``)."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from cpmem.gate import cli as gate_cli
from cpmem.gate.simulated import is_current, run_simulated
from cpmem.gate.simulated import main as simulated_main
from cpmem.golden.cells import load_cells
from cpmem.model.load import load_model
from cpmem.pricing.cold import COLD_SETUP
from cpmem.reports.simulated_render import markdown
from cpmem.samples.rows import (
    SIM_WORST_UNDER,
    central,
    family,
    load_rows,
    required,
    simulated_dir,
    verify_simulated,
)
from cpmem.samples.targets import SIMULATED_TARGETS
from cpmem.units import MIB

PIN = Path(__file__).parent / "data" / "simulated_subset.json"
REPORT = Path(__file__).resolve().parents[2] / "golden" / "reports" / "rank_sim_validation.md"
POLICIES = ("tight", "reference", "global")


def _pin() -> dict[str, Any]:
    return json.loads(PIN.read_text(encoding="utf-8"))


def shortfalls(policy: str, ids: list[str]) -> dict[str, list[str]]:
    report = run_simulated(policy, ids=ids)
    return {t["target"]: sorted(t["failing"]) for t in report["targets"]["targets"]}


def test_simulated_data_is_intact() -> None:
    assert verify_simulated(simulated_dir()) == []


def test_subset_is_spread() -> None:
    rows = load_rows(simulated_dir(), _pin()["rows"])
    assert 24 <= len(rows) <= 78
    assert {r.cp for r in rows} == {1, 2, 4, 8}
    assert {r.tp for r in rows} >= {1, 2, 4}
    assert any(r.tp > 1 and r.cp > 1 for r in rows)
    assert len({r.model for r in rows}) >= 6
    assert any(r.planner.startswith("explicit") for r in rows)
    trainer = [r for r in rows if r.is_trainer]  # the trainer's step: every level of each
    assert len(trainer) >= 20
    assert {r.head for r in trainer} == {"hidden", "logits", "fused", "chunked:4096", "linear-ce"}
    assert {r.cp_comm for r in trainer} == {"all_gather", "p2p", "a2a"}
    assert {r.lora_rank for r in trainer} == {1, 16, 128}
    assert {(r.lora_dropout, r.lora_targets) for r in trainer} >= {(0.0, "all"), (0.1, "attention")}
    staged = [r for r in rows if r.is_pipeline]  # pipeline rows: 1F1B and interleaved, even,
    assert len(staged) >= 6 and {r.pp for r in staged} == {2, 4, 8}  # uneven, mixed lengths
    assert {r.vpp for r in staged} == {1, 2} and any(r.microbatch_lengths for r in staged)
    assert any(r.stage_layers for r in staged) and any(r.tp > 1 for r in staged)
    families = {"gemma-2-9b", "gemma-3-12b", "gpt-oss-20b", "moonlight-16b-a3b", "qwen3-30b-a3b"}
    assert families <= {r.model for r in rows}  # every family_grid model
    assert any(r.ep == 1 and r.tp * r.cp > 1 and r.routing for r in rows)  # family_ep1_grid


def _validated_worst_under() -> dict[str, dict[str, float]]:
    """Per family, 1 - the smallest sim/measured ratio over the cells of >= 2,048 tokens
    in the rank simulator's validation report (the rows whose "in target" is judged)."""
    cells = {c.cell_id: c for c in load_cells()}
    worst: dict[str, dict[str, float]] = {}
    for line in REPORT.read_text(encoding="utf-8").splitlines():
        cols = [c.strip() for c in line.strip("|").split("|")]
        if len(cols) != 13 or cols[0] not in cells or cols[12].startswith("n/a"):
            continue
        fam = family(load_model(cells[cols[0]].model), cols[4] == "True")
        got = worst.setdefault(fam, {"forward": 0.0, "forward_backward": 0.0})
        got["forward"] = max(got["forward"], round(1 - float(cols[8]), 3))
        got["forward_backward"] = max(got["forward_backward"], round(1 - float(cols[11]), 3))
    return worst


def test_allowance_is_the_simulators_validated_error() -> None:
    assert _validated_worst_under() == SIM_WORST_UNDER
    assert required(0, "forward", "attention-only") == -(-64 * MIB * 1000 // 961)
    assert required(0, "forward", "hybrid") == -(-64 * MIB * 1000 // 988)


def test_the_tier_adds_the_cold_set_up_every_policy_prices() -> None:
    """The two cold set-up figures and why they differ. The rank simulator's validation
    compares the simulator with measured peaks, so it adds what the measured runs showed
    on the whole (golden/README.md: "about 58 MiB"; an oracle imports nothing of cpmem, so
    it keeps its own); the simulated tier asks a policy to cover a simulated peak plus the
    set-up every policy prices (``cpmem.pricing.cold.COLD_SETUP``, the largest first-step
    excess measured: tests/golden/test_fitting.py), so no policy is judged against less
    than it charges."""
    from oracles.rank_sim.validation import COLD_BYTES

    assert COLD_BYTES == 58 * MIB
    assert COLD_SETUP == 64 * MIB
    assert central(0) == COLD_SETUP


def test_the_reports_header_names_the_cold_set_up_the_tier_adds() -> None:
    """The Markdown report (and the kept one, golden/reports/simulated_tier.md) states the
    cold set-up the tier adds to a simulated peak (``central``), not the simulator's own
    58 MiB."""
    added = f"{central(0) // MIB} MiB"
    kept = (REPORT.parent / "simulated_tier.md").read_text(encoding="utf-8")
    for text in (markdown([run_simulated("tight", ids=_pin()["rows"][:2])]), kept):
        header = text.split("\n## ", 1)[0]
        assert f"(simulated peak + {added} cold set-up)" in header
        assert f"covered = estimate >= (simulated peak + {added})" in header
        assert "58 MiB" not in header


def test_grid_families() -> None:
    assert family(load_model("qwen3.5-4b"), False) == "hybrid"
    assert family(load_model("qwen3-1.7b"), False) == "attention-only"
    assert family(load_model("qwen3.5-35b-a3b"), False) == "moe-eager"
    assert family(load_model("qwen3.5-35b-a3b"), True) == "moe"


@pytest.mark.parametrize("policy", POLICIES)
def test_subset_shortfalls_are_the_pinned_ones(policy: str) -> None:
    pin = _pin()
    got = shortfalls(policy, pin["rows"])
    assert set(got) == {t.name for t in SIMULATED_TARGETS.get(policy, ())}
    assert got == pin["shortfalls"].get(policy, {})


def _grid_rows() -> int:
    """The committed grid's rows, counted with the csv module."""
    with (simulated_dir() / "rows.csv").open(newline="", encoding="utf-8") as fh:
        return sum(1 for _ in csv.DictReader(fh))


@pytest.mark.parametrize("policy", ["global", "tight"])
def test_cli_tier_simulated(policy: str, capsys: pytest.CaptureFixture[str]) -> None:
    """What the tier must find on the whole grid, known without running it: ``global``
    declares no target (``SIMULATED_TARGETS``) and the data is intact, so it passes and
    exits 0; a policy whose pinned subset misses a declared target misses it on the whole
    grid too (every target holds row by row), so it fails and exits 1."""
    code = gate_cli.main(["--tier", "simulated", "--policy", policy, "--json"])
    out = json.loads(capsys.readouterr().out)
    assert out["tier"] == "simulated" and out["rows"] == _grid_rows()
    assert out["data"]["passed"]
    declared = len(SIMULATED_TARGETS.get(policy, ()))
    assert out["targets"]["declared"] == declared
    pinned_misses = any(_pin()["shortfalls"].get(policy, {}).values())
    expected = declared == 0 or not pinned_misses
    assert (code, out["passed"]) == ((0, True) if expected else (1, False))
    assert policy != "global" or expected
    assert policy != "tight" or not expected  # tight's pin names misses (docs/simulated-grid.md)


def test_record_controls_is_refused_on_the_simulated_tier() -> None:
    assert gate_cli.main(["--tier", "simulated", "--record-controls"]) == 2


def _write() -> None:
    pin = _pin()
    pin["shortfalls"] = {p: shortfalls(p, pin["rows"]) for p in POLICIES}
    pin["shortfalls"] = {p: s for p, s in pin["shortfalls"].items() if s}
    PIN.write_text(json.dumps(pin, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__" and "--write" in sys.argv:
    _write()


def test_every_stage_is_held_to_its_own_simulated_peak() -> None:
    """``stage_bytes`` is a figure per stage: a stage priced one byte under its own
    simulated peak with the allowance is named, whatever the busiest stage's figure."""
    from dataclasses import replace

    from cpmem.gate.simulated import price_rows

    sim_dir = simulated_dir()
    row = next(r for r in load_rows(sim_dir) if r.is_pipeline and r.pp == 4)
    (priced,) = price_rows("tight", [row], sim_dir)
    fam = family(priced.step.geometry, priced.step.compiled)
    need = [required(s, "forward", fam) for s in row.stage_forward]
    fb = priced.estimate.stage_forward_backward_bytes
    at = replace(priced.estimate, stage_bytes=tuple(need))
    assert replace(priced, estimate=at).uncovered_stages == []
    under = replace(at, stage_bytes=(*need[:2], need[2] - 1, need[3]))
    assert replace(priced, estimate=under).uncovered_stages == ["s2"]
    assert fb is not None
    fb_under = replace(at, stage_forward_backward_bytes=(0, *fb[1:]))
    assert replace(priced, estimate=fb_under).uncovered_stages == ["s0:fb"]


def test_the_kept_simulated_tier_report_is_up_to_date(tmp_path: Path) -> None:
    """golden/reports/simulated_tier.md is what ``python -m cpmem.gate.simulated`` prints
    now (its rows and targets follow the committed grid); a changed or missing copy is
    not current."""
    kept = REPORT.parent / "simulated_tier.md"
    assert simulated_main(["--check", str(kept)]) == 0
    text = kept.read_text(encoding="utf-8")
    stale = tmp_path / "simulated_tier.md"
    stale.write_text(text.replace("|", "/", 1), encoding="utf-8")
    assert not is_current(stale, text)
    assert not is_current(tmp_path / "missing.md", text)
