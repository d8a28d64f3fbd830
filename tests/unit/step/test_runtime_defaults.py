"""What a step defaults to by its runtime, where the caller names nothing: ART's trainer
as golden/ measured it, Megatron-LM's run as its own arguments' defaults have it.

Expected outcomes: Megatron-LM's defaults (no recompute without --recompute-granularity,
--cp-comm-type p2p, --attention-backend auto) and Transformer Engine's choice restated in
``cpmem.step.attention_backend`` (its tests hold the rule to TE's source).
"""

from __future__ import annotations

import pytest

from cpmem.api import estimate
from cpmem.errors import InputError
from cpmem.pricing.registry import price
from cpmem.reports.cli_render import render_estimate
from cpmem.step.describe import describe_settings, describe_step
from cpmem.step.recompute import Mode


def test_art_defaults_to_the_measured_step() -> None:
    s = describe_settings("qwen3-1.7b")
    assert s.recompute.mode == Mode.SELECTIVE and s.cp_comm == "all_gather"
    assert s.runtime.attention_backend == "fused" and s.runtime.backend_resolved


def test_megatron_lm_defaults_to_megatrons_own_arguments() -> None:
    s = describe_settings("qwen3-1.7b", runtime="megatron-lm", training="full")
    assert s.recompute.mode == Mode.NONE and s.cp_comm == "p2p"
    assert s.runtime.backend_asked == "auto" and not s.runtime.backend_resolved
    # naming modules asks for selective recompute whatever the runtime
    named = describe_settings("qwen3-1.7b", runtime="megatron-lm", modules="core_attn")
    assert named.recompute.mode == Mode.SELECTIVE


@pytest.mark.parametrize(
    ("device", "picked"),
    [("a100-80gb", "flash"), ("h100", "fused"), ("h200", "fused"), (None, "fused")],
)
def test_auto_is_resolved_when_the_step_is_planned(device: str | None, picked: str) -> None:
    """Below sm90 TE prefers flash-attn, from sm90 its fused (cuDNN) backend; no device is
    read as the measured H200."""
    step = describe_step("qwen3-1.7b", [4096], attention_backend="auto", device=device)
    runtime = step.settings.runtime
    assert runtime.backend_resolved and runtime.backend_asked == "auto"
    assert runtime.attention_backend == picked


def test_the_container_decides_where_its_libraries_do() -> None:
    """head_dim 256: cuDNN 9's fused kernel takes it (dev); NGC 24.01's cuDNN 8.9.7 does
    not and its flash-attn is outside TE's gates: the unfused backend, its scores kept."""
    dev = describe_step("qwen3.5-4b", [4096], attention_backend="auto")
    old = describe_step("qwen3.5-4b", [4096], attention_backend="auto", container="ngc-24.01")
    assert dev.settings.runtime.attention_backend == "fused"
    assert old.settings.runtime.attention_backend == "unfused"
    assert "unfused" in dev.settings.runtime.backend_spread
    with pytest.raises(InputError, match="container"):
        describe_step("qwen3.5-4b", [4096], attention_backend="auto", container="lts-1999")


def test_auto_never_prices_unfused_under_cp() -> None:
    """TE runs no unfused attention under CP (utils.py:756-760): where NGC 24.01 has no
    other backend for the run, it is refused with TE's reasons."""
    with pytest.raises(InputError, match="attention_backend"):
        describe_step(
            "qwen3.5-4b", [4096, 4096], cp=2, attention_backend="auto", container="ngc-24.01"
        )


def test_the_default_policy_is_the_runtimes() -> None:
    art = describe_step("qwen3-1.7b", [4096])
    megatron = describe_step("qwen3-1.7b", [4096], runtime="megatron-lm", training="full")
    assert price(art).policy == "reference"
    assert price(megatron).policy == "tight"
    with pytest.raises(InputError, match="tight"):
        price(megatron, "reference")


def test_the_estimate_says_what_is_trained_and_hides_what_the_step_does_not_hold() -> None:
    est = estimate("qwen3-1.7b", [4096], runtime="megatron-lm", training="full")
    step = describe_step("qwen3-1.7b", [4096], runtime="megatron-lm", training="full")
    assert est.to_dict()["training"] == "full" and est.to_dict()["runtime"] == "megatron-lm"
    text = render_estimate(est, step.plan)
    assert "full training" in text and "lora r1" not in text and "runtime=megatron-lm" in text
    zero = [name for name, b in est.components.items() if b == 0]
    assert zero  # the JSON lists every component, the table only those held
    assert all(f"\n{name} " not in text for name in zero)


def test_experts_split_over_tp_by_megatrons_default_and_not_under_art() -> None:
    """Megatron-LM sets --expert-tensor-parallel-size to TP where it is not given
    (arguments.py:587-588); ART's measured MoE cells split experts over EP alone."""
    megatron = describe_settings("qwen3-30b-a3b", tp=2, ep=2, runtime="megatron-lm")
    art = describe_settings("qwen3-30b-a3b", tp=2, ep=2)
    dense = describe_settings("qwen3-1.7b", tp=2, runtime="megatron-lm")
    assert (megatron.layout.etp, art.layout.etp, dense.layout.etp) == (2, 1, 1)
    est = estimate("qwen3-30b-a3b", [4096], tp=2, ep=2, runtime="megatron-lm", training="full")
    assert (est.to_dict()["ep"], est.to_dict()["etp"]) == (2, 2)


@pytest.mark.parametrize(
    ("model", "runtime", "comm"),
    [
        # DeepSeek-V3: K is 128 + 64 wide, V 128; TE runs it under p2p or a2a+p2p only
        ("deepseek-v3", "art", "p2p"),
        ("deepseek-v3", "megatron-lm", "p2p"),
        # gemma-3's local layers slide; TE runs a window under all_gather or a2a only
        ("gemma-3-12b", "megatron-lm", "all_gather"),
        ("gemma-3-12b", "art", "all_gather"),
        # a plain model keeps its runtime's own type
        ("qwen3-1.7b", "art", "all_gather"),
        ("qwen3-1.7b", "megatron-lm", "p2p"),
    ],
)
def test_the_default_cp_comm_is_one_transformer_engine_runs(
    model: str, runtime: str, comm: str
) -> None:
    """Where no CP comm type is asked, the step rides one TE's CP attention runs the
    model under, and it plans at CP 2; asking for a type TE refuses is still refused."""
    s = describe_settings(model, runtime=runtime, cp=2, tp=1)
    assert s.cp_comm == comm
    describe_step(model, [4096], runtime=runtime, cp=2, tp=1)
    refused = {"deepseek-v3": "all_gather", "gemma-3-12b": "p2p"}.get(model)
    if refused is not None:
        with pytest.raises(InputError, match="cp_comm"):
            describe_step(model, [4096], runtime=runtime, cp=2, tp=1, cp_comm=refused)
