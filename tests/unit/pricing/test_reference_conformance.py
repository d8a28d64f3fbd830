"""The reference policy reproduces every recorded dense estimate to the byte.

Expected values are the recorded columns of the measured sources; each cell is
priced from its recorded counts alone (an explicit plan), as a runtime would.
"""

from __future__ import annotations

from functools import partial

import pytest
from harness import HARNESS
from raw_sources import read_source

from cpmem.api import describe_step as _describe_step
from cpmem.api import estimate as _estimate
from cpmem.api import load_model
from cpmem.calibration.variant import without_segment_states
from cpmem.plan.layout import ParallelLayout
from cpmem.plan.plan import explicit_plan
from cpmem.pricing.reference import REFERENCE, price_reference
from cpmem.step.recompute import Recompute
from cpmem.step.step import Step

# every figure here is recorded for the calibration harness's step (tests/unit/harness.py)
describe_step = partial(_describe_step, **HARNESS)
estimate = partial(_estimate, **HARNESS)

CP_ROWS = read_source("art_recompute_memory_cp.csv")
TP_ROWS = read_source("art_recompute_memory.csv")
DENSE_TP = [
    r
    for r in TP_ROWS
    if "A3B" not in r["model"] and r["phase"] in ("final", "eager_control", "before_segment_states")
]
NEGATIVE = [r for r in TP_ROWS if r["phase"].endswith("_negative_control")]


def _lengths(row: dict[str, str]) -> list[int]:
    return [int(x) for x in row["lengths"].split("+")]


def _cp_plan(row: dict[str, str]):
    return explicit_plan(
        ParallelLayout(tp=1, cp=2),
        logical_tokens=sum(_lengths(row)),
        packed_tokens=int(row["packed_tokens"]),
        busiest_tokens=int(row["retained_tokens"]),
        grad_segments=int(row["grad_segments"]),
    )


def _tp_segments(row: dict[str, str]) -> int:
    if row["grad_segment_count"]:
        return int(row["grad_segment_count"])
    # Not recorded: a shared pair has prefix + two completions, else one per sequence.
    lengths = _lengths(row)
    return 3 if int(row["packed_tokens"]) < sum(lengths) else len(lengths)


def _tp_inputs(row: dict[str, str]) -> Step:
    layout = ParallelLayout(
        tp=int(row["tp"]), cp=1, sp=row["sequence_parallel"] == "True", ep=int(row["ep"])
    )
    plan = explicit_plan(
        layout,
        logical_tokens=sum(_lengths(row)),
        packed_tokens=int(row["packed_tokens"]),
        grad_segments=_tp_segments(row),
    )
    return describe_step(
        load_model(row["model"]),
        plan=plan,
        tp=layout.tp,
        cp=layout.cp,
        sp=layout.sp,
        ep=layout.ep,
        recompute=row["mode"],
        modules=row["modules"],
        compiled=row["compiled"] == "True",
    )


def test_sources_hold_13_cp_rows_and_43_dense_tp_rows():
    assert len(CP_ROWS) == 13
    assert len(DENSE_TP) == 9 + 7 + 27  # before_segment_states, eager_control, final


@pytest.mark.parametrize("row", CP_ROWS, ids=lambda r: f"{r['case']}:{r['lengths']}")
def test_cp_rows_busiest_rank_estimate(row):
    est = estimate(
        row["model"], plan=_cp_plan(row), cp=2, recompute=row["mode"], modules=row["modules"]
    )
    assert est.estimate_bytes == int(row["estimate_bytes"])
    assert est.busiest_tokens == int(row["retained_tokens"])


@pytest.mark.parametrize("row", CP_ROWS, ids=lambda r: f"{r['case']}:{r['lengths']}")
def test_cp_rows_global_variant(row):
    est = estimate(
        row["model"],
        plan=_cp_plan(row),
        cp=2,
        recompute=row["mode"],
        modules=row["modules"],
        policy="global",
    )
    assert est.estimate_bytes == int(row["old_estimate_bytes"])


@pytest.mark.parametrize(
    "row",
    DENSE_TP,
    ids=lambda r: f"{r['phase']}:{r['model']}:tp{r['tp']}:{r['modules']}:{r['lengths']}",
)
def test_tp_dense_rows(row):
    before_states = row["phase"] == "before_segment_states"
    terms = without_segment_states(REFERENCE) if before_states else REFERENCE
    est = price_reference(_tp_inputs(row), terms, "reference")
    assert est.estimate_bytes == int(row["estimate_bytes"])


@pytest.mark.parametrize("row", NEGATIVE, ids=lambda r: f"{r['phase']}:{r['lengths']}")
def test_negative_controls_are_not_reproduced_and_reference_covers_their_peaks(row):
    est = price_reference(_tp_inputs(row), REFERENCE, "reference")
    recorded, peak = int(row["estimate_bytes"]), int(row["forward_peak_max_bytes"])
    assert recorded < peak, "a negative control's recorded estimate fails to cover"
    assert est.estimate_bytes != recorded
    assert est.estimate_bytes >= peak


def test_check_values_from_pricing_md():
    # pricing.md: "27B features 8,142,848; 4B 2,449,408; 1.7B 1,462,272" and the segment
    # state bytes "27B at TP1: 6,414,336; 4B: 4,292,608".
    from cpmem.pricing.reference import feature_width, layer_widths, segment_state_bytes

    for name, features in (
        ("qwen3.5-27b", 8_142_848),
        ("qwen3.5-4b", 2_449_408),
        ("qwen3-1.7b", 1_462_272),
    ):
        g = load_model(name)
        assert feature_width(g, layer_widths(g, ParallelLayout()), Recompute()) == features
    assert segment_state_bytes(load_model("qwen3.5-27b"), 1) == 6_414_336
    assert segment_state_bytes(load_model("qwen3.5-4b"), 1) == 4_292_608


def test_worked_example_components():
    # pricing.md worked example: 27B CP2 4096+4096 sharing 1228 -> 74,651,231,846 bytes.
    est = estimate("qwen3.5-27b", [4096, 4096], shared_prefix=1228, cp=2)
    assert est.estimate_bytes == 74_651_231_846
    assert est.packed_tokens == 6964 and est.busiest_tokens == 4096
    assert est.components["retained_activations"] == 4096 * 2 * 8_142_848
    assert est.components["segment_states"] == 3 * 48 * 6_414_336
    assert est.components["gathered_outputs"] == 8192 * 5120 * 2
    # the rest of pricing.md's estimate, term by term: the 64 MiB cold allowance, the
    # returned hidden states (logical_tokens x H x b), no legacy-floor excess (6,964 x
    # 5,120 x 2 x clamp(64 // 4 + 4, 4, 16) = 1,140,981,760 is below the floor) and the
    # 10% on the sum
    assert est.components["cold_setup"] == 64 * 2**20
    assert est.components["outputs"] == 8192 * 5120 * 2
    assert est.components["static_floor"] == est.components["profile_floor"] == 0
    floor = 64 * 2**20 + 3 * 48 * 6_414_336 + 4096 * 2 * 8_142_848
    assert floor > 6964 * 5120 * 2 * 16
    before = 2 * 8192 * 5120 * 2 + floor
    assert est.components["margin_factor"] == int(before * 1.10) - before
