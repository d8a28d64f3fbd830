"""``cpmem estimate|admit|capacity --megatron-args``: the command line prices the run the
API prices, refuses the LoRA step's flags beside it, and exits as ``admit`` does."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

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
    assert got["static_bytes"] == want.static_bytes
    assert got["peak_bytes"] == want.peak_bytes
    assert got["rank"] == 7  # the last of 8: the rank Megatron-LM logs
    assert "--save" in got["ignored_args"]


def test_estimate_text_names_both_figures() -> None:
    code, out, _ = run(["estimate", *BASE])
    assert code == 0
    assert "static_bytes" in out and "peak_bytes" in out and "ignored" in out


@pytest.mark.parametrize("flag", [["--tp", "2"], ["--lengths", "4096"], ["--lora-rank", "8"]])
def test_a_lora_step_flag_beside_the_arguments_is_refused(flag: list[str]) -> None:
    code, _, err = run(["estimate", *BASE, *flag])
    assert code == 2
    assert flag[0] in err and "does not apply" in err


def test_world_size_is_required() -> None:
    code, _, err = run(["estimate", "--megatron-args", str(CASE)])
    assert code == 2 and "world_size" in err


def test_admit_refuses_a_tiny_budget_with_exit_3_and_fits_a_device() -> None:
    code, out, _ = run(["admit", *BASE, "--budget-gib", "1"])
    assert code == 3 and out.startswith("REFUSE")
    assert "full recompute" in out
    code, out, _ = run(["admit", *BASE])
    assert code == 0 and out.startswith("FIT")


def test_capacity_is_bounded_by_the_learned_positions() -> None:
    code, out, _ = run(["capacity", *BASE, "--json"])
    assert code == 0
    found = json.loads(out)
    assert found["seq_length"] == 1024  # --max-position-embeddings 1024, learned positions
    assert found["limit"] == "--max-position-embeddings"


def test_profiles_refuse_a_megatron_run() -> None:
    code, _, err = run(["profile", "record", "--megatron-args", str(CASE), "--peak-bytes", "1e9"])
    assert code == 2 and "megatron_args" in err
