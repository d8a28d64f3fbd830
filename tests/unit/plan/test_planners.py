"""Reference planners: recorded busiest counts, hand-worked layouts, explicit plans."""

from __future__ import annotations

from functools import partial

import pytest
from harness import HARNESS

from cpmem.api import estimate as _estimate
from cpmem.api import load_model
from cpmem.errors import InputError
from cpmem.plan.layout import ParallelLayout
from cpmem.plan.plan import explicit_plan
from cpmem.plan.planners import default_planner, plan_request
from cpmem.plan.request import Request, Segment

# every figure here is recorded for the calibration harness's step (tests/unit/harness.py)
estimate = partial(_estimate, **HARNESS)

HYBRID = load_model("qwen3.5-27b")
DENSE = load_model("qwen3-1.7b")


def test_recorded_shared_gdn_pair():
    # CP file, 27b-selective 4096+4096 sharing 1228: 6,964 packed, 4,096 on the busiest rank.
    plan = plan_request(Request.pair(4096, 4096, 1228), ParallelLayout(cp=2), geometry=HYBRID)
    assert plan.planner == "gdn-segments"
    assert plan.packed_tokens == 6964
    assert plan.busiest_tokens == 4096
    # prefix + one completion on one rank, the other completion on the other
    assert sorted(plan.rank_tokens) == [2868, 1228 + 2868]
    # attention co-located with the GDN owner: attention adds no extra load
    assert plan.groups[0].attention_tokens == plan.groups[0].gdn_tokens


@pytest.mark.parametrize("length", [64, 256, 2048, 4096])
def test_recorded_unshared_gdn_pairs_one_sequence_per_rank(length):
    plan = plan_request(Request.pair(length, length), ParallelLayout(cp=2), geometry=HYBRID)
    assert plan.rank_tokens == (length, length)
    assert plan.busiest_tokens == length


def test_attention_only_defaults_to_the_chunk_planner():
    assert default_planner(DENSE) == "chunked"
    assert default_planner(HYBRID) == "gdn-segments"


def test_attention_work_hand_worked_pair():
    # 1228 prefix + 2 x 2868: the cut at half the causal work falls at token 4003
    # (worked by hand: 1228 + 2775), rounded up to the 128-token block: 4096.
    plan = plan_request(
        Request.pair(4096, 4096, 1228), ParallelLayout(cp=2), "attention-work", DENSE
    )
    assert plan.rank_tokens == (4096, 6964 - 4096)


def test_recorded_runtime_count_is_taken_as_an_explicit_plan():
    # The 1.7B pair's 5,120 busiest tokens, as a runtime that knows its layout passes it
    # (the chunk planner reproduces the count: tests/unit/plan/test_chunked.py).
    plan = explicit_plan(
        ParallelLayout(cp=2),
        logical_tokens=8192,
        packed_tokens=6964,
        busiest_tokens=5120,
        grad_segments=3,
    )
    assert plan.rank_tokens == (5120, 1844)
    assert estimate(DENSE, plan=plan, cp=2).estimate_bytes == 16_618_671_308


def test_balanced_zigzag_pads_each_row():
    # two rows of 1000 and 30 tokens at CP 4: pad to multiples of 8 -> 1000, 32
    plan = plan_request(Request.independent([1000, 30]), ParallelLayout(cp=4), "balanced")
    assert plan.rank_tokens == (258, 258, 258, 258)
    assert plan.padding_tokens == 4 * 258 - 1030


def test_balanced_under_sp_pads_to_tp_multiples():
    plan = plan_request(
        Request.independent([1000]), ParallelLayout(tp=4, cp=2, sp=True), "balanced"
    )
    # multiple of 2*CP*TP = 16 -> 1008; each rank 504 (a multiple of TP)
    assert plan.rank_tokens == (504, 504)


def test_gdn_segments_chain_splits_a_long_sequence():
    plan = plan_request(Request.independent([8192]), ParallelLayout(cp=2), "gdn-segments")
    assert plan.rank_tokens == (4096, 4096)


def test_cp1_is_the_packed_row_rounded_to_tp():
    plan = plan_request(
        Request.pair(4096, 4096, 1228), ParallelLayout(tp=8, sp=True), "gdn-segments"
    )
    assert plan.packed_tokens == 6968  # recorded TP8 packed count
    assert plan.rank_tokens == (6968,)


def test_forest_order_and_segments():
    req = Request((Segment(10, (Segment(5), Segment(7))), Segment(3)))
    assert req.logical_tokens == 15 + 17 + 3
    assert req.real_tokens == 25
    assert req.grad_segments == 4


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        (
            dict(logical_tokens=100, packed_tokens=100, rank_tokens=[40, 40], grad_segments=1),
            "rank_tokens",
        ),
        (
            dict(logical_tokens=100, packed_tokens=100, rank_tokens=[100], grad_segments=1),
            "rank_tokens",
        ),
        (
            dict(logical_tokens=100, packed_tokens=100, busiest_tokens=10, grad_segments=1),
            "busiest_tokens",
        ),
        (dict(logical_tokens=50, packed_tokens=100, grad_segments=1), "packed_tokens"),
        (dict(logical_tokens=0, packed_tokens=100, grad_segments=1), "logical_tokens"),
    ],
)
def test_explicit_plan_errors_name_the_field(kwargs, field):
    with pytest.raises(InputError) as err:
        explicit_plan(ParallelLayout(cp=2), **kwargs)
    assert err.value.field == field
    assert field in str(err.value)


def test_unknown_planner():
    with pytest.raises(InputError, match="planner='zigzag'"):
        plan_request(Request.independent([10]), ParallelLayout(cp=2), "zigzag")
