"""Pipeline stages: the layers each holds, what its schedule keeps in flight, and what
it holds beyond its layers. Expected figures come from the schedule's published facts
(1F1B holds min(pp - s, M) micro-batches on stage s; Megatron-LM's interleaved factor
1 + (pp - 1)/(pp v) on the first stage) and from single-stage estimates priced here."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from cpmem.api import estimate
from cpmem.errors import InputError
from cpmem.pricing.components import Component, retained_bytes
from cpmem.step.pipeline import Pipeline, stage_layer_counts

M4 = "qwen3.5-4b"  # 32 layers, tied embeddings
M17 = "qwen3-1.7b"  # 28 layers
CONTROLS = Path(__file__).resolve().parents[3] / "golden" / "controls" / "controls.csv"


def _recorded_control(control_id: str, policy: str) -> dict[str, str]:
    with CONTROLS.open(newline="", encoding="utf-8") as fh:
        (row,) = (
            r for r in csv.DictReader(fh) if r["control_id"] == control_id and r["policy"] == policy
        )
    return row


@pytest.mark.parametrize("policy", ["reference", "tight"])
@pytest.mark.parametrize("stages", [{}, {"pp": 1, "microbatches": 1}])
def test_one_stage_is_priced_as_the_recorded_cell(policy: str, stages: dict[str, int]) -> None:
    """A step of one stage, named or not, is priced without the pipeline pricer: it
    reproduces the recorded control of the golden cell ``cp:4b-selective:4096+4096``
    (golden/controls/controls.csv, written by ``cpmem gate --record-controls``, not
    computed now), every component included and none of them a pipeline one. The step
    is the cell's: its harness settings (no head, rank-1 adapters, a cold process) and
    its recorded counts, passed explicitly."""
    row = _recorded_control("cell:cp:4b-selective:4096+4096", policy)
    est = estimate(
        M4,
        [int(n) for n in row["lengths"].split("+")],
        shared_prefix=int(row["shared_prefix"]),
        cp=int(row["cp"]),
        packed_tokens=int(row["packed_tokens"]),
        busiest_tokens=4096,  # the cell's recorded retained tokens (golden/cells.csv)
        segments=int(row["grad_segments"]),
        recompute=row["mode"],
        modules=row["modules"],
        compiled=False,
        step="first",
        head="hidden",
        lora_rank=1,
        policy=policy,
        **stages,  # type: ignore[arg-type]
    )
    assert est.estimate_bytes == int(row["estimate_bytes"])
    assert "+".join(str(b) for b in est.per_rank_bytes) == row["per_rank_bytes"]
    assert est.components == json.loads(row["components"])
    fb = row["forward_backward_bytes"]
    assert est.forward_backward_bytes == (int(fb) if fb else None)
    if fb:
        assert est.forward_backward_components == json.loads(row["forward_backward_components"])
    pipeline = {Component.PIPELINE_IN_FLIGHT, Component.PIPELINE_INPUTS, Component.PIPELINE_BUFFERS}
    assert not pipeline & set(est.components) and not est.stage_bytes
    assert est.busiest_stage == 0 and est.pipeline_op == ""


def test_stage_layers_even_first_last_and_explicit() -> None:
    assert Pipeline(4).virtual_layers(32)[1] == range(8, 16)
    assert stage_layer_counts(32, 4, first=5, last=3) == (5, 12, 12, 3)
    assert stage_layer_counts(32, 2, 2, explicit=[20, 12]) == (10, 6, 10, 6)
    assert Pipeline(2, 2, 2, layers=(10, 6, 10, 6)).chunk_layers(32, 1, 1) == range(26, 32)
    for kwargs, field in (
        ({"pp": 3}, "pp"),  # 32 layers do not divide into 3
        ({"pp": 4, "vpp": 3, "microbatches": 4}, "vpp"),
        ({"pp": 1, "vpp": 2}, "vpp"),
        ({"pp": 4, "first_stage_layers": 7, "last_stage_layers": 4}, "first_stage_layers"),
        ({"pp": 2, "stage_layers": [16, 15]}, "stage_layers"),
        ({"pp": 2, "microbatches": 0}, "microbatches"),
        ({"pp": 4, "vpp": 2, "microbatches": 6}, "microbatches"),  # megatron refuses it
    ):
        with pytest.raises(InputError) as err:
            estimate(M4, [4096], **kwargs)  # type: ignore[arg-type]
        assert err.value.field == field, kwargs


@pytest.mark.parametrize("policy", ["reference", "tight"])
def test_1f1b_holds_min_pp_minus_s_microbatches(policy: str) -> None:
    """Stage s's forward peak holds min(pp - s, M) micro-batches: each one in flight
    beyond the current adds what one micro-batch keeps through the stage's 8 of the
    model's 32 layers, a quarter of the whole model's retained bytes (the Qwen3.5-4B's
    stages each hold 6 GDN and 2 attention layers), with the policy's multiplicative
    margin (its margin_factor over the rest of its sum), and the layer input that micro-
    batch's chunk received (4,096 x 2,560 bf16)."""
    pp, m = 4, 8
    harness = {"policy": policy, "head": "hidden"}  # no head: every stage's layers alike
    est = estimate(M4, [4096], pp=pp, microbatches=m, **harness)
    single = estimate(M4, [4096], pp=pp, microbatches=1, **harness)
    whole = estimate(M4, [4096], **harness)
    factor = whole.components["margin_factor"]
    rest = whole.estimate_bytes - factor - whole.components.get("margin_allowance", 0)
    quarter = retained_bytes(whole) / 4 * (1 + factor / rest)
    received = 4096 * 2560 * 2
    assert est.busiest_stage == 0 and est.pipeline_op.endswith(f"{min(pp, m)} in flight")
    for s in (1, 2):  # middle stages: no embedding, no head
        extra = est.stage_bytes[s] - single.stage_bytes[s]
        assert extra == pytest.approx((min(pp - s, m) - 1) * (quarter + received), rel=1e-3)


@pytest.mark.parametrize("cp", [1, 2])
def test_a_later_stage_keeps_each_chunks_received_input(cp: int) -> None:
    """megatron keeps the activation a chunk off the first virtual stage received until
    that chunk's backward sends its gradient back (``input_tensors``): on stage 1 of a
    1F1B pp=4 step, three micro-batches are in flight at its busiest forward, so it holds
    three layer inputs of its rank's rows ([rows, H] bf16; 2,048 rows a rank at CP 2), and
    the first stage (the embedding's) none. Under full recompute the chunk's first
    checkpoint keeps that input as its layer input, so nothing is added."""
    from cpmem.pricing import pipeline
    from cpmem.pricing.registry import price
    from cpmem.step.describe import describe_step

    def stage(s: int, recompute: str) -> dict[str, int]:
        step = describe_step(M4, [4096], cp=cp, pp=4, microbatches=8, recompute=recompute)
        peak = pipeline.stage_peak(
            step, list(step.microbatch_steps), s, lambda x: price(x, "tight")
        )
        return peak.forward_moment.components("forward")

    rows = 4096 // cp
    assert stage(1, "selective")["pipeline_inputs"] == 3 * rows * 2560 * 2
    assert stage(0, "selective")["pipeline_inputs"] == 0
    assert stage(1, "full")["pipeline_inputs"] == 0


def test_interleaving_scales_the_first_stage_as_megatron_lm() -> None:
    """Megatron-LM's theoretical_memory_usage: interleaving scales the first stage's
    activations by 1 + (pp - 1)/(pp v) over pp micro-batches of its layers."""
    pp, v, m = 4, 2, 8
    flat = estimate(M4, [4096], pp=pp, microbatches=m)
    inter = estimate(M4, [4096], pp=pp, vpp=v, microbatches=m)
    kept_flat = flat.components["retained_activations"] + flat.components["pipeline_in_flight"]
    kept_inter = inter.components["retained_activations"] + inter.components["pipeline_in_flight"]
    assert kept_inter / kept_flat == pytest.approx(1 + (pp - 1) / (pp * v), rel=0.02)


def test_uneven_stages_move_the_peak() -> None:
    even = estimate(M4, [4096], pp=4, microbatches=4)
    heavy_first = estimate(M4, [4096], pp=4, microbatches=4, first_stage_layers=14)
    assert heavy_first.stage_bytes[0] > even.stage_bytes[0]
    assert heavy_first.stage_bytes[1] < even.stage_bytes[1]  # 6 layers instead of 8


def test_the_last_stage_holds_the_head() -> None:
    hidden = estimate(M17, [4096], pp=2, microbatches=1, head="hidden")
    logits = estimate(M17, [4096], pp=2, microbatches=1, head="logits")
    assert logits.stage_bytes[0] == hidden.stage_bytes[0]
    whole = estimate(M17, [4096], head="logits")
    assert logits.stage_bytes[1] - hidden.stage_bytes[1] >= whole.head_bytes * 0.9


def test_differing_microbatches_each_have_their_own_plan() -> None:
    """A long micro-batch in flight raises every stage that holds it: the same four
    micro-batches in two orders give the same worst stage figure only if it holds them."""
    short = estimate(M4, pp=2, cp=2, microbatch_requests=[[2048], [2048], [2048]])
    mixed = estimate(M4, pp=2, cp=2, microbatch_requests=[[2048], [8192], [2048]])
    assert mixed.estimate_bytes > short.estimate_bytes
    assert mixed.logical_tokens == 2048  # the step's own request is the first micro-batch
    with pytest.raises(InputError) as err:
        estimate(M4, pp=2, microbatches=3, microbatch_requests=[[1024], [2048]])
    assert err.value.field == "microbatches"


def test_each_stage_holds_its_own_weights() -> None:
    est = estimate("qwen3.5-27b", [4096], pp=4, microbatches=4)  # untied
    from cpmem.pricing.static import static_memory
    from cpmem.step.describe import describe_settings

    settings = describe_settings("qwen3.5-27b", pp=4, microbatches=4)
    stages = [static_memory(settings, stage=s).components["base_weights"] for s in range(4)]
    whole = static_memory(describe_settings("qwen3.5-27b")).components["base_weights"]
    vocab = 248_320 * 5120 * 2
    # the embedding on the first, the output layer and the final norm on the last
    assert stages[3] == stages[0] + 5120 * 2
    assert stages[1] == stages[2] == (whole - 2 * vocab - 5120 * 2) // 4
    assert sum(stages) == whole
    assert est.static is not None and est.static.components["base_weights"] == stages[0]


def test_json_names_the_stages() -> None:
    out = estimate(M4, [4096], pp=2, microbatches=2, policy="tight").to_dict()
    assert out["busiest_stage"] == 0 and len(out["stage_bytes"]) == 2
    assert out["estimate_bytes"] == max(out["stage_bytes"])
    assert len(out["stage_forward_backward_bytes"]) == 2
    # the busiest stage's backward moment, by component (``Estimate`` checks only the
    # forward's sum)
    assert sum(out["forward_backward_components"].values()) == out["forward_backward_bytes"]
