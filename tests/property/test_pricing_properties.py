"""Properties of the reference pricing and of CP admission.

Expected figures come from the ownership oracle and from the published formula of
docs/pricing.md, written out below with its published TP1 check values (features,
segment-state bytes), never from cpmem's own pricing. Relations between two cpmem
estimates (monotonicity, order-freedom, bounds) need no expected figure at all.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial

import pytest
from hypothesis import assume, event, given
from hypothesis import strategies as st

from cpmem.admission.admission import Decision, admit_step, usable_budget
from cpmem.admission.admission import admit as _admit
from cpmem.calibration.variant import average_tokens, unpadded_tokens
from cpmem.errors import InputError
from cpmem.model.geometry import ModelGeometry
from cpmem.model.presets import PRESETS, get_preset
from cpmem.plan.layout import ParallelLayout
from cpmem.plan.plan import Plan, explicit_plan
from cpmem.plan.planners import PLANNERS, plan_request
from cpmem.plan.request import Request
from cpmem.pricing.reference import REFERENCE, ReferenceStructure, layer_widths, price_reference
from cpmem.pricing.registry import price
from cpmem.step.describe import describe_step as _describe_step
from cpmem.step.recompute import Recompute
from cpmem.step.step import Step
from oracles import ownership
from tests.unit.harness import HARNESS

from .strategies import (
    Grid,
    Tree,
    Trees,
    oracle,
    oracle_for,
    real_tokens,
    segment_count,
    sequence_lengths,
    to_request,
    trees,
    valid_tps,
)

# the reference's published formula and the oracle's layouts are the calibration
# harness's step (tests/unit/harness.py): every figure here is priced for it
admit = partial(_admit, **HARNESS)
describe_step = partial(_describe_step, **HARNESS)

MIB = 2**20


@dataclass(frozen=True)
class Published:
    """A dense model's TP1 figures as docs/pricing.md and the geometry table state them."""

    hidden: int
    layers: int
    gdn_layers: int
    features: int  # "Check values (TP1)"
    segment_bytes: int  # per gradient segment and GDN layer, TP1


PUBLISHED = {
    "qwen3.5-27b": Published(5120, 64, 48, 8_142_848, 6_414_336),
    "qwen3.5-4b": Published(2560, 32, 24, 2_449_408, 4_292_608),
    "qwen3-1.7b": Published(2048, 28, 0, 1_462_272, 0),
}
DENSE = tuple(PUBLISHED)


def published_estimate(
    model: str, *, retained: int, packed: int, logical: int, segments: int, cp: int
) -> int:
    """docs/pricing.md, "The estimate", at TP1 with selective(core_attn) recompute."""
    p = PUBLISHED[model]
    b = 2
    outputs = logical * p.hidden * b
    floor = 64 * MIB + segments * p.gdn_layers * p.segment_bytes + retained * b * p.features
    static = packed * p.hidden * b * min(max(p.layers // 4 + 4, 4), 16)
    compute = max(floor, static) + (outputs if cp > 1 else 0)
    return int((outputs + compute) * 1.10)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def up(a: int, b: int) -> int:
    return ceil_div(a, b) * b


def step_of(geometry: ModelGeometry, plan: Plan, rc: Recompute | None = None) -> Step:
    """``plan`` as a step, at the plan's own layout."""
    layout = plan.layout
    return describe_step(
        geometry,
        plan=plan,
        tp=layout.tp,
        cp=layout.cp,
        sp=layout.sp,
        ep=layout.ep,
        recompute=rc or Recompute(),
    )


def cost(
    geometry: ModelGeometry, plan: Plan, policy: str = "reference", rc: Recompute | None = None
) -> int:
    return price(step_of(geometry, plan, rc), policy).estimate_bytes


def cost_terms(
    geometry: ModelGeometry, plan: Plan, terms: ReferenceStructure, rc: Recompute | None = None
) -> int:
    return price_reference(step_of(geometry, plan, rc), terms, "variant").estimate_bytes


def admit_plan(
    geometry: ModelGeometry, plan: Plan, budget: int, policy: str = "reference"
) -> Decision:
    """Admission of a plan the runtime fixed (fit or refuse as it stands)."""
    return admit_step(step_of(geometry, plan), budget, policy=policy)


RECOMPUTES = (
    Recompute(),
    Recompute("selective", ("core_attn", "mlp")),
    Recompute("none", ()),
    Recompute("full", ()),
    Recompute("no-grad", ()),
)


def _reference_prices(name: str) -> bool:
    """Whether ART's published formula has a width for every layer kind of the preset
    (it refuses a Mamba-2 mixer, which it never priced: ``cpmem.pricing.kinds``)."""
    try:
        layer_widths(PRESETS[name], ParallelLayout())
    except InputError:
        return False
    return True


REFERENCE_PRESETS = tuple(name for name in PRESETS if _reference_prices(name))
"""The presets the properties below range over: every policy they compare prices them."""


@st.composite
def model_grids(
    draw: st.DrawFn, models: tuple[str, ...] = REFERENCE_PRESETS
) -> tuple[ModelGeometry, Grid]:
    geometry = get_preset(draw(st.sampled_from(models)))
    tp = draw(st.sampled_from(valid_tps(geometry)))
    return geometry, Grid(tp=tp, cp=draw(st.integers(1, 16)), sp=draw(st.booleans()))


def lengthen(forest: Trees, index: int, extra: int) -> Trees:
    """The same forest with pre-order segment ``index`` ``extra`` tokens longer."""
    counter = [0]

    def walk(tree: Tree) -> Tree:
        mine = counter[0]
        counter[0] += 1
        tokens, children = tree
        return (tokens + extra if mine == index else tokens, tuple(walk(c) for c in children))

    return tuple(walk(t) for t in forest)


def mirrored(forest: Trees) -> Trees:
    """Every tree's children in reverse order (the packed row reordered, nothing else)."""
    return tuple((t[0], mirrored(t[1])) for t in forest)


def test_published_formula_matches_the_worked_example() -> None:
    """The helper itself: docs/pricing.md's 27B CP2 4k pair is 74,651,231,846 bytes."""
    got = published_estimate(
        "qwen3.5-27b", retained=4096, packed=6964, logical=8192, segments=3, cp=2
    )
    assert got == 74_651_231_846
    old = published_estimate(
        "qwen3.5-27b", retained=6964, packed=6964, logical=8192, segments=3, cp=2
    )
    assert round(old / 2**30, 3) == 117.374


@given(forest=trees(), model=st.sampled_from(DENSE), cp=st.integers(1, 16), data=st.data())
def test_reference_at_tp1_is_the_published_formula_on_the_oracle_layout(
    forest: Trees, model: str, cp: int, data: st.DataObject
) -> None:
    """Busiest-rank pricing = the published formula with R = the oracle's busiest rank."""
    planner = data.draw(st.sampled_from(PLANNERS))
    geometry = get_preset(model)
    real = real_tokens(forest)
    plan = plan_request(to_request(forest), ParallelLayout(cp=cp), planner, geometry)
    retained = oracle(planner, forest, cp, model=model).busiest if cp > 1 else real
    common = {
        "packed": real,
        "logical": sum(sequence_lengths(forest)),
        "segments": segment_count(forest),
        "cp": cp,
    }
    assert cost(geometry, plan) == published_estimate(model, retained=retained, **common)
    assert cost(geometry, plan, "global") == published_estimate(model, retained=real, **common)


@given(forest=trees(), mg=model_grids(), rc=st.sampled_from(RECOMPUTES), data=st.data())
def test_reference_lies_between_the_average_bound_and_global(
    forest: Trees, mg: tuple[ModelGeometry, Grid], rc: Recompute, data: st.DataObject
) -> None:
    """avg-load <= reference <= global, except where the zigzag's padding exceeds packed."""
    geometry, grid = mg
    planner = data.draw(st.sampled_from(PLANNERS))
    plan = plan_request(to_request(forest), grid.layout, planner, geometry)
    ref = cost(geometry, plan, "reference", rc)
    glob = cost(geometry, plan, "global", rc)
    avg = cost_terms(geometry, plan, replace(REFERENCE, tokens=average_tokens), rc)
    assert avg <= ref
    discounted = grid.cp > 1 and rc.mode in ("selective", "none") and not geometry.is_moe
    if not discounted:
        assert avg == ref == glob  # everyone is charged the packed count
        return
    o = oracle_for(planner, forest, grid, geometry)
    busiest = max(up(max(a, g), grid.tp) for a, g in zip(o.attention, o.gdn, strict=True))
    packed = up(real_tokens(forest), grid.tp)
    if busiest <= packed:
        assert ref <= glob
    else:
        # padding puts more than the packed row on a rank: `global` underprices it
        event("zigzag padding: busiest rank > packed, reference > global")
        assert planner == "balanced"
        assert ref > glob


@given(
    forest=trees(),
    mg=model_grids(),
    rc=st.sampled_from(RECOMPUTES),
    extra=st.integers(1, 4096),
    data=st.data(),
)
def test_estimates_grow_with_sequence_length(
    forest: Trees,
    mg: tuple[ModelGeometry, Grid],
    rc: Recompute,
    extra: int,
    data: st.DataObject,
) -> None:
    """A longer sequence never costs less: zigzag under `reference`, any planner under
    `global` (the work- and segment-balancing planners are not monotone per rank)."""
    geometry, grid = mg
    index = data.draw(st.integers(0, segment_count(forest) - 1))
    longer = lengthen(forest, index, extra)
    short_req, long_req = to_request(forest), to_request(longer)
    for planner in PLANNERS:
        a = plan_request(short_req, grid.layout, planner, geometry)
        b = plan_request(long_req, grid.layout, planner, geometry)
        assert cost(geometry, b, "global", rc) >= cost(geometry, a, "global", rc), planner
    a = plan_request(short_req, grid.layout, "balanced")
    b = plan_request(long_req, grid.layout, "balanced")
    assert cost(geometry, b, "reference", rc) >= cost(geometry, a, "reference", rc)


@given(
    forest=trees(),
    mg=model_grids(),
    rc=st.sampled_from(RECOMPUTES),
    data=st.data(),
)
def test_estimates_grow_with_layers(
    forest: Trees, mg: tuple[ModelGeometry, Grid], rc: Recompute, data: st.DataObject
) -> None:
    """Appending layers (any mixer kind the model has) never lowers an estimate."""
    geometry, grid = mg
    kinds = sorted(set(geometry.mixers))
    extra = tuple(data.draw(st.lists(st.sampled_from(kinds), min_size=1, max_size=16)))
    deeper = replace(
        geometry,
        name=f"{geometry.name}+{len(extra)}",
        mixers=geometry.mixers + extra,
        mlps=geometry.mlps + (geometry.mlps[-1],) * len(extra),
        windows=geometry.windows + (geometry.windows[-1],) * len(extra) if geometry.windows else (),
    )
    planner = data.draw(st.sampled_from(PLANNERS))
    plan = plan_request(to_request(forest), grid.layout, planner, geometry)
    for policy in ("reference", "global"):
        assert cost(deeper, plan, policy, rc) >= cost(geometry, plan, policy, rc), policy


@given(forest=trees(), mg=model_grids(), rc=st.sampled_from(RECOMPUTES), data=st.data())
def test_tp_padding_never_lowers_an_estimate(
    forest: Trees, mg: tuple[ModelGeometry, Grid], rc: Recompute, data: st.DataObject
) -> None:
    """Pricing the TP padding costs at least as much as ignoring it; so does padding a rank."""
    geometry, grid = mg
    planner = data.draw(st.sampled_from(PLANNERS))
    plan = plan_request(to_request(forest), grid.layout, planner, geometry)
    unpadded = cost_terms(geometry, plan, replace(REFERENCE, tokens=unpadded_tokens), rc)
    assert cost(geometry, plan, "reference", rc) >= unpadded
    # more padding on one rank of an explicit plan
    (group,) = plan.groups
    ranks = list(group.attention_tokens)
    r = data.draw(st.integers(0, grid.cp - 1))
    pad = grid.tp * data.draw(st.integers(1, 8))
    padded = list(ranks)
    padded[r] += pad
    common = {
        "logical_tokens": group.logical_tokens,
        "packed_tokens": group.packed_tokens,
        "grad_segments": group.grad_segments,
    }
    assume(max(padded) <= up(group.packed_tokens, 2 * grid.cp * grid.tp))
    before = explicit_plan(grid.layout, rank_tokens=ranks, **common)
    after = explicit_plan(grid.layout, rank_tokens=padded, **common)
    assert cost(geometry, after, "reference", rc) >= cost(geometry, before, "reference", rc)


@given(forest=trees(max_sequences=32), mg=model_grids(), rc=st.sampled_from(RECOMPUTES))
def test_zigzag_is_order_free(forest: Trees, mg: tuple[ModelGeometry, Grid], rc: Recompute) -> None:
    """Reordering independent sequences (or a prefix's completions) changes nothing."""
    geometry, grid = mg
    variants = [forest, forest[::-1], mirrored(forest), forest[1:] + forest[:1]]
    plans = [plan_request(to_request(f), grid.layout, "balanced") for f in variants]
    ranks = {p.rank_tokens for p in plans}
    assert len(ranks) == 1
    assert len({cost(geometry, p, "reference", rc) for p in plans}) == 1


# Admission under uneven CP


@given(
    model=st.sampled_from(DENSE),
    cp=st.integers(2, 16),
    packed=st.integers(4, 64 * 1024),
    data=st.data(),
)
def test_uneven_cp_admission_prices_the_busiest_rank(
    model: str, cp: int, packed: int, data: st.DataObject
) -> None:
    """Fits under busiest-rank pricing though `global` refuses; refused if only packed/CP fits."""
    geometry = get_preset(model)
    average = ceil_div(packed, cp)
    busiest = data.draw(st.integers(average + 1, packed - 1), label="busiest")
    logical = packed + data.draw(st.integers(0, packed), label="shared tokens")
    segments = data.draw(st.integers(1, 8), label="segments")
    layout = ParallelLayout(cp=cp)
    args = {"logical_tokens": logical, "packed_tokens": packed, "grad_segments": segments}
    uneven = explicit_plan(layout, busiest_tokens=busiest, **args)
    even = explicit_plan(layout, **args)
    common = {"packed": packed, "logical": logical, "segments": segments, "cp": cp}
    e_avg = published_estimate(model, retained=average, **common)
    e_busy = published_estimate(model, retained=busiest, **common)
    e_glob = published_estimate(model, retained=packed, **common)
    assert e_avg < e_busy < e_glob

    budget = data.draw(st.integers(e_busy, e_glob - 1), label="budget between busy and global")
    fit = admit_plan(geometry, uneven, budget)
    assert (fit.action, fit.required_bytes, fit.available_bytes) == ("fit", e_busy, budget)
    old = admit_plan(geometry, uneven, budget, policy="global")
    assert (old.action, old.required_bytes) == ("refuse", e_glob)

    tight = data.draw(st.integers(e_avg, e_busy - 1), label="budget between average and busy")
    refused = admit_plan(geometry, uneven, tight)
    assert (refused.action, refused.required_bytes) == ("refuse", e_busy)
    assert admit_plan(geometry, even, tight).action == "fit"  # only the even split fits


@given(
    model=st.sampled_from(DENSE),
    cp=st.integers(2, 16),
    n=st.integers(1, 32 * 1024),
    data=st.data(),
)
def test_admit_one_sequence_follows_the_oracle(
    model: str, cp: int, n: int, data: st.DataObject
) -> None:
    """One unshared sequence cannot be split: fit with the cost-optimal (default) planner,
    else the cheapest layout a runtime executes (chunks or zigzag), else refuse; each
    planner priced at the oracle's busiest rank. A layout the oracle leaves a CP rank
    empty under is one ``estimate`` refuses: admission raises (naming ``cp``) where it is
    the default planner's, and does not consider it as an alternative."""
    geometry = get_preset(model)
    forest: Trees = ((n, ()),)
    owners = {pl: oracle(pl, forest, cp, model=model) for pl in ownership.PLANNERS}
    need = {
        pl: published_estimate(
            model,
            retained=o.busiest,
            packed=n,
            logical=n,
            segments=1,
            cp=cp,
        )
        for pl, o in owners.items()
    }
    empty = {
        pl: min(max(a, g) for a, g in zip(o.attention, o.gdn, strict=True)) == 0
        for pl, o in owners.items()
    }
    default = "gdn-segments" if PUBLISHED[model].gdn_layers else "chunked"
    request = Request.independent([n])
    if empty[default]:
        event("the default layout leaves a CP rank empty: refused as input")
        with pytest.raises(InputError) as err:
            admit(geometry, request=request, budget_bytes=2 * max(need.values()), cp=cp)
        assert err.value.field == "cp"
        return
    least = min(need[pl] for pl in (default, "chunked", "balanced") if not empty[pl])
    budget = data.draw(
        st.one_of(
            st.integers(0, 2 * max(need.values())),
            st.sampled_from(sorted({least - 1, least, need[default] - 1, need[default]})),
        ),
        label="budget",
    )
    d = admit(geometry, request=request, budget_bytes=budget, cp=cp)
    if need[default] <= budget:
        assert (d.action, d.required_bytes, d.parts) == ("fit", need[default], 1)
    elif least <= budget:
        event("fit only with a memory-minimal planner")
        assert (d.action, d.required_bytes, d.parts) == ("fit", least, 1)
    else:
        assert (d.action, d.required_bytes) == ("refuse", least)
    assert d.available_bytes == budget


@given(
    free=st.integers(0, 2**40),
    reusable=st.integers(0, 2**38),
    total=st.integers(2**30, 2**38),
)
def test_usable_budget_is_free_plus_reusable_minus_three_percent(
    free: int, reusable: int, total: int
) -> None:
    """available = free + reusable reserved - 3% of device memory (within float rounding),
    and never below zero: less than nothing usable is still nothing."""
    got = usable_budget(free, reusable, total)
    exact_hundredths = 100 * (free + reusable) - 3 * total
    if exact_hundredths < 0:
        assert got == 0
    else:
        assert abs(100 * got - exact_hundredths) <= 100 + (free + reusable + total) // 2**40


@pytest.mark.parametrize("model", DENSE)
def test_a_pair_fits_only_when_its_busiest_rank_does(model: str) -> None:
    """The 4k pair at CP2: admitted at the busiest-rank figure, refused a byte below it."""
    forest: Trees = ((1228, ((2868, ()), (2868, ()))),)
    planner = "gdn-segments" if PUBLISHED[model].gdn_layers else "chunked"
    plan = plan_request(
        Request.pair(4096, 4096, 1228), ParallelLayout(cp=2), planner, get_preset(model)
    )
    need = published_estimate(
        model,
        retained=oracle(planner, forest, 2, model=model).busiest,
        packed=6964,
        logical=8192,
        segments=3,
        cp=2,
    )
    geometry = get_preset(model)
    assert admit_plan(geometry, plan, need).action == "fit"
    assert admit_plan(geometry, plan, need - 1).action == "refuse"


@pytest.mark.parametrize(
    ("model", "planner", "cp", "lengths"),
    [
        ("qwen3.5-27b", "gdn-segments", 4, (3, 17)),
        ("qwen3-1.7b", "attention-work", 2, (232, 235)),
    ],
)
def test_busiest_rank_pricing_is_not_monotone_in_length(
    model: str, planner: str, cp: int, lengths: tuple[int, int]
) -> None:
    """One more token can *lower* the estimate under the segment and work planners: the
    target or the 128-block cut moves. Width search must not assume monotone cost."""
    a, b = lengths
    shorter: Trees = ((a, ()), (b, ()))
    longer: Trees = ((a + 1, ()), (b, ()))
    busy = [ownership.simulate(planner, f, cp).busiest for f in (shorter, longer)]
    assert busy[1] < busy[0]
    geometry = get_preset(model)
    got = []
    for forest, r in zip((shorter, longer), busy, strict=True):
        n = real_tokens(forest)
        expected = published_estimate(model, retained=r, packed=n, logical=n, segments=2, cp=cp)
        plan = plan_request(to_request(forest), ParallelLayout(cp=cp), planner)
        assert cost(geometry, plan) == expected
        got.append(expected)
    assert got[1] < got[0]


def test_zigzag_padding_can_put_more_than_packed_on_a_rank() -> None:
    """64 one-token rows at CP16: each row pads to 32, so every rank holds 128 > 64 packed
    tokens, and busiest-rank pricing exceeds `global` (which charges packed = 64)."""
    forest: Trees = tuple((1, ()) for _ in range(64))
    o = ownership.simulate("balanced", forest, 16)
    assert o.attention == (128,) * 16 and o.padding == 64 * 31
    plan = plan_request(to_request(forest), ParallelLayout(cp=16), "balanced")
    common = {"packed": 64, "logical": 64, "segments": 64, "cp": 16}
    geometry = get_preset("qwen3-1.7b")
    assert cost(geometry, plan) == published_estimate("qwen3-1.7b", retained=128, **common)
    assert cost(geometry, plan, "global") == published_estimate("qwen3-1.7b", retained=64, **common)
    assert cost(geometry, plan) > cost(geometry, plan, "global")
