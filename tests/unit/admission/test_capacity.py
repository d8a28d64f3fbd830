"""Capacity: the longest sequence and pack per layout, checked from outside (against
docs/pricing.md's published formula where it is linear in the length, and with
``cpmem.api.estimate`` for the pipeline), the default layouts, the monotonicity the
search assumes (and where it does not hold), the JSON and the CLI."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cpmem import cli
from cpmem.admission.capacity import (
    MAX_RANKS,
    SIZES,
    Capacity,
    _longest,
    _Search,
    capacity,
    default_layouts,
    parse_layouts,
)
from cpmem.admission.pricer import Pricer
from cpmem.api import describe_settings, estimate, load_model
from cpmem.errors import InputError

M4 = load_model("qwen3.5-4b")
M17 = load_model("qwen3-1.7b")
HYBRID = ("qwen3.5-27b", "qwen3.5-4b", "qwen3.5-35b-a3b")


def _fits(model: str, lengths: list[int], tp: int, cp: int, **options: object) -> bool:
    """Whether ``estimate`` fits its own device budget (forward peak, or the whole step)."""
    figure = options.pop("figure", "forward")
    est = estimate(model, lengths, tp=tp, cp=cp, allow_long=True, **options)  # type: ignore[arg-type]
    assert est.device_budget is not None
    need = est.estimate_bytes if figure == "forward" else est.forward_backward_bytes
    assert need is not None
    return need <= est.device_budget.budget_bytes


MIB = 2**20
HARNESS = {"head": "hidden", "lora_rank": 1, "step": "first", "recompute": "selective"}


def _published_reference(
    n: int, length: int, hidden: int, features: int, states: int, cold: int
) -> int:
    """docs/pricing.md's estimate of ``n`` independent sequences of ``length`` tokens at
    TP 1, CP 1 under selective recompute, restated by hand: R = n·length packed tokens,
    int((outputs R·H·b + cold + n segments' states + R·b·features)·1.10), ``cold`` the
    64 MiB allowance on a process's first step and 0 on a steady one; the legacy floor
    (R·H·b·clamp(L // 4 + 4, 4, 16)) stays below the activation floor here."""
    tokens = n * length
    return int((tokens * hidden * 2 + cold + n * states + tokens * 2 * features) * 1.10)


@pytest.mark.parametrize(
    ("model", "device", "hidden", "features", "states"),
    [
        # docs/pricing.md's check values: features a token (TP1), segment-state bytes per
        # segment and GDN layer x the 24 GDN layers of Qwen3.5-4B; Qwen3-1.7B has no GDN
        ("qwen3-1.7b", "h200", 2048, 1_462_272, 0),
        ("qwen3.5-4b", "h100", 2560, 2_449_408, 24 * 4_292_608),
    ],
)
def test_the_longest_length_is_the_published_formulas_boundary(
    model: str, device: str, hidden: int, features: int, states: int
) -> None:
    """At TP 1, CP 1 the reference's figure is linear in the length (docs/pricing.md, "The
    estimate"), so the longest length that fits a budget B is the largest L with
    int((c + n·L·w)·1.10) <= B, derived here from the published terms (not from cpmem's
    estimate), for the layout's budget (the search's input): the single sequence and the
    pack of two. The step kind that decides is the steady one: its 96 MiB of kernel
    workspaces in static memory outweigh the first step's 64 MiB x 1.10 allowance in the
    activations (the rank-1 adapters' moments add a little more), so the allowance is 0."""
    found = capacity(model, layouts="1x1", device=device, **HARNESS)  # type: ignore[arg-type]
    (lay,) = found.layouts
    assert lay.step_kind == "steady"
    budget = lay.budget_bytes
    terms = (hidden, features, states, 0)
    for fit in (lay.single, lay.pack):
        n = fit.sequences
        # the closed form, then the integer boundary of the rounded figure
        per_token = 2 * (hidden + features)
        length = int((budget / 1.10 - n * states) / (n * per_token))
        while _published_reference(n, length + 1, *terms) <= budget:
            length += 1
        while _published_reference(n, length, *terms) > budget:
            length -= 1
        assert fit.length == length, (n, fit.length, length)
        assert fit.required_bytes == _published_reference(n, length, *terms)
        assert not fit.at_cap and fit.guard_lowered == 0
    assert lay.pack.sequences == 2 and lay.pack_tokens == 2 * (lay.pack_length or 0)


def test_the_whole_step_figure_admits_shorter_lengths_than_the_forward() -> None:
    """``figure`` reaches every probe: tight's forward+backward figure is above its forward
    figure at every length (tests/property/test_tight_properties.py), so the longest
    length that fits the whole step is shorter, on every layout, single and pack."""
    kw = {"layouts": "2x1,1x2", "device": "h100", "policy": "tight", "lora_rank": 16}
    kw["head"] = "hidden"  # a logits head's backward reuses what its forward kept: equal
    whole = capacity(M4, figure="forward_backward", **kw)  # type: ignore[arg-type]
    forward = capacity(M4, figure="forward", **kw)  # type: ignore[arg-type]
    for a, b in zip(whole.layouts, forward.layouts, strict=True):
        assert a.budget_bytes == b.budget_bytes
        assert (a.single.length or 0) < (b.single.length or 0)
        assert (a.pack.length or 0) < (b.pack.length or 0)


def test_default_layouts_are_every_small_layout_the_heads_allow() -> None:
    for name in ("qwen3.5-27b", "qwen3.5-4b", "qwen3-1.7b", "qwen3.5-35b-a3b"):
        kept, excluded = default_layouts(load_model(name))
        assert excluded == []  # every preset's heads allow TP 1, 2, 4, 8
        assert len(kept) == 10 and all(tp * cp <= MAX_RANKS for tp, cp in kept)
        assert {tp for tp, _ in kept} <= set(SIZES) and {cp for _, cp in kept} <= set(SIZES)
    # 12 query heads: TP 8 does not divide them
    odd = replace(M17, name="odd-12", q_heads=12, kv_groups=4)
    kept, excluded = default_layouts(odd)
    assert (8, 1) not in kept and [(e.tp, e.cp) for e in excluded] == [(8, 1)]
    assert "q_heads (12)" in excluded[0].reason
    found = capacity(odd, device="h200")
    assert [(lay.tp, lay.cp) for lay in found.layouts] == kept
    assert found.to_dict()["excluded"] == [{"tp": 8, "cp": 1, "reason": excluded[0].reason}]
    with pytest.raises(InputError) as err:
        capacity(odd, device="h200", layouts="8x1")
    assert err.value.field == "layouts" and "q_heads (12)" in err.value.reason


def test_a2a_excludes_the_layouts_whose_heads_cp_cannot_split() -> None:
    kept, excluded = default_layouts(load_model("qwen3.5-27b"), cp_comm="a2a")
    for tp in SIZES:
        for cp in SIZES:
            if tp * cp > MAX_RANKS:
                continue
            try:
                describe_settings("qwen3.5-27b", tp=tp, cp=cp, cp_comm="a2a")
                runs = True
            except InputError:
                runs = False
            assert ((tp, cp) in kept) == runs
    assert (1, 8) in [(e.tp, e.cp) for e in excluded]


@st.composite
def _probe(draw: st.DrawFn) -> tuple[str, str, int, int, int, int, int]:
    """(model, policy, tp, cp, n, shorter, longer) where the search's assumption holds:
    the hybrid models (gdn-segments) at every default layout, every model without CP."""
    model = draw(st.sampled_from((*HYBRID, "qwen3-1.7b")))
    kept, _ = default_layouts(load_model(model))
    layouts = [(tp, cp) for tp, cp in kept if model in HYBRID or cp == 1]
    tp, cp = draw(st.sampled_from(layouts))
    n = draw(st.integers(1, 3))
    low = max(1, -(-cp // n)) + 64  # past the shortest requests a planner refuses
    a = draw(st.integers(low, 1 << 19))
    b = draw(st.integers(low, 1 << 19))
    policy = draw(st.sampled_from(("reference", "tight", "global")))
    return model, policy, tp, cp, n, min(a, b), max(a, b)


@settings(max_examples=60, deadline=None)
@given(_probe())
def test_the_figure_never_decreases_with_the_length(
    probe: tuple[str, str, int, int, int, int, int],
) -> None:
    model, policy, tp, cp, n, shorter, longer = probe
    a = estimate(model, [shorter] * n, tp=tp, cp=cp, policy=policy, allow_long=True)
    b = estimate(model, [longer] * n, tp=tp, cp=cp, policy=policy, allow_long=True)
    assert a.estimate_bytes <= b.estimate_bytes
    if a.forward_backward_bytes is not None and b.forward_backward_bytes is not None:
        assert a.forward_backward_bytes <= b.forward_backward_bytes


def test_the_chunked_planner_under_cp_is_not_monotone() -> None:
    # why the search guards its answers: two sequences of 43,008 tokens (84 chunks) on
    # two CP ranks hold one sequence per rank, and the next shorter lengths do not
    two = estimate("qwen3-1.7b", [43_008] * 2, cp=2, allow_long=True)
    shorter = estimate("qwen3-1.7b", [43_007] * 2, cp=2, allow_long=True)
    assert two.estimate_bytes < shorter.estimate_bytes
    assert two.busiest_tokens < shorter.busiest_tokens


class _Scripted(_Search):
    """A search whose fitting lengths are given: at most ``fit_to``, and ``dips``."""

    def __init__(self, fit_to: int, dips: set[int]) -> None:
        super().__init__(M17, 1, 1, Pricer(), {}, usable=0)
        self.fit_to, self.dips = fit_to, dips

    def required(self, n: int, length: int) -> int | None:
        self.probes += 1
        need = 0 if length <= self.fit_to or length in self.dips else 1
        self.seen[(n, length)] = None
        return need


def test_the_guard_goes_on_below_a_length_that_fits_alone() -> None:
    # doubling reaches 512 (fits) and 1024 (does not); bisection's first mid, 768,
    # fits alone: the guard finds 767 does not and the search goes on below it
    fit = _longest(_Scripted(700, {768}), 1, 1 << 26)
    assert fit.length == 700 and fit.guard_lowered == 1
    plain = _longest(_Scripted(700, set()), 1, 1 << 26)
    assert plain.length == 700 and plain.guard_lowered == 0


@pytest.mark.parametrize("recompute", ["selective", "none"])
def test_more_cp_never_shortens_the_longest_sequence_on_a_dense_model(recompute: str) -> None:
    # not under full recompute: there the reference's retained activations are the same
    # at every CP size and CP adds the gathered outputs (1.7B on the H200: 567,285
    # tokens at CP 1, 557,064 at CP 2, 4 and 8)
    found = capacity("qwen3-1.7b", device="h200", recompute=recompute)
    by_layout = {(lay.tp, lay.cp): lay for lay in found.layouts}
    for (tp, cp), lay in by_layout.items():
        more = by_layout.get((tp, 2 * cp))
        if more is not None:
            assert (lay.longest_sequence or 0) <= (more.longest_sequence or 0)
            assert lay.pack_tokens <= more.pack_tokens


def test_positions_cap_and_nothing_fits_are_reported() -> None:
    # the harness's step (no head): the 1.7B then fits beyond its positions on an H200
    found = capacity("qwen3-1.7b", device="h200", layouts="1x1", head="hidden")
    single = found.layouts[0].single
    limit = M17.max_position_embeddings
    assert limit is not None and single.length is not None and single.length > limit
    assert single.beyond_positions and found.layouts[0].beyond_positions
    with pytest.raises(InputError, match="max_position_embeddings"):
        estimate("qwen3-1.7b", [single.length])  # what --allow-long lets capacity price
    capped = capacity(M4, device="h200", layouts="1x8", cap=4096)
    assert capped.layouts[0].single.at_cap and capped.layouts[0].longest_sequence == 4096
    tiny = capacity("qwen3.5-27b", device="h100", layouts="1x1", lora_rank=1)
    assert tiny.layouts[0].budget_bytes > 0
    none = capacity("qwen3.5-27b", device_total_bytes=50 * 2**30, layouts="1x1")
    assert none.layouts[0].budget_bytes == 0  # the static memory alone does not fit
    assert none.layouts[0].longest_sequence is None and none.layouts[0].pack_tokens == 0


def test_json_shape() -> None:
    found = capacity(M4, device="h200", layouts="1x1,2x2", pack=3)
    out = json.loads(json.dumps(found.to_dict()))
    assert set(out) >= {
        "model",
        "device",
        "policy",
        "figure",
        "pack",
        "cap",
        "max_position_embeddings",
        "usable_bytes",
        "reserve_bytes",
        "non_torch_bytes",
        "layouts",
        "excluded",
    }
    assert out["device"]["name"] == "h200" and out["pack"] == 3
    lay = out["layouts"][1]
    assert (lay["tp"], lay["cp"], lay["sp"]) == (2, 2, True)
    assert set(lay) == {
        "tp",
        "cp",
        "sp",
        "planner",
        "budget_bytes",
        "static_bytes",
        "step",
        "longest_sequence",
        "pack",
    }
    assert lay["pack"]["sequences"] == 3
    assert lay["pack"]["tokens"] == 3 * lay["pack"]["length"]
    assert lay["budget_bytes"] + lay["static_bytes"] == out["usable_bytes"]


def test_required_prices_what_estimate_prices() -> None:
    found = capacity(M4, device="h200", layouts="2x2", head="logits")
    est = estimate(M4, [30_000], tp=2, cp=2, device="h200", head="logits")
    assert isinstance(found, Capacity)
    assert found.required(2, 2, [30_000]) == est.estimate_bytes


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda: capacity(M4, layouts="1x1"), "device"),
        (lambda: capacity(M4, device="h201"), "device"),
        (lambda: capacity(M4, device="h200", layouts="3x"), "layouts"),
        (lambda: capacity(M4, device="h200", layouts=""), "layouts"),
        (lambda: capacity(M4, device="h200", layouts="0x1"), "layouts"),
        (lambda: capacity(M4, device="h200", tp=2), "tp"),
        (lambda: capacity(M4, device="h200", pack=0), "pack"),
        (lambda: capacity(M4, device="h200", layouts="1x1", figure="forward_backward"), "figure"),
        (lambda: capacity(M4, device="h200", layouts="1x1", figure="both"), "figure"),  # type: ignore[arg-type]
        (lambda: capacity(M4, device="h200", layouts="1x1", policy="nope"), "policy"),
        (lambda: capacity(M4, device="h200", layouts="1x1", lora_rank=0), "lora_rank"),
    ],
)
def test_bad_input_names_the_field(call: object, field: str) -> None:
    with pytest.raises(InputError) as err:
        call()  # type: ignore[operator]
    assert err.value.field == field


def test_parse_layouts() -> None:
    assert parse_layouts("1x1, 2X4,8x1") == [(1, 1), (2, 4), (8, 1)]


def test_cli_table_json_and_errors(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["capacity", "--model", "qwen3.5-4b", "--device", "h200", "--layouts", "1x1,2x2"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    found = capacity(M4, device="h200", layouts="1x1,2x2")
    assert "qwen3.5-4b on h200" in out and "longest sequence" in out
    for lay in found.layouts:
        assert f"{lay.longest_sequence:,}" in out
        assert f"2 x {lay.pack_length:,} = {lay.pack_tokens:,}" in out
    assert cli.main([*argv, "--json", "--recompute", "full"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["recompute"] == "full" and data["plot"] is None
    assert [(lay["tp"], lay["cp"]) for lay in data["layouts"]] == [(1, 1), (2, 2)]
    for bad, field in (
        (["--layouts", "3x"], "layouts"),
        (["--layouts", "1x1", "--pack", "0"], "pack"),
        (["--layouts", "1x1", "--device-total-bytes", "1.5"], "device_total_bytes"),
    ):
        assert cli.main([*argv[:5], *bad]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"cpmem: error: {field}=")
    assert cli.main(["capacity", "--model", "qwen3.5-4b", "--layouts", "1x1"]) == 2
    assert capsys.readouterr().err.startswith("cpmem: error: device=None")


def test_cli_marks_beyond_positions(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["capacity", "--model", "qwen3-1.7b", "--device", "h200", "--layouts", "1x1"]
    assert cli.main([*argv, "--head", "hidden"]) == 0
    out = capsys.readouterr().out
    assert "*: longer than max_position_embeddings (40,960)" in out


def _options(name: str) -> dict[str, argparse.Action]:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {a.option_strings[0]: a for a in sub.choices[name]._actions if a.option_strings}


def test_capacity_flags_have_help_and_match_estimate() -> None:
    capacity_flags, estimate_flags = _options("capacity"), _options("estimate")
    assert all(a.help for flag, a in capacity_flags.items() if flag != "-h")
    for flag, action in capacity_flags.items():
        if flag in estimate_flags and flag not in ("-h", "--device"):
            theirs = estimate_flags[flag]
            assert (action.default, action.choices, action.type) == (
                theirs.default,
                theirs.choices,
                theirs.type,
            ), flag
    # the step settings estimate takes, except the request's, the layout's and the plan's
    not_settings = {
        "--lengths",
        "--shared-prefix",
        "--tp",
        "--cp",
        "--allow-long",
        "--logical-tokens",
        "--packed-tokens",
        "--rank-tokens",
        "--busiest-tokens",
        "--segments",
        "--pp",
        "--vpp",
        "--microbatches",
        "--stage-layers",
        "--first-stage-layers",
        "--last-stage-layers",
        "--microbatch-lengths",
        "--microbatch-file",
    }
    assert set(estimate_flags) - set(capacity_flags) <= not_settings


def test_pipeline_stages_pass_through_to_every_probe() -> None:
    """With --pp the figure is the busiest stage's and the static its own: the answer fits
    as estimate prices the same pipeline step and one token more does not."""
    found = capacity("qwen3.5-27b", device="h200", layouts="1x1", pp=4, microbatches=8)
    (lay,) = found.layouts
    length = lay.longest_sequence
    assert length is not None
    staged = {"pp": 4, "microbatches": 8, "device": "h200"}
    assert _fits("qwen3.5-27b", [length], 1, 1, **staged)
    assert not _fits("qwen3.5-27b", [length + 1], 1, 1, **staged)
    flat = capacity("qwen3.5-27b", device="h200", layouts="1x1").layouts[0]
    assert lay.static_bytes < flat.static_bytes  # a quarter of the layers (and one vocab matrix)
