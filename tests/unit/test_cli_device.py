"""The whole device from the command line: `estimate --device`, `admit --device`, and the
budget forms (``--budget-gib``, the runtime's figures)."""

from __future__ import annotations

import json

import pytest

from cpmem.api import estimate
from cpmem.cli import main

SEED = ["--model", "qwen3.5-27b", "--lengths", "4096,4096", "--shared-prefix", "1228", "--cp", "2"]


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, dict[str, object]]:
    code = main([*argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_estimate_json_names_the_static_memory_and_the_device(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out = _json(capsys, ["estimate", *SEED, "--device", "h200"])
    api = estimate("qwen3.5-27b", [4096, 4096], shared_prefix=1228, cp=2, device="h200")
    assert code == 0 and api.static is not None and api.device_budget is not None
    assert out["static_bytes"] == api.static.total
    assert out["static_components"] == api.static.components
    budget = out["device_budget"]
    assert isinstance(budget, dict)
    assert budget["budget_bytes"] == api.device_budget.budget_bytes
    assert budget["device"]["total_bytes"] == 150_121_021_440
    # the activations are the harness's figure, unchanged by the device
    assert (
        out["estimate_bytes"]
        == estimate("qwen3.5-27b", [4096, 4096], shared_prefix=1228, cp=2).estimate_bytes
    )


def test_admit_on_a_device_prints_and_returns_the_whole_device(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out = _json(capsys, ["admit", *SEED, "--device", "h200"])
    assert code == 0 and out["action"] == "fit"
    whole = out["whole_device"]
    assert isinstance(whole, dict)
    parts = whole["static_bytes"] + whole["activations_bytes"] + whole["head_bytes"]
    parts += whole["reserve_bytes"] + whole["non_torch_bytes"] + whole["free_bytes"]
    assert parts == whole["device_total_bytes"]  # every byte of the device accounted once
    assert whole["busiest_rank"] == 0 and len(whole["per_rank_bytes"]) == 2
    main(["admit", *SEED, "--device", "h200"])
    text = capsys.readouterr().out
    assert "device h200, busiest rank" in text and "outside PyTorch" in text


def test_a_small_device_refuses_what_a_large_one_fits(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["admit", *SEED, "--device", "h200"]) == 0
    assert main(["admit", *SEED, "--device", "h100"]) == 3  # 50 GiB of weights, 79 GiB device
    capsys.readouterr()


def test_budget_forms_admit_without_a_device(capsys: pytest.CaptureFixture[str]) -> None:
    """``--budget-gib`` is a device's usable bytes: the static memory is weighed under it
    (``whole_device``), and what it leaves the activations is the budget less that
    static memory; the runtime's figures are what its process has left after its static
    memory: free + reusable - 3% of the total, for the activations alone."""
    code, out = _json(capsys, ["admit", *SEED, "--budget-gib", "200"])
    whole = out["whole_device"]
    assert isinstance(whole, dict) and code == 0 and out["decided_by"] == "budget"
    assert out["available_bytes"] == 200 * 2**30 - whole["static_bytes"]
    runtime = [
        "--free-bytes",
        "90e9",
        "--reusable-reserved-bytes",
        "0",
        "--device-total-bytes",
        "150121021440",
    ]
    code, out = _json(capsys, ["admit", *SEED, *runtime])
    assert out["available_bytes"] == int(90e9 - 0.03 * 150121021440)
    assert out["decided_by"] == "runtime" and "whole_device" not in out


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--budget-gib", "0"], "budget-gib=0.0"),
        (["--device", "h200", "--free-bytes", "1e9"], "--reusable-reserved-bytes"),
        (["--device", "h300"], "device='h300'"),
        (["--device-total-bytes", "1.5"], "device_total_bytes=1.5"),
        ([], "--device NAME"),
        (["--optimizer", "adamw"], "--optimizer"),
        (["--device", "h200", "--dp", "0"], "dp=0"),
    ],
)
def test_bad_device_input_is_one_line_naming_the_field(
    capsys: pytest.CaptureFixture[str], extra: list[str], needle: str
) -> None:
    try:
        code = main(["admit", *SEED, *extra])
    except SystemExit as exit_info:  # argparse's own checks (choices)
        code = int(str(exit_info.code))
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert needle in err.splitlines()[-1]
