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

from cpmem.errors import InputError
from cpmem.megatron.args import parse_megatron_args
from cpmem.pricing.fsdp_units import Tensor
from cpmem.pricing.torch_fsdp2 import (
    Fsdp2Static,
    Units,
    fsdp2_in_flight,
    fsdp2_static,
    gathered,
    padded_shard,
    real_shard,
)
from cpmem.step.torch_fsdp2 import torch_fsdp2_problems
from tests.unit.megatron_lm.tiny import FLAGS, priced, step_of

LAYER = 262_144 + 512 + 1_024 + 786_432 + 1_536 + 1_024 + 1_048_576 + 2_048 + 1_048_576 + 512
VOCAB = 50_304 * 512
EVERY = 8 * LAYER + 2 * VOCAB + 1_024 * 512 + 2 * 512  # layers, table and output, positions, norm
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
    Weights and gradients bf16 (2 B), the fp32 copy, Adam's two fp32 moments and the fp32
    gradient copy 4 + 8 + 4 B on the real elements."""
    args = parse_megatron_args(FSDP2)
    for rank in ("busiest", "last"):
        est = priced(args, world_size=4, rank=rank)
        assert est.static is not None
        static = dict(est.static.components)
        quarter = EVERY // 4
        assert static["weights"] == 2 * quarter == 38_627_840
        assert static["gradient_buffer"] == 2 * quarter
        assert static["optimizer_states"] == 12 * quarter
        assert static["master_gradients"] == 4 * quarter


def test_padding_on_three_ranks() -> None:
    """Over 3 ranks: chunks of ceil(rows / 3). The busiest rank (the first) holds its whole
    chunk of every tensor; the last holds the remainder of each dim 0. Padded elements on
    every rank: per layer 171 x 512 (proj) + 171 (its bias) + 2 x 171 (norm) + 512 x 512
    (qkv, 1536 rows) + 512 (its bias) + 2 x 171 + 683 x 512 (fc1, 2048 rows) + 683 (bias)
    + 171 x 2048 (fc2) + 171 = 1,051,730; the table and the output 16,768 x 512 each
    (50304 rows), the positions 342 x 512 (1024 rows), the final norm 2 x 171."""
    layer = 171 * 512 + 171 + 2 * 171 + 512 * 512 + 512 + 2 * 171 + 683 * 512 + 683
    layer += 171 * 2048 + 171
    padded = 8 * layer + 2 * 16_768 * 512 + 342 * 512 + 2 * 171
    # the last rank's rows: 512 - 342 = 170, 1536 - 1024 = 512, 2048 - 1366 = 682,
    # 50304 - 33536 = 16768, 1024 - 684 = 340
    last_layer = 170 * 512 + 170 + 2 * 170 + 512 * 512 + 512 + 2 * 170 + 682 * 512 + 682
    last_layer += 170 * 2048 + 170
    last = 8 * last_layer + 2 * 16_768 * 512 + 340 * 512 + 2 * 170
    first = priced(parse_megatron_args(FSDP2), world_size=3, rank="busiest").static
    at_last = priced(parse_megatron_args(FSDP2), world_size=3, rank="last").static
    assert first is not None and at_last is not None
    a, b = dict(first.components), dict(at_last.components)
    assert a["weights"] == b["weights"] == 2 * padded
    assert a["gradient_buffer"] == b["gradient_buffer"] == 2 * padded
    assert a["optimizer_states"] == 12 * padded  # the first rank's chunks are all real
    assert b["optimizer_states"] == 12 * last
    assert b["master_gradients"] == 4 * last


def test_in_flight_on_hand_made_units() -> None:
    """Over 2 ranks: the root [6] gathers 6; units [4, 2] (8), [4, 3] (12), [4] (4).
    Forward: R + max(R + 2 x 8, 8 + 2 x 12, 12 + 2 x 4) = 6 + 32; backward: 3R +
    max(3 x 8 + 2 x 6 + 12, 3 x 12 + 2 x 8 + 4, 3 x 4 + 2 x 12 + 0) = 18 + 56."""
    units = Units(
        ((Tensor(8, 2),), (Tensor(12, 3),), (Tensor(4),)),
        (Tensor(6),),
    )
    flight = fsdp2_in_flight(units, 2)
    assert (flight.forward, flight.backward) == (38, 74)
    # over 4 ranks the root's 6 rows gather as 4 x 2 = 8 (two rows of padding)
    assert gathered(units.root, 4) == 8
    # the last of 4 ranks: one row of each unit's 4 (2 + 3 + 1 elements), none of the
    # root's 6 rows (chunks of 2: rows 0-1, 2-3, 4-5); every rank holds 2 + 3 + 1 + 2 padded
    assert fsdp2_static(units, 4, 3) == Fsdp2Static(padded=8, real=6)


def test_the_tiny_gpt_in_flight_on_four_ranks() -> None:
    """The units gathered whole (no padding over 4): the embedding 50304 x 512 +
    1024 x 512, a layer, the output 50304 x 512, the root's norm 1024. The forward's worst
    is the output layer's copy-out after the last layer: R + LAYER + 2 x VOCAB; the
    backward's, the output layer's: 3R + 3 x VOCAB + 2 x LAYER (the last layer gathered
    ahead) + 0; both in bf16."""
    est = priced(parse_megatron_args(FSDP2), world_size=4, rank="busiest")
    root = 1_024
    assert est.components["fsdp_in_flight"] == 2 * (root + LAYER + 2 * VOCAB)
    assert est.forward_backward_components is not None
    fb = est.forward_backward_components["fsdp_in_flight"]
    embedding = VOCAB + 1_024 * 512
    backward = max(3 * VOCAB + 2 * LAYER, 3 * LAYER + 2 * LAYER + VOCAB, 3 * embedding + 2 * root)
    assert fb == 2 * (3 * root + backward)


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
