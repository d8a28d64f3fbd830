"""The FP8 step setting (``cpmem.step.fp8``): its text, and every combination it is not
priced for refused with each reason at once (the reasons read from the module's sources:
TE's cached FP8 weight copies without param-gather, base.py:712-722; FP8 GEMMs from
compute capability 8.9)."""

from __future__ import annotations

import pytest

from cpmem.api import describe_step
from cpmem.errors import InputError
from cpmem.step.fp8 import Fp8

FULL = {"runtime": "megatron-lm", "training": "full"}


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("tensorwise:param-gather", Fp8("tensorwise", True)),
        ("Delayed", Fp8("delayed", False)),
        ("none", None),
        (None, None),
    ],
)
def test_the_setting_reads_recipe_and_param_gather(text: str | None, parsed: Fp8 | None) -> None:
    assert Fp8.parse(text) == parsed


def test_a_malformed_setting_names_the_field() -> None:
    with pytest.raises(InputError) as err:
        Fp8.parse("tensorwise:gather")
    assert (err.value.field, err.value.value) == ("fp8", "tensorwise:gather")


def test_the_priced_recipe_prices_on_a_dense_model() -> None:
    step = describe_step("qwen3-1.7b", [4096], fp8="tensorwise:param-gather", **FULL)
    assert step.settings.fp8 == Fp8("tensorwise", True)


def test_every_reason_is_named_at_once() -> None:
    with pytest.raises(InputError) as err:
        describe_step("qwen3-1.7b", [4096], fp8="delayed", device="a100-80gb")
    reason = err.value.reason
    assert err.value.field == "fp8" and err.value.value == "delayed"
    for part in (
        "recipe delayed: its amax histories",
        "module/base.py:712-722",
        "full training (--training full) only",
        "compute capability 8.9 or later",
    ):
        assert part in reason


def test_other_layer_kinds_and_recompute_are_refused() -> None:
    with pytest.raises(InputError) as err:
        describe_step(
            "qwen3.5-35b-a3b", [4096], fp8="tensorwise:param-gather", recompute="full", **FULL
        )
    assert "not ['gdn', 'moe']" in err.value.reason
    assert "recompute none" in err.value.reason


def test_tp_comm_overlap_needs_sequence_parallelism() -> None:
    with pytest.raises(InputError) as err:
        describe_step("qwen3-1.7b", [4096], tp_comm_overlap=True, **FULL)
    assert err.value.field == "tp_comm_overlap"
    step = describe_step("qwen3-1.7b", [4096], tp=2, tp_comm_overlap=True, **FULL)
    assert step.settings.tp_comm_overlap


@pytest.mark.parametrize(
    ("given", "reason"),
    [
        ({"fsdp": "optim_grads_params"}, "Megatron FSDP's buffers are not priced"),
        ({"optimizer": "muon"}, "beside Muon's layer-wise buffers are not priced"),
    ],
)
def test_fp8_parameters_in_other_buffers_are_refused(given: dict[str, str], reason: str) -> None:
    """The uint8 buffer, transposes and scale inverses are priced in megatron-core's DDP
    buffers only; Megatron FSDP and Muon keep their parameters in buffers of their own."""
    with pytest.raises(InputError) as err:
        describe_step("qwen3-1.7b", [4096], fp8="tensorwise:param-gather", dp=4, **FULL, **given)
    assert err.value.field == "fp8"
    assert reason in err.value.reason
