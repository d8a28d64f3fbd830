"""Native checks on a CUDA device: cpmem's estimates cover each measured peak.

Why: the estimator is only trustworthy if real peaks stay under it. Each cell runs the
driver in its own process (clean allocator, clean process group) and reads its summary.
Every cell is held against the reference estimate (forward) and the tight policy
(forward and forward+backward). Where GDN ran on the driver's pure-torch fallback (no
fla), each rank-sample's peak less its ``gdn_fallback_saved_bytes`` (what the fallback
saved beyond fla's kernel) is compared, so the fallback can neither fail a cell nor hide
a miss; a cell is skipped only when its engine cannot run at all, never after measuring.
Without CUDA every ``gpu`` test here skips (gpu_tests/conftest.py); the comparison
itself is tested on CPU below.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpu_tests.driver import CellSpec, cell_estimate, cell_geometry, cell_plan

REPO = Path(__file__).resolve().parent.parent
# The driver package, run as a module from the checkout root.
DRIVER_CMD = [sys.executable, "-m", "gpu_tests.driver"]

# Small on purpose: a lent H200 gives minutes, not hours.
CELLS = {
    "dense-megatron-cp1": ["--model", "qwen3-1.7b", "--layers", "4", "--lengths", "2048",
                           "--engine", "megatron"],
    "dense-torch-cp1": ["--model", "qwen3-1.7b", "--layers", "4", "--lengths", "2048",
                        "--engine", "torch"],
    "hybrid-cp1-selective": ["--model", "qwen3.5-4b", "--layers", "4", "--lengths",
                             "1024+1024", "--shared-prefix", "256"],
    "hybrid-cp1-none": ["--model", "qwen3.5-4b", "--layers", "4", "--lengths", "1024+1024",
                        "--shared-prefix", "256", "--recompute", "none"],
    "hybrid-cp2-selective": ["--model", "qwen3.5-4b", "--layers", "4", "--lengths",
                             "1024+1024", "--shared-prefix", "256", "--cp", "2"],
}  # fmt: skip


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _measure(args: list[str], out: Path) -> dict[str, Any]:
    proc = subprocess.run(
        [*DRIVER_CMD, *args, "--device", "cuda", "--timeout", "240", "--out", str(out)],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    summary: dict[str, Any] = json.loads((out / "summary.json").read_text())
    return summary


def tight_figures(summary: dict[str, Any]) -> tuple[int, int]:
    """The tight policy's (forward, forward+backward) bytes for the plan the driver ran."""
    raw = dict(summary["spec"], lengths=tuple(summary["spec"]["lengths"]))
    spec = CellSpec(**raw)
    geometry = cell_geometry(spec)
    plan = cell_plan(spec, geometry)
    assert list(plan.rank_tokens) == summary["plan"]["rank_tokens"]
    # the same step the driver ran: its head and adapters too (harness by default)
    est = cell_estimate(spec, geometry, plan, policy="tight")
    assert est.forward_backward_bytes is not None, "the tight policy prices backward"
    return est.estimate_bytes, est.forward_backward_bytes


def coverage_misses(summary: dict[str, Any], tight_fwd: int, tight_fb: int) -> list[str]:
    """Every estimate a measured peak exceeds (empty when all cover).

    Per rank-sample, a peak on the GDN fallback is first reduced by that sample's
    ``gdn_fallback_saved_bytes``; the maximum over samples is then compared."""
    fallback = summary["ranks"][0]["gdn_kernel"] == "torch-fallback"
    samples = [s for r in summary["ranks"] for s in r["samples"]]

    def peak(key: str) -> int:
        values = []
        for s in samples:
            extra = s.get("gdn_fallback_saved_bytes")
            if fallback:
                assert extra is not None, "a fallback sample must report its extra bytes"
            else:
                assert extra is None, "only the fallback reports extra bytes"
            values.append(s[key] - (extra or 0))
        return max(values)

    fwd, fb = peak("forward_peak_bytes"), peak("forward_backward_peak_bytes")
    less = " less the GDN fallback's extra saved bytes" if fallback else ""
    checks = [
        ("forward peak", fwd, "reference forward estimate", summary["estimate"]["estimate_bytes"]),
        ("forward peak", fwd, "tight forward estimate", tight_fwd),
        ("forward+backward peak", fb, "tight forward+backward estimate", tight_fb),
    ]
    return [
        f"{what}{less} {got} exceeds the {name} {bound} by {got - bound}"
        for what, got, name, bound in checks
        if got > bound
    ]


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CELLS))
def test_native_cell(name: str, tmp_path: Path) -> None:
    args = CELLS[name]
    if "megatron" in args and not _has("megatron.core"):
        pytest.skip("megatron-core is not installed: the megatron engine cannot run")
    summary = _measure(args, tmp_path)
    agg = summary["aggregate"]
    samples = [s for r in summary["ranks"] for s in r["samples"]]
    assert len(samples) == 2 * summary["spec"]["cp"] * summary["spec"]["tp"]
    for s in samples:  # backward completed on every rank and repetition
        assert s["forward_backward_peak_bytes"] is not None
        assert s["forward_backward_peak_bytes"] >= s["forward_peak_bytes"] > 0
        assert s["loss_finite"] and s["adapter_grads_finite"]
        assert s["adapter_grads_present"] == s["adapter_params"] > 0
    assert agg["finite"]
    misses = coverage_misses(summary, *tight_figures(summary))
    assert not misses, f"{name}: " + "; ".join(misses)


# ------------------------------------------------------------------ the comparison, on CPU


def _summary(kernel: str | None, peaks: list[tuple[int, int, int | None]]) -> dict[str, Any]:
    """Synthetic (forward, forward+backward, gdn_fallback_saved_bytes) per rank-sample;
    checks the comparison only, never written anywhere a measurement is read from."""
    samples = [
        {"forward_peak_bytes": f, "forward_backward_peak_bytes": fb,
         "gdn_fallback_saved_bytes": extra}
        for f, fb, extra in peaks
    ]  # fmt: skip
    return {
        "ranks": [{"gdn_kernel": kernel, "samples": samples}],
        "estimate": {"estimate_bytes": 1000},
    }


def test_fallback_bytes_are_subtracted_per_sample_then_compared() -> None:
    # raw peaks exceed every estimate; less each sample's extra bytes they are covered
    ok = _summary("torch-fallback", [(1500, 2500, 600), (1300, 2300, 400)])
    assert coverage_misses(ok, tight_fwd=950, tight_fb=1900) == []
    # the sample with the smaller extra is the one that misses: no max-minus-max
    miss = _summary("torch-fallback", [(1500, 2500, 600), (1400, 2300, 300)])
    got = coverage_misses(miss, tight_fwd=950, tight_fb=2100)
    assert len(got) == 2 and "reference forward estimate 1000 by 100" in got[0]
    assert "tight forward estimate 950 by 150" in got[1]


def test_a_miss_is_reported_not_skipped_for_every_kernel() -> None:
    for kernel in (None, "fla"):
        got = coverage_misses(_summary(kernel, [(1001, 3000, None)]), tight_fwd=2000, tight_fb=2000)
        assert got == [
            "forward peak 1001 exceeds the reference forward estimate 1000 by 1",
            "forward+backward peak 3000 exceeds the tight forward+backward estimate 2000 by 1000",
        ]
    with pytest.raises(AssertionError, match="must report"):
        coverage_misses(_summary("torch-fallback", [(10, 20, None)]), tight_fwd=1, tight_fb=1)


def test_tight_figures_price_the_plan_the_driver_ran() -> None:
    spec = {"model": "qwen3.5-4b", "config": None, "layers": 4, "lengths": [1024, 1024],
            "shared_prefix": 256, "tp": 1, "cp": 2, "sp": False, "recompute": "selective",
            "modules": "core_attn", "engine": "torch", "device": "cuda", "seed": 1234,
            "source_commit": None}  # fmt: skip
    geometry = cell_geometry(CellSpec(**dict(spec, lengths=(1024, 1024))))
    plan = cell_plan(CellSpec(**dict(spec, lengths=(1024, 1024))), geometry)
    fwd, fb = tight_figures({"spec": spec, "plan": {"rank_tokens": list(plan.rank_tokens)}})
    assert 0 < fwd < fb
