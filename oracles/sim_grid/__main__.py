"""``python -m oracles.sim_grid``: generate the simulated grid (golden/simulated/).

The command line is the one part of the generator that asks cpmem for anything: it asks
cpmem's default planner (``cpmem.api``: the plan a user of cpmem would get) for each
configuration's per-CP-rank token counts, and hands them to the workers as plain
numbers (``worker.py`` imports no cpmem). The skewed request is laid out explicitly
instead (``grid.RequestSpec``). Each distinct rank of a configuration is simulated
(ranks with equal counts and GDN pieces once, ``worker.rank_signature``), on an engine
(``engines.py``: local processes, or Ray tasks on a local instance or a cluster), with a
progress line. A pipeline configuration (``grid.pipeline_grid``) plans every micro-batch
as cpmem does (``describe_step(..., pp=, vpp=, microbatch_requests=)``, its
``microbatch_steps``) and simulates every stage of every distinct CP rank, keyed
``stage * cp + cp_rank``. Finished ranks are appended to ``ranks.jsonl`` as they complete, so an
interrupted run resumes where it stopped, on either engine; ``rows.csv``, the provenance
record and ``MANIFEST.sha256`` are rewritten from it (each file replaced whole). A run's
record counts the ranks it finished from that file (the whole lines it appended), never
from a count kept beside it: a Ctrl-C lands between any two steps of the driver, and one
between a rank's line and such a count would leave a record that disagrees with the file.
``--redo`` (with ``--only``) first drops the selected configurations' finished ranks from
``ranks.jsonl``, so that they are simulated again (a simulator change that moves them);
a stopped ``--redo`` run resumes without ``--redo``.

    python -m oracles.sim_grid [--workers 2] [--engine local|ray] [--address ADDR]
                               [--limit N] [--only REGEX [--redo]] [--assemble]
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from oracles.rank_sim import SIM_VERSION
from oracles.sim_grid.configs import everything
from oracles.sim_grid.engines import ENGINES, default_engine, open_engine
from oracles.sim_grid.grid import REPO, SIM_DIR, GridConfig
from oracles.sim_grid.worker import STEP_DEFAULTS, is_pipeline, job_signature

RANKS = "ranks.jsonl"
ROWS = "rows.csv"
PROVENANCE = "provenance.json"
MANIFEST = "MANIFEST.sha256"

COLUMNS = (
    "config_id", "model", "model_source", "layers", "gdn_layers", "tp", "cp", "ep", "routing",
    "sequence_parallel", "compiled", "mode", "modules", "request", "lengths", "shared_prefix",
    "logical_tokens", "packed_tokens", "retained_tokens", "grad_segments", "planner",
    "attention_tokens", "gdn_tokens", "rank_forward_peak_bytes",
    "rank_forward_backward_peak_bytes", "busiest_rank", "forward_peak_bytes",
    "forward_backward_peak_bytes", "simulated_ranks", "sim_seconds", "simulator",
    "head", "lora_rank", "lora_dropout", "lora_targets", "cp_comm",
    "pp", "vpp", "microbatches", "stage_layers", "microbatch_lengths",
    "stage_forward_peak_bytes", "stage_forward_backward_peak_bytes", "busiest_stage",
)  # fmt: skip
"""``rows.csv``: golden/cells.csv's layout columns (model .. grad_segments; ``routing``
is the MoE routing the simulator was given, empty for other models), the plan the
simulator was given (planner, per-CP-rank attention / GDN tokens, '+'-joined), and the
simulator's per-rank peaks ('+'-joined, rank order) with the busiest rank's (by forward
peak), and the trainer's step the rank ran (head, adapters, CP comm; the harness's for the
dense and MoE grids). Peaks are incremental bytes above the pre-forward baseline without the cold
set-up (oracles/rank_sim/README.md).

Pipeline columns (every row; a row without stages has pp 1, vpp 1, microbatches 1, empty
``stage_layers`` and ``microbatch_lengths``, its own peaks as the one stage's, busiest
stage 0): ``stage_layers`` the layers per virtual stage ('+'-joined, index chunk * pp +
stage; empty: even), ``microbatch_lengths`` every micro-batch's lengths (';'-joined, each
'+'-joined) where they differ (empty: each is ``lengths``), ``stage_forward_peak_bytes`` /
``stage_forward_backward_peak_bytes`` each stage's busiest CP rank ('+'-joined, stage
order) and ``busiest_stage`` (largest forward peak). On a pipeline row the per-rank peaks,
``busiest_rank`` and ``forward_peak_bytes`` / ``forward_backward_peak_bytes`` are the
busiest stage's; ``lengths`` .. ``grad_segments`` and the plan (``attention_tokens``,
``gdn_tokens``) are the first micro-batch's."""


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def _identity(c: GridConfig) -> dict[str, Any]:
    """What names a job: its configuration, layout, recompute and request."""
    return {
        "config_id": c.config_id,
        "model": c.model,
        "config_path": str(c.config_path) if c.config_path else None,
        "tp": c.tp,
        "cp": c.cp,
        "mode": c.mode,
        "modules": c.modules,
        "ep": c.ep,
        "routing": c.routing,
        "request": c.request.name,
    }


def plan_job(c: GridConfig) -> dict[str, Any]:
    """The configuration's plan as plain numbers (cpmem's default planner, or the skewed
    explicit layout)."""
    from cpmem import api
    from cpmem.plan.request import Request

    geometry = api.load_model(config=c.config_path) if c.config_path else api.load_model(c.model)
    if c.pipeline is not None:
        return _plan_pipeline(c, geometry)
    request = Request.shared(list(c.request.lengths), c.request.shared_prefix)
    mult = c.tp  # under SP (on with TP, as Megatron runs it) each rank pads to TP
    if c.request.skew and c.cp > 1:
        first = c.request.lengths[0]
        rest = request.real_tokens - first
        base, extra = divmod(rest, c.cp - 1)
        attn = [_round_up(first, mult)] + [
            _round_up(base + (i < extra), mult) for i in range(c.cp - 1)
        ]
        gdn = list(attn)
        planner = "explicit:whole-first"
        packed = _round_up(request.real_tokens, c.tp)
    else:
        comm = c.trainer.cp_comm if c.trainer is not None else "all_gather"
        plan = api.describe_step(
            geometry, request=request, tp=c.tp, cp=c.cp, ep=c.ep, cp_comm=comm, allow_long=True
        ).plan
        g = plan.groups[0]
        attn, gdn = list(g.attention_tokens), list(g.gdn_tokens)
        planner, packed = plan.planner, g.packed_tokens
    if not geometry.is_hybrid:
        gdn = list(attn)  # no GDN layer: one count per rank
    return {
        **_identity(c),
        "lengths": list(c.request.lengths),
        "shared_prefix": c.request.shared_prefix,
        "logical_tokens": request.logical_tokens,
        "packed_tokens": packed,
        "grad_segments": request.grad_segments,
        "planner": planner,
        "attention_tokens": attn,
        "gdn_tokens": gdn,
        "layers": geometry.layers,
        "gdn_layers": geometry.gdn_layers,
        **(asdict(c.trainer) if c.trainer is not None else {}),
    }


def _plan_pipeline(c: GridConfig, geometry: Any) -> dict[str, Any]:
    """A pipeline configuration: every micro-batch planned as cpmem plans it
    (``Step.microbatch_steps``), the layers per virtual stage as cpmem cuts them (None:
    even); the job's top-level counts are the first micro-batch's."""
    from cpmem import api
    from cpmem.plan.request import Request

    spec = c.pipeline
    assert spec is not None
    split = spec.split
    settings: dict[str, Any] = {
        "tp": c.tp, "cp": c.cp, "ep": c.ep, "pp": spec.pp, "vpp": spec.vpp, "allow_long": True,
        "stage_layers": list(split.stages) if split.stages else None,
        "first_stage_layers": split.first, "last_stage_layers": split.last,
    }  # fmt: skip
    lengths = spec.microbatch_lengths
    if spec.differ:
        step = api.describe_step(
            geometry, microbatch_requests=[list(x) for x in lengths], **settings
        )
    else:
        step = api.describe_step(
            geometry, request=Request.shared(list(lengths[0]), 0),
            microbatches=spec.microbatches, **settings,
        )  # fmt: skip
    plans = []
    for mb_lengths, mb in zip(lengths, step.microbatch_steps, strict=True):
        g = mb.plan.groups[0]
        attn, gdn = list(g.attention_tokens), list(g.gdn_tokens)
        assert mb.request is not None and list(mb.request.sequence_lengths) == list(mb_lengths)
        plans.append(
            {
                "lengths": list(mb_lengths),
                "shared_prefix": 0,
                "logical_tokens": mb.request.logical_tokens,
                "packed_tokens": g.packed_tokens,
                "grad_segments": mb.request.grad_segments,
                "planner": mb.plan.planner,
                "attention_tokens": attn,
                "gdn_tokens": gdn if geometry.is_hybrid else list(attn),
            }
        )
    layers = step.settings.pipeline.layers
    first = plans[0]
    return {
        **_identity(c),
        **{k: first[k] for k in ("lengths", "shared_prefix", "logical_tokens", "packed_tokens",
                                 "grad_segments", "planner", "attention_tokens", "gdn_tokens")},
        "layers": geometry.layers,
        "gdn_layers": geometry.gdn_layers,
        "pp": spec.pp,
        "vpp": spec.vpp,
        "microbatches": spec.microbatches,
        "stage_layers": list(layers) if layers is not None else None,
        "microbatch_differ": spec.differ,
        "microbatch_plans": plans,
    }  # fmt: skip


def representatives(job: dict[str, Any]) -> list[int]:
    """For each CP rank, the lowest rank with its signature (that one is simulated); on a
    pipeline job the signature covers every micro-batch."""
    first: dict[tuple[object, ...], int] = {}
    return [first.setdefault(job_signature(job, r), r) for r in range(job["cp"])]


def rank_keys(job: dict[str, Any]) -> list[int]:
    """The ranks.jsonl keys the job needs: its distinct CP ranks, on a pipeline job each at
    every stage (``stage * cp + cp_rank``)."""
    reps = sorted(set(representatives(job)))
    stages = job["pp"] if is_pipeline(job) else 1
    return [s * job["cp"] + r for s in range(stages) for r in reps]


def _finished_ranks(text: str) -> list[dict[str, Any]]:
    """The whole rank records of ``ranks.jsonl``'s text, in order; a line cut short by an
    interrupted run is no record (its rank is simulated again)."""
    records = []
    for line in text.splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records


def _load_done(out: Path) -> dict[tuple[str, int], dict[str, Any]]:
    path = out / RANKS
    records = _finished_ranks(path.read_text()) if path.exists() else []
    return {(r["config_id"], r["rank"]): r for r in records}


def ranks_written_since(path: Path, offset: int) -> int:
    """How many whole rank records ``path`` holds past byte ``offset`` (where a run
    started appending): what the run finished, read from the file it finished them into."""
    if not path.exists():
        return 0
    with path.open("rb") as fh:
        fh.seek(offset)
        return len(_finished_ranks(fh.read().decode()))


def append_rank(fh: Any, res: dict[str, Any]) -> None:
    """Append one finished rank to ``ranks.jsonl``: one whole line, flushed."""
    fh.write(json.dumps(res) + "\n")
    fh.flush()


def drop_ranks(out: Path, config_ids: set[str]) -> int:
    """Rewrite ``ranks.jsonl`` (whole) without the finished ranks of ``config_ids``, every
    other line kept as it was, in order; returns how many were dropped."""
    path = out / RANKS
    if not path.exists():
        return 0
    kept: list[str] = []
    for line in path.read_text().splitlines():
        try:
            config_id = json.loads(line)["config_id"]
        except ValueError:  # a line cut short by an interrupted run: simulated again
            continue
        if config_id not in config_ids:
            kept.append(line)
    dropped = len(path.read_text().splitlines()) - len(kept)
    _write(path, "".join(line + "\n" for line in kept))
    return dropped


def _write(path: Path, text: str) -> None:
    """Replace ``path`` whole: an interrupted write leaves the previous file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _git_sha() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _row(job: dict[str, Any], done: dict[tuple[str, int], dict[str, Any]]) -> dict[str, Any]:
    reps = representatives(job)
    cp, stages = job["cp"], (job["pp"] if is_pipeline(job) else 1)
    per_stage = [[done[(job["config_id"], s * cp + rep)] for rep in reps] for s in range(stages)]
    stage_fwd = [max(r["forward_peak_bytes"] for r in rs) for rs in per_stage]
    stage_fb = [max(r["forward_backward_peak_bytes"] for r in rs) for rs in per_stage]
    busiest_stage = stage_fwd.index(max(stage_fwd))
    results = per_stage[busiest_stage]
    fwd = [r["forward_peak_bytes"] for r in results]
    fb = [r["forward_backward_peak_bytes"] for r in results]
    busiest = fwd.index(max(fwd))
    keys = rank_keys(job)
    tokens = [max(a, g) for a, g in zip(job["attention_tokens"], job["gdn_tokens"], strict=True)]
    mode, modules = job["mode"], job["modules"]
    return {
        "config_id": job["config_id"],
        "model": job["model"],
        "model_source": (
            "preset" if not job["config_path"] else Path(job["config_path"]).relative_to(SIM_DIR)
        ),
        "layers": job["layers"],
        "gdn_layers": job["gdn_layers"],
        "tp": job["tp"],
        "cp": job["cp"],
        "ep": job.get("ep", 1),
        "routing": job.get("routing", ""),
        "sequence_parallel": job["tp"] > 1,
        "compiled": False,
        "mode": mode,
        "modules": modules,
        "request": job.get("request") or job["config_id"].split(":")[3],
        "lengths": "+".join(map(str, job["lengths"])),
        "shared_prefix": job["shared_prefix"],
        "logical_tokens": job["logical_tokens"],
        "packed_tokens": job["packed_tokens"],
        "retained_tokens": max(tokens),
        "grad_segments": job["grad_segments"],
        "planner": job["planner"],
        "attention_tokens": "+".join(map(str, job["attention_tokens"])),
        "gdn_tokens": "+".join(map(str, job["gdn_tokens"])),
        "rank_forward_peak_bytes": "+".join(map(str, fwd)),
        "rank_forward_backward_peak_bytes": "+".join(map(str, fb)),
        "busiest_rank": busiest,
        "forward_peak_bytes": max(fwd),
        "forward_backward_peak_bytes": max(fb),
        "simulated_ranks": len(keys),
        "sim_seconds": round(sum(done[(job["config_id"], k)]["seconds"] for k in keys), 2),
        "simulator": SIM_VERSION,
        **{key: job.get(key, default) for key, default in STEP_DEFAULTS.items()},
        "pp": job.get("pp", 1),
        "vpp": job.get("vpp", 1),
        "microbatches": job.get("microbatches", 1),
        "stage_layers": "+".join(map(str, job.get("stage_layers") or ())),
        "microbatch_lengths": (
            ";".join("+".join(map(str, mb["lengths"])) for mb in job["microbatch_plans"])
            if job.get("microbatch_differ")
            else ""
        ),
        "stage_forward_peak_bytes": "+".join(map(str, stage_fwd)),
        "stage_forward_backward_peak_bytes": "+".join(map(str, stage_fb)),
        "busiest_stage": busiest_stage,
    }


def assemble(out: Path, jobs: list[dict[str, Any]], runs: list[dict[str, Any]]) -> int:
    """Rewrite rows.csv (complete configurations, grid order), the provenance record and
    the manifest from ranks.jsonl; returns the number of rows."""
    done = _load_done(out)
    rows = [_row(j, done) for j in jobs if all((j["config_id"], r) in done for r in rank_keys(j))]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    _write(out / ROWS, buf.getvalue())
    prov_path = out / PROVENANCE
    prov: dict[str, Any] = json.loads(prov_path.read_text()) if prov_path.exists() else {}
    seconds = [r["seconds"] for r in done.values()]
    prov.update(
        {
            "what": "rank simulator rows (simulated, not measured; never mixed into cells.csv)",
            "simulator": SIM_VERSION,
            "generator": "python -m oracles.sim_grid",
            "torch": _version("torch"),
            "megatron-core": _version("megatron-core"),
            "fla": _version("fla-core"),
            "gdn_kernel": "stand-in (oracles/rank_sim/README.md)",
            "cold_setup_added": False,
            "planner": "cpmem default planner (cpmem.plan.planners.plan_request), "
            "skew rows explicit:whole-first, pipeline rows every micro-batch planned as "
            "cpmem's Step.microbatch_steps",
            "configs_sha256": {
                str(p.relative_to(out)): _sha256(p)
                for p in sorted((out / "configs").glob("*.json"))
            },
            "grid_configurations": len(jobs),
            "rows": len(rows),
            "simulated_ranks": len(done),
            "rank_seconds_total": round(sum(seconds), 1),
            "rank_seconds_mean": round(sum(seconds) / len(seconds), 2) if seconds else None,
        }
    )
    prov["runs"] = prov.get("runs", []) + runs
    _write(prov_path, json.dumps(prov, indent=2) + "\n")
    write_manifest(out)
    return len(rows)


def manifest_files(out: Path) -> list[Path]:
    files = [out / ROWS, out / RANKS, out / PROVENANCE, *sorted((out / "configs").glob("*.json"))]
    return [f for f in files if f.exists()]


def write_manifest(out: Path) -> None:
    lines = [f"{_sha256(f)}  {f.relative_to(out).as_posix()}" for f in manifest_files(out)]
    _write(out / MANIFEST, "\n".join(lines) + "\n")


def _progress(done: int, total: int, started: float, extra: str) -> None:
    elapsed = time.monotonic() - started
    rate = done / elapsed if elapsed > 0 and done else 0.0
    eta = (total - done) / rate if rate else float("nan")
    width = 30
    fill = int(width * done / total) if total else width
    sys.stderr.write(
        f"\r[{'#' * fill}{'.' * (width - fill)}] {done}/{total} ranks  "
        f"{elapsed / 60:.1f} min  eta {eta / 60:.1f} min  {extra}   "
    )
    sys.stderr.flush()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m oracles.sim_grid",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--workers",
        type=int,
        default=2,
        help="local processes, or the CPUs of the local Ray instance (default 2)",
    )
    ap.add_argument(
        "--engine",
        choices=ENGINES,
        default=None,
        help="where the ranks run (default: ray when Ray is installed, else local)",
    )
    ap.add_argument(
        "--address",
        default=None,
        help="join this Ray cluster (ray.init(address=...): auto, HOST:6379, "
        "ray://HOST:10001) instead of starting a local instance",
    )
    ap.add_argument("--limit", type=int, default=None, help="first N configurations only")
    ap.add_argument("--only", default=None, help="configurations whose id matches this regex")
    ap.add_argument(
        "--redo",
        action="store_true",
        help="with --only: drop the selected configurations' finished ranks from ranks.jsonl "
        "and simulate them again",
    )
    ap.add_argument("--out", type=Path, default=SIM_DIR, help="default golden/simulated")
    ap.add_argument("--assemble", action="store_true", help="rewrite rows/manifest only")
    ap.add_argument("--every", type=int, default=20, help="reassemble every N finished ranks")
    ap.add_argument(
        "--run-record",
        type=Path,
        default=None,
        help="with --assemble: a JSON run record to add to the provenance (a run that was "
        "stopped before it could write its own)",
    )
    args = ap.parse_args(argv)
    if args.address and args.engine == "local":
        ap.error("--address joins a Ray cluster: use it with --engine ray (or no --engine)")
    if args.redo and (not args.only or args.assemble):
        ap.error("--redo simulates the configurations --only selects again: give --only")
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    configs = everything()
    if args.only:
        configs = [c for c in configs if re.search(args.only, c.config_id)]
    if args.limit is not None:
        configs = configs[: args.limit]
    jobs = [plan_job(c) for c in configs]
    all_jobs = jobs if not (args.only or args.limit) else [plan_job(c) for c in everything()]
    run: dict[str, Any] = {
        "command": " ".join(["python -m oracles.sim_grid", *(argv or sys.argv[1:])]),
        "git_sha": _git_sha(),
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "workers": args.workers,
        "host_cpus": os.cpu_count(),
    }
    if args.assemble:
        runs = [json.loads(args.run_record.read_text())] if args.run_record else []
        n = assemble(out, all_jobs, runs)
        print(f"{n} rows in {out / ROWS}")
        return 0
    if args.redo:  # the files stay consistent: the dropped rows leave rows.csv until redone
        run["redo_dropped_ranks"] = drop_ranks(out, {j["config_id"] for j in jobs})
        assemble(out, all_jobs, [])
        print(f"--redo: {run['redo_dropped_ranks']} finished ranks dropped", file=sys.stderr)
    done = _load_done(out)
    pending = [
        {**j, "rank": r} for j in jobs for r in rank_keys(j) if (j["config_id"], r) not in done
    ]
    total = len(pending)
    print(
        f"{len(jobs)} configurations, {total} ranks to simulate ({len(done)} done)", file=sys.stderr
    )
    if not pending:  # nothing left: leave the files (and their manifest) as they are
        print(f"all {len(jobs)} configurations are simulated; nothing to do", file=sys.stderr)
        return 0
    ranks_path = out / RANKS
    if ranks_path.exists() and not ranks_path.read_bytes().endswith(b"\n"):
        with ranks_path.open("a") as fh:  # close a line an interrupted run cut short
            fh.write("\n")
    # what this run finishes is counted from the file, past where it starts appending
    offset = ranks_path.stat().st_size if ranks_path.exists() else 0
    run["engine"] = args.engine or default_engine(args.address)
    started = time.monotonic()
    try:  # an engine that does not start writes nothing
        engine = open_engine(run["engine"], args.workers, args.address)
    except KeyboardInterrupt:
        print("\ninterrupted while the engine started; nothing written", file=sys.stderr)
        return 130
    finished = 0
    interrupted = False
    try:
        with engine, ranks_path.open("a") as fh:
            run.update(engine.record())
            run["engine_start_seconds"] = round(time.monotonic() - started, 1)
            print(f"engine: {json.dumps(engine.record())}", file=sys.stderr)
            for res in engine.results(pending):
                append_rank(fh, res)
                finished += 1  # the progress line's count; the record reads the file
                _progress(finished, total, started, f"last {res['config_id']}")
                if finished % args.every == 0:
                    assemble(out, all_jobs, [])
    except KeyboardInterrupt:  # finished ranks are kept; the run resumes from them
        interrupted = True
    except Exception as e:  # record the failed run and what it finished, then fail
        run.update(_run_end(ranks_written_since(ranks_path, offset), started, interrupted))
        run["failed"] = f"{type(e).__name__}: {e}"[:500]
        assemble(out, all_jobs, [run])
        sys.stderr.write("\n")
        raise
    run.update(_run_end(ranks_written_since(ranks_path, offset), started, interrupted))
    n = assemble(out, all_jobs, [run])
    sys.stderr.write("\n")
    print(
        f"{run['ranks_simulated']} ranks in {run['wall_seconds']:.0f} s; {n} rows in {out / ROWS}"
    )
    return 130 if interrupted else 0


def _run_end(finished: int, started: float, interrupted: bool) -> dict[str, Any]:
    wall = time.monotonic() - started
    return {
        "ranks_simulated": finished,
        "wall_seconds": round(wall, 1),
        "ranks_per_minute": round(60 * finished / wall, 2) if wall > 0 else None,
        "interrupted": interrupted,
    }


if __name__ == "__main__":
    raise SystemExit(main())
