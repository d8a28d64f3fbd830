"""The grid generator simulates each distinct rank once: ranks with equal counts and GDN
pieces (``oracles.sim_grid.worker.rank_signature``) give equal peaks, whatever their CP
coordinate. Reduced depth (the first 4 layers), two ranks per model kind."""

from __future__ import annotations

from typing import Any

import pytest

from oracles.rank_sim.recompute import Recompute
from oracles.rank_sim.runner import simulate_rank
from oracles.sim_grid.worker import job_layout, job_model, rank_signature


def _job(model: str, tp: int) -> dict[str, Any]:
    return {
        "config_id": f"{model}:test", "model": model, "config_path": None, "tp": tp, "cp": 4,
        "mode": "selective", "modules": "core_attn", "lengths": [4096, 4096],
        "shared_prefix": 0, "logical_tokens": 8192, "packed_tokens": 8192,
        "attention_tokens": [2048] * 4, "gdn_tokens": [2048] * 4,
    }  # fmt: skip


@pytest.mark.parametrize(("model", "tp"), [("qwen3-1.7b", 2), ("qwen3.5-4b", 1)])
def test_equal_signatures_give_equal_peaks(model: str, tp: int) -> None:
    job = _job(model, tp)
    # ranks 0 and 2 each hold the start of one sequence: equal counts and pieces
    assert rank_signature(job, 0) == rank_signature(job, 2)
    sim = job_model(job).truncated(4)
    rc = Recompute.parse("selective", "core_attn")
    a = simulate_rank(sim, job_layout(job, 0), rc)
    b = simulate_rank(sim, job_layout(job, 2), rc)
    assert (a.forward_peak_bytes, a.forward_backward_peak_bytes) == (
        b.forward_peak_bytes,
        b.forward_backward_peak_bytes,
    )
