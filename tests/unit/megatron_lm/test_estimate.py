"""A Megatron-LM rank's peak, the busiest stage, the attention backends' spread, and
admission and capacity against a budget.

Expected values: relations the estimate must keep whatever its terms (the peak is the
static bytes plus what a step adds; ``busiest`` is the largest stage priced on its own
rank; the unfused backend keeps the ``s x s`` scores the flash one does not; the
longest sequence that fits is followed by one that does not), checked against the
figures of separately described runs.
"""

from __future__ import annotations

import pytest

from cpmem.errors import InputError
from cpmem.megatron.admission import (
    SEQUENCE_STEP,
    admit_megatron,
    device_peak_budget,
    megatron_capacity,
)
from cpmem.megatron.estimate import price_megatron
from cpmem.megatron.static import static_components
from cpmem.pricing.device_budget import NON_TORCH_BYTES, RESERVE_FRACTION
from megatron_lm.tiny import run_of, tiny

GIB = 1 << 30


def test_the_peak_is_the_static_bytes_plus_what_the_step_adds() -> None:
    run = run_of(tiny(tensor_model_parallel_size=2, pipeline_model_parallel_size=2))
    est = price_megatron(run)
    assert est.stage == 1  # the last rank is on the last stage
    assert est.static_components == static_components(run, 1)
    assert est.static_bytes == sum(static_components(run, 1).values())
    assert est.peak_bytes == est.static_bytes + sum(est.peak_components.values())
    assert est.activation_bytes == est.peak_bytes - est.static_bytes > 0
    # the last stage's peak holds its layers and the head's backward moment
    assert {"layers", "head_backward"} <= set(est.peak_components)


def test_busiest_is_the_stage_with_the_largest_peak() -> None:
    args = tiny(pipeline_model_parallel_size=4, attention_backend="unfused")
    last = run_of(args, world_size=8)
    by_stage = {
        s: price_megatron(run_of(args, world_size=8, rank=last.stage_rank(s))).peak_bytes
        for s in range(4)
    }
    busiest = price_megatron(run_of(args, world_size=8, rank="busiest"))
    assert busiest.peak_bytes == max(by_stage.values())
    assert by_stage[busiest.stage] == busiest.peak_bytes
    # unfused scores: 4 micro-batches in flight on the first stage outweigh the head
    assert busiest.stage != 3 and busiest.peak_bytes > by_stage[3]
    assert busiest.to_dict()["rank"] == last.stage_rank(busiest.stage)


def test_auto_backend_prices_unfused_and_reports_the_flash_figure() -> None:
    args = tiny()  # --attention-backend auto
    est = price_megatron(run_of(args))
    assert est.run.attention_backend == "unfused"
    assert set(est.spread) == {"flash", "unfused"}
    assert est.spread["unfused"] == est.peak_bytes
    assert est.spread["flash"] <= est.spread["unfused"]
    flash = price_megatron(run_of(tiny(attention_backend="flash")))
    assert est.spread["flash"] == flash.peak_bytes
    assert flash.spread == {}  # a named backend has no spread


def test_admission_fits_under_a_large_budget_and_refuses_under_a_small_one() -> None:
    run = run_of(tiny())
    peak = price_megatron(run).peak_bytes
    fit = admit_megatron(run, budget_bytes=peak)
    assert fit.action == "fit" and fit.suggestion is None and fit.budget_source == "given"
    refused = admit_megatron(run, budget_bytes=peak - 1)
    assert refused.action == "refuse"
    assert refused.suggestion is not None and "full recompute" in refused.suggestion
    assert refused.to_dict()["required_bytes"] == peak


def test_the_refusal_says_whether_full_recompute_fits() -> None:
    run = run_of(tiny())
    full = run_of(
        tiny(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    )
    full_peak = price_megatron(full).peak_bytes
    assert full_peak < price_megatron(run).peak_bytes
    decision = admit_megatron(run, budget_bytes=full_peak)
    assert decision.action == "refuse"
    assert decision.suggestion is not None and decision.suggestion.endswith(": fits")
    tiny_budget = admit_megatron(run, budget_bytes=1)
    assert tiny_budget.suggestion is not None
    assert tiny_budget.suggestion.endswith("still does not fit")
    # a run already recomputing fully is refused with nothing to suggest
    assert admit_megatron(full, budget_bytes=1).suggestion is None


def test_the_device_budget_is_total_less_the_reserve_and_non_torch_bytes() -> None:
    run = run_of(tiny(), device="h100")
    total = run.device.total_bytes
    assert device_peak_budget(run) == total - int(RESERVE_FRACTION * total) - NON_TORCH_BYTES
    decision = admit_megatron(run)
    assert decision.budget_bytes == device_peak_budget(run)
    assert decision.budget_source == "device h100"
    assert decision.action == "fit"  # the tiny GPT: a few GiB on an 80 GB device


def test_a_negative_budget_names_the_field() -> None:
    with pytest.raises(InputError) as err:
        admit_megatron(run_of(tiny()), budget_bytes=-1)
    assert err.value.field == "budget_bytes"


def test_capacity_is_the_longest_sequence_that_fits() -> None:
    rope = {"position_embedding_type": "rope", "max_position_embeddings": None}
    run = run_of(tiny(**rope), world_size=8)
    budget = 12 * GIB
    cap = megatron_capacity(run, budget_bytes=budget)
    assert cap.seq_length is not None and cap.seq_length % SEQUENCE_STEP == 0
    assert cap.limit == "the budget"

    def peak(seq: int) -> int:
        return price_megatron(run_of(tiny(**rope, seq_length=seq), world_size=8)).peak_bytes

    assert peak(cap.seq_length) <= budget < peak(cap.seq_length + SEQUENCE_STEP)
    assert cap.estimate is not None and cap.estimate.peak_bytes == peak(cap.seq_length)


def test_capacity_is_bounded_by_the_learned_positions() -> None:
    run = run_of(tiny(), world_size=8)  # 1024 learned positions
    cap = megatron_capacity(run, budget_bytes=1 << 50)
    assert (cap.seq_length, cap.limit) == (1024, "--max-position-embeddings")


def test_capacity_is_none_where_nothing_fits() -> None:
    cap = megatron_capacity(run_of(tiny()), budget_bytes=1)
    assert cap.seq_length is None and cap.estimate is None


def test_the_estimate_as_json_names_static_peak_and_ignored_args() -> None:
    args = tiny(ignored=("--log-interval", "--save"))
    out = price_megatron(run_of(args)).to_dict()
    assert {"static_bytes", "peak_bytes", "ignored_args"} <= set(out)
    assert out["ignored_args"] == ["--log-interval", "--save"]
    assert out["runtime"] == "megatron-lm"
    assert out["layout"] == {"tp": 1, "pp": 1, "cp": 1, "dp": 8, "vp": 1}
    assert out["peak_bytes"] == out["static_bytes"] + out["activation_bytes"]  # type: ignore[operator]
