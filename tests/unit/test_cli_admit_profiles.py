"""``cpmem admit --profiles`` admits what ``cpmem estimate --profiles`` prices.

With a learned profile for the 4B's CP 2 selective step (10 MB per token, observed at
4,096 tokens), ``cpmem estimate --model qwen3.5-4b --lengths 2048,2048 --cp 2 --profiles
prof.json`` prices about 21 GiB (the profile floor; under 20 GiB without it), so ``cpmem
admit ... --profiles prof.json`` with 20 GiB left for the activations (the runtime's
figures, ``harness.runtime_budget_flags``) must not say FIT: admission prices the same
profile floor. Every figure below is read from ``estimate --json`` with the same
arguments, except the ~21 GiB sanity bound.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from harness import runtime_budget_flags

from cpmem.cli import main
from cpmem.units import fmt_gib

GIB = 1 << 30
PROFILED_GIB = 21.024  # the estimate with the profile, as a sanity bound
REQUEST = ["--model", "qwen3.5-4b", "--lengths", "2048,2048", "--cp", "2", "--head", "hidden"]
PROFILE = {
    "qwen3.5-4b|tp1|cp2|sp0|ep1|selective|core_attn|eager|head=hidden|lora r1|"
    "cp_comm=all_gather|dtype2|steady": {"bytes_per_token": 10000000, "tokens": 4096}
}


@pytest.fixture
def profiles(tmp_path: Path) -> list[str]:
    path = tmp_path / "prof.json"
    path.write_text(json.dumps(PROFILE))
    return ["--profiles", str(path)]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    code = main([*argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def estimate_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    code, out = run(capsys, "estimate", *argv)
    assert code == 0
    return out


def test_the_profile_raises_the_estimate_to_about_21_gib(capsys, profiles):
    est = estimate_json(capsys, *REQUEST, *profiles)
    assert est["estimate_gib"] == pytest.approx(PROFILED_GIB, abs=0.01)
    assert est["estimate_bytes"] / GIB == pytest.approx(PROFILED_GIB, abs=0.01)
    assert est["components"]["profile_floor"] > 0  # the profile is what raises it
    without = estimate_json(capsys, *REQUEST)
    assert without["estimate_bytes"] < 20 * GIB < est["estimate_bytes"]


def test_admit_does_not_fit_what_the_estimate_prices_above_the_budget(capsys, profiles):
    est = estimate_json(capsys, *REQUEST, *profiles)
    code, d = run(capsys, "admit", *REQUEST, *profiles, *runtime_budget_flags(20 * GIB))
    considered = {c["variant"]: c["required_bytes"] for c in d["considered"]}
    # admission prices the cost-optimal layout as estimate does, profile included
    assert considered["cost-optimal"] == est["estimate_bytes"]
    assert est["estimate_bytes"] > d["available_bytes"] == 20 * GIB
    # so it must not fit as it stands: it splits (within the budget) or refuses
    assert d["action"] != "fit"
    assert d["action"] in ("split", "refuse")
    if d["action"] == "split":
        assert code == 0 and d["required_bytes"] <= d["available_bytes"]
        assert d["variant"] == f"split-{d['parts']}"
    else:
        assert code == 3 and d["required_bytes"] > d["available_bytes"]
    # every memory-minimal layout is the estimate with that planner, profile included
    for variant, required in considered.items():
        if variant.startswith("memory-minimal:"):
            planner = variant.removeprefix("memory-minimal:")
            alt = estimate_json(capsys, *REQUEST, *profiles, "--planner", planner)
            assert required == alt["estimate_bytes"], variant
            assert required > d["available_bytes"]


def test_admit_requires_the_estimate_when_it_fits(capsys, profiles):
    est = estimate_json(capsys, *REQUEST, *profiles)
    budget = runtime_budget_flags(est["estimate_bytes"] + GIB)
    code, d = run(capsys, "admit", *REQUEST, *profiles, *budget)
    assert code == 0
    assert (d["action"], d["variant"]) == ("fit", "cost-optimal")
    assert d["required_bytes"] == est["estimate_bytes"]
    assert d["estimate"] == {k: v for k, v in est.items() if k not in ("rank_tokens", "warnings")}


@pytest.mark.parametrize("figure", ["forward", "forward_backward"])
def test_tight_ignores_profiles_in_estimate_and_admission_alike(capsys, profiles, figure):
    est = estimate_json(capsys, *REQUEST, *profiles, "--policy", "tight")
    plain = estimate_json(capsys, *REQUEST, "--policy", "tight")
    # tight prices no floors, and says so: the same figures, the option named as ignored
    assert est["ignored_options"] == ["profiles"] and plain["ignored_options"] == []
    assert {**est, "ignored_options": []} == plain
    # admission requires the larger of the first and the steady step: here the first,
    # which holds tight's cold set-up
    key = "estimate_bytes" if figure == "forward" else "forward_backward_bytes"
    first = estimate_json(capsys, *REQUEST, "--policy", "tight", "--step", "first")
    assert first[key] > est[key]
    wanted = first[key]
    for budget in (20 * GIB, wanted + GIB):
        argv = [*REQUEST, *profiles, "--policy", "tight", "--figure", figure]
        code, d = run(capsys, "admit", *argv, *runtime_budget_flags(budget))
        considered = {c["variant"]: c["required_bytes"] for c in d["considered"]}
        assert considered["cost-optimal"] == wanted
        if wanted <= d["available_bytes"]:
            assert code == 0 and d["action"] == "fit" and d["variant"] == "cost-optimal"
            assert d["required_bytes"] == wanted
        else:
            assert d["action"] != "fit" or d["variant"] != "cost-optimal"


def test_admit_over_the_budget_with_profiles_says_split_or_refuse(capsys, profiles):
    """The command line as a process, 20 GiB against the ~21 GiB profiled estimate: its
    first word is SPLIT or REFUSE (exit 0 or 3), and the cost-optimal figure it prints is
    the estimate's, profile floor included."""
    budget = runtime_budget_flags(20 * GIB)
    argv = [sys.executable, "-m", "cpmem.cli", "admit", *REQUEST, *profiles, *budget]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    first = proc.stdout.split(":", 1)[0]
    assert first in ("SPLIT", "REFUSE"), proc.stdout + proc.stderr
    assert proc.returncode == (0 if first == "SPLIT" else 3)
    est = estimate_json(capsys, *REQUEST, *profiles)
    assert f"cost-optimal {fmt_gib(est['estimate_bytes'])} GiB" in " ".join(proc.stdout.split())
