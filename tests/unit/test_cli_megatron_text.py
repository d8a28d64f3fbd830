"""The Megatron-LM door's text: a run titled by its arguments' file (a functional test
case by its folder, whose file is named alike in every case), the step's own head in the
headers (the last stage's logits, whichever stage is busiest), and counts with their
noun in the singular where there is one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cpmem.cli import main
from cpmem.units import counted

CASES = Path(__file__).resolve().parents[2] / "golden/megatron/cases"
MOE_PP2 = CASES / "moe/gpt3_mcore_tp2_pp2_ep2_te_4experts2parallel/model_config.yaml"
"""TP 2 PP 2 EP 2, 4 experts, 8 GPUs: its busiest stage is the first, which holds no
head (the output layer and the loss are the last stage's)."""
FLAGS = (
    "--num-layers 2 --hidden-size 256 --num-attention-heads 4 --seq-length 256 "
    "--max-position-embeddings 256 --micro-batch-size 1 --global-batch-size 8 --bf16 "
    "--vocab-size 1000 --tokenizer-type NullTokenizer"
)


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    assert main([*argv, "--json"]) == 0
    out: dict[str, object] = json.loads(capsys.readouterr().out)
    return out


def test_a_flags_file_is_titled_by_its_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "runs"
    folder.mkdir()
    flags = folder / "llama-ish.flags"
    flags.write_text(FLAGS)
    out = _json(capsys, "estimate", "--megatron-args", str(flags), "--world-size", "8")
    assert out["model"] == "llama-ish.flags"
    case = _json(capsys, "estimate", "--megatron-args", str(MOE_PP2), "--world-size", "8")
    assert case["model"] == "gpt3_mcore_tp2_pp2_ep2_te_4experts2parallel"


def test_a_pipelined_runs_head_is_its_last_stages(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--megatron-args", str(MOE_PP2), "--world-size", "8"]
    est = _json(capsys, "estimate", *base)
    assert est["busiest_stage"] == 0 and est["head"] == "logits"
    assert main(["capacity", *base]) == 0
    header = capsys.readouterr().out.splitlines()[1]
    assert "head logits" in header


def test_counts_have_their_singular() -> None:
    assert counted(1, "micro-batch") == "1 micro-batch"
    assert counted(4, "micro-batch") == "4 micro-batches"
    assert counted(2, "stage") == "2 stages"
    assert counted(1_000, "token") == "1,000 tokens"


def test_one_micro_batch_is_said_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Global batch 8 over DP 8: one micro-batch a step, in the estimate's header and in
    capacity's (``--microbatches 1`` on a pipelined run)."""
    flags = tmp_path / "one.flags"
    flags.write_text(FLAGS)
    assert main(["estimate", "--megatron-args", str(flags), "--world-size", "8"]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert ", 1 micro-batch," in header
    base = ["--megatron-args", str(MOE_PP2), "--world-size", "8", "--microbatches", "1"]
    assert main(["capacity", *base]) == 0
    assert "pp 2, 1 micro-batch (" in capsys.readouterr().out
