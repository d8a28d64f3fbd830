"""cpmem's reference planners against the token-by-token ownership oracle.

Every expected count comes from ``oracles.ownership`` (which never imports cpmem)
or from arithmetic written out here; the planners under test only supply the
values being checked.
"""

from __future__ import annotations

import inspect
import textwrap

import pytest
from hypothesis import event, example, given
from hypothesis import strategies as st

from cpmem.plan import planners as planners_module
from cpmem.plan.chunked import ChunkCosts, chunked_loads
from cpmem.plan.layout import ParallelLayout
from cpmem.plan.planners import PLANNERS, plan_request
from cpmem.plan.request import Request
from oracles import ownership

from .strategies import (
    PLAN_MODELS,
    Grid,
    PlanModel,
    Trees,
    grids,
    oracle,
    plan_models,
    real_tokens,
    to_request,
    trees,
)

# Edge cases pinned as examples (each a forest, a grid and a model):
# - a subtree exactly at the gdn-segments target (200 real / CP 2 = 100) that has
#   children: kept whole; a `<` for `<=` would place its root and children apart;
EXACT_TARGET: Trees = ((50, ((25, ()), (25, ()))), (100, ()))
# - segment boundaries exactly on chunk edges (the 1.7B 4k pair: the second completion
#   starts at 4,096, chunk 8's first token);
PAIR_4K: Trees = ((1228, ((2868, ()), (2868, ()))),)
# - a row shorter than CP chunks (436 tokens, one chunk, CP 2: re-cut at 218), and
#   shorter than CP itself (3 tokens at CP 8);
PAIR_256: Trees = ((76, ((180, ()), (180, ()))),)
TINY: Trees = ((3, ()),)
# - one rank left with the minimum, a single chunk (14 chunks over 13 ranks).


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def up(a: int, b: int) -> int:
    return ceil_div(a, b) * b


def test_oracle_and_planners_share_the_planner_names() -> None:
    """A planner the oracle does not simulate would silently escape these properties."""
    assert set(PLANNERS) == set(ownership.PLANNERS)


def _grid(cp: int, tp: int = 1, sp: bool = False) -> Grid:
    return Grid(tp=tp, cp=cp, sp=sp)


@given(forest=trees(), grid=grids(), model=plan_models())
@example(forest=EXACT_TARGET, grid=_grid(2), model=PLAN_MODELS["qwen3.5-27b"])
@example(forest=PAIR_4K, grid=_grid(2), model=PLAN_MODELS["qwen3-1.7b"])
@example(forest=PAIR_4K, grid=_grid(2), model=PLAN_MODELS["qwen3.5-27b"])
@example(forest=PAIR_4K, grid=_grid(13), model=PLAN_MODELS["qwen3-1.7b"])
@example(forest=PAIR_256, grid=_grid(2, 2, True), model=PLAN_MODELS["qwen3-1.7b"])
@example(forest=TINY, grid=_grid(8), model=PLAN_MODELS["qwen3.5-4b"])
def test_plans_equal_the_oracle_rank_by_rank(forest: Trees, grid: Grid, model: PlanModel) -> None:
    """Each planner's per-rank attention and GDN counts are the rule's, token for token."""
    request = to_request(forest)
    event(f"cp={'1' if grid.cp == 1 else '2-4' if grid.cp <= 4 else '5-16'}")
    event(f"trees={'1' if len(forest) == 1 else 'many'}")
    for planner in PLANNERS:
        expected = oracle(planner, forest, grid.cp, grid.tp, grid.sp, model.name)
        plan = plan_request(request, grid.layout, planner, model.geometry)
        (group,) = plan.groups
        assert group.attention_tokens == expected.attention, planner
        assert group.gdn_tokens == expected.gdn, planner
        assert group.real_tokens == expected.real_tokens == real_tokens(forest)


@given(forest=trees(), grid=grids(), model=plan_models())
def test_tokens_are_conserved(forest: Trees, grid: Grid, model: PlanModel) -> None:
    """Per-rank tokens add up to the real tokens plus padding; SP slices are TP multiples."""
    real = real_tokens(forest)
    request = to_request(forest)
    for planner in PLANNERS:
        o = oracle(planner, forest, grid.cp, grid.tp, grid.sp, model.name)
        assert sum(o.real) == real
        assert sum(o.attention) == real + o.padding
        if planner == "chunked" and model.hybrid:
            # GDN tokens: every real token once, each rank's count rounded up under SP
            assert sum(o.gdn) >= real
        plan = plan_request(request, grid.layout, planner, model.geometry)
        (group,) = plan.groups
        assert sum(group.attention_tokens) == real + o.padding, planner
        # priced padding: every rank's count rounded up to TP, minus the real tokens
        ranks = [max(a, g) for a, g in zip(o.attention, o.gdn, strict=True)]
        assert plan.padding_tokens == sum(up(n, grid.tp) for n in ranks) - real
        if grid.sp_active:
            assert all(n % grid.tp == 0 for n in group.attention_tokens), planner
            assert all(n % grid.tp == 0 for n in group.gdn_tokens), planner
            assert plan.packed_tokens == up(real, grid.tp)
        else:
            assert real <= plan.packed_tokens < real + grid.tp
        if planner != "balanced" or grid.cp == 1:
            # only the zigzag pads beyond the SP round-up of each rank
            assert o.padding == sum(up(r, grid.tp) - r for r in o.real) * grid.sp_active


@given(forest=trees(), grid=grids(), model=plan_models())
def test_busiest_rank_bounds(forest: Trees, grid: Grid, model: PlanModel) -> None:
    """Nobody beats the even split; the zigzag misses it by at most its padding."""
    real = real_tokens(forest)
    packed = up(real, grid.tp)
    floor = ceil_div(packed, grid.cp)
    request = to_request(forest)
    for planner in PLANNERS:
        plan = plan_request(request, grid.layout, planner, model.geometry)
        assert plan.busiest_tokens >= floor, planner
        assert plan.busiest_tokens <= packed or planner == "balanced", planner
    balanced = plan_request(request, grid.layout, "balanced")
    padding = balanced.padding_tokens
    event(f"balanced padding {'0' if padding == 0 else '>0'}")
    assert balanced.busiest_tokens <= floor + padding
    # and the zigzag really is even: every rank holds the same count
    o = ownership.simulate("balanced", forest, grid.cp, grid.tp, grid.sp)
    assert len(set(o.attention)) == 1


@given(forest=trees(), tp=st.integers(1, 8), sp=st.booleans())
def test_cp1_gives_the_one_rank_everything(forest: Trees, tp: int, sp: bool) -> None:
    """CP = 1: the single rank holds all real tokens (a TP multiple under SP), any planner."""
    real = real_tokens(forest)
    expected = up(real, tp) if sp and tp > 1 else real
    for planner in PLANNERS:
        o = oracle(planner, forest, 1, tp, sp)
        assert o.attention == o.gdn == (expected,)
        plan = plan_request(
            to_request(forest),
            ParallelLayout(tp=tp, cp=1, sp=sp),
            planner,
            PLAN_MODELS["qwen3-1.7b"].geometry,
        )
        assert plan.groups[0].attention_tokens == (expected,)


# Published figures (docs/pricing.md, "Layout"): the oracle must reproduce them,
# or it is simulating some other rule.


def test_oracle_reproduces_the_27b_4k_pair() -> None:
    """GDN segments, CP2, 4096+4096 sharing 1,228: one rank holds 1,228 + 2,868 = 4,096."""
    pair = ((1228, ((2868, ()), (2868, ()))),)
    o = ownership.simulate("gdn-segments", pair, cp=2)
    assert o.real_tokens == 6964
    assert sorted(o.gdn) == [2868, 4096]
    plan = plan_request(Request.pair(4096, 4096, 1228), ParallelLayout(cp=2), "gdn-segments")
    assert plan.busiest_tokens == 4096


def test_attention_work_cut_by_hand() -> None:
    """The 4096+4096 pair (1,228 shared), CP2, worked with closed-form causal work.

    Prefix work 1228·1229/2; a suffix token i (1-based) attends 1228 + i keys. The cut
    is the first token where cumulative work reaches half the total, rounded up to 128.
    """
    prefix, suffix = 1228, 2868
    prefix_work = prefix * (prefix + 1) // 2
    suffix_work = suffix * prefix + suffix * (suffix + 1) // 2
    total = prefix_work + 2 * suffix_work
    i = next(
        i
        for i in range(1, suffix + 1)
        if 2 * (prefix_work + i * prefix + i * (i + 1) // 2) >= total
    )
    cut = -(-(prefix + i) // 128) * 128
    assert (prefix + i, cut) == (4003, 4096)
    pair = ((prefix, ((suffix, ()), (suffix, ()))),)
    assert ownership.simulate("attention-work", pair, cp=2).attention == (cut, 6964 - cut)
    plan = plan_request(Request.pair(4096, 4096, 1228), ParallelLayout(cp=2), "attention-work")
    assert plan.groups[0].attention_tokens == (cut, 6964 - cut)


def test_oracle_reproduces_the_1_7b_attention_pair() -> None:
    """The default attention-only planner (chunks), CP2, the same pair: the runtime put
    5,120 of 6,964 on one rank (golden cp:attention-selective:4096+4096, retained 5,120)."""
    o = oracle("chunked", PAIR_4K, 2)
    assert o.attention == (5120, 1844)
    assert max(o.attention) == 5120
    plan = plan_request(
        Request.pair(4096, 4096, 1228),
        ParallelLayout(cp=2),
        geometry=PLAN_MODELS["qwen3-1.7b"].geometry,
    )
    assert plan.planner == "chunked"
    assert plan.busiest_tokens == 5120


def test_zigzag_by_hand() -> None:
    """10 tokens, CP2: padded to 12, chunks of 3; ranks take chunks {0,3} and {1,2}."""
    o = ownership.simulate("balanced", ((10, ()),), cp=2)
    assert o.attention == (6, 6)
    assert o.real == (4, 6)  # rank 0: tokens 1-3 and 10, then the two padding tokens
    assert o.padding == 2


@pytest.mark.parametrize("planner", ownership.PLANNERS)
def test_oracle_rejects_bad_input(planner: str) -> None:
    """The oracle must fail loudly on input no planner could take."""
    costs = PLAN_MODELS["qwen3-1.7b"].costs
    with pytest.raises(ValueError):
        ownership.simulate(planner, ((0, ()),), cp=2, costs=costs)
    with pytest.raises(ValueError):
        ownership.simulate(planner, (), cp=2, costs=costs)


def test_oracle_chunked_needs_costs() -> None:
    with pytest.raises(ValueError, match="costs"):
        ownership.simulate("chunked", PAIR_4K, cp=2)


@st.composite
def chunk_costs(draw: st.DrawFn) -> ownership.Costs:
    """Any constants: each term from negligible to dominant."""
    return ownership.Costs(
        owned=draw(st.integers(0, 10**10)),
        pair=draw(st.integers(0, 10**6)),
        stage=draw(st.integers(0, 10**13)),
        fetch=draw(st.integers(0, 10**9)),
    )


@given(forest=trees(), cp=st.integers(2, 16), costs=chunk_costs(), hybrid=st.booleans())
@example(forest=PAIR_4K, cp=2, costs=PLAN_MODELS["qwen3-1.7b"].costs, hybrid=False)
@example(forest=PAIR_4K, cp=13, costs=PLAN_MODELS["qwen3-1.7b"].costs, hybrid=True)
@example(forest=PAIR_256, cp=2, costs=PLAN_MODELS["qwen3-1.7b"].costs, hybrid=False)
@example(forest=TINY, cp=8, costs=PLAN_MODELS["qwen3.5-27b"].costs, hybrid=True)
@example(
    forest=((512, ((512, ()), (512, ()))),), cp=2, costs=ownership.Costs(1, 0, 0, 0), hybrid=True
)
def test_chunked_equals_the_oracle_for_any_costs(
    forest: Trees, cp: int, costs: ownership.Costs, hybrid: bool
) -> None:
    """The chunk planner's (attention, GDN) counts are the oracle's for any constants;
    one contiguous range per rank, no rank emptied while the row has enough chunks."""
    got = chunked_loads(to_request(forest), cp, ChunkCosts(*costs), hybrid)
    o = ownership.simulate("chunked", forest, cp, costs=costs, hybrid=hybrid)
    assert tuple(got[0]) == o.attention
    assert tuple(got[1]) == o.gdn
    real = real_tokens(forest)
    assert sum(o.attention) == real
    if real >= cp:
        assert min(o.attention) > 0
    event(f"chunks {'< CP' if -(-real // 512) < cp else '>= CP'}")


def _mutated_gdn_segments() -> object:
    """gdn-segments with the whole-subtree test `subtree_tokens <= target` made `<`."""
    source = textwrap.dedent(inspect.getsource(planners_module._gdn_segments))
    original = "if seg.subtree_tokens <= target:"
    assert source.count(original) == 1  # the mutation site exists, exactly once
    namespace = dict(vars(planners_module))
    exec(source.replace(original, "if seg.subtree_tokens < target:"), namespace)
    return namespace["_gdn_segments"]


def test_the_properties_kill_the_gdn_segments_comparison_mutant(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`<=` -> `<` in gdn-segments' whole-subtree placement changes one pinned plan and
    no other test's: the rank-by-rank property (its pinned example) must fail against it."""
    forest, layout = EXACT_TARGET, ParallelLayout(cp=2)
    assert plan_request(to_request(forest), layout, "gdn-segments").rank_tokens == (100, 100)
    monkeypatch.setitem(planners_module._RANK_LOADS, "gdn-segments", _mutated_gdn_segments())
    assert plan_request(to_request(forest), layout, "gdn-segments").rank_tokens == (150, 50)
    with pytest.raises(AssertionError):
        test_plans_equal_the_oracle_rank_by_rank()
