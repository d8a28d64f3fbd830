"""The expert layout's rules (``cpmem.plan.layout.expert_problems``), from every door.

Megatron-LM gives each EP rank ``num_experts / EP`` routed experts and asserts that EP
divides them (megatron-core 0.16.1 ``transformer/moe/moe_layer.py:101``); each expert's
linears split over ETP with ``divide()`` (``extensions/transformer_engine.py:614-617``,
``1524-1527``), and experts with biases are built at ETP 1 only
(``transformer/transformer_config.py:1588-1591``). Every expected value below is counted
by hand from the models' published configs: Qwen3-30B-A3B has 128 routed experts of FFN
768 without biases; gpt-oss-20b has 32 of FFN 2,880 with biases.
"""

from __future__ import annotations

import pytest

from cpmem.api import describe_settings, estimate
from cpmem.cli import main
from cpmem.errors import InputError

MOE = "qwen3-30b-a3b"  # 128 experts, F_e 768
DIVISORS_OF_128 = [1, 2, 4, 8, 16, 32, 64, 128]


def test_ep_not_dividing_the_experts_is_refused_with_the_share_and_the_rule() -> None:
    with pytest.raises(InputError) as err:
        describe_settings(MOE, ep=3)
    assert (err.value.field, err.value.value) == ("ep", 3)
    assert "128 / 3 = 42.7 experts a rank" in err.value.reason  # 128/3 = 42.67
    assert "moe_layer.py:101" in err.value.reason and "num_experts % EP == 0" in err.value.reason
    assert str(DIVISORS_OF_128) in err.value.reason


def test_ep_above_the_experts_is_refused() -> None:
    with pytest.raises(InputError, match=r"ep=256: exceeds the 128 routed experts"):
        describe_settings(MOE, ep=256)


def test_exactly_the_divisors_of_the_experts_are_accepted() -> None:
    accepted = []
    for ep in range(1, 257):
        try:
            describe_settings(MOE, ep=ep)
        except InputError:
            continue
        accepted.append(ep)
    assert accepted == DIVISORS_OF_128


@pytest.mark.parametrize(("etp", "ok"), [(2, True), (3, True), (5, False), (7, False)])
def test_etp_must_divide_the_experts_ffn(etp: int, ok: bool) -> None:
    """768 = 2^8 x 3: ETP 2 and 3 divide it, 5 and 7 do not (768 = 5 x 153 + 3)."""
    if ok:
        assert describe_settings(MOE, ep=2, etp=etp).layout.etp == etp
        return
    with pytest.raises(InputError, match=r"routed experts' FFN width \(768\)") as err:
        describe_settings(MOE, ep=2, etp=etp)
    assert err.value.field == "etp" and "transformer_engine.py" in err.value.reason


def test_biased_experts_run_at_etp_1_only() -> None:
    assert describe_settings("gpt-oss-20b", ep=4).layout.etp == 1  # ART's default ETP 1
    with pytest.raises(InputError, match="experts have biases") as err:
        describe_settings("gpt-oss-20b", ep=4, etp=2)  # 2,880 / 2: divisible, still refused
    assert "transformer_config.py:1588-1591" in err.value.reason
    with pytest.raises(InputError, match="experts have biases"):  # Megatron-LM's ETP = TP
        describe_settings("gpt-oss-20b", ep=4, tp=2, runtime="megatron-lm")


def test_every_broken_layout_rule_is_listed_at_once() -> None:
    """TP 3 divides none of the 32 query heads, EP 3 none of the 128 experts, ETP 5 not
    the FFN of 768: one error names all three."""
    with pytest.raises(InputError) as err:
        describe_settings(MOE, tp=3, ep=3, etp=5)
    assert err.value.field == "tp+ep+etp"
    assert err.value.value == [3, 3, 5]
    for part in ("tp=3: must divide q_heads (32)", "ep=3: does not divide", "etp=5: does not"):
        assert part in err.value.reason


def test_the_command_line_refuses_them_on_the_model_door(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["estimate", "--model", MOE, "--lengths", "4096", "--ep", "3"])
    assert code == 2
    assert "cpmem: error: ep=3: does not divide the 128 routed experts" in capsys.readouterr().err


@pytest.mark.parametrize("change", [{"ep": 2}, {"etp": 3}, {"ep": 2, "etp": 3}])
def test_expert_settings_on_a_dense_model_are_named_not_priced(change: dict[str, int]) -> None:
    base = estimate("qwen3-1.7b", [4096], policy="tight")
    est = estimate("qwen3-1.7b", [4096], policy="tight", **change)
    assert (est.estimate_bytes, est.forward_backward_bytes) == (
        base.estimate_bytes,
        base.forward_backward_bytes,
    )
    assert est.static is not None and base.static is not None
    assert est.static.total == base.static.total
    assert set(est.to_dict()["ignored_options"]) == set(change)
