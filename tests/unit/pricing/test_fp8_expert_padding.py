"""FP8's padding of each local expert's rows (``cpmem.pricing.kinds.moe_padding``)
and the selective checkpoints FP8 is priced under that Transformer Engine's checkpoint runs
(``mlp``, ``moe``, ``shared_experts``), on the tiny GPT of Megatron-LM's functional tests
made an MoE: hidden 512, GeLU experts of 1,024 (biases on, no dropout), 8 experts top-2,
EP 2 of 2 GPUs, TP 1, the ``alltoall`` dispatcher, grouped GEMMs, 4 sequences of 1,024
tokens a micro-batch (4,096 tokens), tensorwise FP8.

Hand figures. The rank routes its 4,096 tokens and receives the other EP rank's: under the
concentrated bound min(top-2, 8/2) x 2 sources = 4 rows a token. Megatron-LM 4828d651
``moe/experts.py:295-302, 676-691`` pads each of the 4 local experts' splits to a multiple
of 16 rows (32 under MXFP8: ``fp8_utils.py:168-173``) before fc1 and unpads after fc2, so
every per-row tensor the experts save holds the padded rows. A plain (GeLU) expert row keeps
``H + 3 F_e + 4`` = 3,588 elements in bf16; under FP8 fc1's input (``H``) and fc2's
(``F_e``) are saved at 1 B: 1,536 B a row less.
"""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction
from typing import Any

import pytest

from cpmem.pricing.kinds.moe_padding import grouped_rows
from cpmem.pricing.tight.compose import kept_width, tight_widths
from cpmem.step.fp8 import Fp8
from cpmem.step.recompute import Recompute
from cpmem.step.step import Step
from tests.unit.megatron_lm.tiny import step_of, tiny

MOE = {
    "num_experts": 8,
    "moe_router_topk": 2,
    "moe_ffn_hidden_size": 1024,
    "moe_grouped_gemm": True,
    "expert_model_parallel_size": 2,
    "moe_token_dispatcher_type": "alltoall",
    "fp8": "hybrid",
    "fp8_recipe": "tensorwise",
    "attention_dropout": 0.0,
    "hidden_dropout": 0.0,
}
TOKENS = 4 * 1024


def _step(device: str = "h100", **changes: Any) -> Step:
    return step_of(tiny(**{**MOE, **changes}), world_size=2, device=device)


def _with(step: Step, **settings: Any) -> Step:
    return replace(step, settings=replace(step.settings, **settings))


def expert_padding_rows(step: Step, tp: int, sp: bool) -> Fraction:
    """The rows per token FP8's padding adds to the rank's routed rows."""
    return grouped_rows(step, tp, sp) - step.expert_rows_per_token(tp, sp)


def test_the_bound_pads_every_local_expert_short_of_the_multiple() -> None:
    step = _step()
    assert step.priced_tokens == TOKENS and step.expert_rows_per_token() == 4
    # 16,384 rows over 4 local experts: each split gains at most 15 rows and the padded
    # total is a multiple of 16, so at most 16,444 rounded down to 16,432: 48 rows
    assert expert_padding_rows(step, 1, False) == Fraction(48, TOKENS)
    # MXFP8 pads to 32: at most 16,384 + 4 x 31 = 16,508, rounded down to 16,480: 96
    mx = _step("b200", fp8_recipe="mxfp8")
    assert mx.settings.fp8 == Fp8("mxfp8") and expert_padding_rows(mx, 1, False) == Fraction(
        96, TOKENS
    )
    # no FP8, no padding
    assert expert_padding_rows(_with(step, fp8=None), 1, False) == 0


def test_a_row_count_pads_by_the_bound() -> None:
    # 10,000 rows: at most 10,060 rounded down to a multiple of 16, 10,048: 48 rows
    step = _with(_step(), moe_routing="rows:10000")
    assert expert_padding_rows(step, 1, False) == Fraction(48, TOKENS)


def test_a_capacity_that_fills_every_expert_pads_nothing() -> None:
    # capacity 1: each of the 2 sources keeps ceil(4,096 x 2 / 8) = 1,024 rows an expert,
    # 2,048 an expert at most and 8,192 in all: every expert holds exactly 2,048 = 128 x 16
    step = _with(_step(), moe_routing="capacity:1")
    assert step.expert_rows_per_token(1, False) * TOKENS == 8192
    assert expert_padding_rows(step, 1, False) == 0


@pytest.mark.parametrize("routing", ["balanced", "capacity:1:pad"])
def test_an_exact_share_is_padded_to_the_multiple(routing: str) -> None:
    """1,000 tokens a micro-batch (1 sequence of 1,000): balanced, 1,000 x 2 sources x
    top-2 / 8 experts = 500 rows each of the 4 local experts; capacity 1 with padding,
    each of the 2 sources keeps ceil(1,000 x 2 x 1 / 8) = 250 rows an expert: 500 again.
    500 rows padded to 512: 12 rows an expert, 48 on 1,000 tokens."""
    step = _with(_step(seq_length=1000, micro_batch_size=1), moe_routing=routing)
    assert step.priced_tokens == 1000
    assert expert_padding_rows(step, 1, False) == Fraction(4 * 12, 1000)


def test_a_share_on_the_multiple_is_not_padded() -> None:
    # balanced at 4,096 tokens: 4,096 x 2 x 2 / 8 = 2,048 rows an expert, 128 x 16
    step = _with(_step(), moe_routing="balanced")
    assert expert_padding_rows(step, 1, False) == 0


def test_the_padded_rows_are_in_the_moe_saved_set() -> None:
    """Per token, 4 + 48/4,096 rows: bf16 rows ceil(16,432/4,096 x 3,588) = ceil(14,394.05)
    = 14,395 elements where the unpadded 4 rows keep 14,352; FP8's saved inputs
    -16,432/4,096 x 1,536 B = -6,162 B, -3,081 elements. The MoE saved set under FP8 is
    the bf16 one + 43 - 3,081 = -3,038 elements."""
    step = _step()
    fp8 = tight_widths(step.geometry, step)
    bf16_step = _with(step, fp8=None)
    bf16 = tight_widths(bf16_step.geometry, bf16_step)
    assert fp8.fp8_moe == -3081
    assert fp8.of("moe") - bf16.of("moe") == 14_395 - 14_352 - 3081


def test_a_moe_checkpoint_drops_the_fp8_saved_set_whole() -> None:
    """Under ``moe`` Transformer Engine's checkpoint keeps the layer's input alone (TE
    b9d690e0 ``distributed.py:336-400``): what every layer keeps is its norm's input and
    output, the same with FP8 or without, the FP8 copies and padded rows dropped: 2 x 512
    elements a layer beside its attention's saved set (which tensorwise FP8 leaves as it
    is at TP 1: the QKV input -512 B, the output projection's copy +512 B)."""
    step = _with(_step(), recompute=Recompute.parse("selective", "moe"))
    bf16_step = _with(step, fp8=None)
    kept = kept_width(step.geometry, tight_widths(step.geometry, step), step)
    bf16 = kept_width(bf16_step.geometry, tight_widths(bf16_step.geometry, bf16_step), bf16_step)
    assert kept == bf16
    attention = tight_widths(step.geometry, step).of("attention")
    assert kept == 12 * (attention + 2 * 512)


def test_an_mlp_checkpoint_drops_the_dense_fp8_saved_inputs() -> None:
    """The tiny GPT dense (FFN 2,048), TP 1, tensorwise. Without recompute each layer's
    saved set is FP8's: the attention's QKV input -512 B and the output projection's copy
    +512 B (0), fc1's input -512 B and fc2's -2,048 B: -1,280 elements a layer, 12 layers.
    Under ``mlp`` the MLP keeps its input alone, FP8 or not: the same kept set as bf16."""
    step = step_of(tiny(fp8="hybrid", fp8_recipe="tensorwise"), world_size=1)
    bf16_step = _with(step, fp8=None)

    def kept(s: Step) -> int:
        return kept_width(s.geometry, tight_widths(s.geometry, s), s)

    assert kept(step) - kept(bf16_step) == 12 * -1280
    mlp = Recompute.parse("selective", "mlp")
    assert kept(_with(step, recompute=mlp)) == kept(_with(bf16_step, recompute=mlp))


@pytest.mark.parametrize(("recipe", "delta"), [("tensorwise", -256), ("blockwise", -232)])
def test_a_shared_experts_checkpoint_drops_the_shared_experts_fp8_set(
    recipe: str, delta: int
) -> None:
    """A 1,024-wide shared expert, TP 1: under FP8 fc1's input (the norm output, 512)
    gains a 1 B copy, +512 B, and fc2's input (1,024) loses 1 B an element, -1,024 B:
    -512 B, -256 elements. Blockwise adds the two inputs' fp32 scales, 4 B per 128 rows of
    each column: 4 x 512 / 128 + 4 x 1,024 / 128 = 48 B: -464 B, -232 elements. The
    ``shared_experts`` checkpoint drops the shared expert's saved set with them: FP8 less
    bf16 in what every MoE layer keeps is the rest of the FP8 set (the routed rows')."""
    step = _step(moe_shared_expert_intermediate_size=1024, fp8_recipe=recipe)
    shared = Recompute.parse("selective", "shared_experts")
    on, off = _with(step, recompute=shared), _with(step, recompute=Recompute.parse("none"))

    def kept(s: Step) -> int:
        return kept_width(s.geometry, tight_widths(s.geometry, s), s)

    dropped_fp8 = kept(off) - kept(on)
    dropped_bf16 = kept(_with(off, fp8=None)) - kept(_with(on, fp8=None))
    assert dropped_fp8 - dropped_bf16 == 12 * delta
