"""``cpmem diff`` on two commits of a scratch repository.

The scratch repository holds a copy of ``cpmem/`` and ``golden/``. The second commit
drops the reference formula's 1.10 safety factor (``SAFETY = 1.00``). What the diff
must then report follows from that change alone, not from the code under test:

- every reference (and global: the same formula) estimate shrinks by 1/11 (-9.09%),
  to within the one byte ``int()`` rounds away; the tight policy does not move;
- a measured cell loses forward coverage exactly when its recorded pre-change
  estimate (the reference's ``cell:<id>`` row of ``golden/controls/controls.csv``, read
  raw here) divided by 1.1 falls below its measured forward peak;
- a smaller estimate can only admit more: every flipped refusal goes refuse -> fit/split.

Putting the factor back in the (uncommitted) working tree and diffing against the
second commit gains back exactly those cells and exits 0.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cpmem.diff import cli as diff_mod
from cpmem.gate.controls import control_grid
from cpmem.golden.cells import load_cells

ROOT = Path(__file__).resolve().parents[2]
RECORDED = ROOT / "golden" / "controls" / "controls.csv"
SAFETY_LINE = "SAFETY = 1.10\n"


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        cwd=repo,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("scratch")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "cpmem", repo / "cpmem", ignore=ignore)
    shutil.copytree(ROOT / "golden", repo / "golden", ignore=ignore)
    _git(repo, "init", "-q")
    _git(repo, "add", "cpmem", "golden")
    _git(repo, "commit", "-q", "-m", "base")
    ref = repo / "cpmem" / "pricing" / "reference.py"
    text = ref.read_text(encoding="utf-8")
    assert text.count(SAFETY_LINE) == 1
    ref.write_text(text.replace(SAFETY_LINE, "SAFETY = 1.00\n"), encoding="utf-8")
    _git(repo, "commit", "-q", "-am", "drop the safety factor")
    return repo


def _run(repo: Path, base: str, tmp: Path, *extra: str) -> tuple[int, dict[str, Any], str]:
    out = tmp / "diff.md"
    argv = ["--base", base, "--repo", str(repo), "--json", "--out", str(out), *extra]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = diff_mod.main(argv)
    return rc, json.loads(buf.getvalue()), out.read_text(encoding="utf-8")


def _recorded_reference() -> dict[str, int]:
    with RECORDED.open(newline="", encoding="utf-8") as fh:
        return {
            r["control_id"].removeprefix("cell:"): int(r["estimate_bytes"])
            for r in csv.DictReader(fh)
            if r["shape"] == "cell" and r["policy"] == "reference"
        }


def test_dropping_the_safety_factor(scratch: Path, tmp_path: Path) -> None:
    rc, report, md = _run(scratch, "HEAD~1", tmp_path)
    cells = load_cells(scratch / "golden" / "cells.csv")
    measured = {c.cell_id: c for c in cells if not c.refused and c.forward_peak_bytes}
    before = _recorded_reference()
    expected_lost = sorted(
        cid for cid, c in measured.items() if before[cid] / 1.1 < (c.forward_peak_bytes or 0)
    )
    assert expected_lost, "the change must cost some cell its coverage for this test to bite"
    pols = report["diff"]["policies"]
    assert set(pols) == {"reference", "global", "tight"}

    for policy in ("reference", "global"):
        moved = [r for r in pols[policy]["cells_moved"] if r["figure"] == "forward"]
        assert {r["id"] for r in moved} == {c.cell_id for c in cells}
        for r in moved:
            assert abs(r["head_bytes"] - r["base_bytes"] / 1.1) <= 1.5, r
            assert r["delta_ratio"] == pytest.approx(-1 / 11, abs=1e-8)
        controls = pols[policy]["rows_moved"]["control"]
        assert len(controls) == pols[policy]["rows_total"]["control"] == len(control_grid())
        assert all(r["delta_ratio"] == pytest.approx(-1 / 11, abs=1e-8) for r in controls)
        assert pols[policy]["coverage_gained"] == []
        for r in pols[policy]["refusals_flipped"]:
            assert (r["base"], r["recorded"]) == ("refuse", "refused")
            assert r["head"] in ("fit", "split")

    lost = pols["reference"]["coverage_lost"]
    assert sorted(r["cell_id"] for r in lost) == expected_lost
    assert all(r["figure"] == "forward" for r in lost)
    assert pols["tight"]["cells_moved"] == [] and pols["tight"]["coverage_lost"] == []
    assert pols["tight"]["rows_moved"]["control"] == []

    assert rc == 1 and report["passed"] is False
    assert "**Coverage lost**" in md and "### policy `reference`" in md
    assert f"`{expected_lost[0]}`" in md
    assert "-9.09%" in md  # the per-cell change, in percent
    assert report["base"]["revision"] == _git(scratch, "rev-parse", "HEAD~1")
    # the temporary worktree is gone again
    assert len(_git(scratch, "worktree", "list").splitlines()) == 1


def test_restoring_it_in_the_working_tree_gains_coverage(scratch: Path, tmp_path: Path) -> None:
    ref = scratch / "cpmem" / "pricing" / "reference.py"
    changed = ref.read_text(encoding="utf-8")
    ref.write_text(changed.replace("SAFETY = 1.00\n", SAFETY_LINE), encoding="utf-8")
    try:
        rc, report, md = _run(scratch, "HEAD", tmp_path, "--policy", "reference")
    finally:
        ref.write_text(changed, encoding="utf-8")
    pd = report["diff"]["policies"]
    assert list(pd) == ["reference"]
    before = _recorded_reference()
    cells = load_cells(scratch / "golden" / "cells.csv")
    expected = sorted(
        c.cell_id
        for c in cells
        if not c.refused and c.forward_peak_bytes and before[c.cell_id] / 1.1 < c.forward_peak_bytes
    )
    assert sorted(r["cell_id"] for r in pd["reference"]["coverage_gained"]) == expected
    assert pd["reference"]["coverage_lost"] == []
    assert rc == 0 and report["passed"] is True
    assert "No cell loses coverage." in md


def test_a_revision_git_does_not_know_is_a_usage_error(
    scratch: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert diff_mod.main(["--base", "no-such-rev", "--repo", str(scratch)]) == 2
    assert "no-such-rev" in capsys.readouterr().err


def test_a_policy_one_side_lacks_is_a_usage_error(
    scratch: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert diff_mod.main(["--base", "HEAD", "--repo", str(scratch), "--policy", "nope"]) == 2
    assert "nope" in capsys.readouterr().err


PREVIOUS_LAYOUT = "968fc44"
"""The last commit of the layout before the step description (``cell_step`` in
``cpmem.gate.samples``): the one earlier layout ``cpmem.diff.snapshot`` knows."""


def test_the_script_prices_the_previous_layout() -> None:
    """At the last commit before the step description the script finds that layout's
    ``cell_step`` and reproduces every control that commit's own code recorded."""
    from cpmem.diff.checkout import price_checkout, resolve_revision, worktree

    try:
        commit = resolve_revision(ROOT, PREVIOUS_LAYOUT)
    except Exception:
        pytest.skip("the previous layout's commit is not in this clone (shallow checkout)")
    written = _git(ROOT, "show", f"{commit}:golden/controls/controls.csv")
    want = {
        (r["control_id"], r["policy"]): [
            int(r["estimate_bytes"]),
            int(r["forward_backward_bytes"]) if r["forward_backward_bytes"] else None,
        ]
        for r in csv.DictReader(io.StringIO(written + "\n"))
    }
    with worktree(ROOT, commit) as checkout:
        assert (checkout / "cpmem" / "gate" / "samples.py").exists()
        priced = price_checkout(checkout, ROOT / "golden")
    got = {(rid, p): f for rid, fs in priced["rows"]["control"].items() for p, f in fs.items()}
    assert priced["cell_errors"] == {} and priced["row_errors"] == {}
    assert len(priced["cells"]) == len(load_cells())
    assert got == want
    # it had no static memory and no device budget: neither is priced there, and it says so
    device = [
        f for by_id in priced["device"].values() for fs in by_id.values() for f in fs.values()
    ]
    assert len(device) == len(priced["cells"]) * len(priced["policies"]) + len(got)
    assert all(f == [None, None] for f in device)
    assert any("static memory is not priced there" in n for n in priced["device_notes"])


def test_an_older_layout_is_refused_naming_what_is_missing(tmp_path: Path) -> None:
    """A checkout whose cpmem has neither layout (here: an empty package) is refused with
    the names the script looked for, never priced half-way."""
    from cpmem.diff.checkout import DiffError, price_checkout

    (tmp_path / "cpmem").mkdir()
    (tmp_path / "cpmem" / "__init__.py").write_text("", encoding="utf-8")
    with pytest.raises(DiffError, match=r"not a cpmem layout this diff knows.*cell_step"):
        price_checkout(tmp_path, ROOT / "golden")


def test_cpmem_diff_is_a_cpmem_command(scratch: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from cpmem.cli import main

    assert main(["diff", "--base", "HEAD", "--repo", str(scratch), "--policy", "tight"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("## cpmem diff: ") and "Nothing moved." in out


def test_progress_on_a_terminal_only(scratch: Path, capfd: pytest.CaptureFixture[str]) -> None:
    diff_mod.run_diff("HEAD", repo=scratch, policies=["tight"], progress=True)
    assert "pricing working tree" in capfd.readouterr().err
    diff_mod.run_diff("HEAD", repo=scratch, policies=["tight"], progress=False)
    assert capfd.readouterr().err == ""


def test_controls_only_one_side_has_are_counted(scratch: Path, tmp_path: Path) -> None:
    """A fourth control length adds a third as many controls again (the grid is a
    product over the three lengths); they are counted, not compared."""
    controls = scratch / "cpmem" / "gate" / "controls.py"
    line = "LENGTHS = (64, 2048, 32768)\n"
    with _patched(controls, line, "LENGTHS = (64, 2048, 4096, 32768)\n"):
        rc, report, md = _run(scratch, "HEAD", tmp_path, "--policy", "tight")
    added = report["diff"]["rows_added"]["control"]
    assert len(added) == len(control_grid()) // 3 and all(":4096+" in a for a in added)
    assert report["diff"]["rows_removed"]["control"] == []
    assert report["diff"]["policies"]["tight"]["rows_moved"]["control"] == []
    assert rc == 0 and f"Controls only one side has (not compared): {len(added)} added" in md


H200_LINE = "            150_121_021_440,\n"


@contextlib.contextmanager
def _patched(path: Path, line: str, replacement: str) -> Iterator[None]:
    """``path`` in the scratch worktree with its one ``line`` replaced, restored after."""
    text = path.read_text(encoding="utf-8")
    assert text.count(line) == 1
    path.write_text(text.replace(line, replacement), encoding="utf-8")
    try:
        yield
    finally:
        path.write_text(text, encoding="utf-8")


def test_a_device_presets_total_moves_its_budget_in_the_rendered_diff(
    scratch: Path, tmp_path: Path
) -> None:
    """One GiB more on the H200 preset: the budget rule (total - 3% of it - what sits
    outside PyTorch - static) leaves every cell and control that GiB less its 3%, the
    static memory and every activation figure stay where they were."""
    device = scratch / "cpmem" / "step" / "device.py"
    with _patched(device, H200_LINE, "            150_121_021_440 + 2**30,\n"):
        rc, report, md = _run(scratch, "HEAD", tmp_path, "--policy", "tight")
    total = 150_121_021_440
    gained = 2**30 - (int(0.03 * (total + 2**30)) - int(0.03 * total))
    pd = report["diff"]["policies"]["tight"]
    assert pd["cells_moved"] == [] and pd["rows_moved"]["control"] == []
    moved = pd["device_moved"]
    assert {r["id"] for r in moved["cell"]} == {c.cell_id for c in load_cells()}
    assert len(moved["control"]) == len(control_grid())
    for r in moved["cell"] + moved["control"]:
        assert r["figure"] == "h200_budget" and r["delta_bytes"] == gained, r
    assert rc == 0 and report["base"]["notes"] == report["head"]["notes"] == []
    assert "#### Static memory and h200 budget moved: cells" in md
    assert "#### Static memory and h200 budget moved: controls" in md
    assert f"| {gained:+,} |" in md


def test_a_side_that_prices_no_static_memory_is_not_compared() -> None:
    """Static memory and budget one side does not price (None there) are no move; the
    side's note says why, in the Markdown too."""
    from cpmem.diff.cli import _notes, compare, render_markdown

    note = "static memory is not priced there (no Estimate.static)"
    base = {
        "cells": {},
        "refusals": {},
        "rows": {"control": {"c1": {"tight": [100, 200]}, "c2": {"tight": [100, 200]}}},
        "device": {"cell": {}, "control": {"c1": {"tight": [None, None]}, "c2": {"tight": [5, 9]}}},
        "device_notes": [note],
    }
    head = {
        **base,
        "device": {"cell": {}, "control": {"c1": {"tight": [5, 9]}, "c2": {"tight": [5, 8]}}},
        "device_notes": [],
    }
    diff = compare(base, head, [], ["tight"])
    moved = diff["policies"]["tight"]["device_moved"]
    assert moved["cell"] == []
    assert [(r["id"], r["figure"], r["delta_bytes"]) for r in moved["control"]] == [
        ("c2", "h200_budget", -1)
    ]
    report = {
        "diff": diff,
        "base": {"rev": "base", "revision": "0" * 40, "notes": _notes(base)},
        "head": {"rev": "working tree", "notes": _notes(head)},
        "golden": "golden",
        "cells": 0,
        "measured": 0,
        "row_kinds": ["control"],
    }
    md = render_markdown(report)
    assert f"- base: {note}" in md
    assert "| `c2` | h200_budget |" in md and "`c1`" not in md
