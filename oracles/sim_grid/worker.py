"""Simulate one rank of one grid configuration from plain numbers (no cpmem here).

A job is a dict of plain numbers the command line (``__main__``) made from cpmem's plan:
the per-CP-rank attention and GDN token counts (TP padding included), the request's
lengths and shared prefix, and which rank to simulate. Optional fields say which step
the rank runs (``STEP_DEFAULTS``: ``head``, ``lora_rank``, ``lora_dropout``,
``lora_targets``, ``cp_comm``); a job without them simulates the calibration harness,
exactly as before they existed, and its result carries no ``step`` key. The packed row
is cut as the simulator cuts it (``oracles.rank_sim.layout``: contiguous runs in rank
order, padding as 1-token roots).
"""

from __future__ import annotations

import warnings
from typing import Any

from oracles.rank_sim.geometry import SimModel, get_model, load_config
from oracles.rank_sim.layout import RankLayout, contiguous_layout, row_segments
from oracles.rank_sim.recompute import Recompute

STEP_DEFAULTS: dict[str, Any] = {
    "head": "hidden",
    "lora_rank": 1,
    "lora_dropout": 0.0,
    "lora_targets": "all",
    "cp_comm": "all_gather",
}


def job_step(job: dict[str, Any]) -> dict[str, Any]:
    """The job's step inputs, the harness's where it gives none."""
    return {key: job.get(key, default) for key, default in STEP_DEFAULTS.items()}


def job_model(job: dict[str, Any]) -> SimModel:
    path = job.get("config_path")
    return load_config(path) if path else get_model(job["model"])


def job_layout(job: dict[str, Any], rank: int) -> RankLayout:
    attn = tuple(job["attention_tokens"])
    gdn = tuple(job["gdn_tokens"])
    segs = row_segments(tuple(job["lengths"]), job["shared_prefix"], sum(gdn))
    return contiguous_layout(
        segs, attn, gdn, tp=job["tp"], rank=rank, logical_tokens=job["logical_tokens"],
        sp=job["tp"] > 1,
    )  # fmt: skip


def rank_signature(job: dict[str, Any], rank: int) -> tuple[object, ...]:
    """What a rank's simulation depends on besides the configuration's global counts: its
    own counts and GDN pieces. Ranks with equal signatures give equal results (the CP
    coordinate changes no shape, except under ``cp_comm`` p2p, where the ring's steps
    depend on it and the rank is part of the signature), so the generator simulates each
    signature once."""
    lay = job_layout(job, rank)
    if job.get("cp_comm") == "p2p":  # the ring's half-size steps depend on the CP coordinate
        return (lay.attn_local, lay.gdn_local, lay.gdn_pieces, rank)
    return (lay.attn_local, lay.gdn_local, lay.gdn_pieces)


def simulate_job(job: dict[str, Any]) -> dict[str, Any]:
    """Run the job's rank; returns its peaks (bytes, no cold set-up added) and seconds."""
    warnings.filterwarnings("ignore")
    from oracles.rank_sim.runner import simulate_rank

    rank = job["rank"]
    rc = Recompute.parse(job["mode"], job["modules"] or None)
    moe = {"ep": job["ep"], "routing": job["routing"]} if job.get("routing") else {}
    step = job_step(job)
    res = simulate_rank(job_model(job), job_layout(job, rank), rc, **moe, **step)
    out = {
        "config_id": job["config_id"],
        "rank": rank,
        "forward_peak_bytes": res.forward_peak_bytes,
        "forward_backward_peak_bytes": res.forward_backward_peak_bytes,
        "retained_bytes": res.retained_bytes,
        "seconds": round(res.seconds, 2),
    }
    if any(key in job for key in STEP_DEFAULTS):  # say which step was simulated
        out["step"] = res.step
    return out
