"""The command line: the documented examples, JSON names, and errors without tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from harness import SEED_BUDGET_BYTES, runtime_budget_flags

from cpmem import cli
from cpmem.cli import main
from cpmem.units import GIB

HARNESS_FLAGS = ["--head", "hidden", "--step", "first"]
"""The calibration harness's step: every recorded figure below was priced for it."""
TRAINER = [
    "estimate",
    "--model",
    "qwen3.5-27b",
    "--lengths",
    "4096,4096",
    "--shared-prefix",
    "1228",
    "--cp",
    "2",
]
"""The README's first command: the seed pair as a trainer's steady step prices it."""
EXAMPLE = [*TRAINER, "--recompute", "selective", *HARNESS_FLAGS]
"""The seed pair as the harness's step, the figure every recorded source gives."""


def test_the_default_is_a_trainers_steady_step_with_its_head(capsys):
    """The README's first command: no flags but the request give megatron's output layer
    and cross entropy (the head) and a steady step's static memory (Adam's moments)."""
    assert main([*TRAINER, "--json"]) == 0
    trainer = json.loads(capsys.readouterr().out)
    assert main([*EXAMPLE, "--json"]) == 0
    harness = json.loads(capsys.readouterr().out)
    assert trainer["head"] == "logits" and harness["head"] == "hidden"
    # the head's fp32 softmax over the 4,096 tokens and the 248,320-entry vocabulary
    # (megatron-core's cross entropy keeps it until backward: 4 B per logit)
    assert trainer["components"]["head_kept"] >= 4096 * 248_320 * 4
    moments = trainer["static_components"]["optimizer_states"]
    assert moments == 3 * harness["static_components"]["optimizer_states"]  # master + 2


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
    # the busiest rank's 4,096 tokens x 2 bytes x 27B's 8,142,848 features a token
    # (docs/pricing.md's check value), under its documented component name
    assert data["components"]["retained_activations"] == 4096 * 2 * 8_142_848


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
        *HARNESS_FLAGS,
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
        *HARNESS_FLAGS,
    ]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["estimate_bytes"] == 74_651_231_846 and data["busiest_rank"] == 0


def test_admit_fits_under_busiest_rank_and_is_refused_globally(capsys):
    """The measured runtime's own budget for the seed pair (its figures: what its
    process had left for the activations) fits the busiest rank's figure and refuses
    the figure that charges every rank the packed count."""
    base = [a if a != "estimate" else "admit" for a in EXAMPLE]
    base += runtime_budget_flags(SEED_BUDGET_BYTES)
    assert main(base) == 0
    assert capsys.readouterr().out.startswith("FIT")
    assert main([*base, "--policy", "global"]) == 3
    out = capsys.readouterr().out
    assert out.startswith("REFUSE") and "suggestion:" in out


def test_models_lists_presets(capsys):
    assert main(["models", "--json"]) == 0
    models = {m["name"]: m for m in json.loads(capsys.readouterr().out)}
    measured = {name for name, m in models.items() if m["measured"]}
    assert measured == {"qwen3.5-27b", "qwen3.5-4b", "qwen3.5-35b-a3b", "qwen3-1.7b"}
    assert {"qwen3-30b-a3b", "gpt-oss-20b", "gemma-3-12b", "gemma-2-9b", "deepseek-v3"} <= set(
        models
    )
    assert models["gemma-2-9b"]["family"] == "gemma2"


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


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cpmem.cli", *argv], capture_output=True, text=True, check=False
    )


PAIR_1_7B = ["--model", "qwen3-1.7b", "--lengths", "4096,4096", "--shared-prefix", "1228"]


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        # a CP size that leaves a rank with no tokens (hybrid default: whole segments)
        (["--model", "qwen3.5-27b", "--lengths", "4096,4096", "--cp", "1000"], "cp=1000"),
        # fewer tokens than ranks: every layout leaves one empty
        (["--model", "qwen3-1.7b", "--lengths", "500", "--cp", "1000"], "cp=1000"),
        # a length beyond max_position_embeddings (Qwen3-1.7B: 40,960)
        (["--model", "qwen3-1.7b", "--lengths", "50000"], "lengths[0]=50000"),
        # empty items are not silently dropped
        (["--model", "qwen3-1.7b", "--lengths", "4096,,"], "lengths='4096,,'"),
        (["--model", "qwen3-1.7b", "--lengths", ",4096"], "lengths=',4096'"),
        (["--model", "qwen3-1.7b", "--lengths", "4096,x"], "lengths='4096,x'"),
        # --rank-tokens with a different count of ranks than --cp
        (
            [
                "--model",
                "qwen3-1.7b",
                "--cp",
                "2",
                "--logical-tokens",
                "8192",
                "--packed-tokens",
                "6964",
                "--rank-tokens",
                "5120,1844,3",
                "--segments",
                "3",
            ],
            "rank_tokens=[5120, 1844, 3]",
        ),
        (
            [
                "--model",
                "qwen3-1.7b",
                "--cp",
                "2",
                "--logical-tokens",
                "8192",
                "--packed-tokens",
                "6964",
                "--rank-tokens",
                "5120,,1844",
                "--segments",
                "3",
            ],
            "rank_tokens='5120,,1844'",
        ),
    ],
)
@pytest.mark.parametrize("command", ["estimate", "admit"])
def test_nonsense_is_a_one_line_error_naming_field_and_value(argv, needle, command):
    extra = ["--budget-gib", "80"] if command == "admit" else []
    proc = _cli(command, *argv, *extra)
    assert proc.returncode == 2, (proc.stdout[-300:], proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("cpmem: error: ") and needle in lines[0]
    assert proc.stdout == ""


def test_allow_long_prices_with_a_warning_on_stderr_and_in_json():
    proc = _cli("estimate", "--model", "qwen3-1.7b", "--lengths", "50000", "--allow-long", "--json")
    assert proc.returncode == 0, proc.stderr
    (warning,) = json.loads(proc.stdout)["warnings"]
    assert "lengths[0]=50000" in warning and "max_position_embeddings (40,960)" in warning
    assert proc.stderr.strip() == f"cpmem: warning: {warning}"


def test_a_near_empty_rank_is_a_warning():
    # the chunk planner re-cuts 8,192 tokens into 1,000 ranks of 8 (the last holds the rest)
    proc = _cli(
        "admit",
        "--model",
        "qwen3-1.7b",
        "--lengths",
        "4096,4096",
        "--cp",
        "1000",
        "--budget-gib",
        "80",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    (warning,) = json.loads(proc.stdout)["warnings"]
    assert "holds 8 tokens" in warning and warning in proc.stderr


def test_clean_input_has_no_warnings(capsys):
    assert main(["estimate", *PAIR_1_7B, "--cp", "2", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["warnings"] == []
    assert captured.err == ""


def test_the_measured_1_7b_pair_fits_13_gib_only_on_the_balanced_layout(capsys):
    """`cpmem admit` on the measured 1.7B pair (forward peak 13.93 GiB) with 13 GiB left
    for its activations (the runtime's figures): the
    default layout (5,120 on the busiest rank) does not fit; only a layout another runtime
    executes (Megatron's zigzag) would, and the output says which."""
    budget = runtime_budget_flags(13 * GIB)  # left for the activations, as the runtime's
    argv = ["admit", *PAIR_1_7B, "--cp", "2", *budget, "--json", *HARNESS_FLAGS]
    code = main(argv)
    out = json.loads(capsys.readouterr().out)
    considered = {c["variant"]: c for c in out["considered"]}
    cost_optimal = considered["cost-optimal"]
    assert cost_optimal["planner"] == "chunked"
    assert cost_optimal["required_bytes"] > 14_959_463_424  # the measured forward peak
    assert out["estimate"]["busiest_tokens"] != 4096
    assert (code, out["action"], out["variant"], out["planner"]) == (
        0,
        "fit",
        "memory-minimal:balanced",
        "balanced",
    )
    assert set(considered) == {"cost-optimal", "memory-minimal:balanced"}
    main(["admit", *PAIR_1_7B, "--cp", "2", *budget, *HARNESS_FLAGS])
    text = capsys.readouterr().out
    assert "fits only if the runtime lays the request out as balanced" in text
    assert "planner chunked" in text


def test_worst_planner_prices_the_largest_busiest_count(capsys):
    argv = [
        "estimate",
        "--model",
        "qwen3.5-4b",
        "--lengths",
        "2048,2048",
        "--shared-prefix",
        "614",
        "--cp",
        "2",
        "--json",
    ]
    assert main(argv) == 0
    default = json.loads(capsys.readouterr().out)
    assert main([*argv, "--planner", "worst"]) == 0
    worst = json.loads(capsys.readouterr().out)
    assert (default["planner"], default["busiest_tokens"]) == ("gdn-segments", 2048)
    assert (worst["planner"], worst["busiest_tokens"]) == ("worst:chunked", 2560)
    assert worst["estimate_bytes"] > default["estimate_bytes"]


def test_a_config_supplies_max_position_embeddings(tmp_path):
    config = {
        "model_type": "qwen3",
        "num_hidden_layers": 2,
        "hidden_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "intermediate_size": 512,
        "vocab_size": 1000,
        "max_position_embeddings": 1024,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    proc = _cli("estimate", "--config", str(path), "--lengths", "512,2048")
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("cpmem: error: lengths[1]=2048: exceeds")
    assert "max_position_embeddings (1,024)" in proc.stderr
    assert _cli("estimate", "--config", str(path), "--lengths", "512,1024").returncode == 0


def test_every_flag_has_help_and_the_policy_help_lists_the_registry():
    import argparse

    from cpmem.pricing.registry import policy_names

    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    missing = []
    for name in ("estimate", "admit", "models"):
        for action in sub.choices[name]._actions:
            if action.option_strings and action.dest != "help" and not action.help:
                missing.append(f"{name} {action.option_strings[0]}")
    assert missing == []
    policy = next(a for a in sub.choices["estimate"]._actions if a.dest == "policy")
    assert policy.help is not None
    assert all(name in policy.help for name in policy_names()) and "tight" in policy.help


def _right_aligned(table: list[str], labels: tuple[str, ...]) -> bool:
    """Every row's number in each labelled column ends where the label ends."""
    header = table[0]
    for label in labels:
        end = header.index(label) + len(label)
        for row in table[1:]:
            if row[end - 1] == " " or (len(row) > end and row[end] != " "):
                return False
    return True


def test_tables_stay_aligned_for_any_magnitude(capsys):
    argv = ["estimate", "--model", "qwen3-1.7b", "--lengths", "1000000000000", "--allow-long"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out.split("\n\n")
    ranks, components = out[1].splitlines(), out[2].splitlines()
    assert "1,000,000,000,000" in ranks[1]
    assert _right_aligned(ranks, ("tokens", "bytes", "GiB"))
    assert _right_aligned(components, ("bytes", "GiB"))
    assert _right_aligned(components[:-1], ("share",))  # the estimate row has no share


def test_admit_explains_split_n(capsys):
    argv = ["admit", "--model", "qwen3-1.7b", "--lengths", ",".join(["4096"] * 8)]
    assert cli.main([*argv, "--budget-gib", "1"]) == 3
    out = capsys.readouterr().out
    assert "considered  split-2" in out
    assert "split-N: the request run as N sequential sub-forwards" in out
