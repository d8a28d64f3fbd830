"""The grid generator's engines (oracles/sim_grid/engines.py): a run stopped by Ctrl-C on
one engine resumes on the other, and the rows it ends with equal the local pool's, byte
for byte per rank, whichever engine simulated each rank (a real local Ray instance). Six small configurations (7 ranks, full
depth); every run writes a temporary ``--out`` directory, never golden/simulated/."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from oracles.sim_grid import __main__ as sim_grid
from oracles.sim_grid.engines import Engine, ray_installed
from oracles.sim_grid.grid import REPO, SIM_DIR

ONLY = (
    r"^(qwen3-1\.7b:tp(1|2):cp(1|2):(single-8k|single-2k|pair-16k)"
    r"|llama-3\.1-8b-style:tp1:cp1:pair-32k-prefix-8k|qwen3\.5-4b:tp1:cp1:single-2k):"
    r"(?!.*head=)"
)
"""Attention-only, hybrid and config-file models, CP 1 and 2, TP 1 and 2, the harness's
step (no trainer rows): 6 configurations, 7 distinct ranks of about 1-2 s each."""
RANKS = 7

needs_ray = pytest.mark.skipif(
    not ray_installed(),
    reason="Ray is not installed (pip install -e '.[grid]'); the local pool runs without it",
)


def _cmd(out: Path, engine: str) -> list[str]:
    return [sys.executable, "-m", "oracles.sim_grid", "--engine", engine, "--workers", "2",
            "--only", ONLY, "--out", str(out)]  # fmt: skip


def _generate(out: Path, engine: str) -> str:
    p = subprocess.run(_cmd(out, engine), cwd=REPO, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-4000:]
    return p.stderr


def _default_sigint() -> None:
    """The run's SIGINT as a terminal's foreground job has it: a test process started in
    the background by a non-interactive shell ignores SIGINT, and its children would
    inherit that and never stop."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _interrupt(out: Path, engine: str, attempts: int = 3) -> int:
    """Start a run, Ctrl-C it (SIGINT to its whole process group, as a terminal does) once
    a rank is written; returns how many ranks it wrote. A run that finishes every rank
    before the signal lands (a slow or busy test process) proved nothing about
    interruption: its output is cleared and the run started again, at most ``attempts``
    times."""
    ranks = out / sim_grid.RANKS
    for _ in range(attempts):
        p = subprocess.Popen(
            _cmd(out, engine), cwd=REPO, start_new_session=True, text=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=_default_sigint,
        )  # fmt: skip
        deadline = time.monotonic() + 300
        while True:
            exited = p.poll() is not None  # read before the file: a rank seen is then live
            if ranks.exists() and ranks.read_text().count("\n") >= 1:
                break
            assert not exited, p.communicate()[1][-4000:]  # it stopped before any rank
            assert time.monotonic() < deadline, "no rank finished in 300 s"
            time.sleep(0.05)
        if not exited:
            os.killpg(p.pid, signal.SIGINT)
        err = p.communicate(timeout=120)[1]
        if p.returncode == 0 and len(ranks.read_text().splitlines()) == RANKS:
            shutil.rmtree(out)  # finished before the signal: start again
            out.mkdir()
            continue
        assert p.returncode == 130, err[-4000:]  # stopped, recorded as interrupted
        return len(ranks.read_text().splitlines())
    raise AssertionError(f"every run finished its {RANKS} ranks before it could be interrupted")


def _ranks(out: Path) -> dict[tuple[str, int], dict[str, Any]]:
    """Each rank's record without its seconds (the one field that is timing)."""
    recs = [json.loads(line) for line in (out / sim_grid.RANKS).read_text().splitlines()]
    by_rank = {(r["config_id"], r["rank"]): r for r in recs}
    assert len(by_rank) == len(recs)  # no rank simulated twice
    return {k: {f: v for f, v in r.items() if f != "seconds"} for k, r in by_rank.items()}


def _rows(out: Path) -> list[dict[str, str]]:
    with (out / sim_grid.ROWS).open() as fh:
        return [{k: v for k, v in r.items() if k != "sim_seconds"} for r in csv.DictReader(fh)]


def _runs(out: Path) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = json.loads((out / sim_grid.PROVENANCE).read_text())["runs"]
    return runs


def _manifest_holds(out: Path) -> bool:
    lines = (out / sim_grid.MANIFEST).read_text().splitlines()
    return bool(lines) and all(
        hashlib.sha256((out / name).read_bytes()).hexdigest() == digest
        for digest, name in (line.split("  ", 1) for line in lines)
    )


@pytest.fixture(scope="module", autouse=True)
def _committed_grid_untouched() -> Iterator[None]:
    before = {p.name: p.read_bytes() for p in SIM_DIR.iterdir() if p.is_file()}
    yield
    assert {p.name: p.read_bytes() for p in SIM_DIR.iterdir() if p.is_file()} == before


@pytest.fixture(scope="module")
def local_pool(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference: the configurations generated on the local process pool."""
    out = tmp_path_factory.mktemp("local")
    _generate(out, "local")
    assert len(_ranks(out)) == RANKS and len(_rows(out)) == 6
    assert _runs(out)[-1]["engine"] == "local"
    return out


@needs_ray
@pytest.mark.parametrize(("first", "then"), [("ray", "local"), ("local", "ray")])
def test_an_interrupted_run_resumes_on_the_other_engine(
    local_pool: Path, tmp_path: Path, first: str, then: str
) -> None:
    kept = _interrupt(tmp_path, first)
    assert 1 <= kept < RANKS
    # what the stopped run left is whole: its ranks, its record, a manifest that holds
    assert len(_ranks(tmp_path)) == kept
    assert _runs(tmp_path)[-1]["interrupted"] and _runs(tmp_path)[-1]["engine"] == first
    assert _manifest_holds(tmp_path)
    assert f"{RANKS - kept} ranks to simulate ({kept} done)" in _generate(tmp_path, then)
    assert _ranks(tmp_path) == _ranks(local_pool)
    assert _rows(tmp_path) == _rows(local_pool)
    runs = _runs(tmp_path)
    assert [r["engine"] for r in runs] == [first, then]
    assert [r["ranks_simulated"] for r in runs] == [kept, RANKS - kept]
    assert _manifest_holds(tmp_path)
    assert (tmp_path / sim_grid.ROWS).read_text().splitlines()[0] == ",".join(sim_grid.COLUMNS)
    if then == "ray":  # the ranks Ray simulated equal the local pool's, byte for byte (above)
        run = runs[-1]
        assert (run["address"], run["slots"], run["ray_nodes"]) == ("local instance", 2, 1)
        assert not run["interrupted"] and "failed" not in run


class _FailsAfterOne(Engine):
    """Finishes the first job (a made-up result), then a job fails."""

    name = "fake"

    def results(self, jobs: Any) -> Iterator[dict[str, Any]]:
        job = next(iter(jobs))
        yield {"config_id": job["config_id"], "rank": job["rank"], "forward_peak_bytes": 1,
               "forward_backward_peak_bytes": 2, "retained_bytes": 3, "seconds": 0.0}  # fmt: skip
        raise RuntimeError("a rank failed")


def test_a_failed_run_keeps_its_ranks_and_records_the_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A failing job stops the run with its error; the finished ranks, the run record
    (``failed``) and a manifest that holds are written first (no Ray, no simulation)."""
    monkeypatch.setattr(sim_grid, "open_engine", lambda *a: _FailsAfterOne())
    with pytest.raises(RuntimeError, match="a rank failed"):
        sim_grid.main(["--engine", "local", "--only", ONLY, "--out", str(tmp_path)])
    assert "1/7 ranks" in capsys.readouterr().err  # the progress line
    assert len(_ranks(tmp_path)) == 1
    run = _runs(tmp_path)[-1]
    assert run["failed"] == "RuntimeError: a rank failed" and run["ranks_simulated"] == 1
    assert _manifest_holds(tmp_path)


class _FinishesEvery(Engine):
    """Finishes every job at once (made-up results)."""

    name = "fake"

    def results(self, jobs: Any) -> Iterator[dict[str, Any]]:
        for job in jobs:
            yield {"config_id": job["config_id"], "rank": job["rank"], "forward_peak_bytes": 1,
                   "forward_backward_peak_bytes": 2, "retained_bytes": 3, "seconds": 0.0}  # fmt: skip


def test_a_ctrl_c_right_after_a_ranks_line_is_recorded_with_that_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The interleaving ``_interrupt`` can hit, made certain: the run's first rank line
    reaches ranks.jsonl, the test (watching the file) sends SIGINT, and Python raises
    KeyboardInterrupt in the driver at its next step, before anything after the write
    has run. Here the signal is raised right after the rank is appended (``raise_signal``
    runs the handler before it returns). The record must say what the file holds: one
    rank simulated, interrupted; a count kept in memory beside the file said 0."""
    append = sim_grid.append_rank

    def append_then_ctrl_c(fh: Any, res: dict[str, Any]) -> None:
        append(fh, res)
        signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(sim_grid, "append_rank", append_then_ctrl_c)
    monkeypatch.setattr(sim_grid, "open_engine", lambda *a: _FinishesEvery())
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # a terminal's Ctrl-C
    try:
        rc = sim_grid.main(["--engine", "local", "--only", ONLY, "--out", str(tmp_path)])
    finally:
        signal.signal(signal.SIGINT, previous)
    assert rc == 130
    assert len(_ranks(tmp_path)) == 1
    run = _runs(tmp_path)[-1]
    assert run["interrupted"] and "failed" not in run
    assert run["ranks_simulated"] == 1
    assert _manifest_holds(tmp_path)
