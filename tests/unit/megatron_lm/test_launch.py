"""A run read from its launch script or command line (``cpmem.megatron.launch``,
``read_megatron_args``): the ``pretrain_*.py`` flags, torchrun's world, what the script
leaves to its caller, and ``--world-size`` / ``--vocab-size`` given beside it.

World sizes are torchrun's: ``--nproc_per_node`` processes on each of ``--nnodes``
nodes, one and one where not given (``torch/distributed/run.py``); expected values are
those products worked out by hand.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cpmem.api import describe_megatron
from cpmem.errors import InputError
from cpmem.megatron.args import read_megatron_args
from cpmem.megatron.launch import is_script

MODEL = (
    "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 128 "
    "--max-position-embeddings 128 --micro-batch-size 1 --global-batch-size 16 --bf16"
)


def _script(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "train.sh"
    path.write_text(text, encoding="utf-8")
    return path


def test_an_example_shaped_script_is_read_with_its_world(tmp_path: Path) -> None:
    path = _script(
        tmp_path,
        "#!/bin/bash\n"
        "export CUDA_DEVICE_MAX_CONNECTIONS=1\n"
        'GPUS_PER_NODE=8\nNNODES=${SLURM_NNODES:-"2"}\n'
        "DISTRIBUTED_ARGS=(\n  --nproc_per_node $GPUS_PER_NODE\n  --nnodes $NNODES\n"
        "  --node_rank ${RANK:-0}\n  --master_addr ${MASTER_ADDR:-localhost}\n)\n"
        "LAYERS=2\n"
        "MODEL_ARGS=(\n  --num-layers $LAYERS\n  --hidden-size $((32 * 2))\n"
        "  --num-attention-heads 4 --seq-length 128 --max-position-embeddings 128\n)\n"
        "TRAINING_ARGS=(--micro-batch-size 1 --global-batch-size 16 --bf16 --save $1)\n"
        "torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py \\\n"
        "    ${MODEL_ARGS[@]} \\\n    ${TRAINING_ARGS[@]}\n",
    )
    args = read_megatron_args(path)
    assert (args.num_layers, args.hidden_size, args.global_batch_size) == (2, 64, 16)
    assert args.world_size == 16  # 8 per node x 2 nodes
    assert args.env == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    # --save $1 is left to the caller and changes nothing priced: read as ignored
    assert "--save" in args.ignored and "--save" in args.left_to_caller


@pytest.mark.parametrize(
    ("launcher", "world"),
    [
        ("torchrun --nproc-per-node=4 --nnodes=3", 12),
        ("python -m torch.distributed.run --nproc_per_node 2", 2),
        ("torchrun --standalone", 1),  # torchrun's defaults: 1 process, 1 node
        ("torchrun --nnodes 2:2 --nproc_per_node 8 --rdzv_backend c10d", 16),
    ],
)
def test_torchruns_flags_give_the_world(tmp_path: Path, launcher: str, world: int) -> None:
    path = _script(tmp_path, f"{launcher} pretrain_gpt.py {MODEL}\n")
    assert read_megatron_args(path).world_size == world


def test_a_pasted_command_line_is_read_in_place_of_a_file() -> None:
    args = read_megatron_args(f"torchrun --nproc_per_node 4 pretrain_gpt.py {MODEL}")
    assert args.world_size == 4 and args.hidden_size == 64
    assert read_megatron_args(MODEL).hidden_size == 64  # flags pasted alone
    with pytest.raises(InputError) as err:  # a missing file with a blank in its name
        read_megatron_args("my runs/flags.txt")
    assert "cannot be read" in err.value.reason


@pytest.mark.parametrize(
    ("launcher", "reason"),
    [
        ("python", "runs it with no torchrun launcher"),
        ("torchrun --nproc_per_node gpu", "--nproc_per_node gpu is not a count of processes"),
        ("torchrun --nnodes 1:4", "--nnodes 1:4 is an elastic range"),
        ("torchrun --nproc_per_node $GPUS", "--nproc_per_node is left to the script's caller"),
    ],
)
def test_a_world_the_launch_does_not_give_is_asked_for(
    tmp_path: Path, launcher: str, reason: str
) -> None:
    path = _script(tmp_path, f"{launcher} pretrain_gpt.py {MODEL}\n")
    with pytest.raises(InputError) as err:
        read_megatron_args(path, require_world=True)
    assert err.value.value == "--world-size" and reason in err.value.reason
    assert read_megatron_args(path, world_size=24, require_world=True).world_size == 24


def test_world_size_given_beside_replaces_the_launchers(tmp_path: Path) -> None:
    path = _script(tmp_path, f"torchrun --nproc_per_node 8 pretrain_gpt.py {MODEL}\n")
    assert read_megatron_args(path, world_size=64).world_size == 64


def test_a_priced_flag_left_to_the_caller_is_named_with_every_other_problem(
    tmp_path: Path,
) -> None:
    path = _script(
        tmp_path,
        "HIDDEN=$2\n"
        "torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 2 --hidden-size $HIDDEN "
        "--num-attention-heads 4 --seq-length 128 --max-position-embeddings 128 "
        "--micro-batch-size 1 --fp4-format e2m1 --data-path $DATA\n",
    )
    with pytest.raises(InputError) as err:
        read_megatron_args(path)
    # one refusal: the unset priced flag (named through its variable) and the refused flag;
    # the unset data path changes nothing priced and is not named
    assert err.value.value == "--hidden-size $2, --fp4-format e2m1"
    assert "$HIDDEN = $2 (the script's argument 2, left to its caller)" in err.value.reason
    assert "is required" not in err.value.reason


def test_vocab_size_given_beside_replaces_the_arguments(tmp_path: Path) -> None:
    path = _script(
        tmp_path,
        f"torchrun pretrain_gpt.py {MODEL} --tokenizer-type NullTokenizer --vocab-size 1000\n",
    )
    assert read_megatron_args(path).vocab_size == 1000
    assert read_megatron_args(path, vocab_size=32_000).vocab_size == 32_000


def test_vocab_size_beside_gpt2s_bpe_is_refused_not_dropped(tmp_path: Path) -> None:
    path = _script(tmp_path, f"torchrun pretrain_gpt.py {MODEL}\n")
    with pytest.raises(InputError) as err:
        read_megatron_args(path, vocab_size=32_000)
    assert err.value.value == "--vocab-size 32000"
    assert "GPT2BPETokenizer reports the GPT-2 files' 50,257 tokens" in err.value.reason


def test_a_command_handed_to_a_scheduler_is_read_from_its_variable(tmp_path: Path) -> None:
    path = _script(
        tmp_path,
        f"ARGS=({MODEL})\n"
        'CMD="\ncd /megatron;\npython /megatron/pretrain_gpt.py ${ARGS[@]}"\n'
        'sbatch <<EOF\n#!/bin/bash\nsrun bash -c "${CMD}"\nEOF\n',
    )
    args = read_megatron_args(path, world_size=16)
    assert (args.hidden_size, args.world_size) == (64, 16)


def test_a_message_naming_the_script_is_not_a_second_run(tmp_path: Path) -> None:
    path = _script(
        tmp_path,
        f'echo "starting" pretrain_gpt.py\ntorchrun --nproc_per_node 2 pretrain_gpt.py {MODEL}\n',
    )
    assert read_megatron_args(path).world_size == 2


def test_layout_given_beside_is_the_scripts_before_the_world_is_checked(tmp_path: Path) -> None:
    """TP 2 x PP 4 on torchrun's 2 GPUs: Megatron-LM's replica rule refuses it; with
    --pp 1 given beside, TP 2 x PP 1 holds the 2 GPUs as one replica (DP 1)."""
    path = _script(
        tmp_path,
        f"torchrun --nproc_per_node 2 pretrain_gpt.py {MODEL} "
        "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 4\n",
    )
    with pytest.raises(InputError) as err:
        describe_megatron(path)
    assert "TP x PP x CP = 2 x 4 x 1 = 8" in err.value.reason
    step = describe_megatron(path, pp=1)
    assert (step.settings.pipeline.pp, step.settings.layout.dp) == (1, 1)


def test_a_virtual_pipeline_size_beside_replaces_the_layers_per_virtual_stage(
    tmp_path: Path,
) -> None:
    """8 layers on PP 2 with 2 layers per virtual stage is VP 2; --vpp 4 given beside
    replaces it (1 layer per virtual stage), not a second, conflicting setting."""
    path = _script(
        tmp_path,
        "torchrun --nproc_per_node 2 pretrain_gpt.py --num-layers 8 --hidden-size 64 "
        "--num-attention-heads 4 --seq-length 128 --max-position-embeddings 128 "
        "--micro-batch-size 1 --global-batch-size 8 --bf16 "
        "--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 2\n",
    )
    assert describe_megatron(path).settings.pipeline.vpp == 2  # 8 / (2 x 2)
    assert describe_megatron(path, vpp=4).settings.pipeline.vpp == 4


def test_a_script_that_runs_no_training_is_refused(tmp_path: Path) -> None:
    path = _script(tmp_path, "X=1\npython tools/preprocess_data.py --input x\n")
    with pytest.raises(InputError) as err:
        read_megatron_args(path)
    assert "runs no pretrain_*.py" in err.value.reason


def test_another_training_script_is_refused_by_name(tmp_path: Path) -> None:
    path = _script(tmp_path, f"torchrun pretrain_vlm.py {MODEL}\n")
    with pytest.raises(InputError) as err:
        read_megatron_args(path)
    assert "pretrain_vlm.py" in err.value.value and "not a training script" in err.value.reason


@pytest.mark.parametrize(
    ("text", "script"),
    [
        ("--num-layers 2 --bf16\n", False),
        ("# a comment\n--num-layers 2\n", False),
        ("12 --num-layers 12", False),
        ("python pretrain_gpt.py --num-layers 2\n", True),
        ("#!/bin/bash\necho hi\n", True),
        ("LAYERS=2\n", True),
    ],
)
def test_a_flags_file_and_a_script_are_told_apart(text: str, script: bool) -> None:
    assert is_script(text) is script


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("X=`date\ntorchrun pretrain_gpt.py --num-layers 2\n", "has an unclosed '`'"),
        ("X=a\ncase $X in\n  a) Y=1\n", "the script ends inside a statement"),
        ("W=$(( 2 * `x ))\ntorchrun pretrain_gpt.py --num-layers $W\n", "unclosed"),
    ],
)
def test_a_script_cut_short_is_refused_by_name(text: str, reason: str) -> None:
    with pytest.raises(InputError) as err:
        read_megatron_args(text)
    assert reason in err.value.reason
