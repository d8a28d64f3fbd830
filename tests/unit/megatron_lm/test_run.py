"""One Megatron-LM run on one rank: parallel sizes, rank coordinates, stage layers,
micro-batches, the model's derived shapes, and the errors that name the field.

Expected values: Megatron-LM's rules at the recordings' snapshot, restated here by hand
(``megatron/core/parallel_state.py``: rank order ``tp-cp-ep-dp-pp``, TP fastest;
``megatron/training/arguments.py:1320-1329``: the FFN default;
``megatron/training/vocab_utils.py``: the vocabulary padded to a multiple of
``make_vocab_size_divisible_by x TP``; ``megatron/core/num_microbatches_calculator.py``:
micro-batches = global / (micro x DP)).
"""

from __future__ import annotations

import itertools

import pytest

from cpmem.errors import InputError
from cpmem.megatron.run import describe_megatron_run
from megatron_lm.tiny import TINY, run_of, tiny


@pytest.mark.parametrize(
    ("world", "tp", "pp", "cp", "dp"),
    [(8, 1, 1, 1, 8), (8, 2, 2, 1, 2), (8, 2, 2, 2, 1), (16, 2, 1, 2, 4), (4, 1, 4, 1, 1)],
)
def test_data_parallel_size_is_world_over_tp_pp_cp(
    world: int, tp: int, pp: int, cp: int, dp: int
) -> None:
    args = tiny(
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, context_parallel_size=cp
    )
    assert run_of(args, world_size=world).dp == dp


def _rank_order(tp: int, cp: int, dp: int, pp: int) -> list[dict[str, int]]:
    """Every global rank's coordinates, enumerated with PP slowest and TP fastest."""
    return [
        {"tp": t, "cp": c, "dp": d, "pp": p}
        for p, d, c, t in itertools.product(range(pp), range(dp), range(cp), range(tp))
    ]


@pytest.mark.parametrize(
    ("world", "tp", "pp", "cp"), [(16, 2, 2, 2), (24, 2, 3, 1), (8, 1, 4, 2), (12, 3, 1, 2)]
)
def test_every_rank_has_its_coordinates_in_tp_cp_dp_pp_order(
    world: int, tp: int, pp: int, cp: int
) -> None:
    args = tiny(
        num_layers=12,
        num_attention_heads=12 if tp == 3 else 8,
        hidden_size=768 if tp == 3 else 512,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        context_parallel_size=cp,
        global_batch_size=None,
    )
    dp = world // (tp * pp * cp)
    order = _rank_order(tp, cp, dp, pp)
    assert len(order) == world
    run = run_of(args, world_size=world, rank=0)
    for rank, expected in enumerate(order):
        on_rank = run.with_rank(rank)
        assert on_rank.coordinates == expected
        # stage_rank is the inverse: the same tp, cp, dp on the given stage
        assert on_rank.stage_rank(expected["pp"]) == rank
    last = run_of(args, world_size=world, rank="last")
    assert last.rank == world - 1
    assert last.coordinates == {"tp": tp - 1, "cp": cp - 1, "dp": dp - 1, "pp": pp - 1}
    assert last.last_stage and (pp == 1 or not last.first_stage)


def test_busiest_is_described_on_the_last_rank() -> None:
    run = run_of(tiny(pipeline_model_parallel_size=4), world_size=8, rank="busiest")
    assert run.rank == 7 and run.rank_asked == "busiest" and run.last_stage


@pytest.mark.parametrize(("tp", "padded"), [(1, 50304), (2, 50432), (4, 50688)])
def test_gpt2_vocabulary_is_padded_to_a_multiple_of_128_tp(tp: int, padded: int) -> None:
    # 50257 rounded up to a multiple of 128*tp: 393*128 = 50304, 197*256 = 50432,
    # 99*512 = 50688
    run = run_of(tiny(tensor_model_parallel_size=tp))
    assert run.vocab == 50257
    assert run.padded_vocab == padded
    assert padded % (128 * tp) == 0 and padded - 128 * tp < 50257 <= padded


def test_a_stated_vocabulary_and_divisor_are_padded_the_same_way() -> None:
    run = run_of(tiny(vocab_size=131073, make_vocab_size_divisible_by=128))
    assert run.padded_vocab == 131200  # 1025 * 128: the 7B memory-speed cases at TP 1
    run = run_of(tiny(vocab_size=1000, make_vocab_size_divisible_by=64))
    assert run.padded_vocab == 1024  # 16 * 64


@pytest.mark.parametrize(
    ("hidden", "swiglu", "ffn"),
    [
        (512, False, 2048),  # 4h
        (512, True, 1344),  # 8*512/3 = 1365.33; /64 = 21.33 -> 21; 21*64 = 1344
        (4096, True, 10880),  # 8*4096/3 = 10922.67; /64 = 170.67 -> 170; 170*64 = 10880
        (768, True, 2048),  # 8*768/3 = 2048; /64 = 32 -> 32*64 = 2048
    ],
)
def test_ffn_default_is_4h_or_swiglus_8h_over_3_rounded_down_to_64(
    hidden: int, swiglu: bool, ffn: int
) -> None:
    run = run_of(tiny(hidden_size=hidden, swiglu=swiglu))
    assert run.ffn == ffn
    assert run.gated is swiglu


def test_a_given_ffn_size_is_kept() -> None:
    assert run_of(tiny(ffn_hidden_size=3000, swiglu=True)).ffn == 3000


@pytest.mark.parametrize(
    ("world", "tp", "pp", "micro", "global_", "expected"),
    [(8, 2, 2, 4, 32, 4), (8, 1, 1, 4, 32, 1), (8, 1, 4, 1, 64, 32), (8, 1, 2, 2, None, 1)],
)
def test_microbatches_are_global_over_micro_times_dp(
    world: int, tp: int, pp: int, micro: int, global_: int | None, expected: int
) -> None:
    args = tiny(
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        micro_batch_size=micro,
        global_batch_size=global_,
    )
    run = run_of(args, world_size=world)
    # 32 / (4 * 2) = 4; 32 / (4 * 8) = 1; 64 / (1 * 2) = 32; no global batch: micro x DP
    assert run.microbatches == expected


def test_a_global_batch_not_divisible_by_micro_times_dp_is_refused() -> None:
    with pytest.raises(InputError):
        run_of(tiny(global_batch_size=30, micro_batch_size=4), world_size=2)


def test_a_sequence_not_divisible_by_twice_cp_is_refused() -> None:
    with pytest.raises(InputError):
        run_of(tiny(context_parallel_size=2, seq_length=1022), world_size=2)


def test_stage_layers_and_virtual_chunks() -> None:
    run = run_of(
        tiny(pipeline_model_parallel_size=4, num_layers_per_virtual_pipeline_stage=1),
        world_size=8,
    )
    # 12 layers / 4 stages = 3 per stage; 12 / (4 * 1) = 3 chunks of 1 layer
    assert (run.stage_layers, run.virtual_chunks, run.chunk_layers) == (3, 3, 1)
    plain = run_of(tiny(pipeline_model_parallel_size=2), world_size=8)
    assert (plain.stage_layers, plain.virtual_chunks, plain.chunk_layers) == (6, 1, 6)


def test_sequence_parallelism_is_off_at_tp_1() -> None:
    # arguments.py:1431-1439: sequence parallelism disabled when TP is 1
    assert not run_of(tiny(sequence_parallel=True)).sp
    assert run_of(tiny(sequence_parallel=True, tensor_model_parallel_size=2)).sp


def test_tokens_of_a_micro_batch_are_split_over_cp() -> None:
    assert run_of(tiny()).tokens == 1024 * 4
    assert run_of(tiny(context_parallel_size=2), world_size=8).tokens == 1024 * 4 // 2


def test_the_attention_backend_priced() -> None:
    assert run_of(tiny()).attention_backend == "unfused"  # auto: the covering one
    assert run_of(tiny(attention_backend="flash")).attention_backend == "flash"
    assert run_of(tiny(), attention_backend="fused").attention_backend == "fused"
    assert run_of(tiny(transformer_impl="local")).attention_backend == "local"


# --- errors name the field --------------------------------------------------------------


@pytest.mark.parametrize("world", [0, -8, 7, 6])
def test_a_bad_world_size_names_the_field(world: int) -> None:
    args = tiny(tensor_model_parallel_size=2, pipeline_model_parallel_size=2)
    with pytest.raises(InputError) as err:
        run_of(args, world_size=world)
    assert err.value.field == "world_size" and err.value.value == world


def test_a_world_size_that_is_not_an_integer_names_the_field() -> None:
    for world in (True, 8.0, "8"):
        with pytest.raises(InputError) as err:
            describe_megatron_run(TINY, world_size=world)  # type: ignore[arg-type]
        assert err.value.field == "world_size"


@pytest.mark.parametrize("rank", [8, -1, "first", "7x", None])
def test_a_bad_rank_names_the_field(rank: object) -> None:
    with pytest.raises(InputError) as err:
        run_of(TINY, world_size=8, rank=rank)  # type: ignore[arg-type]
    assert err.value.field == "rank" and err.value.value == rank


def test_a_rank_given_as_text_is_read() -> None:
    run = run_of(TINY, world_size=8, rank="3")
    assert run.rank == 3 and run.coordinates["dp"] == 3


def test_a_bad_attention_backend_names_the_field() -> None:
    with pytest.raises(InputError) as err:
        run_of(TINY, attention_backend="magic")
    assert (err.value.field, err.value.value) == ("attention_backend", "magic")
    with pytest.raises(InputError) as err:
        run_of(tiny(attention_backend="magic"))
    assert err.value.field == "megatron_args" and "--attention-backend" in str(err.value.value)
    with pytest.raises(InputError) as err:
        run_of(tiny(transformer_impl="local"), attention_backend="flash")
    assert (err.value.field, err.value.value) == ("attention_backend", "flash")


@pytest.mark.parametrize(
    ("changes", "flag"),
    [
        ({"num_layers": 10, "pipeline_model_parallel_size": 4}, "--num-layers"),
        ({"num_attention_heads": 6, "tensor_model_parallel_size": 4}, "--num-attention-heads"),
        ({"bf16": True, "fp16": True}, "--bf16 --fp16"),
        ({"normalization": "BatchNorm"}, "--normalization"),
        ({"recompute_granularity": "full"}, "--recompute-method"),
        ({"hidden_size": 0}, "--hidden-size"),
        (
            {"pipeline_model_parallel_size": 2, "num_layers_per_virtual_pipeline_stage": 4},
            "--num-layers-per-virtual-pipeline-stage",
        ),
    ],
)
def test_inconsistent_arguments_name_the_flag(changes: dict[str, object], flag: str) -> None:
    with pytest.raises(InputError) as err:
        run_of(tiny(**{"global_batch_size": None, **changes}), world_size=8 * 4)
    assert err.value.field == "megatron_args" and str(err.value.value).startswith(flag)
