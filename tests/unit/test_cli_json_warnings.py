"""Every ``--json`` answer of ``estimate``, ``admit`` and ``capacity`` carries a
``warnings`` list (docs/cli.md: legal but suspicious input, empty when none), from
``--model`` and from ``--megatron-args`` alike."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cpmem.cli import main

CASE = (
    Path(__file__).resolve().parents[2]
    / "golden/megatron/cases/gpt/gpt3_mcore_te_tp1_pp1_dist_optimizer_no_mmap_bin_files"
    / "model_config.yaml"
)
DOORS = {
    "model": ["--model", "qwen3-1.7b", "--device", "h200"],
    "megatron": ["--megatron-args", str(CASE), "--world-size", "8", "--device", "h100"],
}
REQUEST = {"model": ["--lengths", "4096"], "megatron": []}


@pytest.mark.parametrize("door", sorted(DOORS))
@pytest.mark.parametrize("command", ["estimate", "admit", "capacity"])
def test_every_json_answer_has_its_warnings(
    door: str, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [command, *DOORS[door], "--json"]
    if command != "capacity":
        argv += REQUEST[door]
    else:
        argv += ["--layouts", "1x1"] if door == "model" else []
    code = main(argv)
    out = json.loads(capsys.readouterr().out)
    assert code in (0, 3)
    assert out["warnings"] == []


TINY_CP16 = """\
--num-layers 12 --hidden-size 512 --num-attention-heads 8 --seq-length 1024
--max-position-embeddings 1024 --micro-batch-size 1 --global-batch-size 1 --bf16
--context-parallel-size 16 --vocab-size 50257 --tokenizer-type NullTokenizer
--position-embedding-type rope --attention-backend fused
"""
"""One 1,024-token sequence over 16 CP ranks: 1,024 / 16 = 64 tokens a rank, fewer than
one 128-token attention block, the step's warning."""


@pytest.mark.parametrize("command", ["estimate", "admit", "capacity"])
def test_a_megatron_runs_warning_is_in_its_json_and_on_stderr(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = tmp_path / "tiny_cp16.txt"
    flags.write_text(TINY_CP16)
    argv = [command, "--megatron-args", str(flags), "--world-size", "16"]
    assert main([*argv, "--json"]) in (0, 3)
    (warning,) = json.loads(capsys.readouterr().out)["warnings"]
    assert warning.startswith("cp=16: rank 0 holds 64 tokens")
    assert main(argv) in (0, 3)
    assert capsys.readouterr().err.strip() == f"cpmem: warning: {warning}"
