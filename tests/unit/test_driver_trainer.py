"""CPU checks of the driver's trainer-step cells (``--head``, ``--head-ce``,
``--lora-rank``, ``--lora-dropout``; gpu_tests/driver/head.py and the engines' adapters).

Why: trainer_check.sh gets a few minutes of a lent H200, so every new path must run
here first: its flags parse (bad values exit 2 naming the field), the default still
builds the harness exactly (same parameters, same rows), a trainer row says what it ran
(sidecar ``trainer_step``, refused by golden/'s importer) and each head and adapter path
runs forward and backward on the CPU at tiny size. No memory figure is produced on CPU.
"""

from __future__ import annotations

import csv
import functools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cpmem.errors import CpmemError
from cpmem.golden.files import GoldenDataError
from cpmem.golden.validation import validate_row

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from gpu_tests import driver  # noqa: E402
from gpu_tests.driver.head import build_head, have_megatron_cross_entropy  # noqa: E402

DENSE = {
    "model_type": "qwen3",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 256,
}
HYBRID = {
    **DENSE,
    "model_type": "qwen3_5_text",
    "num_hidden_layers": 4,
    "full_attention_interval": 4,
    "linear_num_key_heads": 2,
    "linear_key_head_dim": 16,
    "linear_num_value_heads": 4,
    "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
}


@functools.cache
def megatron() -> bool:
    """Whether megatron-core's cross entropy imports: asked by the tests that need it, not
    at collection (importing megatron-core takes seconds, in every xdist worker)."""
    return have_megatron_cross_entropy()


def _config(tmp_path: Path, raw: dict[str, Any], name: str) -> str:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(raw))
    return str(path)


def _spec(*args: str) -> Any:
    base = ["--model", "qwen3-1.7b", "--layers", "2", "--lengths", "256"]
    return driver.spec_from_args(driver.build_parser().parse_args([*base, *args]))


# ------------------------------------------------------------------ flags


def test_defaults_are_the_harness() -> None:
    spec = _spec()
    assert (spec.head, spec.head_ce, spec.lora_rank, spec.lora_dropout) == ("hidden", "", 1, 0.0)
    assert spec.is_harness and spec.harness_adapters and spec.head_chunk is None


def test_trainer_flags_parse() -> None:
    spec = _spec("--head", "chunked:4096", "--lora-rank", "16", "--lora-dropout", "0.05")
    assert (spec.head, spec.head_chunk, spec.lora_rank, spec.lora_dropout) == (
        "chunked:4096",
        4096,
        16,
        0.05,
    )
    assert spec.head_ce == "" and not spec.is_harness and not spec.harness_adapters
    logits = _spec("--head", "logits")
    assert logits.head_ce == ("megatron" if megatron() else "torch")
    assert _spec("--head", "logits", "--head-ce", "torch").head_ce == "torch"
    dropout_only = _spec("--lora-dropout", "0.1")
    assert dropout_only.head == "hidden" and not dropout_only.is_harness


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--head", "fused"], "head"),  # priced by cpmem, not run by the driver
        (["--head", "linear-ce"], "head"),
        (["--head", "chunked"], "head"),
        (["--head", "chunked:0"], "head"),
        (["--head", "chunked:x"], "head"),
        (["--head", "logits:5"], "head"),
        (["--head", "bogus"], "head"),
        (["--head-ce", "bogus", "--head", "logits"], "head_ce"),
        (["--head-ce", "torch"], "head_ce"),  # only the logits head has a cross entropy
        (["--lora-rank", "0"], "lora_rank"),
        (["--lora-rank", "2.5"], "lora_rank"),
        (["--lora-dropout", "1"], "lora_dropout"),
        (["--lora-dropout", "-0.1"], "lora_dropout"),
        (["--lora-dropout", "nan"], "lora_dropout"),
        (["--lora-dropout", "x"], "lora_dropout"),
        (["--head", "logits", "--tp", "2", "--engine", "megatron"], "head"),
    ],
)
def test_bad_trainer_flags_name_the_field(args: list[str], field: str) -> None:
    with pytest.raises(CpmemError) as info:
        _spec(*args)
    assert str(info.value).startswith(f"{field}=")


def test_bad_flag_exits_2_naming_the_field() -> None:
    rc = driver.main(["--model", "qwen3-1.7b", "--lengths", "64", "--lora-dropout", "2"])
    assert rc == 2


def test_estimate_prices_the_step_the_cell_runs() -> None:
    harness = _spec()
    geometry = driver.cell_geometry(harness)
    plan = driver.cell_plan(harness, geometry)
    base = driver.cell_estimate(harness, geometry, plan, policy="tight")
    for args, head in [(["--head", "logits"], "logits"), (["--head", "chunked:64"], "chunked:64")]:
        est = driver.cell_estimate(_spec(*args), geometry, plan, policy="tight")
        assert est.head.label == head and est.estimate_bytes > base.estimate_bytes
    lora = driver.cell_estimate(
        _spec("--lora-rank", "16", "--lora-dropout", "0.05"), geometry, plan, policy="tight"
    )
    assert (lora.adapter.rank, lora.adapter.dropout) == (16, 0.05)
    assert lora.estimate_bytes > base.estimate_bytes


# ------------------------------------------------------------------ rows


def _row(spec: Any) -> dict[str, str]:
    geometry = driver.cell_geometry(spec)
    plan = driver.cell_plan(spec, geometry)
    agg = {
        "measured": True,
        "rank_samples": 2,
        "forward_peak_bytes": 100,
        "first_forward_peak_bytes": 100,
        "repeat_forward_peak_bytes": 90,
        "retained_max_bytes": 50,
        "forward_backward_peak_bytes": 200,
        "baseline_min_bytes": 10,
        "baseline_max_bytes": 10,
        "available_bytes": 10**9,
        "finite": True,
    }
    prov = {"git_revision": "a" * 40, "driver_sha256": "b" * 64}
    return driver.build_row(spec, geometry, plan, 1000, agg, prov, "NVIDIA H200", "run1")


def test_harness_row_and_id_are_unchanged() -> None:
    row = _row(_spec())
    assert tuple(row) == driver.GOLDEN_COLUMNS
    assert row["cell_id"] == "native:qwen3-1.7b-L2:tp1cp1:selective-core_attn:256p0:megatron:run1"
    validate_row(row)


def test_trainer_row_says_what_it_ran_and_golden_refuses_it() -> None:
    spec = _spec("--head", "logits", "--head-ce", "torch", "--lora-rank", "16",
                 "--lora-dropout", "0.05")  # fmt: skip
    row = _row(spec)
    assert list(row)[-1] == driver.TRAINER_COLUMN
    assert row[driver.TRAINER_COLUMN] == "head=logits;ce=torch;lora_rank=16;lora_dropout=0.05"
    assert row["cell_id"].endswith(":megatron:head-logits-torch:lora-r16-p0.05:run1")
    with pytest.raises(GoldenDataError, match="unknown columns"):
        validate_row(row)
    validate_row({k: v for k, v in row.items() if k != driver.TRAINER_COLUMN})  # else golden


def test_trainer_rows_csv_carries_the_sidecar(tmp_path: Path) -> None:
    harness, trainer = _row(_spec()), _row(_spec("--head", "chunked:64"))
    driver.write_rows(tmp_path / "harness" / "rows.csv", [harness])
    driver.write_rows(tmp_path / "trainer" / "rows.csv", [trainer])
    header = (tmp_path / "harness" / "rows.csv").read_text().splitlines()[0]
    assert header == ",".join(driver.GOLDEN_COLUMNS)  # the harness's file as before
    out = tmp_path / "merged.csv"
    assert driver.merge_cell_rows(tmp_path, out, trainer=True) == 2
    with out.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [r[driver.TRAINER_COLUMN] for r in rows] == [
        driver.HARNESS_STEP,
        "head=chunked:64;ce=;lora_rank=1;lora_dropout=0",
    ]
    assert driver.trainer_step(_spec()) == driver.HARNESS_STEP
    # without trainer=True (the other scripts) a harness-only merge is golden-only
    (tmp_path / "trainer" / "rows.csv").unlink()
    driver.merge_cell_rows(tmp_path, out)
    assert out.read_text().splitlines()[0] == ",".join(driver.GOLDEN_COLUMNS)


# ------------------------------------------------------------------ modules, in process


def _tiny_spec(tmp_path: Path, *args: str) -> Any:
    cfg = _config(tmp_path, DENSE, "dense")
    parsed = driver.build_parser().parse_args(["--config", cfg, "--lengths", "40", *args])
    return driver.spec_from_args(parsed)


def test_chunked_head_equals_the_cross_entropy_and_keeps_no_logits(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    spec_ce = _tiny_spec(tmp_path, "--head", "logits", "--head-ce", "torch", "--engine", "torch")
    spec_ch = _tiny_spec(tmp_path, "--head", "chunked:16", "--engine", "torch")
    geometry = driver.cell_geometry(spec_ce)
    cpu = torch.device("cpu")
    torch.manual_seed(0)
    ce = build_head(spec_ce, geometry, cpu)
    torch.manual_seed(0)
    chunked = build_head(spec_ch, geometry, cpu)
    assert torch.equal(ce.weight, chunked.weight)
    hidden = torch.randn(40, 64, dtype=torch.bfloat16)
    labels = torch.randint(0, 256, (40,))

    def run(head: Any) -> tuple[Any, Any, list[tuple[int, ...]]]:
        x = hidden.clone().requires_grad_(True)
        saved: list[tuple[int, ...]] = []

        def pack(t: Any) -> Any:
            saved.append(tuple(t.shape))
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = head(x, labels)
        loss.backward()
        return loss.detach(), x.grad, saved

    loss_ce, grad_ce, saved_ce = run(ce)
    loss_ch, grad_ch, saved_ch = run(chunked)
    assert torch.allclose(loss_ce, loss_ch, atol=1e-5)
    assert torch.allclose(grad_ce.float(), grad_ch.float(), atol=1e-4)
    assert (40, 256) in saved_ce  # the cross entropy keeps the logits' softmax
    assert not [s for s in saved_ch if s and s[-1] == 256]  # chunks: recomputed, not kept
    assert driver.build_head(_tiny_spec(tmp_path), geometry, cpu) is None  # the harness


def test_output_layer_pads_the_vocabulary_as_megatron(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    cfg = _config(tmp_path, {**DENSE, "vocab_size": 300}, "odd")
    parsed = driver.build_parser().parse_args(["--config", cfg, "--lengths", "8", "--head",
                                               "chunked:4", "--engine", "torch"])  # fmt: skip
    spec = driver.spec_from_args(parsed)
    head = build_head(spec, driver.cell_geometry(spec), torch.device("cpu"))
    assert tuple(head.weight.shape) == (384, 64)  # 300 up to a multiple of 128
    loss = head(torch.randn(8, 64, dtype=torch.bfloat16, requires_grad=True),
                torch.randint(0, 300, (8,)))  # fmt: skip
    assert loss.dim() == 0 and torch.isfinite(loss)


def test_grouped_adapters_share_one_dropped_input(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    group = driver.make_lora_group(8, {"q": 6, "k": 4}, "cpu", torch.float32, rank=3, dropout=0.5)
    shapes = {n: tuple(p.shape) for n, p in group.named_parameters()}
    assert shapes == {"weight.q": (6, 8), "weight.k": (4, 8), "lora_a": (3, 8),
                      "lora_b.q": (6, 3), "lora_b.k": (4, 3)}  # fmt: skip
    with torch.no_grad():
        group.lora_a.fill_(1.0)
    x = torch.ones(1000, 8)
    mid = group.adapter_input(x)
    # dropout before A: each row sums the kept inputs, scaled by 1 / (1 - p) = 2
    assert set(mid[:, 0].tolist()) <= {float(2 * k) for k in range(9)}
    assert mid[:, 0].std() > 0
    no_dropout = driver.make_lora_group(8, {"o": 5}, "cpu", torch.float32, rank=2, dropout=0.0)
    assert torch.equal(no_dropout.adapter_input(x), x @ no_dropout.lora_a.t())
    assert no_dropout(x).shape == (1000, 5)


def _adapter_shapes(tmp_path: Path, raw: dict[str, Any], *args: str) -> dict[str, tuple[int, ...]]:
    torch = pytest.importorskip("torch")
    cfg = _config(tmp_path, raw, "m")
    spec = driver.spec_from_args(
        driver.build_parser().parse_args(
            ["--config", cfg, "--lengths", "40", "--engine", "torch", *args]
        )
    )
    geometry = driver.cell_geometry(spec)
    request = driver.Request.shared(list(spec.lengths), 0)
    plan = driver.cell_plan(spec, geometry)
    layout = driver.RowLayout.from_plan(request, plan.groups[0].attention_tokens)
    from cpmem.step.recompute import Recompute

    ctx = driver.RankContext(
        layout, 0, driver.Dist(0, 1, torch.device("cpu")), Recompute.parse("none", None),
        lora_rank=spec.lora_rank, lora_dropout=spec.lora_dropout,
    )  # fmt: skip
    model = driver.build_torch_model(geometry, ctx, torch.device("cpu"))
    return {n: tuple(p.shape) for n, p in model.named_parameters() if "lora_" in n}


def test_harness_adapters_are_per_projection_rank_1(tmp_path: Path) -> None:
    shapes = _adapter_shapes(tmp_path, HYBRID)
    layer0 = {n[len("layers.0.") :]: s for n, s in shapes.items() if n.startswith("layers.0.")}
    assert layer0 == {
        "mixer.in_proj_qkv.lora_a": (1, 64), "mixer.in_proj_qkv.lora_b": (128, 1),
        "mixer.in_proj_z.lora_a": (1, 64), "mixer.in_proj_z.lora_b": (64, 1),
        "mixer.in_proj_b.lora_a": (1, 64), "mixer.in_proj_b.lora_b": (4, 1),
        "mixer.in_proj_a.lora_a": (1, 64), "mixer.in_proj_a.lora_b": (4, 1),
        "mixer.out_proj.lora_a": (1, 64), "mixer.out_proj.lora_b": (64, 1),
        "mlp.gate_proj.lora_a": (1, 64), "mlp.gate_proj.lora_b": (128, 1),
        "mlp.up_proj.lora_a": (1, 64), "mlp.up_proj.lora_b": (128, 1),
        "mlp.down_proj.lora_a": (1, 128), "mlp.down_proj.lora_b": (64, 1),
    }  # fmt: skip
    attn = {n[len("layers.3.mixer.") :] for n in shapes if n.startswith("layers.3.mixer.")}
    assert attn == {f"{p}.lora_{ab}" for p in ("q_proj", "k_proj", "v_proj", "o_proj")
                    for ab in "ab"}  # fmt: skip


def test_trainer_adapters_follow_megatrons_fused_projections(tmp_path: Path) -> None:
    shapes = _adapter_shapes(tmp_path, HYBRID, "--lora-rank", "4", "--lora-dropout", "0.1")
    a_mats = sorted(n for n in shapes if n.endswith("lora_a"))
    # per layer: one A on the shared input of the mixer's input projections, one on its
    # output projection, one on gate/up, one on down (megatron: qkv|gdn_in, proj|gdn_out,
    # fc1, fc2)
    assert len(a_mats) == 4 * 4
    assert shapes["layers.0.mixer.in_group.lora_a"] == (4, 64)
    assert shapes["layers.0.mixer.in_group.lora_b.in_proj_z"] == (64, 4)
    assert shapes["layers.3.mixer.in_group.lora_b.q_proj"] == (128, 4)  # gated query
    assert shapes["layers.3.mlp.down_proj.lora_b.out"] == (64, 4)


# ------------------------------------------------------------------ tiny CPU end to end


def _run(tmp_path: Path, name: str, args: list[str]) -> dict[str, Any]:
    out = tmp_path / name
    proc = subprocess.run(
        [sys.executable, "-m", "gpu_tests.driver", *args, "--device", "cpu", "--out", str(out)],
        capture_output=True, text=True, timeout=240, cwd=REPO,
        env=dict(os.environ, CUDA_VISIBLE_DEVICES=""),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary: dict[str, Any] = json.loads((out / "summary.json").read_text())
    samples = [s for r in summary["ranks"] for s in r["samples"]]
    assert len(samples) == 2 * summary["spec"]["cp"]
    for s in samples:  # every step ran: forward, loss, backward, adapter grads
        assert s["loss_finite"] and s["adapter_grads_finite"]
        assert s["adapter_grads_present"] == s["adapter_params"] == s["adapter_grads_nonzero"] > 0
        assert s["forward_peak_bytes"] is None  # CPU: nothing measured, nothing invented
    assert summary["row"]["finite"] == "True"
    with (out / "rows.csv").open(newline="") as fh:
        (row,) = list(csv.DictReader(fh))
    assert row[driver.TRAINER_COLUMN] == summary["trainer"]["trainer_step"]
    assert summary["estimate_tight"]["head"] == summary["spec"]["head"]
    assert summary["estimate_tight"]["adapter"]["rank"] == summary["spec"]["lora_rank"]
    assert "forward_backward_bytes" in summary["estimate_tight"]
    return summary


CELLS = {
    "torch-lora-dropout-chunked": (
        "hybrid", ["--head", "chunked:32", "--lora-rank", "4", "--lora-dropout", "0.1"]),
    "torch-cp2-logits-lora": (
        "hybrid", ["--head", "logits", "--cp", "2", "--lora-rank", "2", "--lora-dropout", "0.2"]),
    "megatron-logits-lora-dropout": (
        "dense", ["--head", "logits", "--lora-rank", "4", "--lora-dropout", "0.1"]),
    "megatron-chunked": ("dense", ["--head", "chunked:16", "--recompute", "full"]),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(CELLS))
def test_cpu_trainer_cell_runs_every_step(name: str, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    model, args = CELLS[name]
    if model == "dense" and not megatron():
        pytest.skip("megatron-core is not installed")
    cfg = _config(tmp_path, HYBRID if model == "hybrid" else DENSE, model)
    summary = _run(tmp_path, name, ["--config", cfg, "--lengths", "100", *args])
    assert summary["spec"]["engine"] == ("torch" if model == "hybrid" else "megatron")
    if summary["spec"]["cp"] == 2:
        assert [r["rank_tokens"] for r in summary["ranks"]] == summary["plan"]["rank_tokens"]


def test_cpu_heads_run_and_compute_the_same_loss(tmp_path: Path) -> None:
    """Each head on the torch engine runs every step; with the same seed, model and
    labels, torch's and megatron's cross entropy and the chunked log-probs give one loss
    (the heads differ in memory, not in value)."""
    pytest.importorskip("torch")
    cfg = _config(tmp_path, HYBRID, "hybrid")
    base = ["--config", cfg, "--lengths", "100"]
    heads = [["--head", "logits", "--head-ce", "torch"], ["--head", "chunked:32"]]
    if megatron():
        heads.append(["--head", "logits", "--head-ce", "megatron"])
    losses = []
    for i, head in enumerate(heads):
        summary = _run(tmp_path, f"h{i}", [*base, *head])
        assert summary["ranks"][0]["head_ce"] == (head[3] if "--head-ce" in head else None)
        assert summary["ranks"][0]["gdn_kernel"] == "torch-fallback"
        losses.append(summary["ranks"][0]["samples"][0]["loss"])
    assert max(losses) - min(losses) < 1e-4 * abs(losses[0])


# ------------------------------------------------------------------ trainer_check's table


def _summary(fwd: int | None, fb: int | None, t_fwd: int, t_fb: int, step: str) -> dict:
    return {
        "aggregate": {"forward_peak_bytes": fwd, "forward_backward_peak_bytes": fb,
                      "finite": True, "gdn_fallback_saved_bytes": None},
        "estimate": {"estimate_bytes": t_fwd + 2**20},
        "estimate_tight": {"estimate_bytes": t_fwd, "forward_backward_bytes": t_fb},
        "trainer": {"trainer_step": step},
        "spec": {"engine": "torch"},
    }  # fmt: skip


def test_trainer_table_reads_each_term_against_its_base(tmp_path: Path) -> None:
    from gpu_tests.driver.trainer_table import main, table

    gib = 2**30
    cells = {
        "m-1.5b-base": _summary(2 * gib, 3 * gib, 2 * gib, 4 * gib, driver.HARNESS_STEP),
        "m-1.5b-logits": _summary(5 * gib, 6 * gib, 4 * gib, 8 * gib, "head=logits;ce=torch"),
        "n-base": _summary(None, None, gib, gib, driver.HARNESS_STEP),  # CPU: not measured
    }
    for name, s in cells.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(json.dumps(s))
    text = table(tmp_path)
    line = next(x for x in text.splitlines() if x.startswith("m-1.5b-logits "))
    assert line.split()[1:] == ["5.000", "6.000", "4.001", "4.000", "8.000", "1.250", "0.750",
                                "+3072", "+2048", "+3072", "+4096"]  # fmt: skip
    base = next(x for x in text.splitlines() if x.startswith("n-base "))
    assert base.split()[1:3] == ["-", "-"] and base.split()[4] == "1.000"
    assert "m-1.5b-logits: torch engine, head=logits;ce=torch, finite=True" in text
    assert main([str(tmp_path / "missing")]) == 2
