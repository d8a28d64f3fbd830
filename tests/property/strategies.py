"""Hypothesis strategies: random prefix-tree requests and TP x CP layouts.

Requests are drawn as the oracle's plain nested tuples (``(tokens, (children...))``)
and converted to cpmem objects only at the test boundary, so the oracle never sees
a cpmem type. Real tokens are capped (64k) and long segments are drawn rarely, so
the token-by-token oracle stays fast enough for ``ci``'s 500 examples per property.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from cpmem.errors import InputError
from cpmem.model.geometry import ModelGeometry
from cpmem.model.presets import get_preset
from cpmem.plan.layout import ParallelLayout
from cpmem.plan.request import Request, Segment
from oracles import ownership

MAX_SEQUENCES = 64
MAX_SEQUENCE_TOKENS = 32 * 1024
MAX_REAL_TOKENS = 64 * 1024
MAX_DEPTH = 3

Tree = tuple[int, tuple["Tree", ...]]
Trees = tuple[Tree, ...]


@st.composite
def segment_tokens(draw: st.DrawFn, cap: int) -> int:
    """Mostly short runs, sometimes a few thousand tokens, rarely up to 32k."""
    # fixed bounds, clamped afterwards: bounds that depend on earlier draws make
    # Hypothesis discard many replayed examples as invalid
    bucket = draw(st.integers(0, 15))
    short = draw(st.integers(1, 512))
    medium = draw(st.integers(1, 4096))
    long = draw(st.integers(1, MAX_SEQUENCE_TOKENS))
    n = short if bucket < 11 else medium if bucket < 15 else long
    return max(1, min(n, cap))


@st.composite
def trees(
    draw: st.DrawFn,
    max_sequences: int = MAX_SEQUENCES,
    max_real_tokens: int = MAX_REAL_TOKENS,
) -> Trees:
    """A forest: unshared sequences, shared prefixes with completions, nested prefixes."""
    state = {
        "leaves": draw(st.integers(1, max_sequences)),
        "budget": draw(st.integers(1, max_real_tokens)),
    }

    def node(depth: int, above: int) -> Tree:
        cap = min(state["budget"], MAX_SEQUENCE_TOKENS - above)
        n = draw(segment_tokens(cap))
        state["budget"] -= n
        can_branch = (
            depth < MAX_DEPTH
            and state["budget"] >= 1
            and above + n < MAX_SEQUENCE_TOKENS
            and state["leaves"] >= 1
        )
        if not can_branch or not draw(st.booleans()):
            state["leaves"] -= 1
            return (n, ())
        children: list[Tree] = []
        wanted = draw(st.integers(1, 6))
        while (
            len(children) < wanted and state["leaves"] >= 1 and state["budget"] >= 1
        ) or not children:
            children.append(node(depth + 1, above + n))
        return (n, tuple(children))

    forest: list[Tree] = []
    while not forest or (state["leaves"] >= 1 and state["budget"] >= 1):
        forest.append(node(0, 0))
    return tuple(forest)


def to_request(forest: Trees) -> Request:
    """The same forest as a cpmem Request."""

    def seg(tree: Tree) -> Segment:
        return Segment(tree[0], tuple(seg(c) for c in tree[1]))

    return Request(tuple(seg(t) for t in forest))


def real_tokens(forest: Trees) -> int:
    """Tokens stored once per segment: counted here without cpmem."""
    return sum(t[0] + real_tokens(t[1]) for t in forest)


def sequence_lengths(forest: Trees, above: int = 0) -> list[int]:
    """Root-to-leaf lengths, counted here without cpmem."""
    out: list[int] = []
    for tokens, children in forest:
        out.extend(sequence_lengths(children, above + tokens) if children else [above + tokens])
    return out


def segment_count(forest: Trees) -> int:
    return sum(1 + segment_count(t[1]) for t in forest)


@dataclass(frozen=True)
class Grid:
    """A TP x CP layout as plain numbers (plus the cpmem object built from them)."""

    tp: int
    cp: int
    sp: bool

    @property
    def sp_active(self) -> bool:
        return self.sp and self.tp > 1

    @property
    def layout(self) -> ParallelLayout:
        return ParallelLayout(tp=self.tp, cp=self.cp, sp=self.sp)


def grids(
    cp: st.SearchStrategy[int] | None = None, tp: st.SearchStrategy[int] | None = None
) -> st.SearchStrategy[Grid]:
    """CP 1..16, TP 1..8, SP on or off."""
    return st.builds(
        Grid,
        tp=tp if tp is not None else st.integers(1, 8),
        cp=cp if cp is not None else st.integers(1, 16),
        sp=st.booleans(),
    )


# The chunk planner's constants for the two preset families the properties plan for,
# written out from runtime-layout.md (femtoseconds): owned = 3 (8 h^2 + 6 h f) / 400e12 s,
# pair = 3 * 4 * Q / 400e12 s, 1.2 ms + 1.2 ms per remote stage, 3e-5 ms + 3e-5 ms per
# fetched key. ``hybrid``: the model has GDN layers.
STAGE = 2_400_000_000_000
FETCH = 60_000_000


def _owned(h: int, f: int) -> int:
    return 3 * (8 * h * h + 6 * h * f) * 10**15 // (400 * 10**12)


def _pair(q: int) -> int:
    return 3 * 4 * q * 10**15 // (400 * 10**12)


@dataclass(frozen=True)
class PlanModel:
    """A preset the properties plan for, with its chunk costs as plain numbers."""

    name: str
    owned: int
    pair: int
    hybrid: bool

    @property
    def costs(self) -> ownership.Costs:
        return ownership.Costs(self.owned, self.pair, STAGE, FETCH)

    @property
    def geometry(self) -> ModelGeometry:
        return get_preset(self.name)


PLAN_MODELS = {
    "qwen3-1.7b": PlanModel("qwen3-1.7b", _owned(2048, 6144), _pair(16 * 128), hybrid=False),
    "qwen3.5-27b": PlanModel("qwen3.5-27b", _owned(5120, 17408), _pair(24 * 256), hybrid=True),
    "qwen3.5-4b": PlanModel("qwen3.5-4b", _owned(2560, 9216), _pair(16 * 256), hybrid=True),
}


def plan_models() -> st.SearchStrategy[PlanModel]:
    return st.sampled_from(sorted(PLAN_MODELS.values(), key=lambda m: m.name))


def oracle(
    planner: str, forest: Trees, cp: int, tp: int = 1, sp: bool = False, model: str = "qwen3-1.7b"
) -> ownership.Ownership:
    """The ownership oracle for ``planner`` (the chunk planner with ``model``'s costs)."""
    m = PLAN_MODELS[model]
    return ownership.simulate(planner, forest, cp, tp, sp, m.costs, m.hybrid)


def geometry_costs(geometry: ModelGeometry) -> ownership.Costs:
    """runtime-layout.md's constants for any geometry (an MoE layer's f: the routed
    experts' width top-k * expert FFN plus the shared expert's)."""
    f = geometry.ffn or geometry.moe_top_k * geometry.expert_ffn + geometry.shared_expert_ffn
    return ownership.Costs(
        _owned(geometry.hidden, f), _pair(geometry.q_heads * geometry.head_dim), STAGE, FETCH
    )


def oracle_for(
    planner: str, forest: Trees, grid: Grid, geometry: ModelGeometry
) -> ownership.Ownership:
    """The oracle for ``planner`` on ``grid`` with ``geometry``'s chunk costs."""
    return ownership.simulate(
        planner,
        forest,
        grid.cp,
        grid.tp,
        grid.sp,
        geometry_costs(geometry),
        geometry.gdn_layers > 0,
    )


def valid_tps(geometry: ModelGeometry) -> list[int]:
    """TP degrees the model's heads can be sharded over, up to 8 (the model's own input
    check, not an oracle)."""
    out = []
    for tp in range(1, 9):
        try:
            geometry.check_tp(tp)
        except InputError:
            continue
        out.append(tp)
    return out
