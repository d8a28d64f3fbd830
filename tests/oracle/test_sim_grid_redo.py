"""The grid generator's ``--redo``: the configurations ``--only`` selects are simulated
again (their finished ranks dropped from ranks.jsonl first), every other rank is kept as
it was. A stand-in engine returns marked results (no simulation); every run writes a
temporary ``--out`` directory, never golden/simulated/."""

from __future__ import annotations

import csv
import hashlib
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from oracles.sim_grid import __main__ as sim_grid
from oracles.sim_grid.engines import Engine

ONLY = (
    r"^(qwen3-1\.7b:tp(1|2):cp(1|2):(single-8k|single-2k|pair-16k)"
    r"|llama-3\.1-8b-style:tp1:cp1:pair-32k-prefix-8k|qwen3\.5-4b:tp1:cp1:single-2k):"
    r"(?!.*head=)"
)
"""6 configurations, 7 distinct ranks (tests/oracle/test_sim_grid_ray.py's selection)."""
REDO = r"^llama-3\.1-8b-style:tp1:cp1:pair-32k-prefix-8k:(?!.*head=)"
LLAMA = "llama-3.1-8b-style:tp1:cp1:pair-32k-prefix-8k:selective:core_attn"


class _Marked(Engine):
    """Every job's result carries ``mark`` as its peaks."""

    name = "marked"

    def __init__(self, mark: int) -> None:
        self.mark = mark

    def results(self, jobs: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for job in jobs:
            yield {"config_id": job["config_id"], "rank": job["rank"],
                   "forward_peak_bytes": self.mark, "forward_backward_peak_bytes": self.mark,
                   "retained_bytes": self.mark, "seconds": 0.0}  # fmt: skip


def _run(monkeypatch: pytest.MonkeyPatch, out: Path, mark: int, *args: str) -> None:
    monkeypatch.setattr(sim_grid, "open_engine", lambda *a: _Marked(mark))
    assert sim_grid.main(["--engine", "local", *args, "--out", str(out)]) == 0


def _marks(out: Path) -> dict[tuple[str, int], int]:
    lines = (out / sim_grid.RANKS).read_text().splitlines()
    recs = [json.loads(line) for line in lines]
    marks = {(r["config_id"], r["rank"]): r["forward_peak_bytes"] for r in recs}
    assert len(marks) == len(recs)  # no rank twice
    return marks


def test_redo_simulates_the_selected_configurations_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _run(monkeypatch, tmp_path, 1, "--only", ONLY)
    first = _marks(tmp_path)
    assert len(first) == 7 and set(first.values()) == {1}
    _run(monkeypatch, tmp_path, 2, "--only", ONLY)  # without --redo: nothing to do
    assert _marks(tmp_path) == first
    _run(monkeypatch, tmp_path, 3, "--only", REDO, "--redo")
    assert _marks(tmp_path) == {k: 3 if k[0] == LLAMA else 1 for k in first}
    rows = {r["config_id"]: r for r in csv.DictReader((tmp_path / sim_grid.ROWS).open())}
    assert len(rows) == 6 and rows[LLAMA]["forward_peak_bytes"] == "3"
    run = json.loads((tmp_path / sim_grid.PROVENANCE).read_text())["runs"][-1]
    assert (run["redo_dropped_ranks"], run["ranks_simulated"]) == (1, 1)
    for line in (tmp_path / sim_grid.MANIFEST).read_text().splitlines():
        digest, name = line.split("  ", 1)
        assert hashlib.sha256((tmp_path / name).read_bytes()).hexdigest() == digest


def test_redo_needs_a_selection(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as err:
        sim_grid.main(["--redo", "--out", str(tmp_path)])
    assert err.value.code == 2
    assert not (tmp_path / sim_grid.RANKS).exists()
