"""CPU checks of the native measurement driver (the gpu_tests/driver package).

Why: the GPU campaign gets a few minutes of a lent H200, so everything that does not
need CUDA (argument handling, row schema, layout, GDN math, a tiny end-to-end run)
must be proven here first. No memory figure is produced on CPU and none is invented.
"""

from __future__ import annotations

import csv
import hashlib
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cpmem.golden.schema import COLUMN_NAMES
from cpmem.golden.validation import validate_row

REPO = Path(__file__).resolve().parents[2]
# The driver is a package run as a module from the checkout root.
DRIVER_CMD = [sys.executable, "-m", "gpu_tests.driver"]

DENSE_CONFIG = {
    "model_type": "qwen3",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 256,
}
HYBRID_CONFIG = {
    **DENSE_CONFIG,
    "model_type": "qwen3_5_text",
    "num_hidden_layers": 4,
    "full_attention_interval": 4,
    "linear_num_key_heads": 2,
    "linear_key_head_dim": 16,
    "linear_num_value_heads": 4,
    "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
}


def _load_driver() -> Any:
    if str(REPO) not in sys.path:  # pytest's pythonpath puts it there; be explicit anyway
        sys.path.insert(0, str(REPO))
    return importlib.import_module("gpu_tests.driver")


driver = _load_driver()


def _config(tmp_path: Path, raw: dict[str, Any], name: str) -> str:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(raw))
    return str(path)


# ------------------------------------------------------------------ argument handling


@pytest.mark.parametrize(
    ("argv", "field", "value"),
    [
        (["--lengths", "12x"], "lengths", "12x"),
        (["--lengths", "0+5"], "lengths", "0+5"),
        (["--lengths", "64", "--shared-prefix", "-3"], "shared_prefix", "-3"),
        (["--lengths", "64+64", "--shared-prefix", "64"], "shared_prefix", "64"),
        (["--lengths", "64", "--tp", "0"], "tp", "0"),
        (["--lengths", "64", "--tp", "3"], "tp", "3"),
        (["--lengths", "64", "--cp", "two"], "cp", "two"),
        (["--lengths", "64", "--cp", "0"], "cp", "0"),
        (["--lengths", "64", "--layers", "99"], "layers", "99"),
        (["--lengths", "64", "--recompute", "some"], "recompute", "some"),
        (["--lengths", "64", "--recompute", "none", "--modules", "mlp"], "modules", "mlp"),
    ],
)
def test_bad_argument_names_field_and_value(
    argv: list[str], field: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = driver.main(["--model", "qwen3-1.7b", *argv])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith(f"error: {field}=")
    assert value in err
    assert "Traceback" not in err


def test_bad_argument_exits_nonzero_without_traceback_as_a_process() -> None:
    proc = subprocess.run(
        [*DRIVER_CMD, "--model", "qwen3-1.7b", "--lengths", "64", "--cp", "-1"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode == 2
    assert "error: cp='-1'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_package_folder_runs_as_a_path_from_anywhere(tmp_path: Path) -> None:
    # worker ranks are started this way (python gpu_tests/driver --worker)
    proc = subprocess.run(
        [sys.executable, str(REPO / "gpu_tests" / "driver"), "--model", "qwen3-1.7b",
         "--lengths", "64", "--tp", "0"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "error: tp='0'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_driver_sha256_covers_every_module_of_the_package() -> None:
    names = [p.relative_to(driver.PACKAGE_DIR).as_posix() for p in driver.driver_files()]
    on_disk = sorted(
        p.relative_to(driver.PACKAGE_DIR).as_posix()
        for p in driver.PACKAGE_DIR.rglob("*.py")
        if "__pycache__" not in p.parts
    )
    assert names == on_disk and {"__init__.py", "__main__.py", "cli.py"} <= set(names)
    digest = driver.driver_sha256()
    assert len(digest) == 64 and digest == driver.driver_sha256()
    assert digest != hashlib.sha256((driver.PACKAGE_DIR / "__init__.py").read_bytes()).hexdigest()


def test_layout_rules_resolve_engine_and_refuse_unsupported() -> None:
    args = driver.build_parser().parse_args(["--model", "qwen3-1.7b", "--lengths", "64"])
    assert driver.spec_from_args(args).engine == "megatron"
    args = driver.build_parser().parse_args(
        ["--model", "qwen3.5-4b", "--layers", "8", "--lengths", "64", "--cp", "2"]
    )
    spec = driver.spec_from_args(args)
    assert (spec.engine, spec.layers, spec.cp, spec.sp) == ("torch", 8, 2, False)
    bad = driver.build_parser().parse_args(
        ["--model", "qwen3.5-4b", "--lengths", "64", "--engine", "megatron"]
    )
    with pytest.raises(driver.InputError, match="GDN"):
        driver.spec_from_args(bad)


# ------------------------------------------------------------------ rows


def _spec(**kw: Any) -> Any:
    base = {"model": "qwen3.5-4b", "config": None, "layers": 8, "lengths": (2048, 2048)}
    base.update(shared_prefix=614, cp=2)
    base.update(kw)
    return driver.validate_spec(driver.CellSpec(**base))


def _row(measured: bool) -> dict[str, str]:
    spec = _spec()
    geometry = driver.cell_geometry(spec)
    plan = driver.cell_plan(spec, geometry)
    est = driver.cell_estimate(spec, geometry, plan)
    # Synthetic per-rank samples: they exercise formatting only and are never written
    # anywhere a measurement could be read from.
    fig = (lambda n: n) if measured else (lambda n: None)
    ranks = [
        {
            "samples": [
                {
                    "repetition": rep,
                    "forward_peak_bytes": fig(1000 + 10 * r + rep),
                    "retained_bytes": fig(500 + r),
                    "forward_backward_peak_bytes": fig(2000 + r),
                    "baseline_bytes": fig(100 + r),
                    "available_bytes": fig(10**9 - r),
                    "loss_finite": True,
                    "adapter_grads_finite": True,
                    "adapter_grads_present": 3,
                    "adapter_params": 3,
                }
                for rep in range(2)
            ]
        }
        for r in range(2)
    ]
    agg = driver.aggregate(ranks)
    prov = driver.provenance(spec)
    name = "NVIDIA H200" if measured else "cpu"
    return driver.build_row(spec, geometry, plan, est.estimate_bytes, agg, prov, name, "run1")


def test_row_has_exactly_the_golden_columns() -> None:
    row = _row(measured=True)
    assert tuple(row) == driver.GOLDEN_COLUMNS
    schema = json.loads((REPO / "golden" / "schema.json").read_text())
    assert tuple(c["name"] for c in schema["columns"]) == driver.GOLDEN_COLUMNS
    assert tuple(COLUMN_NAMES) == driver.GOLDEN_COLUMNS


def test_row_provenance_and_integer_bytes() -> None:
    row = _row(measured=True)
    assert row["campaign"] == "native" and row["phase"] == "native"
    assert row["source_repository"] == "cpmem"
    assert row["source_path"] == "gpu_tests/driver"
    assert len(row["source_commit"]) == 40 and int(row["source_commit"], 16) >= 0
    assert row["estimator_source_sha"] == row["source_commit"]
    assert row["driver_sha256"] == driver.driver_sha256()
    assert len(row["driver_sha256"]) == 64
    for col in driver.BYTE_COLUMNS:
        if row[col]:
            assert row[col].isdigit(), (col, row[col])
    # maxima over ranks and repetitions; first/repeat split by repetition
    assert row["forward_peak_bytes"] == "1011"
    assert row["first_forward_peak_bytes"] == "1010"
    assert row["repeat_forward_peak_bytes"] == "1011"
    assert (row["baseline_min_bytes"], row["baseline_max_bytes"]) == ("100", "101")
    assert row["measured_rank_samples"] == "4"
    assert row["recorded_covers_forward"] == "True"
    assert row["lengths"] == "2048+2048" and row["logical_tokens"] == "4096"
    assert int(row["retained_tokens"]) < int(row["packed_tokens"])


def test_cpu_row_leaves_every_peak_empty() -> None:
    row = _row(measured=False)
    for col in ("forward_peak_bytes", "retained_max_bytes", "forward_backward_peak_bytes"):
        assert row[col] == ""
    assert row["measured_rank_samples"] == "0"
    assert row["recorded_covers_forward"] == ""
    assert row["recorded_estimate_bytes"].isdigit()
    assert row["device"] == "cpu"


def test_row_passes_golden_validation() -> None:
    row = _row(measured=True)
    assert row["phase"] == "native" and row["campaign"] == "native"
    validate_row(row)  # raises GoldenDataError naming the column on any violation


def test_written_csv_round_trips(tmp_path: Path) -> None:
    row = _row(measured=True)
    driver.write_rows(tmp_path / "rows.csv", [row])
    with (tmp_path / "rows.csv").open(newline="") as fh:
        back = list(csv.DictReader(fh))
    assert back == [row]


# ------------------------------------------------------------------ layout and GDN math


def test_row_layout_follows_the_plan_counts() -> None:
    request = driver.Request.shared([10, 8], 4)  # prefix 4, completions 6 and 4
    layout = driver.RowLayout.from_plan(request, [9, 5])
    assert layout.total == 14
    assert layout.pieces(0) == [driver.Piece(0, 0, 4), driver.Piece(1, 4, 9)]
    assert layout.pieces(1) == [driver.Piece(1, 9, 10), driver.Piece(2, 10, 14)]
    # second completion sees the prefix and itself, not the first completion
    assert layout.key_ranges(driver.Piece(2, 10, 14)) == [(0, 4), (10, 14)]
    assert layout.key_ranges(driver.Piece(1, 9, 10)) == [(0, 10)]
    assert layout.positions(1) == [9, 4, 5, 6, 7]
    assert layout.owner_of_end(9, 1) == (0, 1)


def test_gdn_chunked_fallback_matches_the_recurrence() -> None:
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(0)
    t, h, dk, dv = 150, 3, 8, 5
    q = torch.nn.functional.normalize(torch.randn(t, h, dk, generator=gen), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(t, h, dk, generator=gen), dim=-1)
    v = torch.randn(t, h, dv, generator=gen)
    g = -torch.rand(t, h, generator=gen) * 0.2
    beta = torch.rand(t, h, generator=gen)
    s0 = torch.randn(h, dk, dv, generator=gen) * 0.1
    o_ref, s_ref = driver.gdn_reference_recurrent(q, k, v, g, beta, s0)
    o, s = driver.gdn_chunked_torch(q, k, v, g, beta, s0, chunk=64)
    torch.testing.assert_close(o, o_ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(s, s_ref, atol=1e-4, rtol=1e-4)


def test_fla_equivalent_counts_fla_saved_tensors_once_per_storage() -> None:
    torch = pytest.importorskip("torch")
    bf16 = torch.bfloat16
    t, h, dk, dv = 10, 2, 4, 3
    q, k = torch.randn(t, h, dk, dtype=bf16), torch.randn(t, h, dk, dtype=bf16)
    v = torch.randn(t, h, 2 * dv, dtype=bf16)[..., :dv]  # strided: fla copies it
    beta = torch.rand(t, h, dtype=bf16)
    state = torch.zeros(h, dk, dv)
    seen: set[int] = set()
    new = 2 * t * h * dk * 2 + 3 * t * h * 4 + t * h * 64 * 2  # q, k; rstd x2, g; A
    kept = t * h * dv * 2 + t * h * 2 + h * dk * dv * 4  # v copy; beta, state storages
    assert driver.fla_equivalent_saved_bytes(q, k, v, beta, state, seen) == new + kept
    # a later piece of the same layer call: beta and state storages are counted already
    half = t // 2
    again = 2 * half * h * dk * 2 + 3 * half * h * 4 + half * h * 64 * 2 + half * h * dv * 2
    got = driver.fla_equivalent_saved_bytes(q[half:], k[half:], v[half:], beta[half:], state, seen)
    assert got == again


# ------------------------------------------------------------------ tiny CPU end to end


def _run_cli(args: list[str], tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], dict]:
    out = tmp_path / "out"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(
        [*DRIVER_CMD, *args, "--device", "cpu", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, json.loads((out / "summary.json").read_text())


def _assert_finite_without_peaks(summary: dict, ranks: int) -> None:
    samples = [s for r in summary["ranks"] for s in r["samples"]]
    assert len(samples) == 2 * ranks
    for s in samples:
        assert s["loss_finite"] and s["adapter_grads_finite"]
        assert s["adapter_grads_present"] == s["adapter_params"] > 0
        assert s["adapter_grads_nonzero"] == s["adapter_params"]
        assert s["forward_peak_bytes"] is None  # CPU: not meaningful, not invented
    assert summary["row"]["finite"] == "True"
    assert summary["row"]["forward_peak_bytes"] == ""


def test_cpu_end_to_end_megatron_cp1(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    cfg = _config(tmp_path, DENSE_CONFIG, "tiny-dense")
    _, summary = _run_cli(["--config", cfg, "--lengths", "40+24", "--shared-prefix", "8"], tmp_path)
    assert summary["spec"]["engine"] == "megatron"
    assert summary["ranks"][0]["rank_tokens"] == 56  # prefix stored once
    _assert_finite_without_peaks(summary, ranks=1)


def test_cpu_end_to_end_torch_cp2_hybrid(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    cfg = _config(tmp_path, HYBRID_CONFIG, "tiny-hybrid")
    args = ["--config", cfg, "--lengths", "100+90", "--shared-prefix", "30", "--cp", "2"]
    _, summary = _run_cli(args, tmp_path)
    assert summary["spec"]["engine"] == "torch"
    assert [r["rank_tokens"] for r in summary["ranks"]] == summary["plan"]["rank_tokens"]
    assert summary["ranks"][0]["gdn_kernel"] == "torch-fallback"
    _assert_finite_without_peaks(summary, ranks=2)
    for s in (s for r in summary["ranks"] for s in r["samples"]):
        total, fla = s["gdn_fallback_total_saved_bytes"], s["gdn_fla_equivalent_saved_bytes"]
        assert total > fla > 0  # the fallback keeps more than fla's kernel
        assert s["gdn_fallback_saved_bytes"] == total - fla
    assert summary["aggregate"]["gdn_fallback_saved_bytes"] == max(
        s["gdn_fallback_saved_bytes"] for r in summary["ranks"] for s in r["samples"]
    )


def test_device_scripts_merge_their_cells_rows(tmp_path: Path) -> None:
    """h200_check.sh and trace_check.sh write one rows.csv: every cell's rows in
    cell-name order; none written where no cell wrote any."""
    from gpu_tests.driver.rows import GOLDEN_COLUMNS, merge_cell_rows, write_rows

    def row(cell_id: str) -> dict[str, str]:
        return {c: (cell_id if c == "cell_id" else "") for c in GOLDEN_COLUMNS}

    write_rows(tmp_path / "b-cell" / "rows.csv", [row("b")])
    write_rows(tmp_path / "a-cell" / "rows.csv", [row("a1"), row("a2")])
    out = tmp_path / "out" / "rows.csv"
    assert merge_cell_rows(tmp_path, out) == 3
    lines = out.read_text(encoding="utf-8").splitlines()
    assert lines[0] == ",".join(GOLDEN_COLUMNS)
    assert [line.split(",")[GOLDEN_COLUMNS.index("cell_id")] for line in lines[1:]] == [
        "a1",
        "a2",
        "b",
    ]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert merge_cell_rows(empty, tmp_path / "none.csv") == 0
    assert not (tmp_path / "none.csv").exists()
