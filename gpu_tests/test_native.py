"""Native checks on a CUDA device: cpmem's estimate covers each measured forward peak.

Why: the estimator is only trustworthy if real peaks stay under it. Each cell runs the
driver in its own process (clean allocator, clean process group) and reads its summary.
Without CUDA every test here skips (gpu_tests/conftest.py).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

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


def _measure(args: list[str], out: Path) -> dict:
    proc = subprocess.run(
        [*DRIVER_CMD, *args, "--device", "cuda", "--timeout", "240",
         "--out", str(out)],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads((out / "summary.json").read_text())


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CELLS))
def test_native_cell(name: str, tmp_path: Path) -> None:
    args = CELLS[name]
    if "megatron" in args and not _has("megatron.core"):
        pytest.skip("megatron-core is not installed")
    summary = _measure(args, tmp_path)
    agg, est = summary["aggregate"], summary["estimate"]["estimate_bytes"]
    samples = [s for r in summary["ranks"] for s in r["samples"]]
    assert len(samples) == 2 * summary["spec"]["cp"] * summary["spec"]["tp"]
    for s in samples:  # backward completed on every rank and repetition
        assert s["forward_backward_peak_bytes"] is not None
        assert s["forward_backward_peak_bytes"] >= s["forward_peak_bytes"] > 0
        assert s["loss_finite"] and s["adapter_grads_finite"]
        assert s["adapter_grads_present"] == s["adapter_params"] > 0
    assert agg["finite"]
    if summary["ranks"][0]["gdn_kernel"] == "torch-fallback":
        pytest.skip(
            "finite and complete, but GDN ran on the pure-torch fallback (no fla): its extra "
            f"saved bytes ({agg['gdn_fallback_saved_bytes']}) are not what cpmem prices; "
            f"forward peak {agg['forward_peak_bytes']} vs estimate {est}"
        )
    assert agg["forward_peak_bytes"] <= est, (
        f"forward peak {agg['forward_peak_bytes']} exceeds cpmem's estimate {est}"
    )
