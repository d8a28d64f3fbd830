"""No silent no-ops: an option a policy does not price is named on the estimate.

Each declared ignore is checked both ways: under the policy that lists it the option
moves nothing (activations, forward+backward, static memory), and under a policy that
prices it the same change moves the figure, so the listing is neither false nor idle.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from cpmem.api import describe_step, estimate
from cpmem.pricing.registry import IGNORES, POLICIES
from cpmem.step.profiles import ProfileStore

M17, M4, MOE = "qwen3-1.7b", "qwen3.5-4b", "qwen3.5-35b-a3b"


def _floor_store() -> ProfileStore:
    store = ProfileStore()
    store.observe(describe_step(M4, [4096]).signature, peak_bytes=10**12, tokens=4096)
    return store


MOE_ONLY = "qwen3-30b-a3b"  # every MLP routed, no shared expert
UNEVEN = [6144, 2048]
Case = tuple[str, dict[str, Any], dict[str, Any], "str | None"]

# option -> (model, common settings, the change, a policy that prices it); the request is
# ``common["lengths"]`` where given, else one 4,096-token sequence
CHANGES: dict[str, Case] = {
    "compiled": (M17, {"head": "hidden"}, {"compiled": True}, "tight"),
    "moe_routing": (MOE, {"tp": 4, "ep": 4}, {"moe_routing": "balanced"}, "tight"),
    "profiles": (M4, {}, {"profiles": _floor_store()}, "reference"),
    # flash-attn's bshd copies: one more query-wide output per attention layer under tight
    "attention_backend": (M17, {"head": "hidden"}, {"attention_backend": "flash"}, "tight"),
    # the experts' SwiGLU saved set: 3 F_e fused, 5 unfused in the reference's widths
    "fused_swiglu": (MOE_ONLY, {"tp": 2, "ep": 4}, {"fused_swiglu": True}, "reference"),
    # tight keeps the core's saved set without a core_attn checkpoint
    "recompute": (M17, {"tp": 2, "cp": 2, "head": "hidden"}, {"recompute": "none"}, "tight"),
    # tight prices p2p's padded in-flight ring buffers
    "cp_comm": (M17, {"tp": 2, "cp": 2, "head": "hidden"}, {"cp_comm": "p2p"}, "tight"),
    # the in-flight chunks' output-projection inputs on the host under tight
    "offload": (M17, {"pp": 2, "microbatches": 4}, {"offload": "core_attn+attn_proj"}, "tight"),
    # an MoE model: the reference charges the packed count, tight the busiest rank's
    "planner": (
        MOE,
        {"tp": 4, "ep": 4, "cp": 2, "lengths": UNEVEN},
        {"planner": "balanced"},
        "tight",
    ),
}
OVERRIDES: dict[tuple[str, str], Case] = {
    # Megatron-LM's fused SwiGLU on an ungated dense model: tight reads compile nowhere
    ("tight", "compiled"): (
        M17,
        {"head": "hidden", "runtime": "megatron-lm"},
        {"compiled": True},
        None,
    ),
    # gated attention under flash: no policy prices flash-attn's copies there
    ("tight", "attention_backend"): (M4, {"head": "hidden"}, {"attention_backend": "flash"}, None),
    # a dense model: global charges every rank the packed count, tight the busiest's
    ("global", "planner"): (
        M17,
        {"tp": 2, "cp": 2, "head": "hidden", "lengths": UNEVEN},
        {"planner": "balanced"},
        "tight",
    ),
}
"""Where a policy ignores an option on some steps only, a step it ignores it on."""


def _case(policy: str, option: str) -> Case:
    return OVERRIDES.get((policy, option), CHANGES[option])


def _estimate(model: str, policy: str, **options: Any) -> Any:
    lengths = options.pop("lengths", [4096])
    return estimate(model, lengths, policy=policy, **options)


def _figures(model: str, policy: str, **options: Any) -> tuple[Any, ...]:
    est = _estimate(model, policy, **options)
    assert est.static is not None
    return est.estimate_bytes, est.forward_backward_bytes, est.static.total


def test_every_declared_ignore_has_a_case() -> None:
    declared = {o for ignores in IGNORES.values() for o in ignores}
    assert declared == set(CHANGES)
    assert set(IGNORES) == set(POLICIES)


@pytest.mark.parametrize(
    ("policy", "option"), [(p, o) for p, ignores in IGNORES.items() for o in ignores]
)
def test_a_declared_ignore_moves_nothing_and_is_named(policy: str, option: str) -> None:
    model, common, change, pricer = _case(policy, option)
    assert _figures(model, policy, **common) == _figures(model, policy, **common, **change)
    assert _estimate(model, policy, **common, **change).to_dict()["ignored_options"] == [option]
    if pricer is None:
        return  # no policy prices it on this step (the reason says so)
    assert _figures(model, pricer, **common) != _figures(model, pricer, **common, **change)
    assert not _estimate(model, pricer, **common, **change).ignored_options


@pytest.mark.parametrize(
    ("model", "common", "change", "option"),
    [
        (M17, {}, {"moe_routing": "balanced"}, "moe_routing"),  # no routed experts
        (M17, {}, {"ep": 2}, "ep"),
        (M17, {}, {"cp_comm": "p2p"}, "cp_comm"),  # cp 1: nothing exchanged
        (M17, {}, {"dp": 4}, "dp"),  # no distributed optimizer: DP replicates
        (M17, {}, {"output_bytes": 1 << 30}, "output_bytes"),  # a head returns no hidden
    ],
)
@pytest.mark.parametrize("policy", ["reference", "tight"])
def test_an_option_the_step_cannot_use_is_named(
    model: str, common: dict[str, Any], change: dict[str, Any], option: str, policy: str
) -> None:
    assert _figures(model, policy, **common) == _figures(model, policy, **common, **change)
    est = estimate(model, [4096], policy=policy, **common, **change)
    assert option in est.to_dict()["ignored_options"]


def test_the_human_output_warns_in_one_line_and_the_json_lists() -> None:
    argv = [sys.executable, "-m", "cpmem.cli", "estimate", "--model", MOE, "--lengths", "4096"]
    argv += ["--tp", "4", "--ep", "4", "--compiled", "--moe-routing", "balanced"]
    tight_argv = [*argv, "--policy", "tight"]
    argv += ["--policy", "reference"]  # ART's MoE steps default to tight
    text = subprocess.run(argv, capture_output=True, text=True, check=True)
    (line,) = [ln for ln in text.stderr.splitlines() if "ignores" in ln]
    assert line.startswith("cpmem: warning: policy reference ignores compiled")
    assert "moe_routing" in line
    out = json.loads(subprocess.run([*argv, "--json"], capture_output=True, text=True).stdout)
    assert out["ignored_options"] == ["compiled", "moe_routing"]
    tight = subprocess.run(tight_argv, capture_output=True, text=True)
    assert "ignores" not in tight.stderr
