"""Against a device, admission and capacity answer for every step of the run: the first
(its kernel set-up paid in the activations, no optimizer moments yet) and the steady
ones (the moments and the kernel workspaces allocated), whichever holds more, and for a
pipeline step the stage where static memory and activations together are largest."""

from __future__ import annotations

from typing import Any

import pytest

from cpmem.admission.admission import admit
from cpmem.admission.capacity import capacity
from cpmem.api import estimate
from cpmem.pricing.device_budget import device_budget
from cpmem.pricing.static import StaticMemory
from cpmem.step.device import DEVICES

M4, M27 = "qwen3.5-4b", "qwen3.5-27b"
PAIR: dict[str, Any] = {"lengths": [4096, 4096], "shared_prefix": 1228, "cp": 2}


def _whole(model: str, figure: str = "forward", **options: Any) -> int:
    """static + activations of one step kind, read off ``estimate``."""
    est = estimate(model, device="h200", **options)
    assert est.static is not None
    act = est.estimate_bytes if figure == "forward" else est.forward_backward_bytes
    assert act is not None
    return est.static.total + act


@pytest.mark.parametrize(
    ("options", "figure", "kind"),
    [
        # rank-64 adapters: Adam's two fp32 moments (8 B a parameter) outweigh the
        # first step's 64 MiB kernel set-up
        ({"lora_rank": 64}, "forward", "steady"),
        # no optimizer state: the first step's set-up (64 MiB forward, tight's 97 MiB
        # first backward) outweighs the 96 MiB of workspaces a steady step keeps
        ({"optimizer": "none", "policy": "tight"}, "forward_backward", "first"),
    ],
)
def test_admission_decides_on_the_larger_step_kind(
    options: dict[str, Any], figure: str, kind: str
) -> None:
    policy = options.pop("policy", "reference")
    kinds = {
        k: _whole(M27, figure, policy=policy, step=k, **options, **PAIR)
        for k in ("first", "steady")
    }
    assert max(kinds, key=kinds.__getitem__) == kind
    d = admit(M27, device="h200", policy=policy, figure=figure, **options, **PAIR)
    assert d.estimate.step_kind == kind and dict(d.step_kinds) == kinds
    assert d.device_budget is not None
    assert d.required_bytes + d.device_budget.static.total == kinds[kind]
    usable = device_budget(DEVICES["h200"], StaticMemory({})).budget_bytes
    assert d.available_bytes + d.device_budget.static.total == usable
    assert d.to_dict()["step_whole_device_bytes"] == kinds


def test_a_pipeline_step_is_admitted_where_static_and_activations_are_largest() -> None:
    """4B at PP 4 with stages of 5, 5, 11, 11 layers and rank-64 adapters: stage 2 holds
    the most activations, but stage 3 (as many layers, and the output layer with its
    vocabulary-sized weight) fills the device most; estimate and admission both name
    the stage of max(stage static + stage activations) and hold its figure."""
    args: dict[str, Any] = {
        "lengths": [4096],
        "pp": 4,
        "lora_rank": 64,
        "stage_layers": [5, 5, 11, 11],
        "microbatches": 4,
        "device": "h200",
    }

    def stage_sums(kind: str) -> list[int]:
        out = estimate(M4, step=kind, **args).to_dict()
        pairs = zip(out["stage_static_bytes"], out["stage_bytes"], strict=True)
        return [s + a for s, a in pairs]

    est = estimate(M4, **args)
    out = est.to_dict()
    sums = stage_sums("steady")
    stage = sums.index(max(sums))
    assert out["device_stage"] == stage != out["busiest_stage"]
    assert est.static is not None and est.static.total == out["stage_static_bytes"][stage]
    d = admit(M4, **args)
    assert d.device_budget is not None
    held = d.required_bytes + d.device_budget.static.total
    assert held == max(max(sums), max(stage_sums("first")))


def test_capacity_fits_both_step_kinds_at_its_answer() -> None:
    """The longest sequence capacity finds fits the device as the first and as a steady
    step; one token more does not fit one of them (tight's whole step, no optimizer:
    the first step governs there)."""
    kw: dict[str, Any] = {"policy": "tight", "optimizer": "none", "head": "hidden"}
    found = capacity(M4, device="h200", layouts="1x1", figure="forward_backward", **kw)
    (lay,) = found.layouts
    length = lay.longest_sequence
    assert length is not None
    usable = found.usable_bytes

    def fits(n: int, kind: str) -> bool:
        return _whole(M4, "forward_backward", lengths=[n], step=kind, **kw) <= usable

    assert fits(length, "first") and fits(length, "steady")
    assert not (fits(length + 1, "first") and fits(length + 1, "steady"))
    assert lay.step_kind == "first"
