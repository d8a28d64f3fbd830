"""The command line: the documented examples, JSON names, and errors without tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cpmem.cli import main

EXAMPLE = [
    "estimate",
    "--model",
    "qwen3.5-27b",
    "--lengths",
    "4096,4096",
    "--shared-prefix",
    "1228",
    "--cp",
    "2",
    "--recompute",
    "selective",
]


def test_documented_example(capsys):
    assert main(EXAMPLE) == 0
    out = capsys.readouterr().out
    assert "69.524" in out
    assert "4,096 tokens priced" in out


def test_documented_example_global(capsys):
    assert main([*EXAMPLE, "--policy", "global"]) == 0
    assert "117.374" in capsys.readouterr().out


def test_json_names_are_stable(capsys):
    assert main([*EXAMPLE, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    for key in (
        "policy",
        "estimate_bytes",
        "estimate_gib",
        "busiest_rank",
        "busiest_tokens",
        "per_rank_bytes",
        "components",
    ):
        assert key in data
    assert data["estimate_bytes"] == 74_651_231_846
    assert data["busiest_tokens"] == 4096
    assert data["per_rank_bytes"][data["busiest_rank"]] == data["estimate_bytes"]
    assert sum(data["components"].values()) == data["estimate_bytes"]


def test_recorded_cell_from_explicit_flags(capsys):
    # CP file, attention-selective 4096+4096: the runtime put 5,120 tokens on one rank.
    argv = [
        "estimate",
        "--model",
        "Qwen/Qwen3-1.7B",
        "--cp",
        "2",
        "--logical-tokens",
        "8192",
        "--packed-tokens",
        "6964",
        "--busiest-tokens",
        "5120",
        "--segments",
        "3",
        "--json",
    ]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["estimate_bytes"] == 16_618_671_308


def test_rank_tokens_flag(capsys):
    argv = [
        "estimate",
        "--model",
        "qwen3.5-27b",
        "--cp",
        "2",
        "--logical-tokens",
        "8192",
        "--packed-tokens",
        "6964",
        "--rank-tokens",
        "4096,2868",
        "--segments",
        "3",
        "--json",
    ]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["estimate_bytes"] == 74_651_231_846 and data["busiest_rank"] == 0


def test_admit_fits_under_busiest_rank_and_is_refused_globally(capsys):
    base = [a if a != "estimate" else "admit" for a in EXAMPLE] + ["--budget-gib", "81.868"]
    assert main(base) == 0
    assert capsys.readouterr().out.startswith("FIT")
    assert main([*base, "--policy", "global"]) == 3
    out = capsys.readouterr().out
    assert out.startswith("REFUSE") and "suggestion:" in out


def test_models_lists_presets(capsys):
    assert main(["models", "--json"]) == 0
    names = {m["name"] for m in json.loads(capsys.readouterr().out)}
    assert names == {"qwen3.5-27b", "qwen3.5-4b", "qwen3.5-35b-a3b", "qwen3-1.7b"}


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["estimate", "--model", "nope", "--lengths", "8"], "model='nope'"),
        (["estimate", "--model", "qwen3-1.7b", "--lengths", "0,5"], "lengths[0]=0"),
        (["estimate", "--model", "qwen3-1.7b", "--lengths", "-3"], "lengths[0]=-3"),
        (
            ["estimate", "--model", "qwen3-1.7b", "--lengths", "5,5", "--shared-prefix", "9"],
            "shared_prefix=9",
        ),
        (["estimate", "--model", "qwen3-1.7b", "--lengths", "5", "--cp", "0"], "cp=0"),
        (["estimate", "--model", "qwen3-1.7b", "--lengths", "5", "--tp", "0"], "tp=0"),
        (["estimate", "--model", "qwen3-1.7b", "--lengths", "5", "--tp", "3"], "tp=3"),
        (
            ["estimate", "--model", "qwen3-1.7b", "--lengths", "5", "--policy", "magic"],
            "policy='magic'",
        ),
        (
            [
                "estimate",
                "--model",
                "qwen3-1.7b",
                "--cp",
                "2",
                "--logical-tokens",
                "100",
                "--packed-tokens",
                "100",
                "--rank-tokens",
                "10,10",
                "--segments",
                "1",
            ],
            "rank_tokens",
        ),
        (
            ["admit", "--model", "qwen3-1.7b", "--lengths", "5", "--budget-gib", "nan"],
            "budget-gib=nan",
        ),
        (
            ["admit", "--model", "qwen3-1.7b", "--lengths", "5", "--budget-gib", "-1"],
            "budget-gib=-1.0",
        ),
        (
            [
                "admit",
                "--model",
                "qwen3-1.7b",
                "--lengths",
                "5",
                "--free-bytes",
                "1e9",
                "--reusable-reserved-bytes",
                "nan",
                "--device-total-bytes",
                "1e10",
            ],
            "reusable_reserved_bytes=nan",
        ),
        (["estimate", "--config", "/nonexistent/config.json", "--lengths", "5"], "file not found"),
    ],
)
def test_bad_input_exits_nonzero_naming_field(argv, needle):
    proc = subprocess.run(
        [sys.executable, "-m", "cpmem.cli", *argv], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr
    assert "Traceback" not in proc.stderr


def test_import_without_torch():
    code = (
        "import sys; sys.modules['torch'] = None; import cpmem, cpmem.cli, cpmem.api; "
        "from cpmem.api import estimate; print(estimate('qwen3.5-4b', [64]).estimate_bytes)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout) > 0
