"""The rows a rank's experts receive (``cpmem.step.routing``), stated as an expectation or
a bound, from either door.

Expected values are hand counts of megatron-core 0.16's routing: the balanced
expectation (every expert ``tokens x top-k / E`` copies), ``get_capacity``
(``ceil(tokens x top-k / E x F)`` per expert and source rank, ``moe_utils.py``), the
padded dispatcher's ``capacity x tp_size x ep_size`` rows per local expert
(``token_dispatcher.py``), and the rank simulator's ``expert_rows``
(oracles/rank_sim/moe.py) for the balanced and concentrated counts.
"""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from cpmem.api import estimate
from cpmem.errors import InputError
from cpmem.megatron.args import parse_megatron_args
from cpmem.model.presets import get_preset
from cpmem.step.routing import check_routing, rows_per_token
from tests.unit.megatron_lm.test_args import REQUIRED
from tests.unit.megatron_lm.tiny import step_of, tiny

QWEN3_MOE = get_preset("qwen3-30b-a3b")  # 128 experts, top-8
GPT_OSS = get_preset("gpt-oss-20b")  # 32 experts, top-4


@pytest.mark.parametrize(
    ("given", "canonical"),
    [
        ("worst", "concentrated"),
        ("concentrated", "concentrated"),
        ("balanced", "balanced"),
        ("capacity:1.25", "capacity:1.25"),
        ("capacity:1.0:pad", "capacity:1:pad"),
        ("rows:4096", "rows:4096"),
    ],
)
def test_each_form_reads(given: str, canonical: str) -> None:
    assert check_routing(given) == canonical


@pytest.mark.parametrize(
    "bad", ["capacity", "capacity:0", "capacity:-1", "capacity:x", "rows:0", "rows:1.5", "even"]
)
def test_a_bad_routing_is_refused_naming_the_field(bad: str) -> None:
    with pytest.raises(InputError, match="moe_routing"):
        check_routing(bad)


def test_balanced_is_the_expectation_the_simulator_routes() -> None:
    """gpt-oss at TP1 EP8: the EP group routes 8 ranks' tokens, 4 copies each, over 32
    experts; the rank's 4 experts receive 8 x T x 4 / 32 x 4 = 4T rows (the simulator's
    ``expert_rows``: ceil(copies / E) x E / EP). The old ``ceil(k / EP) x EP`` was 8T."""
    t = 4096
    assert rows_per_token(GPT_OSS, 8, "balanced", tp=1) * t == 4 * t
    simulator = -(-(t * 8 * 4) // 32) * (32 // 8)
    assert rows_per_token(GPT_OSS, 8, "balanced", tp=1) * t == simulator
    # the worst case: every copy on this rank's experts, one per token and local expert
    assert rows_per_token(GPT_OSS, 8, "concentrated", tp=1) == 4 * 8


def test_a_capacity_is_megatrons_per_expert_bound() -> None:
    """Qwen3-MoE at TP2 EP4 SP, 4,096 tokens: the group routes 2 TP groups' tokens
    (8,192), each of the 4 sources 2,048 router tokens; a factor of 1.25 keeps
    ceil(2,048 x 8 x 1.25 / 128) = 160 copies per expert and source; the rank's 32
    experts receive 4 x 160 each: 20,480 rows, below the worst case (8 x 2 x 4,096)."""
    t = 4096
    per_source = math.ceil(2048 * 8 * 1.25 / 128)
    rows = 32 * 4 * per_source
    got = rows_per_token(QWEN3_MOE, 4, "capacity:1.25", tp=2, tokens=t)
    assert got == Fraction(rows, t)
    assert rows < 8 * 2 * t
    # a factor above what the worst case reaches caps at the worst case when dropping,
    # and holds the padded count when padding
    assert rows_per_token(QWEN3_MOE, 4, "capacity:100", tp=2, tokens=t) == 16
    padded = rows_per_token(QWEN3_MOE, 4, "capacity:100:pad", tp=2, tokens=t)
    assert padded == Fraction(32 * 4 * math.ceil(2048 * 8 * 100 / 128), t) > 16


def test_at_ep_below_tp_a_rank_routes_only_its_sequence_shard() -> None:
    """Qwen3-MoE at TP2 SP EP1 (ETP 1, ART's runtime), 4,096 tokens on the CP rank: each
    TP rank routes its 2,048-token shard to its own 128 experts, 8 copies each: 16,384
    rows, 4 per token of the CP rank (the simulator's ``expert_rows``: 2,048 x 1 x
    min(8, 128)). Without SP every TP rank routes all 4,096 tokens: 8 per token."""
    t = 4096
    simulator = (t // 2) * 1 * min(8, 128 // 1)
    assert rows_per_token(QWEN3_MOE, 1, "concentrated", tp=2) * t == simulator
    assert rows_per_token(QWEN3_MOE, 1, "balanced", tp=2) * t == simulator  # EP 1: alike
    assert rows_per_token(QWEN3_MOE, 1, "concentrated", tp=2, sp=False) == 8
    # EP 2 < TP 4: two shards of 1,024 tokens reach a rank's 64 experts
    assert rows_per_token(QWEN3_MOE, 2, "concentrated", tp=4) * t == (t // 4) * 2 * 8


def test_expert_tensor_parallelism_gathers_the_etp_groups_rows() -> None:
    """megatron-core 0.16 ``MoEAlltoAllTokenDispatcher``: the all-to-all over EP, then an
    all-gather over the ETP group (``dispatch_postprocess``); the allgather dispatcher
    gathers over ETP x EP at once. Each rank's experts receive the copies of ETP x EP
    shards of T/TP tokens: Qwen3-MoE at TP2 ETP2 EP2 (Megatron-LM's ETP = TP default),
    4,096 tokens: 2 x 2 shards of 2,048, min(8, 64) copies each = 32,768 rows, 8 per
    token; balanced 2 x 2 x 2,048 x 8 / 128 x 64 = 16,384, 4 per token. The padded
    capacity is ``capacity x tp_size x ep_size`` per local expert (``preprocess``)."""
    t = 4096
    worst = rows_per_token(QWEN3_MOE, 2, "concentrated", tp=2, etp=2)
    assert worst * t == 2 * 2 * 2048 * 8
    assert rows_per_token(QWEN3_MOE, 2, "balanced", tp=2, etp=2) * t == 2 * 2 * 2048 * 8 // 2
    capacity = math.ceil(2048 * 8 / 128 * 1.5)  # get_capacity on one source's 2,048 tokens
    padded = rows_per_token(QWEN3_MOE, 2, "capacity:1.5:pad", tp=2, etp=2, tokens=t)
    assert padded * t == 64 * capacity * 2 * 2


def test_rows_are_the_count_given() -> None:
    assert rows_per_token(QWEN3_MOE, 4, "rows:12000", tp=2, tokens=4096) == Fraction(12000, 4096)


def test_the_estimate_names_its_routing_and_prices_the_others_beside_it() -> None:
    """``routing_figures``: the step's figure under the worst case, the expectation, a
    capacity (the stated one, else factor 1) and stated rows; the step's own is its
    figure; the expectation is below the bound."""
    common = {"tp": 2, "ep": 4, "policy": "tight"}
    worst = estimate("qwen3-30b-a3b", [4096], **common).to_dict()
    assert worst["moe_routing"] == "concentrated" and worst["routing_bound"].startswith("bound")
    figures = worst["routing_figures"]
    assert figures["concentrated"] == worst["estimate_bytes"]
    assert figures["balanced"] < figures["concentrated"] and worst["capacity_factor"] == 1.0
    stated = estimate("qwen3-30b-a3b", [4096], moe_routing="capacity:1.25", **common).to_dict()
    assert stated["routing_figures"]["capacity"] == stated["estimate_bytes"]
    assert stated["capacity_factor"] == 1.25
    assert figures["balanced"] < stated["estimate_bytes"] < figures["concentrated"]
    balanced = estimate("qwen3-30b-a3b", [4096], moe_routing="balanced", **common).to_dict()
    assert balanced["routing_bound"] == "expectation"
    # a policy that prices no routing gives no figures under others
    published = estimate("qwen3-30b-a3b", [4096], tp=2, ep=4, policy="reference").to_dict()
    assert "routing_figures" not in published


MOE_ARGS = {
    "num_experts": 8,
    "expert_model_parallel_size": 2,
    "tensor_model_parallel_size": 2,
    "sequence_parallel": True,
    "moe_router_topk": 2,
    "add_bias_linear": False,
}


def test_megatron_lm_reads_its_capacity_arguments() -> None:
    """--moe-expert-capacity-factor F is a capacity bound, padded with
    --moe-pad-expert-input-to-capacity; without it the worst case; a negative factor is
    none (transformer_config.py)."""
    assert step_of(tiny(**MOE_ARGS)).moe_routing == "concentrated"
    capped = step_of(tiny(**MOE_ARGS, moe_expert_capacity_factor=1.5))
    assert capped.moe_routing == "capacity:1.5"
    padded = tiny(**MOE_ARGS, moe_expert_capacity_factor=1.5, moe_pad_expert_input_to_capacity=True)
    assert step_of(padded).moe_routing == "capacity:1.5:pad"
    assert step_of(tiny(**MOE_ARGS, moe_expert_capacity_factor=-1.0)).moe_routing == "concentrated"


def test_megatron_lm_refuses_padding_without_a_capacity() -> None:
    with pytest.raises(InputError, match="moe_expert_capacity_factor must be set"):
        step_of(tiny(**MOE_ARGS, moe_pad_expert_input_to_capacity=True))


def test_the_capacity_flags_parse_and_the_drop_policy_is_named_ignored() -> None:
    args = parse_megatron_args(
        {
            **REQUIRED,
            "--num-experts": 4,
            "--moe-expert-capacity-factor": 1.25,
            "--moe-pad-expert-input-to-capacity": True,
            "--moe-token-drop-policy": "position",
        }
    )
    assert args.moe_expert_capacity_factor == 1.25 and args.moe_pad_expert_input_to_capacity
    assert "--moe-token-drop-policy" in args.ignored


def test_forced_load_balancing_is_the_balanced_expectation() -> None:
    """--moe-router-force-load-balancing replaces the router's logits by independent
    standard normal draws (megatron-core d98e8a64 router.py:861-863; moe_utils.py:1278,
    ``logits.clone().normal_()``): every token's top-k is a uniformly random set of the E
    experts, so each expert expects ``tokens x top-k / E`` rows, ``balanced``. A stated
    capacity is still the hard bound."""
    forced = {**MOE_ARGS, "moe_router_force_load_balancing": True}
    assert step_of(tiny(**forced)).moe_routing == "balanced"
    capped = step_of(tiny(**forced, moe_expert_capacity_factor=1.5))
    assert capped.moe_routing == "capacity:1.5"
    args = parse_megatron_args(
        {**REQUIRED, "--num-experts": 4, "--moe-router-force-load-balancing": True}
    )
    assert (
        args.moe_router_force_load_balancing
        and "--moe-router-force-load-balancing" not in args.ignored
    )
