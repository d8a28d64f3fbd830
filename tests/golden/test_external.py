"""Gating an estimator that is not a cpmem policy: ``cpmem gate --estimator`` and
``--estimates``, and ``cpmem golden export`` (docs/external-estimators.md)."""

from __future__ import annotations

import csv
import dataclasses
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cpmem.cli import main
from cpmem.errors import InputError
from cpmem.gate.external import describe, describe_row, hf_config, step_description
from cpmem.gate.external_simulated import row_descriptions
from cpmem.golden.cells import load_cells
from cpmem.golden.files import GOLDEN_DIR
from cpmem.model.hf_config import load_config
from cpmem.model.load import load_model
from cpmem.model.presets import PRESETS
from cpmem.plan.layout import ParallelLayout
from cpmem.plan.plan import ForwardGroup, Plan
from cpmem.plan.request import Request
from cpmem.samples.rows import load_rows, simulated_dir
from cpmem.step.cuda_graphs import CudaGraphs
from cpmem.step.describe import describe_step
from cpmem.step.device import Device
from cpmem.step.fp8 import Fp8
from cpmem.step.offload import Offload
from cpmem.step.pipeline import Pipeline
from cpmem.step.recompute import Module, Recompute
from cpmem.step.runtime import Runtime
from cpmem.step.step import Step, StepSettings
from cpmem.step.trainer import Adapter, Head, Optimizer
from tests.golden import external_estimators as ext

ROOT = Path(__file__).resolve().parents[2]
MODULE = "tests.golden.external_estimators"
MIB = 1 << 20
# trainer.ADAPTER_TARGETS written out: the mixers' projections (attention, GDN, Mamba-2's
# in_proj/out_proj) and the feed-forward ones
EVERY_TARGET = [
    "qkv", "proj", "fc1", "fc2", "gdn_in", "gdn_out", "experts", "mamba_in", "mamba_out"
]  # fmt: skip
ATTENTION_TARGETS = ["qkv", "proj", "gdn_in", "gdn_out", "mamba_in", "mamba_out"]
DOC = (ROOT / "docs" / "external-estimators.md").read_text(encoding="utf-8")


def _doc_table_keys(header: str) -> set[str]:
    """Every backticked name in the first column of the doc's table under ``header``."""
    lines = DOC.splitlines()
    start = lines.index(header) + 2  # past the header and its rule
    keys: set[str] = set()
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        keys.update(re.findall(r"`([^`]+)`", line.split("|")[1]))
    return keys


DOC_KEYS = _doc_table_keys("| key | meaning | unit |")
MICROBATCH_DOC_KEYS = _doc_table_keys("| micro-batch key | meaning | unit |")

with (GOLDEN_DIR / "cells.csv").open(newline="", encoding="utf-8") as _fh:
    RAW = list(csv.DictReader(_fh))
# measured cells straight from the file: id -> (forward peak, forward+backward peak or None)
PEAKS = {
    r["cell_id"]: (
        int(r["forward_peak_bytes"]),
        int(r["forward_backward_peak_bytes"]) if r["forward_backward_peak_bytes"] else None,
    )
    for r in RAW
    if r["forward_peak_bytes"]
}
DESCRIBED = {c.cell_id: describe(c) for c in load_cells() if c.cell_id in PEAKS}


@pytest.fixture(autouse=True)
def _importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT))


def _gate(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    rc = main(["gate", *argv, "--json"])
    out = capsys.readouterr().out
    return rc, (json.loads(out) if out.strip() else {})


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_the_description_config_reads_back_to_the_preset(name: str) -> None:
    geometry = PRESETS[name]
    cfg = json.loads(json.dumps(hf_config(geometry)))
    assert load_config(cfg, name=name, fused_swiglu=geometry.fused_swiglu) == geometry


def test_descriptions_carry_the_recorded_layout_and_never_the_peaks() -> None:
    assert set(DESCRIBED) == set(PEAKS) and len(PEAKS) > 50
    for r in RAW:
        d = DESCRIBED.get(r["cell_id"])
        if d is None:
            continue
        assert set(d) == DOC_KEYS
        assert json.loads(json.dumps(d)) == d  # plain JSON
        assert not any("peak" in k for k in d)
        assert (d["tp"], d["cp"], d["ep"]) == (int(r["tp"]), int(r["cp"]), int(r["ep"]))
        assert d["sp"] == (r["sequence_parallel"] == "True")
        assert d["lengths"] == [int(x) for x in r["lengths"].split("+")]
        assert d["shared_prefix"] == int(r["shared_prefix"])
        assert d["packed_tokens"] == int(r["packed_tokens"])
        assert d["recompute"] == r["mode"]
        assert d["compiled"] == (r["compiled"] == "True")
        if int(r["cp"]) > 1:  # the busiest rank's tokens as recorded
            assert d["busiest_tokens"] == int(r["retained_tokens"])
            assert d["rank_tokens_recorded"] == "busiest"
        if r["grad_segments"]:
            assert d["segments"] == int(r["grad_segments"])
        # warm where the first and repeat forward peaks were recorded within 1 MiB
        first, repeat = r["first_forward_peak_bytes"], r["repeat_forward_peak_bytes"]
        warm = bool(first and repeat) and abs(int(first) - int(repeat)) < MIB
        assert d["cold"] is not warm
        _assert_harness(d)


def _assert_harness(d: dict[str, Any]) -> None:
    """The measured harness: no LM head (the hidden states are returned), rank-1 LoRA
    on every projection without dropout, all-gathered K/V, one stage, one micro-batch."""
    cfg = d["config"]
    assert (d["head"], d["head_kind"], d["head_chunk"]) == ("hidden", "hidden", None)
    assert d["output_bytes"] == d["logical_tokens"] * cfg["hidden_size"] * 2
    assert (d["lora_rank"], d["lora_dropout"], d["lora_targets"]) == (1, 0.0, EVERY_TARGET)
    assert d["cp_comm"] == "all_gather" and d["dtype_bytes"] == 2
    assert (d["pp"], d["vpp"], d["microbatches"]) == (1, 1, 1)
    assert d["stage_layers"] == [cfg["num_hidden_layers"]]
    own = {k: v for k, v in d.items() if k in MICROBATCH_DOC_KEYS}
    assert d["microbatch_plans"] == [own]


def test_a_generous_external_estimator_passes(capsys: pytest.CaptureFixture[str]) -> None:
    # it truly covers every measured cell, forward and forward+backward
    for cid, (fwd_peak, fb_peak) in PEAKS.items():
        got = ext.generous(DESCRIBED[cid])
        assert got["forward"] >= fwd_peak, cid
        assert fb_peak is None or got["forward_backward"] >= fb_peak, cid
    rc, report = _gate(capsys, "--estimator", f"{MODULE}:generous")
    assert rc == 0 and report["passed"]
    checks = report["checks"]
    assert checks["coverage"]["cells"] == len(PEAKS) and checks["coverage"]["failing"] == []
    fb_measured = sum(1 for _, fb in PEAKS.values() if fb is not None)
    assert checks["coverage"]["forward_backward"]["covered"] == fb_measured
    for name in ("conformance", "controls", "refusals", "power", "targets"):
        assert checks[name]["applicable"] is False
    assert {g["group"] for g in checks["headroom"]["by_model"]} == {
        c.split("/")[-1] for c in {r["model"] for r in RAW}
    }


def test_an_estimator_that_misses_cells_fails_naming_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    expected = sorted(cid for cid, (peak, _) in PEAKS.items() if peak > ext.CAP)
    assert expected  # the cap is below the largest measured peaks
    rc, report = _gate(capsys, "--estimator", f"{MODULE}:capped")
    assert rc == 1 and not report["passed"]
    assert sorted(report["checks"]["coverage"]["failing"]) == expected
    assert "forward_backward" not in report["checks"]["coverage"]  # it gives forward only
    # the human report names them too
    assert main(["gate", "--estimator", f"{MODULE}:capped"]) == 1
    out = capsys.readouterr().out
    assert all(cid in out for cid in expected) and "n/a" in out


def test_an_estimator_returning_something_else_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["gate", "--estimator", f"{MODULE}:not_bytes"]) == 2
    assert "non-negative integer" in capsys.readouterr().err
    assert main(["gate", "--estimator", f"{MODULE}:nowhere"]) == 2
    assert main(["gate", "--estimator", "no_such_module_xyz:f"]) == 2


def _export(tmp_path: Path) -> list[dict[str, Any]]:
    out = tmp_path / "cells.jsonl"
    assert main(["golden", "export", "--out", str(out)]) == 0
    return [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]


def _write_csv(path: Path, rows: list[tuple[str, int, int | None]]) -> Path:
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["cell_id", "estimate_bytes", "forward_backward_bytes"])
        for cid, fwd, fb in rows:
            w.writerow([cid, fwd, "" if fb is None else fb])
    return path


def test_golden_export_writes_the_descriptions(tmp_path: Path) -> None:
    exported = _export(tmp_path)
    assert {d["cell_id"]: d for d in exported} == DESCRIBED


def test_estimates_csv_passes_and_fails_like_the_function(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    exported = _export(tmp_path)
    rows = [
        (d["cell_id"], ext.generous(d)["forward"], ext.generous(d)["forward_backward"])
        for d in exported
    ]
    good = _write_csv(tmp_path / "good.csv", rows)
    rc, report = _gate(capsys, "--estimates", str(good))
    assert rc == 0 and report["passed"]

    dropped = rows[0][0]
    missing = _write_csv(tmp_path / "missing.csv", rows[1:])
    rc, report = _gate(capsys, "--estimates", str(missing))
    assert rc == 1 and report["checks"]["coverage"]["failing"] == [f"{dropped} (no estimate)"]

    low_id, low_peak = next((cid, p) for cid, (p, _) in PEAKS.items())
    low = [(c, low_peak - 1 if c == low_id else f, fb) for c, f, fb in rows]
    rc, report = _gate(capsys, "--estimates", str(_write_csv(tmp_path / "low.csv", low)))
    assert rc == 1 and report["checks"]["coverage"]["failing"] == [low_id]

    forward_only = tmp_path / "forward_only.csv"
    forward_only.write_text(
        "cell_id,estimate_bytes\n" + "".join(f"{c},{f}\n" for c, f, _ in rows), encoding="utf-8"
    )
    rc, report = _gate(capsys, "--estimates", str(forward_only))
    assert rc == 0 and "forward_backward" not in report["checks"]["coverage"]


@pytest.mark.parametrize(
    "text, field",
    [
        ("cell_id,estimate_bytes\nno-such-cell,1\n", "cell_id"),
        ("cell_id,estimate_bytes\nx,lots\n", "estimate_bytes"),
        ("cell,bytes\nx,1\n", "estimates"),
    ],
)
def test_a_bad_estimates_file_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, field: str
) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(text, encoding="utf-8")
    assert main(["gate", "--estimates", str(path)]) == 2
    assert field in capsys.readouterr().err


def test_record_controls_does_not_combine_with_an_external_estimator(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["gate", "--record-controls", "--estimator", f"{MODULE}:generous"]
    assert main(argv) == 2
    assert "record-controls" in capsys.readouterr().err


# --- every field of the step is described --------------------------------------------

with (GOLDEN_DIR / "simulated" / "rows.csv").open(newline="", encoding="utf-8") as _fh:
    RAW_ROWS = list(csv.DictReader(_fh))
HARNESS_ROW = ("hidden", "1", "0.0", "all", "all_gather")  # head, rank, dropout, targets, comm


@pytest.fixture(scope="module")
def grid() -> dict[str, dict[str, Any]]:
    return {d["cell_id"]: d for d in row_descriptions()}


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split("+") if x]


def test_the_doc_lists_every_key_of_the_description_both_ways(
    grid: dict[str, dict[str, Any]],
) -> None:
    assert {"cell_id", "head", "microbatch_plans"} <= DOC_KEYS and "lengths" in MICROBATCH_DOC_KEYS
    for d in [*DESCRIBED.values(), *grid.values()]:
        assert set(d) == DOC_KEYS, d["cell_id"]
        for plan in d["microbatch_plans"]:
            assert set(plan) == MICROBATCH_DOC_KEYS, d["cell_id"]


def test_grid_descriptions_carry_each_rows_head_adapters_comm_and_pipeline(
    grid: dict[str, dict[str, Any]],
) -> None:
    assert list(grid) == [r["config_id"] for r in RAW_ROWS]
    seen = {"trainer": 0, "pipeline": 0, "stage layers": 0, "micro-batch lengths": 0}
    for r in RAW_ROWS:
        d = grid[r["config_id"]]
        kind, _, chunk = r["head"].partition(":")
        assert (d["head"], d["head_kind"], d["head_chunk"]) == (
            r["head"],
            kind,
            int(chunk) if chunk else None,
        )
        assert (d["lora_rank"], d["lora_dropout"]) == (
            int(r["lora_rank"]),
            float(r["lora_dropout"]),
        )
        targets = {"all": EVERY_TARGET, "attention": ATTENTION_TARGETS}[r["lora_targets"]]
        assert d["lora_targets"] == targets and d["cp_comm"] == r["cp_comm"]
        assert d["cold"] is True and d["sp"] == (r["sequence_parallel"] == "True")
        hidden = d["config"]["hidden_size"]
        returned = d["logical_tokens"] * hidden * 2 if kind == "hidden" else 0
        assert d["output_bytes"] == returned
        pp, vpp, m = int(r["pp"]), int(r["vpp"]), int(r["microbatches"])
        assert (d["pp"], d["vpp"], d["microbatches"]) == (pp, vpp, m)
        even = [int(r["layers"]) // (pp * vpp)] * (pp * vpp)
        assert d["stage_layers"] == (_ints(r["stage_layers"]) or even)
        lengths = _ints(r["lengths"])
        assert d["lengths"] == lengths and d["shared_prefix"] == int(r["shared_prefix"])
        given = [_ints(part) for part in r["microbatch_lengths"].split(";") if part]
        plans = d["microbatch_plans"]
        assert [p["lengths"] for p in plans] == (given or [lengths] * m)
        assert all(p["logical_tokens"] == sum(p["lengths"]) for p in plans)
        if not given:  # the simulator's own per-rank counts, every micro-batch alike
            assert d["attention_rank_tokens"] == _ints(r["attention_tokens"])
            assert d["gdn_rank_tokens"] == _ints(r["gdn_tokens"])
        seen["trainer"] += (r["head"], r["lora_rank"], r["lora_dropout"], r["lora_targets"],
                            r["cp_comm"]) != HARNESS_ROW  # fmt: skip
        seen["pipeline"] += pp > 1
        seen["stage layers"] += bool(r["stage_layers"])
        seen["micro-batch lengths"] += bool(given)
    assert all(seen.values()), seen  # every kind of row was checked


Change = Callable[[StepSettings], StepSettings]
BASE = describe_step(
    "qwen3.5-4b",
    [3072, 2048],
    shared_prefix=512,
    tp=2,
    cp=2,
    sp=True,
    head="chunked:1024",
    lora_rank=16,
    lora_dropout=0.1,
    lora_targets="attention",
    pp=2,
    microbatches=2,
    dp=2,
    device="h200",
)
NESTED: dict[str, type] = {
    "layout": ParallelLayout,
    "recompute": Recompute,
    "head": Head,
    "adapter": Adapter,
    "optimizer": Optimizer,
    "device": Device,
    "pipeline": Pipeline,
}
"""StepSettings fields whose value is a dataclass: each of its fields is described."""


def _set(**changes: Any) -> Change:
    return lambda s: s.replace(**changes)


def _nested(owner: str, **changes: Any) -> Change:
    return lambda s: s.replace(**{owner: dataclasses.replace(getattr(s, owner), **changes)})


def _same(s: StepSettings) -> StepSettings:
    return s


HIDDEN: Change = _set(head=Head())
FULL_DENSE: Change = _set(
    geometry=load_model("qwen3-1.7b"),
    adapter=Adapter(),
    training="full",
    recompute=Recompute.parse("none"),
    layout=ParallelLayout(tp=2, sp=True),
)
"""A step FP8 and the TP overlap are priced on: full training of attention and dense MLPs
at TP 2 with SP, nothing recomputed."""
SETTINGS_CHANGES: dict[tuple[type, str], tuple[Change, Change, set[str]]] = {
    # (class, field): (the base, the base with the field changed, the keys that carry it)
    (StepSettings, "geometry"): (_same, _set(geometry=load_model("qwen3-1.7b")), {"config"}),
    (StepSettings, "compiled"): (_same, _set(compiled=True), {"compiled"}),
    (StepSettings, "moe_routing"): (_same, _set(moe_routing="balanced"), {"moe_routing"}),
    (StepSettings, "cold"): (_same, _set(cold=True), {"cold"}),
    (StepSettings, "planner"): (_same, _set(planner="balanced"), {"planner"}),
    # the returned outputs are the hidden states' only where no head ends the forward
    (StepSettings, "output_bytes"): (
        HIDDEN,
        _set(head=Head(), output_bytes=12_345),
        {"output_bytes"},
    ),
    (StepSettings, "allow_long"): (_same, _set(allow_long=True), {"allow_long"}),
    (StepSettings, "cp_comm"): (_same, _set(cp_comm="p2p"), {"cp_comm"}),
    # fp32 attention runs unfused (flash and fused take bf16/fp16 only): from an unfused base
    (StepSettings, "dtype_bytes"): (
        _set(runtime=Runtime().with_backend("unfused", "unfused")),
        _set(runtime=Runtime().with_backend("unfused", "unfused"), dtype_bytes=4),
        {"dtype_bytes"},
    ),
    (ParallelLayout, "tp"): (_same, _nested("layout", tp=1), {"tp"}),
    (ParallelLayout, "cp"): (_same, _nested("layout", cp=4), {"cp", "rank_tokens"}),
    (ParallelLayout, "sp"): (_same, _nested("layout", sp=False), {"sp"}),
    (ParallelLayout, "ep"): (_same, _nested("layout", ep=2), {"ep"}),
    (ParallelLayout, "dp"): (_same, _nested("layout", dp=4), {"dp"}),
    (Recompute, "mode"): (_same, _nested("recompute", mode="full"), {"recompute", "modules"}),
    (Recompute, "modules"): (
        _same,
        _nested("recompute", modules=(Module.CORE_ATTN, Module.MLP)),
        {"modules"},
    ),
    (Head, "kind"): (_same, _set(head=Head("logits")), {"head", "head_kind", "head_chunk"}),
    (Head, "chunk"): (_same, _set(head=Head("chunked", 2048)), {"head", "head_chunk"}),
    (Adapter, "rank"): (_same, _nested("adapter", rank=64), {"lora_rank"}),
    (Adapter, "dropout"): (_same, _nested("adapter", dropout=0.0), {"lora_dropout"}),
    (Adapter, "targets"): (_same, _nested("adapter", targets=("fc1", "fc2")), {"lora_targets"}),
    (Optimizer, "kind"): (_same, _nested("optimizer", kind="sgd"), {"optimizer"}),
    (Optimizer, "distributed"): (
        _same,
        _nested("optimizer", distributed=True),
        {"distributed_optimizer"},
    ),
    (Optimizer, "instances"): (
        _nested("optimizer", distributed=True),
        _nested("optimizer", distributed=True, instances=2),
        {"optimizer_instances"},
    ),
    # Muon's layer-wise distributed optimizer is priced for full training
    (Optimizer, "muon_layout"): (
        lambda s: FULL_DENSE(s).replace(optimizer=Optimizer("muon", True)),
        _nested("optimizer", muon_layout="precomputed"),
        {"muon_layout"},
    ),
    (Device, "name"): (_same, _nested("device", name="another"), {"device"}),
    (Device, "total_bytes"): (
        _same,
        _nested("device", total_bytes=80 << 30),
        {"device_total_bytes"},
    ),
    (Pipeline, "pp"): (_same, _nested("pipeline", pp=4), {"pp", "stage_layers"}),
    (Pipeline, "vpp"): (_same, _nested("pipeline", vpp=2), {"vpp", "stage_layers"}),
    (Pipeline, "microbatches"): (
        _same,
        _nested("pipeline", microbatches=4),
        {"microbatches", "microbatch_plans"},
    ),
    (Pipeline, "layers"): (_same, _nested("pipeline", layers=(12, 20)), {"stage_layers"}),
    (Device, "compute_capability_major"): (
        _same,
        _nested("device", compute_capability_major=8),
        {"device_compute_capability"},
    ),
    (Device, "compute_capability_minor"): (
        _same,
        _nested("device", compute_capability_minor=5),
        {"device_compute_capability"},
    ),
    (Pipeline, "group"): (
        _same,
        _nested("pipeline", vpp=2, group=2),
        {"microbatch_group"},
    ),
    (Pipeline, "deferred_wgrad"): (
        lambda s: s.replace(
            adapter=Adapter(),
            training="full",
            head=Head("logits"),
            pipeline=dataclasses.replace(s.pipeline, pp=2),
        ),
        lambda s: s.replace(
            adapter=Adapter(),
            training="full",
            head=Head("logits"),
            pipeline=dataclasses.replace(s.pipeline, pp=2, deferred_wgrad=0),
        ),
        {"deferred_wgrad"},
    ),
    (StepSettings, "offload"): (_same, _set(offload=Offload(("core_attn",))), {"offload"}),
    (Optimizer, "grad_bytes"): (_same, _nested("optimizer", grad_bytes=2), {"grad_bytes"}),
    # Megatron FSDP lays out full training of dense GPT layers on one stage
    (Optimizer, "fsdp"): (
        _set(
            geometry=load_model("qwen3-1.7b"),
            training="full",
            adapter=Adapter(),
            pipeline=Pipeline(),
        ),
        _nested("optimizer", fsdp="optim"),
        {"fsdp"},
    ),
    (Optimizer, "fsdp_buffers"): (
        _set(
            geometry=load_model("qwen3-1.7b"),
            training="full",
            adapter=Adapter(),
            pipeline=Pipeline(),
            optimizer=Optimizer(fsdp="optim"),
        ),
        _nested("optimizer", fsdp="optim", fsdp_buffers="double-buffer"),
        {"fsdp_buffers"},
    ),
    (ParallelLayout, "etp"): (_same, _nested("layout", etp=2), {"etp"}),
    (Recompute, "full_method"): (
        _nested("recompute", mode="full"),
        _nested("recompute", mode="full", full_method="block"),
        {"full_recompute_method"},
    ),
    (Recompute, "full_layers"): (
        _nested("recompute", mode="full"),
        _nested("recompute", mode="full", full_layers=2),
        {"full_recompute_layers"},
    ),
    (StepSettings, "training"): (
        _set(adapter=Adapter()),
        _set(adapter=Adapter(), training="full"),
        {"training"},
    ),
    (StepSettings, "runtime"): (
        _same,
        _set(runtime=Runtime.megatron_lm()),
        {"runtime", "runtime_settings"},
    ),
    (StepSettings, "rank"): (_same, _set(rank="last"), {"rank"}),
    (StepSettings, "quantized_weights"): (
        _same,
        _set(quantized_weights="stored"),
        {"quantized_weights"},
    ),
    (StepSettings, "fp8"): (
        FULL_DENSE,
        lambda s: FULL_DENSE(s).replace(fp8=Fp8("tensorwise", True)),
        {"fp8"},
    ),
    (StepSettings, "tp_comm_overlap"): (
        FULL_DENSE,
        lambda s: FULL_DENSE(s).replace(tp_comm_overlap=True),
        {"tp_comm_overlap"},
    ),
    (StepSettings, "cuda_graphs"): (
        FULL_DENSE,
        lambda s: FULL_DENSE(s).replace(cuda_graphs=CudaGraphs("transformer_engine", ("attn",))),
        {"cuda_graphs"},
    ),
    (StepSettings, "holds_embedding"): (
        _same,
        _set(holds_embedding=False),
        {"holds_embedding"},
    ),
}
EXCLUDED: dict[tuple[type, str], str] = {
    (StepSettings, "profiles"): "cpmem's learned floors from earlier runs of a signature: "
    "an input of cpmem's own policies, not how the step runs (cells and rows price none)",
    (StepSettings, "fused_swiglu_asked"): "whether the caller named the activation's "
    "fusion: which options cpmem's policies name as ignored, not how the step runs (the "
    "fusion itself is the geometry's fused_swiglu, described)",
    (Device, "source"): "the provenance text of a preset's total bytes (compare=False: not "
    "part of the device)",
}


def _fields(cls: type) -> set[tuple[type, str]]:
    return {(cls, f.name) for f in dataclasses.fields(cls)}


def _describe(step: Step, lengths: list[int] | None = None) -> dict[str, Any]:
    return step_description(step, cell_id="x", model="m", lengths=lengths)


def test_every_field_of_the_step_settings_is_described_or_excluded_with_a_reason() -> None:
    for name, cls in NESTED.items():  # the nested dataclasses are the settings' own
        assert type(getattr(BASE.settings, name)) is cls, name
    every = {k for k in _fields(StepSettings) if k[1] not in NESTED}
    for cls in NESTED.values():
        every |= _fields(cls)
    assert set(SETTINGS_CHANGES) | set(EXCLUDED) == every
    assert not set(SETTINGS_CHANGES) & set(EXCLUDED)


@pytest.mark.parametrize("field", list(SETTINGS_CHANGES), ids=lambda k: f"{k[0].__name__}.{k[1]}")
def test_a_change_of_one_setting_changes_the_keys_that_carry_it(field: tuple[type, str]) -> None:
    before, after, keys = SETTINGS_CHANGES[field]
    base = before(BASE.settings)
    d0 = _describe(base.step(BASE.request))
    d1 = _describe(after(base).step(BASE.request))
    assert keys <= DOC_KEYS
    assert keys <= {k for k in d0 if d0[k] != d1[k]}


EXPLICIT = describe_step(
    "qwen3.5-4b",
    logical_tokens=6144,
    packed_tokens=6144,
    segments=2,
    rank_tokens=[3200, 2944],
    gdn_rank_tokens=[3072, 3072],
    tp=2,
    cp=2,
)
EXPLICIT_LENGTHS = [4096, 2048]


def _with_group(**changes: Any) -> Step:
    group = dataclasses.replace(EXPLICIT.plan.groups[0], **changes)
    return Step(EXPLICIT.settings, dataclasses.replace(EXPLICIT.plan, groups=(group,)))


def _with_plan(**changes: Any) -> Step:
    return Step(EXPLICIT.settings, dataclasses.replace(EXPLICIT.plan, **changes))


STEP_CHANGES: dict[tuple[type, str], tuple[Step, Step, set[str]]] = {
    # (class, field): (a step, the step with the field changed, the keys that carry it)
    (ForwardGroup, "logical_tokens"): (
        EXPLICIT,
        _with_group(logical_tokens=6000),
        {"logical_tokens"},
    ),
    (ForwardGroup, "packed_tokens"): (EXPLICIT, _with_group(packed_tokens=6200), {"packed_tokens"}),
    (ForwardGroup, "attention_tokens"): (
        EXPLICIT,
        _with_group(attention_tokens=(3300, 2844)),
        {"attention_rank_tokens", "rank_tokens"},
    ),
    (ForwardGroup, "gdn_tokens"): (
        EXPLICIT,
        _with_group(gdn_tokens=(3000, 3144)),
        {"gdn_rank_tokens"},
    ),
    (ForwardGroup, "grad_segments"): (EXPLICIT, _with_group(grad_segments=3), {"segments"}),
    (ForwardGroup, "real_tokens"): (EXPLICIT, _with_group(real_tokens=6100), {"real_tokens"}),
    (ForwardGroup, "rank_segments"): (
        EXPLICIT,
        _with_group(rank_segments=(1, 2)),
        {"rank_segments"},
    ),
    (Plan, "planner"): (EXPLICIT, _with_plan(planner="balanced"), {"planner"}),
    (Plan, "groups"): (
        EXPLICIT,
        _with_plan(groups=EXPLICIT.plan.groups * 2),
        {"forward_groups", "logical_tokens", "rank_tokens"},
    ),
    (Step, "request"): (
        BASE,
        BASE.settings.step(Request.shared([3072, 1536], 256)),
        {"lengths", "shared_prefix"},
    ),
    (Step, "microbatches"): (
        BASE,
        BASE.settings.step(BASE.request, microbatches=(BASE.request, Request.independent([1024]))),
        {"microbatch_plans"},
    ),
}
STEP_EXCLUDED: dict[tuple[type, str], str] = {
    (Step, "settings"): "described field by field (SETTINGS_CHANGES)",
    (Step, "plan"): "described field by field (the Plan and ForwardGroup entries)",
    (Step, "warnings"): "the checks' messages about the step, not what it holds",
    (Plan, "layout"): "the settings' own layout (step_for_plan requires it): tp, cp, sp, ep, dp",
}


def test_every_field_of_the_step_and_its_plan_is_described_or_excluded_with_a_reason() -> None:
    every = _fields(Step) | _fields(Plan) | _fields(ForwardGroup)
    assert set(STEP_CHANGES) | set(STEP_EXCLUDED) == every
    assert not set(STEP_CHANGES) & set(STEP_EXCLUDED)


@pytest.mark.parametrize("field", list(STEP_CHANGES), ids=lambda k: f"{k[0].__name__}.{k[1]}")
def test_a_change_of_one_plan_field_changes_the_keys_that_carry_it(
    field: tuple[type, str],
) -> None:
    before, after, keys = STEP_CHANGES[field]
    lengths = EXPLICIT_LENGTHS if before is EXPLICIT else None
    d0, d1 = _describe(before, lengths), _describe(after, lengths)
    assert keys <= DOC_KEYS
    assert keys <= {k for k in d0 if d0[k] != d1[k]}


def test_a_described_request_must_be_the_steps_own() -> None:
    with pytest.raises(InputError, match="lengths"):
        _describe(BASE, [4096])
    with pytest.raises(InputError, match="explicit plan"):
        _describe(EXPLICIT)


# --- rows that differ in one field ---------------------------------------------------

BASE_ROW = next(
    r
    for r in load_rows(simulated_dir())
    if r.pp > 1
    and r.cp > 1
    and r.microbatch_lengths
    and r.stage_layers != r.stage_layers[::-1]
    and not r.is_trainer
)
LAST_LONGER = (*BASE_ROW.microbatch_lengths[:-1], (BASE_ROW.microbatch_lengths[-1][0] + 512,))
ROW_CHANGES: dict[str, tuple[dict[str, Any], set[str]]] = {
    "head logits": ({"head": "logits"}, {"head", "head_kind", "output_bytes"}),
    "head chunked": (
        {"head": "chunked:4096"},
        {"head", "head_kind", "head_chunk", "output_bytes"},
    ),
    "lora rank": ({"lora_rank": 16}, {"lora_rank"}),
    "lora dropout": ({"lora_dropout": 0.1}, {"lora_dropout"}),
    "lora targets": ({"lora_targets": "attention"}, {"lora_targets"}),
    "cp comm": ({"cp_comm": "p2p"}, {"cp_comm"}),
    "stage layers": ({"stage_layers": BASE_ROW.stage_layers[::-1]}, {"stage_layers"}),
    "micro-batch lengths": ({"microbatch_lengths": LAST_LONGER}, {"microbatch_plans"}),
}


@pytest.mark.parametrize("change", list(ROW_CHANGES))
def test_rows_differing_in_one_field_differ_in_exactly_its_keys(change: str) -> None:
    fields, keys = ROW_CHANGES[change]
    sim_dir = simulated_dir()
    d0 = describe_row(BASE_ROW, sim_dir=sim_dir)
    d1 = describe_row(dataclasses.replace(BASE_ROW, **fields), sim_dir=sim_dir)
    assert {k for k in d0 if d0[k] != d1[k]} == keys


def test_an_estimator_reading_the_head_prices_rows_with_different_heads_apart() -> None:
    sim_dir = simulated_dir()
    heads = ("hidden", "logits", "fused", "chunked:1024", "linear-ce")
    described = [
        describe_row(dataclasses.replace(BASE_ROW, head=h), sim_dir=sim_dir) for h in heads
    ]
    aware = [ext.head_aware(d)["forward"] for d in described]
    plain = [ext.generous(d)["forward"] for d in described]
    assert len(set(plain)) == 1  # an estimator that ignores the head sees one step
    # hidden and linear-ce keep no logits; the other three keep different amounts
    assert aware[0] == aware[4] == plain[0]
    assert len({aware[0], aware[1], aware[2], aware[3]}) == 4


def test_the_simulated_gate_passes_the_head_to_the_estimator(
    grid: dict[str, dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    rc, report = _gate(capsys, "--tier", "simulated", "--estimator", f"{MODULE}:head_aware")
    assert rc in (0, 1) and report["rows"] == len(RAW_ROWS)
    got = {r["config_id"]: r["estimate_bytes"] for r in report["checks"]["coverage"]["by_row"]}
    priced = {cid for cid, d in grid.items() if d["head_kind"] in ("logits", "fused", "chunked")}
    assert priced and {r["config_id"] for r in RAW_ROWS if r["head"] != "hidden"} > priced
    for cid, d in grid.items():
        plain = ext.generous(d)["forward"]
        assert got[cid] == ext.head_aware(d)["forward"], cid
        assert (got[cid] > plain) == (cid in priced), cid


def test_golden_export_writes_every_row_description(
    tmp_path: Path, grid: dict[str, dict[str, Any]]
) -> None:
    out = tmp_path / "rows.jsonl"
    assert main(["golden", "export", "--tier", "simulated", "--out", str(out)]) == 0
    lines = [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()]
    assert lines == list(grid.values())
