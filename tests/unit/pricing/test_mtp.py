"""Multi-token prediction (``ModelGeometry.mtp_*``, ``cpmem.pricing.tight.compose.mtp_bytes``):
each depth is one more stack of its layers, its inputs and one more loss head, kept from
its forward until its backward on the stage that holds the head.

The expectations are read off megatron-core's MTP at the recordings' snapshot
(``MultiTokenPredictionLayer._concat_embeddings``: two norms' saved inputs and the
``2H`` concatenation ``eh_proj`` saves; ``process_mtp_loss``: one output layer and
cross entropy per depth, computed before the main loss) and composed from the step's own
terms: a depth's layers keep what the same layer keeps in the stack (the retained
activations of a model one layer deeper), its head what the main head keeps.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from cpmem.api import describe_step, load_model
from cpmem.pricing.components import Component
from cpmem.pricing.registry import price

TOKENS = 2048


def _gpt(depths: int, layers: int = 4):  # type: ignore[no-untyped-def]
    g = load_model("qwen3-1.7b")
    g = replace(g, mixers=g.mixers[:layers], mlps=g.mlps[:layers], name="mtp-gpt")
    if depths:
        g = replace(g, mtp_mixers=("attention",), mtp_mlps=("dense",), mtp_depths=depths)
    return g


def _estimate(depths: int, layers: int = 4, **settings: object):  # type: ignore[no-untyped-def]
    step = describe_step(
        _gpt(depths, layers),
        [TOKENS],
        runtime="megatron-lm",
        training="full",
        attention_backend="flash",
        **settings,  # type: ignore[arg-type]
    )
    return price(step, "tight")


@pytest.mark.parametrize("depths", [1, 2])
def test_a_depth_keeps_one_layer_its_inputs_its_ids_and_one_head(depths: int) -> None:
    plain, deeper, mtp = _estimate(0), _estimate(0, layers=5), _estimate(depths)
    layer = (
        deeper.components[Component.RETAINED_ACTIVATIONS]
        - plain.components[Component.RETAINED_ACTIVATIONS]
    )
    h = plain_hidden = 2048
    # full training, TP 1: enorm's input, eh_proj's 2H concatenation, the main states'
    # copy in the output layer's (1 + D)-token input; bf16
    inputs = 4 * h * 2 * TOKENS
    ids = 8 * TOKENS  # the shifted tokens' int64 ids the embedding saves
    head = plain.components[Component.HEAD_KEPT]
    assert plain_hidden == load_model("qwen3-1.7b").hidden
    assert mtp.components[Component.MTP] == depths * (layer + inputs + ids + head)
    assert mtp.peak_bytes > plain.peak_bytes


def test_the_harness_returning_hidden_states_runs_no_depth() -> None:
    est = _estimate(1, head="hidden")
    assert Component.MTP not in est.components


def test_only_the_stage_holding_the_head_keeps_the_depths() -> None:
    one_stage = _estimate(1, pp=2, microbatches=2)
    plain = _estimate(0, pp=2, microbatches=2)
    assert one_stage.stage_bytes[0] == plain.stage_bytes[0]
    assert one_stage.stage_bytes[1] > plain.stage_bytes[1]


@pytest.mark.parametrize(
    ("training", "tp", "sp", "elements"),
    [
        # LoRA: hnorm's input alone (enorm's input carries no gradient; a frozen eh_proj
        # and output layer keep no input)
        ("lora", 1, False, 2048),
        ("lora", 2, True, 2048 // 2 + (2048 - 2048 // 2)),  # + the gathered view's rest
        ("full", 2, True, 4 * 2048 // 2 + (2048 - 2048 // 2)),
        ("full", 2, False, 4 * 2048),  # no SP: every TP rank holds every token whole
    ],
)
def test_a_depth_keeps_its_inputs_by_training_and_sp(
    training: str, tp: int, sp: bool, elements: int
) -> None:
    """Per token of the rank, the depth's inputs beyond its layer's kept set (which prices
    the layer's input at H/s): under SP the layer's input is a first-dim view of the
    gathered ``eh_proj`` output ``[tokens, H]``, so its input norm keeps H, H - H/s more."""
    lora = {"lora_rank": 16} if training == "lora" else {}

    def parts(depths: int, layers: int = 4):  # type: ignore[no-untyped-def]
        step = describe_step(
            _gpt(depths, layers), [TOKENS], runtime="megatron-lm", training=training,
            attention_backend="flash", tp=tp, sp=sp, head="logits", **lora,
        )  # fmt: skip
        return price(step, "tight").components

    plain, deeper, mtp = parts(0), parts(0, layers=5), parts(1)
    layer = deeper[Component.RETAINED_ACTIVATIONS] - plain[Component.RETAINED_ACTIVATIONS]
    ids, head = 8 * TOKENS, plain[Component.HEAD_KEPT]
    assert mtp[Component.MTP] == layer + 2 * elements * TOKENS + ids + head
