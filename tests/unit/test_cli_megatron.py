"""``cpmem estimate|admit|capacity --megatron-args``: the command line prices the step the
API describes, takes every other flag given as an override of the arguments' setting,
and exits as ``admit`` does."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

from cpmem import cli
from cpmem.api import estimate_megatron

CASE = (
    Path(__file__).resolve().parents[2]
    / "golden/megatron/cases/gpt/gpt3_mcore_te_tp1_pp1_dist_optimizer_no_mmap_bin_files"
    / "model_config.yaml"
)
BASE = ["--megatron-args", str(CASE), "--world-size", "8", "--device", "h100"]


def run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(argv)
    return code, out.getvalue(), err.getvalue()


def test_estimate_json_is_the_api_estimate() -> None:
    code, out, _ = run(["estimate", *BASE, "--json"])
    assert code == 0
    got = json.loads(out)
    want = estimate_megatron(CASE, world_size=8, device="h100")
    assert want.static is not None
    assert got["static_bytes"] == want.static.total
    assert got["peak_bytes"] == want.peak_bytes
    assert got["policy"] == "tight"  # a Megatron-LM run's default policy
    assert got["world_size"] == 8
    assert "--save" in got["ignored_args"]


DP3_FLAGS = """\
--num-layers 1 --hidden-size 64 --num-attention-heads 2 --seq-length 128
--max-position-embeddings 128 --micro-batch-size 1 --global-batch-size 3 --bf16
--use-distributed-optimizer --vocab-size 1000 --tokenizer-type NullTokenizer
"""
"""A one-layer GPT on 3 GPUs (DP 3) whose distributed-optimizer buffer ends in padding.
Hand count: the 1,000-token vocabulary padded to 1,024 rows (a multiple of 128) x 64 =
65,536 (tied: one table), 128 learned positions x 64 = 8,192, the layer's QKV 64 x 192 +
192, projection 64 x 64 + 64, FC1 64 x 256 + 256, FC2 256 x 64 + 64 and two LayerNorms of
2 x 64: 49,984, the final LayerNorm 128: 123,840 elements, each parameter a multiple of
64 so none padded at its start. The bucket ends on a multiple of lcm(3, 128) = 384:
124,032 elements, 192 of them padding, in three slices of 41,344; the last slice holds
the padding, so 41,152 real elements. The optimizer's state is 12 B a real element (an
fp32 master copy and Adam's two fp32 moments): 496,128 B on the first slice (the busiest
rank's, all real), 493,824 B on the last (the rank Megatron-LM logs)."""


def test_the_last_rank_is_megatrons_logging_rank_and_the_busiest_the_default(
    tmp_path: Path,
) -> None:
    flags = tmp_path / "dp3.flags"
    flags.write_text(DP3_FLAGS)
    base = ["estimate", "--megatron-args", str(flags), "--world-size", "3", "--json"]
    _, out, _ = run(base)
    _, last, _ = run([*base, "--rank", "last"])
    busiest, logged = json.loads(out)["static_components"], json.loads(last)["static_components"]
    assert busiest["weights"] == logged["weights"] == 2 * 124_032  # bf16, the whole buffer
    assert busiest["optimizer_states"] == 12 * 41_344 == 496_128
    assert logged["optimizer_states"] == 12 * 41_152 == 493_824


def test_estimate_text_names_both_figures() -> None:
    code, out, _ = run(["estimate", *BASE])
    assert code == 0
    assert "static_bytes" in out and "peak_bytes" in out and "ignored" in out


def test_a_flag_given_overrides_the_arguments_setting() -> None:
    """--lora-rank prices a LoRA run of the same model (training lora); --tp another
    layout of it; both through the same step description."""
    _, full, _ = run(["estimate", *BASE, "--json"])
    code, lora, _ = run(["estimate", *BASE, "--json", "--lora-rank", "8"])
    assert code == 0
    assert json.loads(lora)["adapter"]["rank"] == 8
    assert json.loads(lora)["static_bytes"] < json.loads(full)["static_bytes"]  # no Adam state
    code, tp2, _ = run(["estimate", *BASE, "--json", "--tp", "2"])
    assert code == 0 and json.loads(tp2)["tp"] == 2


def test_lengths_are_the_arguments_own() -> None:
    code, _, err = run(["estimate", *BASE, "--lengths", "4096"])
    assert code == 2 and "lengths" in err and "--seq-length" in err


def test_vocab_size_is_refused_beside_a_model() -> None:
    code, _, err = run(
        ["estimate", "--model", "qwen3-1.7b", "--lengths", "1024", "--vocab-size", "9"]
    )
    assert code == 2 and "vocab_size=9" in err and "--megatron-args" in err


def test_world_size_is_required() -> None:
    code, _, err = run(["estimate", "--megatron-args", str(CASE)])
    assert code == 2 and "--world-size" in err and "gives no world size" in err


def test_admit_refuses_a_tiny_budget_with_exit_3_and_fits_a_device() -> None:
    code, out, _ = run(["admit", *BASE, "--budget-gib", "1"])
    assert code == 3 and out.startswith("REFUSE")
    code, out, _ = run(["admit", *BASE])
    assert code == 0 and out.startswith("FIT")
    assert "busiest rank" in out


def test_capacity_is_bounded_by_the_learned_positions() -> None:
    code, out, _ = run(["capacity", *BASE, "--json"])
    assert code == 0
    found = json.loads(out)["layouts"][0]["pack"]
    # --max-position-embeddings 1024 rows of learned positions: no sequence beyond them
    assert found["length"] == 1024 and found["sequences"] == 4 and found["at_cap"]


def test_profiles_refuse_a_megatron_run() -> None:
    code, _, err = run(["profile", "record", "--megatron-args", str(CASE), "--peak-bytes", "1e9"])
    assert code == 2 and "megatron_args" in err


def test_capacity_searches_a_rope_model_past_its_positions() -> None:
    """Rope positions have no table: the search runs up to the device (lengths past
    --max-position-embeddings flagged, as for any model), never failing at its start."""
    rope = CASE.parents[1] / "gpt3_mcore_te_tp1_pp2_rope_embeddings" / "model_config.yaml"
    code, out, _ = run(["capacity", "--megatron-args", str(rope), "--world-size", "8", "--json"])
    assert code == 0
    found = json.loads(out)["layouts"][0]["pack"]
    assert found["length"] > 1024 and found["beyond_positions"]


def test_a_setting_typed_at_cpmems_default_is_an_override() -> None:
    """The flags given are read from the settings' declaration, not by comparing with the
    parser's defaults: ``--lora-rank 1`` (cpmem's default rank) trains rank-1 adapters on
    the run's model, where the run's own arguments train every parameter."""
    code, out, _ = run(["estimate", *BASE, "--json"])
    assert code == 0 and json.loads(out)["training"] == "full"
    code, out, _ = run(["estimate", *BASE, "--lora-rank", "1", "--json"])
    got = json.loads(out)
    assert code == 0 and got["training"] == "lora" and got["adapter"]["rank"] == 1
