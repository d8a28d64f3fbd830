"""The trainer's step inputs (head, adapters, CP comm): parsed and checked in one place,
defaulting to a trainer's step (megatron's output layer and loss), named in every estimate's text and JSON."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cpmem.api import estimate
from cpmem.errors import InputError
from cpmem.step.trainer import ADAPTER_TARGETS, Adapter, Head, parse_targets

PAIR = {"lengths": [4096, 4096], "shared_prefix": 1228, "cp": 2}


def test_the_default_step_is_a_trainers_and_the_harness_is_spelled_out() -> None:
    """By default a step ends with megatron's output layer and cross entropy, whose
    ``vocab_parallel_cross_entropy`` keeps the fp32 softmax of the rank's tokens until
    backward (4 B per logit: 4,096 tokens x Qwen3.5's 248,320-entry vocabulary, a
    multiple of 128 already); the calibration harness's step (hidden states returned,
    first of its process) reproduces the recorded estimate of the published source
    (art_recompute_memory_cp.csv: 74,651,231,846 B for this pair)."""
    assert Adapter().is_harness and Adapter().targets == ADAPTER_TARGETS
    trainer = estimate("qwen3.5-27b", **PAIR)
    assert trainer.head == Head("logits") and trainer.head_bytes > 0
    assert trainer.components["head_kept"] >= 4096 * 248_320 * 4
    harness = estimate("qwen3.5-27b", head="hidden", step="first", **PAIR)
    assert harness.head.returns_hidden and harness.head_bytes == 0
    assert harness.estimate_bytes == 74_651_231_846


@pytest.mark.parametrize(
    ("text", "kind", "chunk"),
    [("logits", "logits", None), ("fused", "fused", None), ("chunked:512", "chunked", 512),
     ("linear-ce", "linear-ce", None)],
)  # fmt: skip
def test_heads_parse(text: str, kind: str, chunk: int | None) -> None:
    head = Head.parse(text)
    assert (head.kind, head.chunk, head.label) == (kind, chunk, text)


def test_targets_parse_groups_and_names_in_one_order() -> None:
    assert parse_targets("attention") == (
        "qkv",
        "proj",
        "gdn_in",
        "gdn_out",
        "mamba_in",
        "mamba_out",
    )
    assert parse_targets("mlp") == ("fc1", "fc2", "experts")
    assert parse_targets("fc2,qkv") == ("qkv", "fc2")
    assert parse_targets(["attention", "fc1"]) == (
        "qkv",
        "proj",
        "fc1",
        "gdn_in",
        "gdn_out",
        "mamba_in",
        "mamba_out",
    )
    assert Adapter(16, 0.05, ("qkv",)).label == "lora r16 dropout 0.05 targets qkv"
    assert Adapter(targets=parse_targets("mlp")).label == "lora r1 targets mlp"


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"head": "chunked:0"}, "head"),
        ({"head": "chunked"}, "head"),
        ({"head": "chunked:x"}, "head"),
        ({"head": "logits:4"}, "head"),
        ({"head": "softmax"}, "head"),
        ({"lora_rank": 0}, "lora_rank"),
        ({"lora_rank": 1.5}, "lora_rank"),
        ({"lora_dropout": 1.0}, "lora_dropout"),
        ({"lora_dropout": -0.1}, "lora_dropout"),
        ({"lora_targets": "lm_head"}, "lora_targets"),
        ({"lora_targets": "qkv,,fc1"}, "lora_targets"),
        ({"cp_comm": "ring"}, "cp_comm"),
        # Qwen3.5-27B: 24 query and 4 KV heads; Ulysses splits each over CP
        ({"cp_comm": "a2a", "cp": 8}, "cp_comm"),
    ],
)
def test_a_choice_that_cannot_run_names_its_field(options: dict[str, object], field: str) -> None:
    args = {**PAIR, **options}
    with pytest.raises(InputError) as err:
        estimate("qwen3.5-27b", **args)  # type: ignore[arg-type]
    assert err.value.field == field


def test_a2a_runs_where_the_heads_divide() -> None:
    est = estimate("qwen3.5-27b", cp_comm="a2a", **PAIR)  # 4 KV heads over CP 2
    assert est.cp_comm == "a2a"


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cpmem.cli", *argv], capture_output=True, text=True, check=False
    )


def test_text_and_json_say_what_was_priced() -> None:
    base = ["estimate", "--model", "qwen3.5-4b", "--lengths", "2048,2048", "--cp", "2"]
    opts = ["--head", "chunked:1024", "--lora-rank", "16", "--lora-dropout", "0.05",
            "--lora-targets", "attention", "--cp-comm", "p2p"]  # fmt: skip
    text = _cli(*base, *opts)
    assert text.returncode == 0, text.stderr
    assert "head chunked:1024  lora r16 dropout 0.05 targets attention  cp_comm p2p" in text.stdout
    out = json.loads(_cli(*base, *opts, "--json").stdout)
    assert out["head"] == "chunked:1024" and out["cp_comm"] == "p2p"
    assert out["adapter"] == {
        "rank": 16,
        "dropout": 0.05,
        "targets": ["qkv", "proj", "gdn_in", "gdn_out", "mamba_in", "mamba_out"],
    }
    assert out["head_bytes"] > 0
    harness = json.loads(_cli(*base, "--head", "hidden", "--json").stdout)
    assert harness["head"] == "hidden" and harness["head_bytes"] == 0
    assert harness["adapter"] == {"rank": 1, "dropout": 0.0, "targets": list(ADAPTER_TARGETS)}


def test_bad_choices_are_one_line_errors() -> None:
    base = ["estimate", "--model", "qwen3.5-4b", "--lengths", "2048"]
    for flag, value, needle in (
        ("--head", "chunked:0", "head='chunked:0'"),
        ("--lora-rank", "0", "lora_rank=0"),
        ("--lora-dropout", "1", "lora_dropout=1.0"),
        ("--lora-targets", "embed", "lora_targets='embed'"),
    ):
        proc = _cli(*base, flag, value)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr
        assert lines[0].startswith("cpmem: error: ") and needle in lines[0]
