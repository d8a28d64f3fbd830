"""Torch FSDP2 (``cpmem.pricing.torch_fsdp2``, the step's ``fsdp`` ``torch_fsdp2``): each
figure worked out by hand from PyTorch's ``fully_shard`` (``_fsdp_param.py``,
``_fsdp_collectives.py``, ``_fsdp_param_group.py``, torch 2.13) and Megatron-LM's
``TorchFullyShardedDataParallel`` at 4828d651 (the sharding rule is also held against
``fully_shard`` itself: tests/oracle/test_torch_fsdp2_sharding.py).

The model is the rule tests' tiny GPT (``tiny.FLAGS``: 8 layers, hidden 512, 8 heads, ffn
2048, LayerNorm, linear biases, 1024 learned positions, GPT-2's 50257 tokens padded to a
multiple of 128: 50304), untied, bf16, TP 1. A layer on the Transformer Engine spec:
linear_proj [512, 512] = 262,144 and its bias 512; linear_qkv's fused norm 512 + 512, its
weight [1536, 512] = 786,432 and bias 1536; fc1's fused norm 512 + 512, fc1 [2048, 512] =
1,048,576 and bias 2048; fc2 [512, 2048] = 1,048,576 and bias 512: 3,152,384 elements.
"""

from __future__ import annotations

import pytest

from cpmem.api import describe_step
from cpmem.errors import InputError
from cpmem.megatron.args import parse_megatron_args
from cpmem.pricing.fsdp_units import Tensor
from cpmem.pricing.torch_fsdp2 import (
    Fsdp2Static,
    Units,
    fsdp2_in_flight,
    fsdp2_static,
    gathered,
    gradient_excess,
    padded_shard,
    real_shard,
)
from cpmem.step.torch_fsdp2 import torch_fsdp2_problems
from tests.unit.megatron_lm.tiny import FLAGS, priced, step_of

LAYER = 262_144 + 512 + 1_024 + 786_432 + 1_536 + 1_024 + 1_048_576 + 2_048 + 1_048_576 + 512
VOCAB = 50_304 * 512
EVERY = 8 * LAYER + 2 * VOCAB + 1_024 * 512 + 2 * 512  # layers, table and output, positions, norm
# Over 3 ranks, chunks of ceil(rows / 3) (the docstring of test_padding_on_three_ranks)
LAYER_3 = 171 * 512 + 171 + 2 * 171 + 512 * 512 + 512 + 2 * 171 + 683 * 512 + 683
LAYER_3 += 171 * 2048 + 171
PADDED_3 = 8 * LAYER_3 + 2 * 16_768 * 512 + 342 * 512 + 2 * 171
# the last rank's rows: 512 - 342 = 170, 1536 - 1024 = 512, 2048 - 1366 = 682,
# 50304 - 33536 = 16768, 1024 - 684 = 340
LAST_LAYER_3 = 170 * 512 + 170 + 2 * 170 + 512 * 512 + 512 + 2 * 170 + 682 * 512 + 682
LAST_LAYER_3 += 170 * 2048 + 170
LAST_3 = 8 * LAST_LAYER_3 + 2 * 16_768 * 512 + 340 * 512 + 2 * 170
FSDP2 = {
    **FLAGS,
    "--bf16": True,
    "--use-torch-fsdp2": True,
    "--no-gradient-accumulation-fusion": True,
    "--untie-embeddings-and-output-weights": True,
}


def test_the_layer_and_the_model_add_up() -> None:
    assert LAYER == 3_152_384
    assert EVERY == 77_255_680


def test_a_chunk_is_ceil_rows_over_ranks_and_the_last_ranks_hold_fewer() -> None:
    fc2 = Tensor(512 * 2048, 2048)  # [512, 2048] over 3 ranks: chunks of ceil(512/3) = 171 rows
    assert padded_shard(fc2, 3) == 171 * 2048
    assert [real_shard(fc2, 3, r) for r in range(3)] == [171 * 2048, 171 * 2048, 170 * 2048]
    gate = Tensor(512, 512)  # [1, 512] over 4 ranks: one row on the first, none after
    assert padded_shard(gate, 4) == 512
    assert [real_shard(gate, 4, r) for r in range(4)] == [512, 0, 0, 0]
    assert gathered([fc2], 3) == 3 * 171 * 2048  # the flat all-gather buffer, padding included


def test_the_tiny_gpt_static_on_four_ranks() -> None:
    """Every dim 0 divides by 4: each rank holds a quarter of every tensor, no padding.
    As a step leaves it: weights bf16 (2 B), the fp32 copy, Adam's two fp32 moments and
    the fp32 gradient copy 4 + 8 + 4 B on the real elements; the bf16 gradients freed as
    they are copied (optimizer.py:914-919), so no gradient buffer."""
    args = parse_megatron_args(FSDP2)
    for rank in ("busiest", "last"):
        est = priced(args, world_size=4, rank=rank)
        assert est.static is not None
        static = dict(est.static.components)
        quarter = EVERY // 4
        assert static["weights"] == 2 * quarter == 38_627_840
        assert "gradient_buffer" not in static
        assert static["optimizer_states"] == 12 * quarter
        assert static["master_gradients"] == 4 * quarter


def test_fp32_parameters_keep_their_gradients_and_no_copy() -> None:
    """Without --bf16 the FP32Optimizer steps the parameters and their fp32 gradients
    as they are: weights and gradients 4 B on the chunks, Adam's moments 8 B, no copy."""
    args = parse_megatron_args({k: v for k, v in FSDP2.items() if k != "--bf16"})
    est = priced(args, world_size=4, rank="busiest")
    assert est.static is not None
    static = dict(est.static.components)
    quarter = EVERY // 4
    assert static["weights"] == static["gradient_buffer"] == 4 * quarter
    assert static["optimizer_states"] == 8 * quarter
    assert "master_gradients" not in static
    # over 3 ranks the last keeps its padded gradient chunks, its moments on its real rows
    last = priced(args, world_size=3, rank="last").static
    assert last is not None
    assert dict(last.components)["gradient_buffer"] == 4 * PADDED_3
    assert dict(last.components)["optimizer_states"] == 8 * LAST_3


def test_padding_on_three_ranks() -> None:
    """Over 3 ranks: chunks of ceil(rows / 3). The busiest rank (the first) holds its whole
    chunk of every tensor; the last holds the remainder of each dim 0. Padded elements on
    every rank: per layer 171 x 512 (proj) + 171 (its bias) + 2 x 171 (norm) + 512 x 512
    (qkv, 1536 rows) + 512 (its bias) + 2 x 171 + 683 x 512 (fc1, 2048 rows) + 683 (bias)
    + 171 x 2048 (fc2) + 171 = 1,051,821; the table and the output 16,768 x 512 each
    (50304 rows), the positions 342 x 512 (1024 rows), the final norm 2 x 171."""
    assert LAYER_3 == 1_051_821
    first = priced(parse_megatron_args(FSDP2), world_size=3, rank="busiest").static
    at_last = priced(parse_megatron_args(FSDP2), world_size=3, rank="last").static
    assert first is not None and at_last is not None
    a, b = dict(first.components), dict(at_last.components)
    assert a["weights"] == b["weights"] == 2 * PADDED_3
    assert a["optimizer_states"] == 12 * PADDED_3  # the first rank's chunks are all real
    assert b["optimizer_states"] == 12 * LAST_3
    assert b["master_gradients"] == 4 * LAST_3


def test_in_flight_on_hand_made_units() -> None:
    """Over 2 ranks: the root [6] gathers 6; units [4, 2] (8), [4, 3] (12), [4] (4).
    Forward: R + max(max(6, 8) + 8, max(8, 12) + 12, max(12, 4) + 4) = 6 + 24; backward:
    3R + max(2 x 8 + 6 + 12, 2 x 12 + 8 + 4, 2 x 4 + 12 + 0) = 18 + 36."""
    units = Units(
        ((Tensor(8, 2),), (Tensor(12, 3),), (Tensor(4),)),
        (Tensor(6),),
    )
    flight = fsdp2_in_flight(units, 2)
    assert (flight.forward, flight.backward) == (30, 54)
    # over 4 ranks the root's 6 rows gather as 4 x 2 = 8 (two rows of padding)
    assert gathered(units.root, 4) == 8
    # the last of 4 ranks: one row of each unit's 4 (2 + 3 + 1 elements), none of the
    # root's 6 rows (chunks of 2: rows 0-1, 2-3, 4-5); every rank holds 2 + 3 + 1 + 2 padded
    assert fsdp2_static(units, 4, 3) == Fsdp2Static(padded=8, real=6)
    # the bf16 gradients (2 x 8) never outgrow the last rank's fp32 copies (4 x 6)
    assert gradient_excess(units, 4, 2, 4) == 0


def test_gradients_can_outgrow_their_copies_on_the_last_rank() -> None:
    """A [1, 512] gate over 4 ranks: every rank keeps a padded 512-element chunk (2 B a
    gradient element: 1,024 B), the last holds no real row, so no fp32 copy: 1,024 B in
    flight; none where gradients are fp32 and not copied."""
    units = Units(((Tensor(512, 512),),), ())
    assert gradient_excess(units, 4, 2, 4) == 1_024
    assert gradient_excess(units, 4, 4, 0) == 0


def test_the_tiny_gpt_in_flight_on_four_ranks() -> None:
    """The units gathered whole (no padding over 4): the embedding E = 50304 x 512 +
    1024 x 512, a layer L, the output V = 50304 x 512, the root's norm R = 1024. The
    forward's worst is the embedding's copy-out, its flat buffer beside its copy: R + 2E
    (the output's, R + 2V, is smaller); the backward's, the embedding's: 3R + 2E + R (the
    root before it) + L (the first layer's reduce-scatter input kept), above the output's
    2V + L and the layers' 3L + V and 3L + E; both in bf16."""
    est = priced(parse_megatron_args(FSDP2), world_size=4, rank="busiest")
    root, embedding = 1_024, VOCAB + 1_024 * 512
    assert est.components["fsdp_in_flight"] == 2 * (root + 2 * embedding)
    assert est.forward_backward_components is not None
    fb = est.forward_backward_components["fsdp_in_flight"]
    assert fb == 2 * (3 * root + 2 * embedding + root + LAYER)


@pytest.mark.parametrize(
    ("overrides", "field", "says"),
    [
        ({"distributed_optimizer": True}, "distributed_optimizer", "arguments.py:980-981"),
        ({"optimizer": "muon"}, "fsdp", "emerging optimizer does not support Torch-FSDP2"),
        ({"grad_bytes": 4}, "grad_bytes", "reduces gradients in the parameters' dtype"),
        ({"fsdp_buffers": "double-buffer"}, "fsdp_buffers", "double buffer"),
    ],
)
def test_the_step_refuses_what_it_does_not_price(
    overrides: dict[str, object], field: str, says: str
) -> None:
    with pytest.raises(InputError) as err:
        step_of(parse_megatron_args(FSDP2), world_size=4, **overrides)
    assert err.value.field == field and says in err.value.reason


def test_tied_embeddings_are_refused_at_the_step() -> None:
    untied = {k: v for k, v in FSDP2.items() if k != "--untie-embeddings-and-output-weights"}
    args = parse_megatron_args({**untied, "--use-torch-fsdp2": False})
    with pytest.raises(InputError) as err:
        step_of(args, world_size=4, fsdp="torch_fsdp2", grad_bytes=2)
    assert "requires --untie-embeddings-and-output-weights" in err.value.reason


def test_expert_parallelism_and_a_wider_gradient_are_listed_together() -> None:
    g = step_of(parse_megatron_args(FSDP2), world_size=4).geometry
    problems = torch_fsdp2_problems(g, ep=2, grad_bytes=4, dtype_bytes=2, fp8=None)
    assert [(p.field, p.value) for p in problems] == [("ep", 2), ("grad_bytes", 4)]
    assert "not supported with expert parallelism (arguments.py:978-979)" in problems[0].reason


def test_on_1024_ranks_the_gradients_outgrow_the_last_ranks_copies() -> None:
    """Over 1024 ranks most tensors' rows run out before the last rank. Per layer,
    (rows, row): proj (512, 512) a 1-row chunk, 512 padded, none real on the last rank;
    its bias and the four norm vectors 1 each, none real; qkv (1536, 512) 2 rows: 1,024,
    none (1536 < 2046); its bias 2, none; fc1 (2048, 512) 2 rows: 1,024, the last 2 rows
    real (2048 - 2046); its bias 2, 2 real; fc2 (512, 2048) 1 row: 2,048, none; its bias 1:
    4,618 padded, 1,026 real. The table and the output (50304, 512): 50-row chunks, 25,600
    each, none real (50304 < 51150); the positions (1024, 512): 512, one row real; the final
    norm 1 + 1. Padded 8 x 4,618 + 2 x 25,600 + 512 + 2 = 88,658; the last rank's real
    8 x 1,026 + 512 = 8,720. Its bf16 gradients outgrow its fp32 copies by
    2 x 88,658 - 4 x 8,720 = 142,436 B, in flight on every rank. Gathered: the embedding
    1024 x (25,600 + 512) = 26,738,688, a layer 1024 x 4,618, the output 1024 x 25,600,
    the root 2,048; the forward's worst is the embedding's copy-out: 2,048 + 2 x
    26,738,688 = 53,479,424 elements, 2 B each."""
    for rank in ("busiest", "last"):
        est = priced(parse_megatron_args(FSDP2), world_size=1024, rank=rank)
        assert est.components["fsdp_in_flight"] == 2 * 53_479_424 + 142_436
    assert est.static is not None
    static = dict(est.static.components)
    assert static["weights"] == 2 * 88_658
    assert static["master_gradients"] == 4 * 8_720


def test_a_runtime_with_gradient_accumulation_fusion_is_refused() -> None:
    """The step's own runtime fuses gradient accumulation unless told otherwise; Megatron-LM
    rejects it beside Torch FSDP2. The bf16 model's gradient element defaults to its own
    2 B under Torch FSDP2 (not refused on that)."""
    with pytest.raises(InputError) as err:
        describe_step("olmo-2-7b", [4096], training="full", fsdp="torch_fsdp2", dp=8, device="h100")
    assert err.value.field == "fsdp"
    assert "rejects gradient accumulation fusion beside Torch FSDP2" in err.value.reason
    assert "grad_bytes" not in str(err.value)


def test_the_answer_names_the_whole_model_built_before_it_is_sharded() -> None:
    """Megatron-LM builds the model on the GPU in bf16 before fully_shard shards it
    (training.py:1796-1802): every element of the tiny GPT, 2 B each, outside the figure."""
    est = priced(parse_megatron_args(FSDP2), world_size=4)
    (note,) = [n for n in est.notes if n.startswith("fsdp=torch_fsdp2")]
    assert f"({2 * EVERY:,} B of weights at start-up" in note
    assert note.endswith("not in this figure")
