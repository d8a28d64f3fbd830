"""The combined 1F1B schedule without pipeline stages (``--overlap-moe-expert-parallel-comm``
with several micro-batches, ``combined_1f1b_schedule_for_no_pipelining``,
combined_1f1b.py:35-137 at 4828d651): each micro-batch's forward runs beside the previous
one's backward, layer by layer (``cpmem.pricing.accumulation``)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from cpmem.gate.megatron_tier import read_case
from cpmem.megatron.describe import describe_megatron
from cpmem.pricing.accumulation import price_accumulation, runs_combined
from cpmem.pricing.components import Component
from cpmem.pricing.estimate import Estimate
from cpmem.pricing.registry import POLICIES, price
from cpmem.step.step import Step

CASE = (
    Path(__file__).parents[3]
    / "golden/megatron/cases/moe/gpt3_mcore_te_tp2_pp1_te_a2a_ovlp_8experts_etp1_ep4"
)
# the case's model_config.yaml: --micro-batch-size 4, --seq-length 1024, --hidden-size 512,
# TP 2 with SP, bf16: one layer input on a rank is 4 x 1024 / 2 rows x 512 x 2 B
LAYER_INPUT = 4 * 1024 // 2 * 512 * 2  # 2,097,152 B


def _case(overlap: bool = True, world: int = 8) -> Step:
    """The a2a_ovlp case as its recordings ran it (8 GPUs: DP 4, GBS 32 / (MBS 4 x DP 4)
    = 2 micro-batches), with or without the overlap."""
    args = read_case(CASE / "model_config.yaml")
    step = describe_megatron(args, world_size=world, device="h100", rank="last")
    runtime = replace(step.settings.runtime, overlap_moe_comm=overlap)
    return replace(step, settings=step.settings.replace(runtime=runtime))


def test_the_case_runs_the_combined_schedule_over_two_microbatches() -> None:
    step = _case()
    assert step.settings.pipeline.microbatches == 2
    assert runs_combined(step)
    assert not runs_combined(_case(overlap=False))


def test_the_next_forward_beside_the_head_backward_adds_one_layer_input() -> None:
    """Every micro-batch here is the same request: the combined step's largest moment is
    micro-batch 1's head backward (its whole forward+backward figure) beside micro-batch
    2's embedding output, one layer input (hand count above); its layer steps (the layers
    below and above as chunks, both transients) stay under it. Without the overlap the
    step is one micro-batch's."""
    combined = price(_case(), "tight")
    apart = price(_case(overlap=False), "tight")
    assert combined.estimate_bytes == apart.estimate_bytes + LAYER_INPUT
    assert combined.forward_backward_bytes == apart.forward_backward_bytes + LAYER_INPUT
    assert combined.components[str(Component.PIPELINE_IN_FLIGHT)] == LAYER_INPUT
    assert any("head backward is the largest moment" in n for n in combined.notes)


def _fake_policy(
    real: Estimate, head: int, per_layer: int, transient: int, heavy: tuple[int, ...] = ()
) -> object:
    """A policy pricing a chunk of layers ``0..n-1`` at ``n x per_layer`` kept (4 x that
    for a layer in ``heavy``) plus one layer's ``transient`` (forward and forward+backward
    alike), and the whole model (its head on) at ``head`` more: figures chosen by hand."""

    def fn(step: Step) -> Estimate:
        n = step.geometry.layers
        whole = not step.settings.geometry.pipeline_chunk
        kept = n * per_layer + sum(3 * per_layer for j in heavy if j < n)
        total = kept + transient + (head if whole else 0)
        comps = {str(Component.RETAINED_ACTIVATIONS): total}
        return replace(
            real,
            estimate_bytes=total,
            components=comps,
            per_rank_bytes=(total,) * len(real.per_rank_bytes),
            forward_backward_bytes=total,
            forward_backward_components=comps,
            layers_backward_bytes=kept + transient,  # the layers' moment: no head
        )

    return fn


@pytest.mark.parametrize("head", [0, 10**9])
def test_the_layer_steps_hold_one_layer_more_and_both_transients(head: int) -> None:
    """With L layers of ``p`` kept bytes and a transient ``t`` each, layer step ``k`` holds
    micro-batch 1's layers 0..L-1-k (``(L-k) p + t``) and a layer input arriving, beside
    micro-batch 2's layers 0..k (``(k+1) p + t``) and a layer input passed on: ``(L+1) p +
    2t + 2 x input`` at every ``k``. The head's moments are ``L p + t + head + input``:
    the larger of the two stands."""
    step = _case()
    real = POLICIES["tight"](step)
    n, p, t = step.geometry.layers, 100 * 2**20, 30 * 2**20
    est = price_accumulation(step, _fake_policy(real, head, p, t))  # type: ignore[arg-type]
    layers = (n + 1) * p + 2 * t + 2 * LAYER_INPUT
    at_head = n * p + t + head + LAYER_INPUT
    assert est.estimate_bytes == max(layers, at_head)
    assert est.forward_backward_bytes == max(layers, at_head)
    assert est.layers_backward_bytes == layers
    assert sum(est.components.values()) == est.estimate_bytes
    which = "layers" if layers > at_head else "head backward"
    assert any(f"{which} is the largest moment" in n for n in est.notes)


def test_the_layer_steps_pair_each_forward_layer_with_its_backward_partner() -> None:
    """Layers 5 and 6 of 12 keep 4 x ``p``: step ``k`` holds micro-batch 1's layers 0..11-k
    and micro-batch 2's 0..k, so at ``k`` = 5 (1's 0..6, 2's 0..5) and ``k`` = 6 three
    heavy layers are live, at ``k`` = 0 two: ``13 p + 3 x 3p + 2t + 2 x input``."""
    step = _case()
    real = POLICIES["tight"](step)
    p, t = 100 * 2**20, 30 * 2**20
    fn = _fake_policy(real, 0, p, t, heavy=(5, 6))
    est = price_accumulation(step, fn)  # type: ignore[arg-type]
    assert est.estimate_bytes == 13 * p + 9 * p + 2 * t + 2 * LAYER_INPUT
