"""Gating an estimator that is not a cpmem policy: ``cpmem gate --estimator`` and
``--estimates``, and ``cpmem golden export`` (docs/external-estimators.md)."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest

from cpmem.cli import main
from cpmem.gate.external import describe, hf_config
from cpmem.golden.cells import load_cells
from cpmem.golden.files import GOLDEN_DIR
from cpmem.model.hf_config import load_config
from cpmem.model.presets import PRESETS
from tests.golden import external_estimators as ext

ROOT = Path(__file__).resolve().parents[2]
MODULE = "tests.golden.external_estimators"

with (GOLDEN_DIR / "cells.csv").open(newline="", encoding="utf-8") as _fh:
    RAW = list(csv.DictReader(_fh))
# measured cells straight from the file: id -> (forward peak, forward+backward peak or None)
PEAKS = {
    r["cell_id"]: (
        int(r["forward_peak_bytes"]),
        int(r["forward_backward_peak_bytes"]) if r["forward_backward_peak_bytes"] else None,
    )
    for r in RAW
    if r["forward_peak_bytes"]
}
DESCRIBED = {c.cell_id: describe(c) for c in load_cells() if c.cell_id in PEAKS}


@pytest.fixture(autouse=True)
def _importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT))


def _gate(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    rc = main(["gate", *argv, "--json"])
    out = capsys.readouterr().out
    return rc, (json.loads(out) if out.strip() else {})


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_the_description_config_reads_back_to_the_preset(name: str) -> None:
    geometry = PRESETS[name]
    cfg = json.loads(json.dumps(hf_config(geometry)))
    assert load_config(cfg, name=name, fused_swiglu=geometry.fused_swiglu) == geometry


def test_descriptions_carry_the_recorded_layout_and_never_the_peaks() -> None:
    assert set(DESCRIBED) == set(PEAKS) and len(PEAKS) > 50
    keys = {
        "cell_id", "model", "config", "fused_swiglu", "dtype", "tp", "cp", "sp", "ep",
        "recompute", "modules", "compiled", "moe_routing", "lengths", "shared_prefix",
        "logical_tokens", "packed_tokens", "rank_tokens", "busiest_tokens",
        "rank_tokens_recorded", "segments",
    }  # fmt: skip
    for r in RAW:
        d = DESCRIBED.get(r["cell_id"])
        if d is None:
            continue
        assert set(d) == keys
        assert json.loads(json.dumps(d)) == d  # plain JSON
        assert not any("peak" in k for k in d)
        assert (d["tp"], d["cp"], d["ep"]) == (int(r["tp"]), int(r["cp"]), int(r["ep"]))
        assert d["lengths"] == [int(x) for x in r["lengths"].split("+")]
        assert d["packed_tokens"] == int(r["packed_tokens"])
        assert d["recompute"] == r["mode"]
        if int(r["cp"]) > 1:  # the busiest rank's tokens as recorded
            assert d["busiest_tokens"] == int(r["retained_tokens"])
            assert d["rank_tokens_recorded"] == "busiest"
        if r["grad_segments"]:
            assert d["segments"] == int(r["grad_segments"])


def test_a_generous_external_estimator_passes(capsys: pytest.CaptureFixture[str]) -> None:
    # it truly covers every measured cell, forward and forward+backward
    for cid, (fwd_peak, fb_peak) in PEAKS.items():
        got = ext.generous(DESCRIBED[cid])
        assert got["forward"] >= fwd_peak, cid
        assert fb_peak is None or got["forward_backward"] >= fb_peak, cid
    rc, report = _gate(capsys, "--estimator", f"{MODULE}:generous")
    assert rc == 0 and report["passed"]
    checks = report["checks"]
    assert checks["coverage"]["cells"] == len(PEAKS) and checks["coverage"]["failing"] == []
    fb_measured = sum(1 for _, fb in PEAKS.values() if fb is not None)
    assert checks["coverage"]["forward_backward"]["covered"] == fb_measured
    for name in ("conformance", "controls", "refusals", "power", "targets"):
        assert checks[name]["applicable"] is False
    assert {g["group"] for g in checks["headroom"]["by_model"]} == {
        c.split("/")[-1] for c in {r["model"] for r in RAW}
    }


def test_an_estimator_that_misses_cells_fails_naming_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    expected = sorted(cid for cid, (peak, _) in PEAKS.items() if peak > ext.CAP)
    assert expected  # the cap is below the largest measured peaks
    rc, report = _gate(capsys, "--estimator", f"{MODULE}:capped")
    assert rc == 1 and not report["passed"]
    assert sorted(report["checks"]["coverage"]["failing"]) == expected
    assert "forward_backward" not in report["checks"]["coverage"]  # it gives forward only
    # the human report names them too
    assert main(["gate", "--estimator", f"{MODULE}:capped"]) == 1
    out = capsys.readouterr().out
    assert all(cid in out for cid in expected) and "n/a" in out


def test_an_estimator_returning_something_else_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["gate", "--estimator", f"{MODULE}:not_bytes"]) == 2
    assert "non-negative integer" in capsys.readouterr().err
    assert main(["gate", "--estimator", f"{MODULE}:nowhere"]) == 2
    assert main(["gate", "--estimator", "no_such_module_xyz:f"]) == 2


def _export(tmp_path: Path) -> list[dict[str, Any]]:
    out = tmp_path / "cells.jsonl"
    assert main(["golden", "export", "--out", str(out)]) == 0
    return [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]


def _write_csv(path: Path, rows: list[tuple[str, int, int | None]]) -> Path:
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["cell_id", "estimate_bytes", "forward_backward_bytes"])
        for cid, fwd, fb in rows:
            w.writerow([cid, fwd, "" if fb is None else fb])
    return path


def test_golden_export_writes_the_descriptions(tmp_path: Path) -> None:
    exported = _export(tmp_path)
    assert {d["cell_id"]: d for d in exported} == DESCRIBED


def test_estimates_csv_passes_and_fails_like_the_function(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    exported = _export(tmp_path)
    rows = [
        (d["cell_id"], ext.generous(d)["forward"], ext.generous(d)["forward_backward"])
        for d in exported
    ]
    good = _write_csv(tmp_path / "good.csv", rows)
    rc, report = _gate(capsys, "--estimates", str(good))
    assert rc == 0 and report["passed"]

    dropped = rows[0][0]
    missing = _write_csv(tmp_path / "missing.csv", rows[1:])
    rc, report = _gate(capsys, "--estimates", str(missing))
    assert rc == 1 and report["checks"]["coverage"]["failing"] == [f"{dropped} (no estimate)"]

    low_id, low_peak = next((cid, p) for cid, (p, _) in PEAKS.items())
    low = [(c, low_peak - 1 if c == low_id else f, fb) for c, f, fb in rows]
    rc, report = _gate(capsys, "--estimates", str(_write_csv(tmp_path / "low.csv", low)))
    assert rc == 1 and report["checks"]["coverage"]["failing"] == [low_id]

    forward_only = tmp_path / "forward_only.csv"
    forward_only.write_text(
        "cell_id,estimate_bytes\n" + "".join(f"{c},{f}\n" for c, f, _ in rows), encoding="utf-8"
    )
    rc, report = _gate(capsys, "--estimates", str(forward_only))
    assert rc == 0 and "forward_backward" not in report["checks"]["coverage"]


@pytest.mark.parametrize(
    "text, field",
    [
        ("cell_id,estimate_bytes\nno-such-cell,1\n", "cell_id"),
        ("cell_id,estimate_bytes\nx,lots\n", "estimate_bytes"),
        ("cell,bytes\nx,1\n", "estimates"),
    ],
)
def test_a_bad_estimates_file_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, field: str
) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(text, encoding="utf-8")
    assert main(["gate", "--estimates", str(path)]) == 2
    assert field in capsys.readouterr().err


def test_record_controls_does_not_combine_with_an_external_estimator(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["gate", "--record-controls", "--estimator", f"{MODULE}:generous"]
    assert main(argv) == 2
    assert "record-controls" in capsys.readouterr().err
