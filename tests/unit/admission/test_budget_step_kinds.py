"""Against a given budget, admission prices the layout it chooses as the first and as a
steady step of its process and decides on the larger activation figure, naming the step
kind in its text and JSON; every expected figure here is an ``estimate`` call of one
step kind, made independently of admission."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from harness import runtime_budget_flags

from cpmem.admission.admission import admit
from cpmem.api import estimate
from cpmem.cli import main
from cpmem.reports.cli_render import step_kinds_line
from cpmem.units import GIB

M17, M4 = "qwen3-1.7b", "qwen3.5-4b"
# Qwen3-1.7B TP 2 CP 2 under tight, two sequences of 5,632 tokens: the chunked planner's
# busiest rank; tight's first step holds its 64 MiB cold set-up (and the margin on it)
# beyond the steady step, so a budget of 11.8108 GiB lies between the two figures
PAIR: dict[str, Any] = {"lengths": [5632, 5632], "tp": 2, "cp": 2, "policy": "tight"}
BUDGET_GIB = 11.8108


def _figure(kind: str, **options: Any) -> int:
    return estimate(M17, step=kind, **{**PAIR, **options}).estimate_bytes


def test_a_budget_between_the_steady_and_the_first_step_is_not_a_fit() -> None:
    first, steady = _figure("first"), _figure("steady")
    budget = int(BUDGET_GIB * GIB)
    assert steady <= budget < first  # 11.778 GiB <= 11.8108 GiB < 11.843 GiB
    d = admit(M17, budget_bytes=budget, **PAIR)
    assert d.action != "fit"
    assert dict(d.considered)["cost-optimal"] == first
    # the balanced layout holds as much here, and two parts each keep their activations
    assert d.action == "refuse" and d.required_bytes == first
    assert d.estimate.step_kind == "first"
    out = d.to_dict()
    assert out["step_required_bytes"] == {"first": first, "steady": steady}
    assert out["estimate"]["step"] == "first"
    assert "step_whole_device_bytes" not in out


@pytest.mark.parametrize("asked", ["first", "steady"])
def test_the_step_asked_does_not_change_the_decision(asked: str) -> None:
    """At the first step's figure the layout fits, decided on the first step, whichever
    step the arguments name."""
    first, steady = _figure("first"), _figure("steady")
    d = admit(M17, budget_bytes=first, step=asked, **PAIR)
    assert (d.action, d.variant, d.required_bytes) == ("fit", "cost-optimal", first)
    assert dict(d.step_kinds) == {"first": first, "steady": steady}
    assert d.estimate.step_kind == "first"


def test_a_split_is_priced_at_one_step_kind_for_every_part() -> None:
    """Two 4,096-token sequences of the 4B at CP 1 under the reference, split in two: each
    kind's cost is both parts' retained bytes plus one part's other bytes (docs/admission.md,
    the split rule), every part priced at that kind by ``estimate``."""
    whole = estimate(M4, [4096, 4096], step="first").estimate_bytes

    def split_cost(kind: str) -> int:
        part = estimate(M4, [4096], step=kind)
        return 2 * part.retained_bytes + (part.estimate_bytes - part.retained_bytes)

    costs = {kind: split_cost(kind) for kind in ("first", "steady")}
    assert costs["first"] > costs["steady"]
    d = admit(M4, [4096, 4096], budget_bytes=costs["first"])
    assert whole > costs["first"]  # one forward does not fit; two parts do
    assert (d.action, d.parts, d.required_bytes) == ("split", 2, costs["first"])
    assert dict(d.step_kinds) == costs and d.estimate.step_kind == "first"


def test_admit_says_which_step_decided(capsys: pytest.CaptureFixture[str]) -> None:
    first, steady = _figure("first"), _figure("steady")
    argv = ["admit", "--model", M17, "--lengths", "5632,5632", "--tp", "2", "--cp", "2"]
    # the runtime's figures: the budget left for the activations, compared with them alone
    argv += ["--policy", "tight", *runtime_budget_flags(int(BUDGET_GIB * GIB))]
    assert main(argv) == 3
    text = capsys.readouterr().out
    line = (
        f"decided on the first step, the larger of its activations (first "
        f"{first / GIB:.3f} GiB, steady {steady / GIB:.3f} GiB)"
    )
    assert line in text and "11.843" in line and "11.778" in line
    assert main([*argv, "--json"]) == 3
    out = json.loads(capsys.readouterr().out)
    assert out["step_required_bytes"] == {"first": first, "steady": steady}


def test_equal_step_kinds_are_said_to_be_alike() -> None:
    d = admit(M17, budget_bytes=1 << 50, **PAIR)
    same = replace(d, step_kinds=(("first", 5 * GIB), ("steady", 5 * GIB)))
    assert step_kinds_line(same) == (
        "decided on the first and the steady step alike (first 5.000 GiB, steady 5.000 GiB)"
    )
