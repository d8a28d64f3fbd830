"""Simulate one rank of one grid configuration from plain numbers (no cpmem here).

A job is a dict of plain numbers the command line (``__main__``) made from cpmem's plan:
the per-CP-rank attention and GDN token counts (TP padding included), the request's
lengths and shared prefix, and which rank to simulate. Optional fields say which step
the rank runs (``STEP_DEFAULTS``: ``head``, ``lora_rank``, ``lora_dropout``,
``lora_targets``, ``cp_comm``); a job without them simulates the calibration harness,
exactly as before they existed, and its result carries no ``step`` key. The packed row
is cut as the simulator cuts it (``oracles.rank_sim.layout``: contiguous runs in rank
order, padding as 1-token roots).

A pipeline job (``pp`` > 1: the pipeline grid) carries every micro-batch's plan
(``microbatch_plans``: lengths, counts, as above) and the stages' layers; its ``rank`` is
the key ``stage * cp + cp_rank``: one stage of one CP rank, simulated over the step's
micro-batches with ``oracles.rank_sim.pipeline.simulate_stage``.
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


def is_pipeline(job: dict[str, Any]) -> bool:
    return int(job.get("pp", 1)) > 1


def microbatch_jobs(job: dict[str, Any]) -> list[dict[str, Any]]:
    """A pipeline job's micro-batches, each a job of its own counts (the job's layout)."""
    keep: dict[str, Any] = {k: job[k] for k in ("tp", "cp", "cp_comm") if k in job}
    return [{**mb, **keep} for mb in job["microbatch_plans"]]


def job_signature(job: dict[str, Any], cp_rank: int) -> tuple[object, ...]:
    """``rank_signature``; of a pipeline job, the tuple of its micro-batches' (a CP rank's
    stages depend on every micro-batch's counts and pieces)."""
    if not is_pipeline(job):
        return rank_signature(job, cp_rank)
    return tuple(rank_signature(mb, cp_rank) for mb in microbatch_jobs(job))


def stage_of(job: dict[str, Any], key: int) -> tuple[int, int]:
    """(stage, CP rank) of a pipeline job's rank key ``stage * cp + cp_rank``."""
    stage, cp_rank = divmod(key, int(job["cp"]))
    return stage, cp_rank


def simulate_job(job: dict[str, Any]) -> dict[str, Any]:
    """Run the job's rank; returns its peaks (bytes, no cold set-up added) and seconds."""
    warnings.filterwarnings("ignore")
    from oracles.rank_sim.runner import simulate_rank

    rank = job["rank"]
    rc = Recompute.parse(job["mode"], job["modules"] or None)
    moe = {"ep": job["ep"], "routing": job["routing"]} if job.get("routing") else {}
    step = job_step(job)
    if is_pipeline(job):
        return simulate_pipeline_job(job, rc, moe, step)
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


def simulate_pipeline_job(
    job: dict[str, Any], rc: Recompute, moe: dict[str, Any], step: dict[str, Any]
) -> dict[str, Any]:
    """One stage of one CP rank over the job's micro-batches (megatron's schedule)."""
    from oracles.rank_sim.pipeline import simulate_stage

    stage, cp_rank = stage_of(job, job["rank"])
    layouts = [job_layout(mb, cp_rank) for mb in microbatch_jobs(job)]
    res = simulate_stage(
        job_model(job), layouts, rc, pp=job["pp"], stage=stage, vpp=job["vpp"],
        stage_layers=job.get("stage_layers"), **moe, **step,
    )  # fmt: skip
    fw, fb = res.forward_peak, res.forward_backward_peak
    out = {
        "config_id": job["config_id"],
        "rank": job["rank"],
        "stage": stage,
        "cp_rank": cp_rank,
        "forward_peak_bytes": res.forward_peak_bytes,
        "forward_backward_peak_bytes": res.forward_backward_peak_bytes,
        "retained_bytes": res.retained_bytes,
        "schedule": res.schedule,
        "warmup": res.warmup,
        "forward_peak": {
            "microbatch": fw.microbatch,
            "chunk": fw.chunk,
            "in_flight_microbatches": fw.in_flight_microbatches,
            "in_flight_chunks": fw.in_flight_chunks,
        },
        "forward_backward_peak": {"kind": fb.kind, "microbatch": fb.microbatch, "chunk": fb.chunk},
        "parameter_bytes": res.parameter_bytes,
        "seconds": round(res.seconds, 2),
    }
    if any(key in job for key in STEP_DEFAULTS):
        out["step"] = res.step
    return out
