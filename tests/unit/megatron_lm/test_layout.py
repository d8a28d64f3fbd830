"""The pipeline's layer split (``cpmem.megatron.layout``) against splits counted by hand
from Megatron-LM's rules at the snapshot: ``get_num_layers_to_build``
(``transformer_block.py:76-203``) gives a rank's layers, divided evenly over its virtual
stages, one fewer on the first (last) virtual stage of the first (last) rank where the
embedding (loss) is accounted for; virtual stage ``v`` of rank ``p`` is the
``v * PP + p``-th in the model's order (``transformer_layer.py:65-200``).
"""

from __future__ import annotations

from typing import Any

import pytest

from cpmem.errors import InputError
from cpmem.megatron.args import MegatronArgs, parse_megatron_args
from cpmem.megatron.layout import layout_problems, stage_layer_counts, virtual_pipeline_size

BASE = {
    "--hidden-size": 256,
    "--num-attention-heads": 4,
    "--seq-length": 256,
    "--max-position-embeddings": 256,
    "--micro-batch-size": 1,
}


def _args(**flags: Any) -> MegatronArgs:
    return parse_megatron_args(
        {**BASE, **{"--" + k.replace("_", "-"): v for k, v in flags.items()}}
    )


def _refused(**flags: Any) -> InputError:
    with pytest.raises(InputError) as err:
        _args(**flags)
    return err.value


def test_an_even_split_has_no_counts_and_one_chunk() -> None:
    args = _args(num_layers=16, pipeline_model_parallel_size=4)
    assert stage_layer_counts(args) is None
    assert virtual_pipeline_size(args) is None


def test_virtual_stages_by_count_and_by_layers_per_stage_agree() -> None:
    # 16 layers over 4 ranks: 4 per rank; 2 per virtual stage is 2 virtual stages
    by_count = _args(
        num_layers=16, pipeline_model_parallel_size=4, num_virtual_stages_per_pipeline_rank=2
    )
    by_layers = _args(
        num_layers=16, pipeline_model_parallel_size=4, num_layers_per_virtual_pipeline_stage=2
    )
    assert virtual_pipeline_size(by_count) == virtual_pipeline_size(by_layers) == 2
    # one virtual stage per rank is no interleaving (arguments.py:978-979)
    one = _args(
        num_layers=16, pipeline_model_parallel_size=4, num_virtual_stages_per_pipeline_rank=1
    )
    assert virtual_pipeline_size(one) is None


def test_an_uneven_first_and_last_stage() -> None:
    # 13 layers, PP 4, first 1, last 4: the 2 middle ranks share 8, 4 each
    args = _args(
        num_layers=13,
        pipeline_model_parallel_size=4,
        decoder_first_pipeline_num_layers=1,
        decoder_last_pipeline_num_layers=4,
    )
    assert stage_layer_counts(args) == (1, 4, 4, 4)


def test_an_uneven_last_stage_alone() -> None:
    # 10 layers, PP 3, last 2: ranks 0 and 1 share 8, 4 each
    args = _args(num_layers=10, pipeline_model_parallel_size=3, decoder_last_pipeline_num_layers=2)
    assert stage_layer_counts(args) == (4, 4, 2)


def test_uneven_stages_with_virtual_stages_in_virtual_stage_order() -> None:
    # 16 layers, PP 4, first 2 and last 2, 2 virtual stages: the middle ranks hold 6
    # each, 3 per chunk; ranks 0 and 3 hold 2, 1 per chunk. Order: chunk 0 of ranks
    # 0..3, then chunk 1 of ranks 0..3.
    args = _args(
        num_layers=16,
        pipeline_model_parallel_size=4,
        num_virtual_stages_per_pipeline_rank=2,
        decoder_first_pipeline_num_layers=2,
        decoder_last_pipeline_num_layers=2,
    )
    assert virtual_pipeline_size(args) == 2
    assert stage_layer_counts(args) == (1, 3, 3, 1, 1, 3, 3, 1)


def test_the_embedding_and_loss_counted_as_layers() -> None:
    # 14 layers + embedding + loss = 16 over 4 ranks, 4 each; the embedding takes one
    # from rank 0, the loss one from rank 3
    args = _args(
        num_layers=14,
        pipeline_model_parallel_size=4,
        account_for_embedding_in_pipeline_split=True,
        account_for_loss_in_pipeline_split=True,
    )
    assert stage_layer_counts(args) == (3, 4, 4, 3)


def test_the_embedding_and_loss_counted_with_virtual_stages() -> None:
    # 16 accounted layers, 4 per rank, 2 per chunk; the first chunk of rank 0 and the
    # last chunk of rank 3 lose one each
    by_count = _args(
        num_layers=14,
        pipeline_model_parallel_size=4,
        num_virtual_stages_per_pipeline_rank=2,
        account_for_embedding_in_pipeline_split=True,
        account_for_loss_in_pipeline_split=True,
    )
    assert stage_layer_counts(by_count) == (1, 2, 2, 2, 2, 2, 2, 1)
    # by layers per virtual stage: (14 + 2) / 4 = 4 per rank, 2 per chunk (arguments.py:962-975)
    by_layers = _args(
        num_layers=14,
        pipeline_model_parallel_size=4,
        num_layers_per_virtual_pipeline_stage=2,
        account_for_embedding_in_pipeline_split=True,
        account_for_loss_in_pipeline_split=True,
    )
    assert virtual_pipeline_size(by_layers) == 2
    assert stage_layer_counts(by_layers) == (1, 2, 2, 2, 2, 2, 2, 1)


@pytest.mark.parametrize(
    ("flags", "named", "says"),
    [
        (
            {"num_layers": 14, "pipeline_model_parallel_size": 4},
            "--num-layers 14",
            "does not split evenly over 4 pipeline stages",
        ),
        (
            # 14 + 1 = 15 layers accounted over 4 stages
            {
                "num_layers": 14,
                "pipeline_model_parallel_size": 4,
                "account_for_embedding_in_pipeline_split": True,
            },
            "--num-layers 14",
            "with the embedding or loss accounted (15)",
        ),
        (
            {
                "num_layers": 12,
                "pipeline_model_parallel_size": 4,
                "num_layers_per_virtual_pipeline_stage": 2,
            },
            "--num-layers-per-virtual-pipeline-stage 2",
            "does not divide each pipeline stage's 3 layers",
        ),
        (
            {
                "num_layers": 16,
                "pipeline_model_parallel_size": 4,
                "num_layers_per_virtual_pipeline_stage": 2,
                "num_virtual_stages_per_pipeline_rank": 2,
            },
            "--num-layers-per-virtual-pipeline-stage 2 --num-virtual-stages-per-pipeline-rank 2",
            "no more than one of the two",
        ),
        (
            {
                "num_layers": 16,
                "pipeline_model_parallel_size": 4,
                "num_layers_per_virtual_pipeline_stage": 2,
                "decoder_first_pipeline_num_layers": 2,
            },
            "--num-layers-per-virtual-pipeline-stage 2",
            "give the virtual stages by --num-virtual-stages-per-pipeline-rank",
        ),
        (
            {
                "num_layers": 14,
                "pipeline_model_parallel_size": 4,
                "decoder_first_pipeline_num_layers": 2,
                "decoder_last_pipeline_num_layers": 3,
            },
            "--num-layers 14",
            "leaves 9 middle layers, not divisible by the 2 middle pipeline stages",
        ),
        (
            # PP 2 with both ends given leaves no middle stage for 2 layers
            {
                "num_layers": 6,
                "pipeline_model_parallel_size": 2,
                "decoder_first_pipeline_num_layers": 2,
                "decoder_last_pipeline_num_layers": 2,
            },
            "--num-layers 6",
            "leaves 2 layers for 0 middle pipeline stages",
        ),
        (
            # 11 layers: first 1, last 2, the middle ranks 4 each (2 per chunk)
            {
                "num_layers": 11,
                "pipeline_model_parallel_size": 4,
                "num_virtual_stages_per_pipeline_rank": 2,
                "decoder_first_pipeline_num_layers": 1,
                "decoder_last_pipeline_num_layers": 2,
            },
            "--decoder-first-pipeline-num-layers 1",
            "must be divisible by the virtual pipeline size 2",
        ),
        (
            {
                "num_layers": 8,
                "pipeline_model_parallel_size": 4,
                "decoder_first_pipeline_num_layers": 0,
            },
            "--decoder-first-pipeline-num-layers 0",
            "must be larger than 0",
        ),
        (
            {
                "num_layers": 16,
                "pipeline_model_parallel_size": 4,
                "decoder_first_pipeline_num_layers": 4,
                "account_for_loss_in_pipeline_split": True,
            },
            "--decoder-first/last-pipeline-num-layers with --account-for-*-in-pipeline-split",
            "cannot be set at the same time",
        ),
        (
            {
                "num_layers": 8,
                "pipeline_model_parallel_size": 1,
                "num_virtual_stages_per_pipeline_rank": 2,
            },
            "--pipeline-model-parallel-size 1",
            "needs more than one pipeline stage",
        ),
        (
            {
                "num_layers": 8,
                "pipeline_model_parallel_size": 2,
                "num_virtual_stages_per_pipeline_rank": 2,
                "no_overlap_p2p_communication": True,
            },
            "--pipeline-model-parallel-size 2 --no-overlap-p2p-communication",
            "needs more than two pipeline stages",
        ),
    ],
)
def test_megatron_lms_checks_of_the_split(flags: dict[str, Any], named: str, says: str) -> None:
    err = _refused(**flags)
    assert err.field == "megatron_args"
    assert err.value == named
    assert says in err.reason


def test_a_valid_split_has_no_problems() -> None:
    args = _args(
        num_layers=16,
        pipeline_model_parallel_size=4,
        num_virtual_stages_per_pipeline_rank=2,
        decoder_first_pipeline_num_layers=2,
        decoder_last_pipeline_num_layers=2,
    )
    assert layout_problems(args) == []
