"""Running one cell end to end: inline for one rank, else one worker process per rank.

Why worker processes: each rank needs its own process group member and, on one GPU,
its own allocator statistics. Workers are started as ``python gpu_tests/driver
--worker`` (the package folder as a path, so any working directory works) and read
the cell from CPMEM_DRIVER_SPEC; rank 0 writes every rank's samples to
CPMEM_DRIVER_RESULT, and the parent aggregates, prices and writes the rows.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .measure import free_port, run_rank
from .paths import PACKAGE_DIR
from .provenance import provenance
from .rows import TRAINER_COLUMN, aggregate, build_row, trainer_step, write_rows
from .spec import CellSpec, cell_estimate, cell_geometry, cell_plan
from .torchlib import load_torch


def finish(spec: CellSpec, ranks: Sequence[dict[str, Any]], out: Path | None) -> dict[str, Any]:
    """Aggregate, price with cpmem, build the row, write rows.csv + summary.json.

    The row records the reference estimate (as every golden row does); the summary also
    carries the tight policy's forward and forward+backward estimate of the same step
    (``estimate_tight``) and the trainer settings (``trainer``)."""
    geometry = cell_geometry(spec)
    plan = cell_plan(spec, geometry)
    est = cell_estimate(spec, geometry, plan)
    tight = cell_estimate(spec, geometry, plan, policy="tight")
    agg = aggregate(ranks)
    prov = provenance(spec)
    device_name = ranks[0]["device_name"]
    stamp = prov["date_utc"].replace("-", "").replace(":", "")
    run_id = f"{stamp}-{prov['driver_sha256'][:8]}"
    row = build_row(spec, geometry, plan, est.estimate_bytes, agg, prov, device_name, run_id)
    notes = sorted({n for r in ranks for n in r["notes"]})
    if not agg["measured"]:
        notes.append("no CUDA: memory figures are not meaningful on CPU and were left empty")
    if not prov["git_revision"]:
        notes.append("source_commit unknown: pass --source-commit (append_rows will refuse)")
    peak = agg["forward_peak_bytes"]
    summary = {
        "row": row,
        "spec": asdict(spec),
        "provenance": prov,
        "plan": {
            "planner": plan.planner,
            "rank_tokens": list(plan.rank_tokens),
            "busiest_tokens": plan.busiest_tokens,
            "packed_tokens": plan.packed_tokens,
        },
        "estimate": est.to_dict(),
        "estimate_tight": tight.to_dict(),
        "trainer": {
            "harness": spec.is_harness,
            "head": spec.head,
            "head_ce": spec.head_ce or None,
            "lora_rank": spec.lora_rank,
            "lora_dropout": spec.lora_dropout,
            "adapter_layout": (
                "one adapter per megatron projection (fused QKV, fused gate/up)"
                if spec.engine == "megatron"
                else "one rank-1 adapter per projection (the harness)"
                if spec.harness_adapters
                else "one adapter per group of projections sharing an input (megatron's fused layout)"
            ),
            TRAINER_COLUMN: trainer_step(spec),
        },
        "aggregate": agg,
        "forward_peak_over_estimate": (peak / est.estimate_bytes) if peak is not None else None,
        "ranks": list(ranks),
        "notes": notes,
    }
    if out is not None:
        write_rows(out / "rows.csv", [row])
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def run_cell(spec: CellSpec, out: Path | None = None, timeout: float = 900) -> dict[str, Any]:
    """Measure one cell: inline for one rank, else one worker process per rank."""
    if spec.world == 1:
        ranks = run_rank(spec)["ranks"]
        return finish(spec, ranks, out)
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "ranks.json"
        port = str(free_port())
        procs = []
        for rank in range(spec.world):
            env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank),
                       WORLD_SIZE=str(spec.world), MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                       CPMEM_DRIVER_SPEC=json.dumps(asdict(spec)),
                       CPMEM_DRIVER_RESULT=str(result))  # fmt: skip
            procs.append(subprocess.Popen([sys.executable, str(PACKAGE_DIR), "--worker"], env=env))
        try:
            codes = [p.wait(timeout=timeout) for p in procs]
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise RuntimeError(f"worker ranks ran past {timeout} s and were killed") from None
        if any(codes) or not result.exists():
            raise RuntimeError(f"worker ranks failed with exit codes {codes}")
        ranks = json.loads(result.read_text())
    return finish(spec, ranks, out)


def worker_main() -> int:
    """One rank under our launcher or torchrun (RANK / WORLD_SIZE set in the environment)."""
    spec_json = os.environ.get("CPMEM_DRIVER_SPEC")
    if spec_json is None:
        raise SystemExit("--worker needs CPMEM_DRIVER_SPEC")
    raw = json.loads(spec_json)
    raw["lengths"] = tuple(raw["lengths"])
    spec = CellSpec(**raw)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    ranks = run_rank(spec, rank, world, int(os.environ.get("LOCAL_RANK", rank)))["ranks"]
    if rank == 0:
        Path(os.environ["CPMEM_DRIVER_RESULT"]).write_text(json.dumps(ranks))
    torch = load_torch()
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    return 0
