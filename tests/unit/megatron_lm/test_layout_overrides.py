"""Layout flags beside ``--megatron-args`` are the run's own arguments: the world stays
the one given, and DP = world / (TP x PP x CP) is derived after them, with the
micro-batch count, the vocabulary's padding and the optimizer's shards; a DP that
contradicts the world, or a world the layout does not divide, is refused naming both.

The run: the tiny GPT of Megatron-LM's functional tests (12 layers, hidden 512, 8
heads, sequence 1,024, micro-batch 4, global batch 32, bf16, GPT-2's 50,257 tokens, tied
embeddings, learned positions, LayerNorm and biases) as flags at TP 4 with the
distributed optimizer, on 8 GPUs.

Hand count at TP 2 (world 8, so DP 4): the vocabulary padded to a multiple of 128 x 2 is
50,432 rows; a rank holds 50,432 x 512 / 2 = 12,910,592 embedding elements, 1,024 x 512
= 524,288 position elements, per layer QKV 512 x 1,536 / 2 + 768 bias, the projection
512 x 512 / 2 + 512, FC1 512 x 2,048 / 2 + 1,024, FC2 2,048 x 512 / 2 + 512 and two
LayerNorms of 1,024: 1,577,728, twelve times 18,932,736, and the final LayerNorm's
1,024: 32,368,640 elements, every one starting on a multiple of 64 and their sum a
multiple of lcm(4, 128), so no padding. The distributed optimizer gives each of the 4
DP ranks 8,092,160 of them, 12 bytes each (an fp32 master copy and Adam's two fp32
moments): 97,105,920 B. Micro-batches: 32 / (4 x 4) = 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cpmem import cli
from cpmem.megatron.describe import describe_megatron

TINY_TP4 = """\
--num-layers 12 --hidden-size 512 --num-attention-heads 8 --seq-length 1024
--max-position-embeddings 1024 --micro-batch-size 4 --global-batch-size 32 --bf16
--tensor-model-parallel-size 4 --sequence-parallel --use-distributed-optimizer
--vocab-size 50257 --tokenizer-type NullTokenizer
"""
TP2_OPTIMIZER_BYTES = 97_105_920
TP2_WEIGHT_BYTES = 2 * 32_368_640


@pytest.fixture
def flags(tmp_path: Path) -> Path:
    path = tmp_path / "tiny_tp4.txt"
    path.write_text(TINY_TP4)
    return path


def _estimate(
    flags: Path, capsys: pytest.CaptureFixture[str], *extra: str
) -> tuple[int, dict[str, object], str]:
    argv = ["estimate", "--megatron-args", str(flags), "--world-size", "8", *extra, "--json"]
    code = cli.main(argv)
    captured = capsys.readouterr()
    return code, (json.loads(captured.out) if code == 0 else {}), captured.err


def test_a_tp_override_keeps_the_world(flags: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _estimate(flags, capsys, "--tp", "2")
    assert code == 0
    assert (out["world_size"], out["tp"], out["dp"], out["microbatches"]) == (8, 2, 4, 2)
    static = out["static_components"]
    assert isinstance(static, dict)
    assert static["optimizer_states"] == TP2_OPTIMIZER_BYTES
    assert static["weights"] == TP2_WEIGHT_BYTES


def test_the_arguments_own_layout_is_unchanged(
    flags: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """TP 4 on 8 GPUs: DP 2, 32 / (4 x 2) = 4 micro-batches."""
    code, out, _ = _estimate(flags, capsys)
    assert code == 0 and (out["world_size"], out["tp"], out["dp"], out["microbatches"]) == (
        8,
        4,
        2,
        4,
    )
    code, same, _ = _estimate(flags, capsys, "--dp", "2")  # the world's own DP: accepted
    assert code == 0 and same == out


def test_a_dp_that_contradicts_the_world_is_refused(
    flags: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _estimate(flags, capsys, "--dp", "4")
    assert code == 2
    line = err.strip().splitlines()[-1]
    assert "dp=4" in line and "world_size 8" in line and "is DP 2" in line


def test_a_world_the_layout_does_not_divide_is_refused(
    flags: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _estimate(flags, capsys, "--tp", "2", "--pp", "3")
    assert code == 2
    line = err.strip().splitlines()[-1]
    assert "world_size=8" in line and "TP x PP x CP = 2 x 3 x 1 = 6" in line


def test_the_api_derives_dp_after_the_layout(flags: Path) -> None:
    step = describe_megatron(flags, world_size=8, tp=2)
    assert (step.settings.world_size, step.settings.layout.dp) == (8, 4)
    assert step.settings.pipeline.microbatches == 2
    pp2 = describe_megatron(flags, world_size=8, pp=2)  # TP 4 x PP 2: DP 1, 8 micro-batches
    assert (pp2.settings.layout.dp, pp2.settings.pipeline.microbatches) == (1, 8)


def test_a_size_given_as_one_is_an_override(
    flags: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--tp 1`` is not the flag left out: TP 1 on 8 GPUs is DP 8, 32 / (4 x 8) = 1
    micro-batch; ``--dp 1`` contradicts the world's DP 2."""
    code, out, _ = _estimate(flags, capsys, "--tp", "1")
    assert code == 0 and (out["tp"], out["dp"], out["microbatches"]) == (1, 8, 1)
    assert out["sp"] is False  # sequence parallelism only at TP > 1
    code, _, err = _estimate(flags, capsys, "--dp", "1")
    assert code == 2 and "dp=1" in err and "is DP 2" in err
