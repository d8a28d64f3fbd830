"""Admission: budget arithmetic, fit / split / refuse, width selection, agreement."""

from __future__ import annotations

import math
from functools import partial

import pytest
from harness import HARNESS

from cpmem.admission.admission import admit as _admit
from cpmem.admission.admission import admit_step, split_request, usable_budget
from cpmem.admission.comm import LocalCommunicator, collective_plan
from cpmem.admission.width import select_width
from cpmem.api import describe_step as _describe_step
from cpmem.api import estimate as _estimate
from cpmem.api import load_model
from cpmem.errors import InputError, PlanningError
from cpmem.plan.layout import ParallelLayout
from cpmem.plan.plan import explicit_plan
from cpmem.plan.request import Request
from cpmem.step.recompute import Recompute

# every figure here is recorded for the calibration harness's step (tests/unit/harness.py)
admit = partial(_admit, **HARNESS)
describe_step = partial(_describe_step, **HARNESS)
estimate = partial(_estimate, **HARNESS)

GIB = 1 << 30
M27 = load_model("qwen3.5-27b")
M4 = load_model("qwen3.5-4b")
PAIR = Request.pair(4096, 4096, 1228)


def test_usable_budget_formula():
    # free + reusable reserved - 3% of device memory
    assert usable_budget(100, 20, 1000) == 90
    for bad in (math.nan, -1.0, math.inf):
        with pytest.raises(InputError):
            usable_budget(bad, 0, 10)


def test_27b_pair_fits_busiest_rank_and_is_refused_globally():
    ok = admit(M27, request=PAIR, budget_bytes=81.868 * GIB, cp=2)
    assert ok.action == "fit" and ok.variant == "cost-optimal"
    assert ok.required_bytes == 74_651_231_846
    no = admit(M27, request=PAIR, budget_bytes=81.868 * GIB, cp=2, policy="global")
    assert no.action == "refuse"
    assert no.required_bytes == 126_029_345_587
    assert no.suggestion


def test_memory_minimal_plan_used_when_cost_optimal_does_not_fit():
    cost_optimal = estimate(M27, request=PAIR, cp=2).estimate_bytes
    balanced = estimate(M27, request=PAIR, cp=2, planner="balanced").estimate_bytes
    assert balanced < cost_optimal
    d = admit(M27, request=PAIR, budget_bytes=(balanced + cost_optimal) // 2, cp=2)
    assert d.action == "fit" and d.variant == "memory-minimal:balanced"


def test_split_ladder():
    four = Request.independent([8192] * 4)
    whole = estimate(M4, request=four).estimate_bytes
    one = estimate(M4, [8192])
    # a 2-way split keeps both parts' retained bytes but one part's workspace
    retained = one.components["retained_activations"] + one.components["segment_states"]
    two = estimate(M4, [8192, 8192])
    two_retained = two.components["retained_activations"] + two.components["segment_states"]
    split2 = 2 * two_retained + (two.estimate_bytes - two_retained)
    assert split2 < whole
    d = admit(M4, request=four, budget_bytes=(split2 + whole) // 2)
    assert d.action == "split" and d.parts == 2 and d.required_bytes == split2
    assert retained > 0


def test_refusal_carries_peak_limit_and_suggestion():
    d = admit(M27, request=Request.independent([32768]), budget_bytes=10 * GIB)
    assert d.action == "refuse"
    assert d.required_bytes > d.available_bytes == 10 * GIB
    assert "shorten" in d.suggestion or "cp=" in d.suggestion or "recompute" in d.suggestion


def test_split_request_shares_prefix_per_part():
    parts = split_request(Request.shared([100, 100, 100, 100], 40), 2)
    assert [p.sequence_lengths for p in parts] == [[100, 100], [100, 100]]
    assert all(p.real_tokens == 40 + 60 + 60 for p in parts)
    assert split_request(Request.independent([5]), 2) is None


def test_admit_plan_uneven_layout():
    plan = explicit_plan(
        ParallelLayout(cp=2),
        logical_tokens=8192,
        packed_tokens=6964,
        rank_tokens=[4096, 2868],
        grad_segments=3,
    )
    step = describe_step(M27, plan=plan, cp=2)
    assert admit_step(step, 70 * GIB).action == "fit"
    assert admit_step(step, 69 * GIB).action == "refuse"


def _linear_width(queue, layout, budget):
    """Brute force: the largest n whose exact plan fits (monotone cost assumed)."""
    best = 0
    for n in range(1, len(queue) + 1):
        req = Request(tuple(t for r in queue[:n] for t in r.trees))
        if estimate(M4, request=req, cp=layout.cp).estimate_bytes <= budget:
            best = n
    return best


@pytest.mark.parametrize("cp", [1, 2, 4])
@pytest.mark.parametrize("budget_gib", [3, 11, 40])
def test_width_selection_matches_linear_scan(cp, budget_gib):
    queue = [Request.pair(1000 + 37 * i, 900 + 11 * i, 100) for i in range(24)]
    layout = ParallelLayout(cp=cp)
    got = select_width(M4, queue, budget_gib * GIB, cp=cp, **HARNESS)
    assert got.count == _linear_width(queue, layout, budget_gib * GIB)


def test_collective_plan_local():
    assert collective_plan(LocalCommunicator(), lambda: 7) == 7

    def boom() -> int:
        raise InputError("lengths", [], "bad")

    with pytest.raises(InputError):
        collective_plan(LocalCommunicator(), boom)


class _PeerFailed(LocalCommunicator):
    """Rank 0 of a 2-rank group whose rank 1 failed planning."""

    size = 2

    def gather_errors(self, error):
        return [error, "PlanningError: out of tokens"]


def test_peer_failure_raises_naming_the_rank():
    with pytest.raises(PlanningError, match="rank 1") as err:
        collective_plan(_PeerFailed(), lambda: 1)
    assert err.value.failed_rank == 1


class _PeerNeedsMore(LocalCommunicator):
    """Rank 0 of a 2-rank group whose rank 1 reports ``peer[v]`` where this rank's
    required bytes are ``v`` (the same where ``peer`` has no entry); the same budget."""

    size = 2

    def __init__(self, peer: dict[int, int]) -> None:
        self.peer = peer

    def max_int(self, value: int) -> int:
        return max(value, self.peer.get(value, value))

    def gather_errors(self, error):
        return [error, None]


def test_refusal_reports_the_groups_agreed_requirement():
    """docs/admission.md: every rank reports the same required bytes, the group's MAX. A
    peer that needs more for this rank's least-demanding variant makes another variant
    the least-demanding one; the refusal names that variant, its agreed bytes and this
    rank's estimate of it."""
    local = admit(M27, request=PAIR, budget_bytes=10 * GIB, cp=2)
    assert local.action == "refuse"
    mine = {v: b for v, b in local.considered if not v.startswith("split-")}
    least, runner_up = sorted(mine, key=mine.__getitem__)[:2]
    assert local.variant == least and local.required_bytes == mine[least]
    more = mine[runner_up] + GIB  # the peer's requirement for this rank's least variant
    d = admit(
        M27, request=PAIR, budget_bytes=10 * GIB, cp=2, comm=_PeerNeedsMore({mine[least]: more})
    )
    assert d.action == "refuse"
    assert dict(d.considered)[least] == more
    assert (d.variant, d.required_bytes) == (runner_up, mine[runner_up])
    assert d.estimate.estimate_bytes == mine[runner_up]
    assert d.planner_of(d.variant) == local.planner_of(runner_up)


def test_full_and_no_grad_keep_global_pricing_under_cp():
    for mode in ("full", "no-grad"):
        cp2 = estimate(M27, request=PAIR, cp=2, recompute=Recompute(mode, ()))
        glob = estimate(M27, request=PAIR, cp=2, recompute=Recompute(mode, ()), policy="global")
        assert cp2.estimate_bytes == glob.estimate_bytes
        assert cp2.busiest_tokens == 6964
    sel = estimate(M27, request=PAIR, cp=2).estimate_bytes
    full = estimate(M27, request=PAIR, cp=2, recompute="full").estimate_bytes
    nograd = estimate(M27, request=PAIR, cp=2, recompute="no-grad").estimate_bytes
    assert nograd < full < estimate(M27, request=PAIR, cp=2, policy="global").estimate_bytes
    assert sel > 0


def test_usable_budget_never_negative():
    # 1 GB free on an 80 GB device: 3% reserve exceeds it; nothing is usable.
    assert usable_budget(1e9, 0, 80e9) == 0


def test_bad_budget_raises_inside_the_collective():
    """A bad budget on this rank reaches the others (through gather_errors) instead of
    raising before the first collective and leaving them waiting."""
    seen: list[str | None] = []

    class Recording(LocalCommunicator):
        def gather_errors(self, error):
            seen.append(error)
            return [error]

    for call in (
        lambda c: admit(M4, request=Request.independent([64]), budget_bytes=-1, comm=c),
        lambda c: admit_step(
            describe_step(
                M4,
                plan=explicit_plan(
                    ParallelLayout(), logical_tokens=64, packed_tokens=64, grad_segments=1
                ),
            ),
            math.nan,
            comm=c,
        ),
        lambda c: select_width(M4, [Request.independent([64])], -5, comm=c),
    ):
        seen.clear()
        with pytest.raises(InputError, match="budget_bytes"):
            call(Recording())
        assert seen and seen[0] is not None and "budget_bytes" in seen[0]


def test_explicit_plan_accepts_the_balanced_planners_padding():
    # 64 one-token rows at CP 16: each row pads to 32, so every rank holds 128 > packed 64.
    from cpmem.plan.planners import plan_request

    planned = plan_request(Request.independent([1] * 64), ParallelLayout(cp=16), "balanced")
    assert planned.rank_tokens == (128,) * 16
    again = explicit_plan(
        ParallelLayout(cp=16),
        logical_tokens=64,
        packed_tokens=64,
        grad_segments=64,
        rank_tokens=list(planned.rank_tokens),
    )
    assert again.rank_tokens == planned.rank_tokens


def test_memory_minimal_alternatives_are_layouts_a_runtime_executes():
    """Only the measured runtime's chunks and Megatron's zigzag are offered as
    alternatives (never attention-work or gdn-segments, rules only cpmem applies), and
    every considered variant names the planner its layout assumes."""
    d = admit(M27, request=PAIR, budget_bytes=10 * GIB, cp=2)
    assert d.action != "fit"
    variants = [v for v, _ in d.considered]
    assert variants[:3] == ["cost-optimal", "memory-minimal:chunked", "memory-minimal:balanced"]
    assert d.planner_of("cost-optimal") == "gdn-segments"  # the hybrid default
    assert d.planner_of("memory-minimal:chunked") == "chunked"
    assert d.planner_of("memory-minimal:balanced") == "balanced"
    assert all(c["planner"] for c in d.to_dict()["considered"])  # type: ignore[union-attr]
    assert not any("attention-work" in v or "gdn-segments" in v for v in variants)


def test_attention_only_cost_optimal_is_the_chunk_layout_and_not_offered_twice():
    dense = load_model("qwen3-1.7b")
    d = admit(dense, request=PAIR, budget_bytes=100 * GIB, cp=2)
    assert (d.action, d.variant, d.planner_of(d.variant)) == ("fit", "cost-optimal", "chunked")
    assert d.estimate.busiest_tokens == 5120
    assert [v for v, _ in d.considered] == ["cost-optimal", "memory-minimal:balanced"]


def test_split_under_a_policy_with_other_component_names():
    """Splitting reads what each part keeps until backward from the estimate
    (``retained_bytes``), not from one policy's component names: under ``tight`` a
    split is priced and chosen when only it fits."""
    geometry = load_model("qwen3-1.7b")
    request = Request.independent([4096] * 8)
    probe = admit(geometry, request=request, budget_bytes=0, policy="tight")
    considered = dict(probe.considered)
    whole, halves = considered["cost-optimal"], considered["split-2"]
    assert halves < whole  # one part's workspace at a time, every part's activations
    decision = admit(geometry, request=request, budget_bytes=(halves + whole) // 2, policy="tight")
    assert decision.action == "split" and decision.parts == 2
    assert decision.estimate.retained_bytes is not None
    assert 0 < decision.estimate.retained_bytes < decision.estimate.estimate_bytes
