"""Every flag of ``cpmem estimate``, on every door (``--model``, ``--config``,
``--megatron-args``): a flag given away from the door's own setting is priced (a figure
moves), named (``ignored_options``, with the reason) or refused (exit 2, the reason on
stderr), never silently dropped.

``CHANGES`` gives each flag a value; ``SAME`` lists, with the reason, the doors where
that value is the door's own setting or where it is read and changes nothing there (each
checked to move nothing and name nothing, so the list stays true); ``NOT_STEP`` the
flags that describe no step (which door, which output, which policy). A new flag fails
``test_every_flag_is_swept`` until it has a row.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cpmem.api import describe_step
from cpmem.cli import build_parser, main
from cpmem.step.profiles import ProfileStore

ROOT = Path(__file__).resolve().parents[2]
CASE = ROOT / (
    "golden/megatron/cases/gpt/gpt3_mcore_te_tp1_pp1_dist_optimizer_no_mmap_bin_files/"
    "model_config.yaml"
)  # GPT h512, 12 layers, TP 1 PP 1, --bf16, distributed optimizer, unfused attention
DOORS: dict[str, list[str]] = {
    "model": ["--model", "qwen3-1.7b", "--lengths", "6144,2048", "--tp", "2", "--cp", "2"],
    "config": ["--config", str(ROOT / "examples/qwen3-1.7b/config.json"), "--lengths", "4096"],
    "megatron": ["--megatron-args", str(CASE), "--world-size", "8"],
}
NOT_STEP = {
    "--help": "the parser's help",
    "--model": "a door",
    "--config": "a door",
    "--megatron-args": "a door",
    "--json": "the output's form",
    "--policy": "which policy prices the step (each one's ignores are tested apart)",
}
CHANGES: dict[str, list[str]] = {
    "--fused-activation": ["--fused-activation"],
    "--unfused-activation": ["--unfused-activation"],
    "--lengths": ["--lengths", "1024"],
    "--shared-prefix": ["--shared-prefix", "512"],
    "--tp": ["--tp", "4"],
    "--cp": ["--cp", "4"],
    "--allow-long": ["--allow-long"],
    "--ep": ["--ep", "2"],
    "--sp": ["--sp"],
    "--no-sp": ["--no-sp"],
    "--recompute": ["--recompute", "full"],
    "--modules": ["--modules", "core_attn+mlp"],
    "--planner": ["--planner", "balanced"],
    "--compiled": ["--compiled"],
    "--moe-routing": ["--moe-routing", "balanced"],
    "--profiles": ["--profiles", "PROFILES"],
    "--step": ["--step", "first"],
    "--head": ["--head", "chunked:1024"],
    "--lora-rank": ["--lora-rank", "16"],
    "--lora-dropout": ["--lora-dropout", "0.1"],
    "--lora-targets": ["--lora-targets", "attention"],
    "--cp-comm": ["--cp-comm", "a2a"],
    "--runtime": ["--runtime", "megatron-lm"],
    "--training": ["--training", "full"],
    "--quantized-weights": ["--quantized-weights", "stored"],
    "--fp8": ["--fp8", "tensorwise:param-gather"],
    "--tp-comm-overlap": ["--tp-comm-overlap"],
    "--cuda-graphs": ["--cuda-graphs", "transformer_engine:attn,mlp"],
    "--attention-backend": ["--attention-backend", "flash"],
    "--container": ["--container", "ngc-24.01"],
    "--etp": ["--etp", "2"],
    "--dtype": ["--dtype", "fp16"],
    "--rank": ["--rank", "last"],
    "--dp": ["--dp", "2"],
    "--optimizer": ["--optimizer", "sgd"],
    "--distributed-optimizer": ["--distributed-optimizer"],
    "--optimizer-instances": ["--optimizer-instances", "2"],
    "--muon-layout": ["--muon-layout", "precomputed"],
    "--fsdp": ["--fsdp", "optim_grads_params"],
    "--fsdp-buffers": ["--fsdp-buffers", "double-buffer"],  # refused without --fsdp
    "--device": ["--device", "b200"],
    "--device-total-bytes": ["--device-total-bytes", "90000000000"],
    "--pp": ["--pp", "2"],
    "--vpp": ["--vpp", "2"],
    "--microbatches": ["--microbatches", "2"],
    "--stage-layers": ["--stage-layers", "14,14"],
    "--first-stage-layers": ["--first-stage-layers", "10"],
    "--last-stage-layers": ["--last-stage-layers", "10"],
    "--microbatch-lengths": ["--microbatch-lengths", "4096;2048"],
    "--microbatch-file": ["--microbatch-file", "MICROBATCHES"],
    "--logical-tokens": ["--logical-tokens", "8192"],
    "--packed-tokens": ["--packed-tokens", "8192"],
    "--rank-tokens": ["--rank-tokens", "4096,4096"],
    "--busiest-tokens": ["--busiest-tokens", "5120"],
    "--segments": ["--segments", "2"],
    "--world-size": ["--world-size", "16"],
    "--vocab-size": ["--vocab-size", "32000"],
}
SAME: dict[tuple[str, str], str] = {
    ("model", "--unfused-activation"): "Qwen3's SwiGLU runs unfused in ART's runtime already",
    ("config", "--unfused-activation"): "Qwen3's SwiGLU runs unfused in ART's runtime already",
    ("model", "--sp"): "SP is on at TP 2 by default",
    ("config", "--no-sp"): "SP is off at TP 1 by default",
    ("megatron", "--no-sp"): "the run is TP 1: SP off",
    ("megatron", "--training"): "the run trains every parameter already",
    ("megatron", "--runtime"): "the run is Megatron-LM's already",
    ("megatron", "--distributed-optimizer"): "the run uses it already",
    ("megatron", "--rank"): "priced: the last of the 8 distributed-optimizer slices holds as "
    "many real elements as the first (a pipeline or another slice moves it)",
}


def _estimate_flags() -> set[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return {s for a in sub.choices["estimate"]._actions for s in a.option_strings}


def test_every_flag_is_swept() -> None:
    flags = {f for f in _estimate_flags() if f.startswith("--")}
    assert flags == set(CHANGES) | set(NOT_STEP)
    assert not set(CHANGES) & set(NOT_STEP)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A profile store with a large floor for the two LoRA doors' steps, and a
    micro-batch file."""
    tmp = tmp_path_factory.mktemp("flags")
    store = ProfileStore()
    for door in ("model", "config"):
        argv = DOORS[door]
        config = argv[1] if door == "config" else None
        step = describe_step(
            None if config else argv[1],
            [int(n) for n in argv[argv.index("--lengths") + 1].split(",")],
            config=config,
            **({"tp": 2, "cp": 2} if door == "model" else {}),
        )
        store.observe(step.signature, peak_bytes=10**12, tokens=step.plan.busiest_tokens)
    profiles = tmp / "profiles.json"
    store.save(profiles)
    microbatches = tmp / "microbatches.json"
    microbatches.write_text(json.dumps([[4096], [2048, 2048]]), encoding="utf-8")
    return {"PROFILES": str(profiles), "MICROBATCHES": str(microbatches)}


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, Any]:
    code = main(["estimate", *argv, "--json"])
    out = capsys.readouterr()
    return code, (json.loads(out.out) if code == 0 else out.err)


FIGURES = (
    "estimate_bytes",
    "forward_backward_bytes",
    "static_bytes",
    "peak_bytes",
    "per_rank_bytes",
    "stage_bytes",
    "device_budget",
    "components",
    "static_components",
)


@pytest.mark.parametrize("door", DOORS)
@pytest.mark.parametrize("flag", sorted(CHANGES))
def test_a_flag_is_priced_named_or_refused(
    door: str, flag: str, files: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, base = _run(DOORS[door], capsys)
    assert code == 0, base
    given = [files.get(a, a) for a in CHANGES[flag]]
    code, got = _run([*DOORS[door], *given], capsys)
    if code != 0:
        assert code == 2 and got.startswith("cpmem: error: "), got
        assert (door, flag) not in SAME
        return
    moved = any(got.get(k) != base.get(k) for k in FIGURES)
    named = set(got["ignored_options"]) - set(base["ignored_options"])
    if (door, flag) in SAME:
        assert not moved and not named, f"{flag} on {door}: expected {SAME[door, flag]!r}"
        return
    # a flag is priced (moves a figure) or named, never both; a layout flag on the Megatron
    # door may move the run and name what it moved (its micro-batches at PP 1)
    own = flag.removeprefix("--").replace("-", "_")
    named_own = own in named or (bool(named) and not moved)
    assert moved != named_own, f"{flag} on {door}: moved={moved}, named={sorted(named)}"


def test_world_size_beside_a_model_gives_the_data_parallel_ranks(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--world-size 16 at TP 2 x CP 2 x PP 1 is DP 4: the same step as --dp 4 (the
    distributed optimizer then shards over DP x CP = 8); a --dp that differs is refused
    naming both, and capacity, which searches layouts, takes --dp."""
    base = [*DOORS["model"], "--distributed-optimizer"]
    code, world = _run([*base, "--world-size", "16"], capsys)
    assert code == 0
    code, dp = _run([*base, "--dp", "4"], capsys)
    assert code == 0
    assert world == dp
    code, err = _run([*base, "--world-size", "16", "--dp", "2"], capsys)
    assert code == 2
    assert (
        "dp=2: contradicts --world-size 16: DP = world / (TP x CP x PP) = 16 / (2 x 2 x 1)" in err
    )
    code, err = _run([*base, "--world-size", "6"], capsys)
    assert code == 2 and "world_size=6: is not divisible by TP x CP x PP = 2 x 2 x 1" in err
    code = main(["capacity", "--model", "qwen3-1.7b", "--device", "h100", "--world-size", "8"])
    assert code == 2 and "world_size=8" in capsys.readouterr().err


@pytest.mark.parametrize("door", DOORS)
def test_an_unknown_container_is_refused_on_every_door(
    door: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _run([*DOORS[door], "--container", "bogus"], capsys)
    assert code == 2
    assert "container='bogus': must be one of ['dev', 'ngc-24.01', 'ngc-24.10']" in err


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--world-size", "8"], "dp"),  # DP 8 at TP 1: no distributed optimizer reads it
        (["--rank", "last"], "rank"),  # one stage, no distributed optimizer: every rank's
        (["--etp", "3"], "etp"),  # Qwen3-1.7B has no routed experts
    ],
)
def test_the_reported_config_run_names_what_changes_nothing(
    flags: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The reproduction: on a --config run these once changed nothing and nothing named them."""
    code, base = _run(DOORS["config"], capsys)
    code, got = _run([*DOORS["config"], *flags], capsys)
    assert code == 0
    assert got["ignored_options"] == [named] and base["ignored_options"] == []
    assert {k: got[k] for k in FIGURES if k in got} == {k: base[k] for k in FIGURES if k in base}
