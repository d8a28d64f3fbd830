"""Admission prices what ``estimate`` prices: for any valid input, the bytes admission
requires for a variant are ``cpmem.api.estimate``'s for that variant with the same options.

The regression behind it: admission once rebuilt its own pricing input and dropped
options ``estimate`` honoured (learned profiles), so ``cpmem admit`` could FIT a request
``cpmem estimate`` priced above the budget. Every expected figure here comes from
``estimate`` called with the arguments the test gave ``admit`` (and, for a variant, the
one argument the variant changes); the split rule is restated here, not called. Admission
prices every variant as the first and as a steady step of its process and requires the
larger (a split all its parts at one kind), so each expected figure is the larger of two
``estimate`` calls, ``step="first"`` and ``step="steady"``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from cpmem.admission.admission import Decision, admit, split_request
from cpmem.admission.pricer import BALANCED_NOTE, Figure
from cpmem.api import describe_step, estimate
from cpmem.errors import InputError
from cpmem.model.presets import get_preset
from cpmem.plan.layout import round_up
from cpmem.plan.planners import EXECUTABLE, PLANNER_CHOICES
from cpmem.plan.request import Request
from cpmem.pricing.estimate import Estimate
from cpmem.step.profiles import Profile, ProfileStore

from .strategies import valid_tps

MODELS = ("qwen3-1.7b", "qwen3.5-4b", "qwen3.5-35b-a3b")
MOE_MODEL = "qwen3.5-35b-a3b"
POLICY_FIGURES: tuple[tuple[str, Figure], ...] = (
    ("reference", "forward"),
    ("global", "forward"),
    ("tight", "forward"),
    ("tight", "forward_backward"),
)
# (mode, modules): the CLI's spelling, parsed by describe_settings as the CLI's is
RECOMPUTES = (
    ("none", None),
    ("selective", "core_attn"),
    ("selective", "core_attn+mlp"),
    ("full", None),
    ("no-grad", None),
)
MOE_RECOMPUTES = (("selective", "core_attn+moe"),)
KINDS = ("first", "steady")  # on a tie admission decides on the first
MAX_TOKENS = 8 * 1024
HUGE = 1 << 50
PARTS = 1 << 20


def profile_key(model: str, settings: dict[str, Any], step: str = "steady") -> str:
    """The store's key for the step ``settings`` describe as a ``step`` step of its
    process (``ProfileSignature.key``: the step's own, so the profile applies to it)."""
    described = {k: v for k, v in settings.items() if k != "profiles"}
    return describe_step(model, [16384], **{**described, "step": step}).signature.key


@dataclass(frozen=True)
class Case:
    """One admission input: the model, what the step holds, the settings and the pricer."""

    model: str
    policy: str
    figure: Figure
    inputs: dict[str, Any]  # lengths + shared_prefix, or an explicit plan's counts
    settings: dict[str, Any]  # describe_settings' keywords

    @property
    def explicit(self) -> bool:
        return "packed_tokens" in self.inputs

    def estimate(self, **changes: Any) -> Estimate:
        """``estimate`` with the case's arguments (``changes`` replacing some), on the
        routing admission decides on: the balanced expectation is admitted on the worst
        case (``concentrated``), the bound a router without capacity reaches."""
        args = {**self.inputs, **self.settings, **changes}
        if args.get("moe_routing") == "balanced":
            args["moe_routing"] = "concentrated"
        return estimate(self.model, policy=self.policy, **args)

    def decided(self, **changes: Any) -> Estimate:
        """The estimate of the step kind that requires more (the first on a tie)."""
        first, steady = (self.estimate(step=kind, **changes) for kind in KINDS)
        return first if self.figure_of(first) >= self.figure_of(steady) else steady

    def required(self, **changes: Any) -> int:
        """The larger of the first and the steady step's figure."""
        return self.figure_of(self.decided(**changes))

    def admit(self, budget: int) -> Decision:
        return admit(
            self.model,
            budget_bytes=budget,
            policy=self.policy,
            figure=self.figure,
            **self.inputs,
            **self.settings,
        )

    def figure_of(self, est: Estimate) -> int:
        if self.figure == "forward_backward":
            assert est.forward_backward_bytes is not None
            return est.forward_backward_bytes
        return est.estimate_bytes


@st.composite
def explicit_counts(draw: st.DrawFn, tp: int, cp: int) -> dict[str, Any]:
    """A runtime's plan counts: logical tokens, packed (real tokens, shared prefixes
    stored once, padded to TP), segments, and per-rank tokens (even, padded, skewed) or
    only the busiest rank's."""
    # fixed bounds, clamped afterwards (bounds that depend on earlier draws make
    # Hypothesis discard replayed examples as invalid)
    logical = max(cp, draw(st.integers(1, MAX_TOKENS), label="logical"))
    real = max(cp, min(logical, draw(st.integers(1, MAX_TOKENS), label="real")))
    packed = round_up(real, tp)
    segments = draw(st.integers(1, 8), label="segments")
    counts: dict[str, Any] = {
        "logical_tokens": logical,
        "packed_tokens": packed,
        "segments": segments,
    }
    floor = -(-packed // cp)
    if draw(st.booleans(), label="busiest only"):
        counts["busiest_tokens"] = floor + draw(st.integers(0, 1024), label="busiest extra")
        return counts
    base, extra = divmod(packed, cp)
    ranks = [base + (1 if r < extra else 0) for r in range(cp)]
    shift = draw(st.integers(0, 4096), label="skew")
    if cp > 1 and shift:
        moved = min(shift, ranks[-1])
        ranks[0] += moved
        ranks[-1] -= moved
    pad = draw(st.lists(st.integers(0, 4), min_size=cp, max_size=cp), label="pad")
    counts["rank_tokens"] = [n + tp * p for n, p in zip(ranks, pad, strict=True)]
    return counts


@st.composite
def cases(draw: st.DrawFn) -> Case:
    model = draw(st.sampled_from(MODELS), label="model")
    policy, figure = draw(st.sampled_from(POLICY_FIGURES), label="policy, figure")
    tp = draw(st.sampled_from(valid_tps(get_preset(model))), label="tp")
    cp = draw(st.sampled_from((1, 2, 3, 4, 8)), label="cp")
    moe = model == MOE_MODEL
    mode, modules = draw(
        st.sampled_from(RECOMPUTES + (MOE_RECOMPUTES if moe else ())), label="recompute"
    )
    compiled = draw(st.booleans(), label="compiled")
    settings: dict[str, Any] = {
        "tp": tp,
        "cp": cp,
        "sp": draw(st.sampled_from((None, True, False)), label="sp"),
        "recompute": mode,
        "modules": modules,
        "compiled": compiled,
        "planner": draw(st.sampled_from((None, *PLANNER_CHOICES)), label="planner"),
    }
    if moe:
        settings["ep"] = draw(st.sampled_from((1, 2, 4, 8)), label="ep")
        settings["moe_routing"] = draw(
            st.sampled_from(("concentrated", "balanced")), label="moe_routing"
        )
    if draw(st.booleans(), label="profiles"):
        key = profile_key(model, settings, draw(st.sampled_from(KINDS), label="profile step"))
        bytes_per_token = draw(st.integers(10_000, 20_000_000), label="bytes per token")
        tokens = draw(st.integers(64, MAX_TOKENS), label="profile tokens")
        settings["profiles"] = ProfileStore({key: Profile(float(bytes_per_token), tokens)})
    if draw(st.integers(0, 4), label="explicit") == 0:
        inputs = draw(explicit_counts(tp, cp))
        settings.pop("planner")  # an explicit plan is not planned
    else:
        drawn = draw(st.lists(st.integers(1, 4096), min_size=1, max_size=6), label="lengths")
        # the longest prefix of the drawn sequences within MAX_TOKENS (no filter: a
        # filter would discard many examples)
        lengths = [n for i, n in enumerate(drawn) if sum(drawn[: i + 1]) <= MAX_TOKENS]
        shared = 0
        if len(lengths) > 1 and min(lengths) > 1 and draw(st.booleans(), label="share"):
            shared = min(min(lengths) - 1, draw(st.integers(1, 4095), label="shared_prefix"))
        inputs = {"lengths": lengths, "shared_prefix": shared}
    return Case(model, policy, figure, inputs, settings)


def split_figure(case: Case, parts: list[Estimate]) -> int:
    """The split rule, restated: every part keeps its retained bytes
    (``Estimate.retained_bytes``) until backward; one part's workspace (its figure less
    its retained bytes) is live at a time, so the largest part's workspace counts once."""
    retained = [p.retained_bytes for p in parts]
    workspace = [case.figure_of(p) - r for p, r in zip(parts, retained, strict=True)]
    return sum(retained) + max(workspace)


def split_parts(case: Case, n: int, kind: str) -> list[Estimate] | None:
    """Each part of the N-way split estimated on its own (``request=part``) as a ``kind``
    step, or None where the request cannot be cut N ways or a part's estimate is refused."""
    lengths, shared = case.inputs["lengths"], case.inputs["shared_prefix"]
    pieces = split_request(Request.shared(lengths, shared), n)
    if pieces is None:
        return None
    try:
        return [case.estimate(request=p, step=kind, lengths=None, shared_prefix=0) for p in pieces]
    except InputError:
        return None


def split_decided(case: Case, n: int) -> list[Estimate] | None:
    """The parts of the N-way split at the step kind whose split figure is larger (the
    first on a tie), or None as ``split_parts``."""
    first, steady = (split_parts(case, n, kind) for kind in KINDS)
    if first is None or steady is None:
        return None
    return first if split_figure(case, first) >= split_figure(case, steady) else steady


def expected_required(case: Case, variant: str) -> int:
    """What ``estimate`` prices for ``variant`` with the case's options."""
    if variant in ("cost-optimal", "explicit"):
        return case.required()
    if variant.startswith("memory-minimal:"):
        planner = variant.removeprefix("memory-minimal:")
        return case.required(planner=planner)
    if variant.startswith("split-"):
        parts = split_decided(case, int(variant.removeprefix("split-")))
        assert parts is not None, f"admission considered {variant}, estimate cannot price it"
        return split_figure(case, parts)
    raise AssertionError(f"unknown variant {variant!r}")


def budget_for(case: Case, data: st.DataObject) -> int:
    """A budget drawn around the variants' figures (from ``estimate``), so that fit,
    memory-minimal, split and refuse all occur."""
    cost_optimal = case.required()
    anchors = {"fit": cost_optimal}
    if not case.explicit and case.settings.get("cp", 1) > 1:
        alternatives = []
        for planner in EXECUTABLE:
            try:
                alternatives.append(case.required(planner=planner))
            except InputError:
                continue
        if alternatives and min(alternatives) < cost_optimal:
            anchors["memory-minimal"] = min(alternatives)
    if not case.explicit:
        parts = split_decided(case, 2)
        if parts is not None:
            anchors["split"] = split_figure(case, parts)
    lowest = min(anchors.values())
    kinds = ("fit", "memory-minimal", "split", "refuse", "anywhere")
    kind = data.draw(st.sampled_from(kinds), label="budget")
    fraction = data.draw(st.integers(0, PARTS - 1), label="budget fraction") / PARTS
    if kind == "refuse":  # below every variant's figure
        return int(lowest * fraction)
    if kind == "anywhere":
        return int(2 * cost_optimal * fraction)
    # at the anchor, or up to 1% above it
    anchor = anchors.get(kind, cost_optimal)
    return anchor + int(anchor * fraction / 100)


def check_decision(case: Case, d: Decision, budget: int) -> None:
    """Every variant admission considered is priced as ``estimate`` prices it; the
    chosen one's figure is the decision's, and the decision follows from the figures."""
    considered = dict(d.considered)
    assert len(considered) == len(d.considered), "a variant was considered twice"
    for variant, required in d.considered:
        assert required == expected_required(case, variant), variant
    assert d.available_bytes == budget
    if d.action == "refuse":
        assert all(req > budget for req in considered.values())
    else:
        assert d.required_bytes <= budget
    first = "explicit" if case.explicit else "cost-optimal"
    if considered[first] <= budget:  # what fits as priced is admitted as priced
        assert (d.action, d.variant) == ("fit", first)
    if case.explicit:
        assert d.variant == "explicit" and list(considered) == ["explicit"]
        assert d.action in ("fit", "refuse")
    else:
        # the memory-minimal alternatives are exactly the executable layouts estimate
        # prices, less the cost-optimal one's own planner
        cost_optimal = case.estimate()
        wanted = set()
        if case.settings.get("cp", 1) > 1:
            for planner in EXECUTABLE:
                if planner == cost_optimal.planner:
                    continue
                try:
                    case.estimate(planner=planner)
                except InputError:
                    continue
                wanted.add(f"memory-minimal:{planner}")
        assert {v for v in considered if v.startswith("memory-minimal:")} == wanted
    assert d.required_bytes == considered[d.variant]
    assert d.required_bytes == expected_required(case, d.variant)
    # the balanced expectation is admitted on the worst case, and the decision says so
    balanced = case.settings.get("moe_routing") == "balanced"
    assert any("worst-case MoE routing" in n for n in d.estimate.notes) == balanced
    decided = replace(d.estimate, notes=tuple(n for n in d.estimate.notes if n != BALANCED_NOTE))
    if d.variant.startswith("split-"):
        parts = split_decided(case, d.parts)
        assert parts is not None and d.parts == int(d.variant.removeprefix("split-"))
        assert decided == max(parts, key=case.figure_of)
    elif d.variant.startswith("memory-minimal:"):
        assert decided == case.decided(planner=d.variant.removeprefix("memory-minimal:"))
    else:
        assert decided == case.decided()


@given(case=cases(), data=st.data())
def test_admission_requires_what_estimate_prices(case: Case, data: st.DataObject) -> None:
    """For any valid input, the chosen variant's required bytes (and every considered
    variant's) are ``estimate``'s for that variant: ``cost-optimal`` / ``explicit`` the
    same arguments, ``memory-minimal:<p>`` the same with ``planner=p``, ``split-N`` the
    split rule over each part's own estimate."""
    try:
        case.estimate()
    except InputError:
        # what estimate refuses, admission refuses the same way (not a decision)
        with pytest.raises(InputError):
            case.admit(HUGE)
        event("input refused by both")
        return
    budget = budget_for(case, data)
    d = case.admit(budget)
    check_decision(case, d, budget)
    kind = "split" if d.variant.startswith("split-") else d.variant.split(":")[0]
    event(f"{d.action} {kind}")
    event(f"policy {case.policy} {case.figure}")
    if "profiles" in case.settings:
        floor = case.estimate().components.get("profile_floor", 0)
        event("profile floor raises the estimate" if floor else "profile floor below the estimate")


# Every action is reachable, each with the same equality (deterministic, small inputs).

REACHABLE = [
    pytest.param(
        Case(
            "qwen3.5-4b",
            "reference",
            "forward",
            {"lengths": [2048, 2048], "shared_prefix": 0},
            {"cp": 2},
        ),
        "fit",
        "cost-optimal",
        id="fit-cost-optimal",
    ),
    pytest.param(
        Case(
            "qwen3.5-4b",
            "reference",
            "forward",
            {"lengths": [4096, 4096], "shared_prefix": 1228},
            {"cp": 2},
        ),
        "fit",
        "memory-minimal",
        id="fit-memory-minimal",
    ),
    pytest.param(
        Case(
            "qwen3.5-4b",
            "reference",
            "forward",
            {"lengths": [2048, 2048], "shared_prefix": 0},
            {
                "cp": 2,
                "profiles": ProfileStore(
                    {profile_key("qwen3.5-4b", {"cp": 2}): Profile(1e7, 4096)}
                ),
            },
        ),
        "split",
        "split",
        id="split-with-profiles",
    ),
    pytest.param(
        Case(
            "qwen3-1.7b",
            "tight",
            "forward_backward",
            {"lengths": [4096, 2048, 1024, 512], "shared_prefix": 0},
            {"recompute": "full"},
        ),
        "split",
        "split",
        id="split-tight-forward-backward",
    ),
    pytest.param(
        Case(
            "qwen3-1.7b",
            "global",
            "forward",
            {"lengths": [8192], "shared_prefix": 0},
            {"cp": 2},
        ),
        "refuse",
        None,
        id="refuse",
    ),
    pytest.param(
        Case(
            "qwen3.5-4b",
            "tight",
            "forward",
            {
                "logical_tokens": 8192,
                "packed_tokens": 8192,
                "rank_tokens": [5120, 3072],
                "segments": 2,
            },
            {"cp": 2},
        ),
        "fit",
        "explicit",
        id="fit-explicit",
    ),
    pytest.param(
        Case(
            "qwen3.5-4b",
            "tight",
            "forward",
            {
                "logical_tokens": 8192,
                "packed_tokens": 8192,
                "rank_tokens": [5120, 3072],
                "segments": 2,
            },
            {"cp": 2},
        ),
        "refuse",
        "explicit",
        id="refuse-explicit",
    ),
]


def _budget(case: Case, action: str, kind: str | None) -> int:
    """A budget that must give ``action`` by the variants' own estimates."""
    cost_optimal = case.required()
    if action == "fit" and kind in ("cost-optimal", "explicit"):
        return cost_optimal
    if kind == "memory-minimal":
        alternatives = [case.required(planner=p) for p in EXECUTABLE]
        assert min(alternatives) < cost_optimal, "no memory-minimal layout below cost-optimal"
        return min(alternatives)
    if kind == "split":
        parts = split_decided(case, 2)
        assert parts is not None
        split = split_figure(case, parts)
        alternatives = [cost_optimal]
        if case.settings.get("cp", 1) > 1:
            alternatives += [case.required(planner=p) for p in EXECUTABLE]
        assert split < min(alternatives), "splitting in two does not lower the figure"
        return split
    return cost_optimal // 2  # refuse


@pytest.mark.parametrize(("case", "action", "kind"), REACHABLE)
def test_every_action_is_reachable(case: Case, action: str, kind: str | None) -> None:
    budget = _budget(case, action, kind)
    d = case.admit(budget)
    assert d.action == action
    if kind is not None:
        assert d.variant.startswith(kind)
    check_decision(case, d, budget)
