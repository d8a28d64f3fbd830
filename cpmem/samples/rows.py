"""The simulated grid's rows (``golden/simulated/``): loading and verifying them, the
plan each row's simulation was given as pricing inputs, and the allowance an estimate
must reach over a simulated peak (the cold set-up the simulator leaves out and its
validated worst under-estimate)."""

from __future__ import annotations

import csv
import hashlib
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from cpmem.errors import CpmemError
from cpmem.golden.files import default_golden_dir
from cpmem.model.geometry import ModelGeometry
from cpmem.model.load import load_model
from cpmem.pricing.cold import COLD_SETUP
from cpmem.step.describe import SettingsArguments, describe_step
from cpmem.step.step import Step

SIM_SUBDIR = "simulated"
ROWS_FILE = "rows.csv"
MANIFEST_FILE = "MANIFEST.sha256"

Family = Literal["moe", "moe-eager", "hybrid", "attention-only"]
SIM_WORST_UNDER: dict[Family, dict[str, float]] = {
    "moe": {"forward": 0.094, "forward_backward": 0.096},
    "moe-eager": {"forward": 0.04, "forward_backward": 0.031},
    "hybrid": {"forward": 0.012, "forward_backward": 0.016},
    "attention-only": {"forward": 0.039, "forward_backward": 0.047},
}
"""The simulator's validated worst under-estimate on measured cells of >= 2,048 tokens,
per model family (golden/reports/rank_sim_validation.md; tests/golden/test_simulated.py
reads the report and holds these to it). Hybrids (Gated DeltaNet + gated attention;
measured: Qwen3.5-27B, Qwen3.5-4B): worst forward ratio 0.988, forward+backward 0.984
(4B CP2 ``none`` 4096+4096). Attention-only models (ungated attention; measured:
Qwen3-1.7B): worst 0.961 and 0.953 (TP2 cells: oracles/rank_sim/README.md "The miss",
one query-wide tensor per ungated attention layer the simulator does not keep). A grid
model takes its family's figure: the miss is the ungated attention's, so it must not
widen the hybrids' allowance, and an unmeasured attention-only model inherits it. MoE
hybrids (measured: Qwen3.5-35B-A3B, TP4 EP4) under torch.compile: worst 0.906 and 0.904
(the compiled balanced-routing ``core_attn`` 1500+1500 cell; oracles/rank_sim/README.md
"MoE"); in eager mode (the measured cells: concentrated routing) 0.960 and 0.969 (the
``core_attn+moe`` 1500+1500 and ``core_attn`` cells): the compiled runs' fused expert
kernels are the simulator's larger miss (``MOE_COMPILED_ROW_FP32_F``), so an eager MoE
row inherits the eager cells' error."""
Figure = Literal["forward", "forward_backward"]


class SimulatedDataError(CpmemError, ValueError):
    """golden/simulated/ is missing, or its rows do not match its manifest."""


HARNESS_STEP = ("hidden", 1, 0.0, "all", "all_gather")
"""(head, lora rank, dropout, targets, CP comm) of the measured harness."""


@dataclass(frozen=True)
class SimRow:
    """One grid configuration: the plan the simulator was given and its per-rank peaks
    (bytes above the pre-forward baseline, cold set-up not included)."""

    config_id: str
    model: str
    model_source: str
    tp: int
    cp: int
    ep: int
    routing: str
    sequence_parallel: bool
    mode: str
    modules: str
    request: str
    lengths: tuple[int, ...]
    shared_prefix: int
    logical_tokens: int
    packed_tokens: int
    grad_segments: int
    planner: str
    attention_tokens: tuple[int, ...]
    gdn_tokens: tuple[int, ...]
    rank_forward: tuple[int, ...]
    rank_forward_backward: tuple[int, ...]
    busiest_rank: int
    forward_peak: int
    forward_backward_peak: int
    head: str = "hidden"
    lora_rank: int = 1
    lora_dropout: float = 0.0
    lora_targets: str = "all"
    cp_comm: str = "all_gather"
    pp: int = 1
    vpp: int = 1
    microbatches: int = 1
    stage_layers: tuple[int, ...] = ()
    microbatch_lengths: tuple[tuple[int, ...], ...] = ()
    """Every micro-batch's lengths where they differ (empty: ``lengths`` repeated)."""
    stage_forward: tuple[int, ...] = ()
    stage_forward_backward: tuple[int, ...] = ()
    busiest_stage: int = 0

    @property
    def is_pipeline(self) -> bool:
        return self.pp > 1

    @property
    def is_trainer(self) -> bool:
        """Whether the row's step is a trainer's (a head, other adapters or CP comm), not
        the measured harness's."""
        step = (self.head, self.lora_rank, self.lora_dropout, self.lora_targets, self.cp_comm)
        return step != HARNESS_STEP


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("+") if x)


def simulated_dir(golden_dir: Path | None = None) -> Path:
    return (golden_dir if golden_dir is not None else default_golden_dir()) / SIM_SUBDIR


def verify_simulated(sim_dir: Path) -> list[str]:
    """Problems with golden/simulated/MANIFEST.sha256 (empty: every file matches)."""
    path = sim_dir / MANIFEST_FILE
    if not path.is_file():
        return [f"{path}: missing (python -m oracles.sim_grid --assemble writes it)"]
    problems: list[str] = []
    listed: set[str] = set()
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        m = re.match(r"^([0-9a-f]{64})  (\S.*)$", line)
        if not m:
            problems.append(f"{MANIFEST_FILE}: line {i} malformed: {line!r}")
            continue
        listed.add(m[2])
        target = sim_dir / m[2]
        if not target.is_file():
            problems.append(f"{m[2]}: listed but missing")
        elif hashlib.sha256(target.read_bytes()).hexdigest() != m[1]:
            problems.append(f"{m[2]}: sha256 does not match the manifest")
    for required in (ROWS_FILE, "provenance.json"):
        if required not in listed:
            problems.append(f"{required}: not in {MANIFEST_FILE}")
    return problems


def load_rows(sim_dir: Path, ids: Iterable[str] | None = None) -> list[SimRow]:
    """The grid rows (all, or those named by ``ids``, in file order)."""
    path = sim_dir / ROWS_FILE
    if not path.is_file():
        raise SimulatedDataError(f"{path}: missing (generate with python -m oracles.sim_grid)")
    wanted = set(ids) if ids is not None else None
    rows: list[SimRow] = []
    with path.open(newline="", encoding="utf-8") as fh:
        for r in csv.DictReader(fh):
            if wanted is not None and r["config_id"] not in wanted:
                continue
            rows.append(
                SimRow(
                    config_id=r["config_id"],
                    model=r["model"],
                    model_source=r["model_source"],
                    tp=int(r["tp"]),
                    cp=int(r["cp"]),
                    ep=int(r["ep"]),
                    routing=r["routing"],
                    sequence_parallel=r["sequence_parallel"] == "True",
                    mode=r["mode"],
                    modules=r["modules"],
                    request=r["request"],
                    lengths=_ints(r["lengths"]),
                    shared_prefix=int(r["shared_prefix"]),
                    logical_tokens=int(r["logical_tokens"]),
                    packed_tokens=int(r["packed_tokens"]),
                    grad_segments=int(r["grad_segments"]),
                    planner=r["planner"],
                    attention_tokens=_ints(r["attention_tokens"]),
                    gdn_tokens=_ints(r["gdn_tokens"]),
                    rank_forward=_ints(r["rank_forward_peak_bytes"]),
                    rank_forward_backward=_ints(r["rank_forward_backward_peak_bytes"]),
                    busiest_rank=int(r["busiest_rank"]),
                    forward_peak=int(r["forward_peak_bytes"]),
                    forward_backward_peak=int(r["forward_backward_peak_bytes"]),
                    head=r.get("head") or "hidden",
                    lora_rank=int(r.get("lora_rank") or 1),
                    lora_dropout=float(r.get("lora_dropout") or 0.0),
                    lora_targets=r.get("lora_targets") or "all",
                    cp_comm=r.get("cp_comm") or "all_gather",
                    pp=int(r.get("pp") or 1),
                    vpp=int(r.get("vpp") or 1),
                    microbatches=int(r.get("microbatches") or 1),
                    stage_layers=_ints(r.get("stage_layers") or ""),
                    microbatch_lengths=tuple(
                        _ints(part)
                        for part in (r.get("microbatch_lengths") or "").split(";")
                        if part
                    ),
                    stage_forward=_ints(r.get("stage_forward_peak_bytes") or ""),
                    stage_forward_backward=_ints(r.get("stage_forward_backward_peak_bytes") or ""),
                    busiest_stage=int(r.get("busiest_stage") or 0),
                )
            )
    if wanted is not None:
        missing = wanted - {r.config_id for r in rows}
        if missing:
            raise SimulatedDataError(f"rows not in {path}: {sorted(missing)[:5]}")
    return rows


def row_step(row: SimRow, sim_dir: Path, cache: dict[str, ModelGeometry] | None = None) -> Step:
    """The plan the simulator was given (its per-rank attention and GDN counts) as an
    explicit plan, with the row's recompute path and trainer's step (head, adapters, CP
    comm); a cold step (the allowance assumes the set-up is paid). A pipeline row adds
    its stages; where its micro-batches differ, each is planned from its lengths, as the
    grid's generator planned them."""
    cache = cache if cache is not None else {}
    geometry = cache.get(row.model_source + row.model)
    if geometry is None:
        geometry = (
            load_model(row.model)
            if row.model_source == "preset"
            else load_model(config=sim_dir / row.model_source)
        )
        cache[row.model_source + row.model] = geometry
    settings: SettingsArguments = {
        "tp": row.tp,
        "cp": row.cp,
        "sp": row.sequence_parallel,
        "ep": row.ep,
        "recompute": row.mode,
        "modules": row.modules or None,
        "moe_routing": row.routing or "concentrated",
        "step": "first",
        "head": row.head,
        "lora_rank": row.lora_rank,
        "lora_dropout": row.lora_dropout,
        "lora_targets": row.lora_targets,
        "cp_comm": row.cp_comm,
    }
    if row.is_pipeline:
        settings["pp"], settings["vpp"] = row.pp, row.vpp
        settings["stage_layers"] = row.stage_layers or None
        if row.microbatch_lengths:  # each micro-batch planned as the generator planned it
            return describe_step(
                geometry, microbatch_requests=[list(m) for m in row.microbatch_lengths], **settings
            )
        settings["microbatches"] = row.microbatches
    return describe_step(
        geometry,
        logical_tokens=row.logical_tokens,
        packed_tokens=row.packed_tokens,
        segments=row.grad_segments,
        rank_tokens=row.attention_tokens,
        gdn_rank_tokens=row.gdn_tokens,
        **settings,
    )


def central(sim_bytes: int) -> int:
    """The simulator's figure with the cold set-up it leaves out: the one every policy
    prices (``COLD_SETUP``, 64 MiB), not the 58 MiB the simulator's own validation adds
    (golden/README.md's "about 58 MiB"): a policy must cover the set-up it charges."""
    return sim_bytes + COLD_SETUP


def family(geometry: ModelGeometry, compiled: bool) -> Family:
    """The validation family whose worst simulator error a grid row's model inherits
    (MoE models by execution mode: the measured compiled and eager cells miss apart)."""
    if geometry.is_moe:
        return "moe" if compiled else "moe-eager"
    return "hybrid" if geometry.is_hybrid else "attention-only"


def required(sim_bytes: int, figure: Figure, model_family: Family) -> int:
    """What an estimate must reach to cover a simulated peak: the cold set-up and the
    simulator's validated worst under-estimate for the model's family."""
    return math.ceil(central(sim_bytes) / (1 - SIM_WORST_UNDER[model_family][figure]))
