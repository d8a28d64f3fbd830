"""The simulated grid's pipeline rows (oracles/sim_grid/grid.py ``pipeline_grid``): the
grid covers its axes (schedules, splits, layouts, micro-batches), one small pipeline configuration generated end to end
through the generator (a temporary ``--out``, never golden/simulated/) equals direct
``simulate_stage`` calls on cpmem's per-micro-batch plans, and the committed rows.csv
carries the pipeline columns (defaults on the rows without stages)."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from oracles.sim_grid import __main__ as sim_grid
from oracles.sim_grid.grid import (
    MODELS,
    PIPELINE_LAYERS,
    REPO,
    SIM_DIR,
    GridConfig,
    grid,
    moe_grid,
    pipeline_grid,
    trainer_grid,
)

NEW_COLUMNS = (
    "pp", "vpp", "microbatches", "stage_layers", "microbatch_lengths",
    "stage_forward_peak_bytes", "stage_forward_backward_peak_bytes", "busiest_stage",
)  # fmt: skip


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split("+") if x]


def test_pipeline_grid_covers_every_schedule_with_even_and_uneven_stages() -> None:
    """>= 150 configurations: PP {2, 4, 8} x V {1, 2} x M {PP, 2 PP, 8}, each schedule with
    even and uneven stages; >= 40 whose micro-batches differ; TP > 1 and CP > 1 rows; every
    micro-batch >= 2,048 tokens; ids unique and apart from the other grids."""
    g = pipeline_grid()
    assert len(g) >= 150
    ids = [c.config_id for c in g]
    assert len(set(ids)) == len(ids)
    others = {c.config_id for c in grid() + moe_grid() + trainer_grid()}
    assert not set(ids) & others
    specs = [(c, c.pipeline) for c in g if c.pipeline is not None]
    assert len(specs) == len(g)
    schedules = {(p.pp, p.vpp, p.microbatches) for _, p in specs}
    want = {(pp, v, m) for pp in (2, 4, 8) for v in (1, 2) for m in (pp, 2 * pp, 8)}
    assert schedules == want
    for pp in (2, 4, 8):
        rows = [(c, p) for c, p in specs if p.pp == pp]
        assert {p.split.even for _, p in rows} == {True, False}, pp
        assert any(p.differ for _, p in rows) and any(not p.differ for _, p in rows), pp
        assert any(c.tp > 1 for c, _ in rows) and any(c.cp > 1 for c, _ in rows), pp
    assert sum(p.differ for _, p in specs) >= 40
    assert any(c.tp > 1 and c.cp > 1 for c, _ in specs)
    assert {(c.tp, c.cp) for c, _ in specs} >= {(1, 1), (2, 1), (1, 2), (2, 2), (4, 1), (1, 4)}
    for c, p in specs:
        assert p.vpp == 1 or (p.microbatches >= p.pp and p.microbatches % p.pp == 0), c.config_id
        assert min(sum(mb) for mb in p.microbatch_lengths) >= 2048, c.config_id
        assert c.request.lengths == p.microbatch_lengths[0]
        assert re.search(rf":pp{p.pp}:v{p.vpp}:m{p.microbatches}:", c.config_id)
    assert {c.model for c, _ in specs} <= set(MODELS)


def test_pipeline_layers_and_plans() -> None:
    """The grid's layer table is the simulator's; each job's stages add up to the model's
    layers (uneven ones as cpmem cuts them), every micro-batch carries its own plan, the
    job's top-level counts are the first micro-batch's, and megatron accepts every
    schedule (the simulator's restatement of its interleaving checks)."""
    pytest.importorskip("torch")
    from oracles.rank_sim.pipeline import check_pipeline, stage_layer_counts
    from oracles.sim_grid.worker import job_model

    for c in pipeline_grid():
        job = sim_grid.plan_job(c)
        model = job_model(job)
        assert model.layers == PIPELINE_LAYERS[c.model] == job["layers"]
        assert c.pipeline is not None
        counts = stage_layer_counts(model, job["pp"], job["vpp"], job["stage_layers"])
        assert (job["stage_layers"] is None) == c.pipeline.split.even
        if job["stage_layers"] is not None:
            assert len(set(counts)) > 1
        for stage in range(job["pp"]):
            check_pipeline(job["pp"], stage, job["vpp"], job["microbatches"])
        plans = job["microbatch_plans"]
        assert len(plans) == job["microbatches"]
        assert [tuple(p["lengths"]) for p in plans] == list(c.pipeline.microbatch_lengths)
        assert job["attention_tokens"] == plans[0]["attention_tokens"]
        assert all(len(p["attention_tokens"]) == c.cp for p in plans)
        keys = sim_grid.rank_keys(job)
        assert {k // c.cp for k in keys} == set(range(job["pp"]))


def _cheapest() -> GridConfig:
    """A PP 2 configuration at CP 2 whose micro-batches differ, fewest layers x M."""
    candidates = [
        c
        for c in pipeline_grid()
        if c.pipeline is not None and c.pipeline.pp == 2 and c.cp == 2 and c.pipeline.differ
    ]

    def cost(c: GridConfig) -> tuple[int, int]:
        assert c.pipeline is not None
        return (PIPELINE_LAYERS[c.model] * c.pipeline.microbatches, c.order)

    return min(candidates, key=cost)


def _direct(c: GridConfig, stage: int, cp_rank: int) -> Any:
    """The stage from cpmem's own per-micro-batch plans, through the simulator directly
    (not the worker)."""
    from cpmem import api
    from oracles.rank_sim.geometry import get_model, load_config
    from oracles.rank_sim.layout import contiguous_layout, row_segments
    from oracles.rank_sim.pipeline import simulate_stage
    from oracles.rank_sim.recompute import Recompute

    spec = c.pipeline
    assert spec is not None
    geometry = api.load_model(config=c.config_path) if c.config_path else api.load_model(c.model)
    step = api.describe_step(
        geometry, microbatch_requests=[list(x) for x in spec.microbatch_lengths], tp=c.tp,
        cp=c.cp, pp=spec.pp, vpp=spec.vpp, first_stage_layers=spec.split.first,
        last_stage_layers=spec.split.last,
        stage_layers=list(spec.split.stages) if spec.split.stages else None,
    )  # fmt: skip
    layouts = []
    for mb in step.microbatch_steps:
        g = mb.plan.groups[0]
        attn = tuple(g.attention_tokens)
        gdn = tuple(g.gdn_tokens) if geometry.is_hybrid else attn
        assert mb.request is not None
        segs = row_segments(tuple(mb.request.sequence_lengths), 0, sum(gdn))
        layouts.append(
            contiguous_layout(segs, attn, gdn, tp=c.tp, rank=cp_rank,
                              logical_tokens=mb.request.logical_tokens, sp=c.tp > 1)
        )  # fmt: skip
    model = load_config(c.config_path) if c.config_path else get_model(c.model)
    layers = step.settings.pipeline.layers
    return simulate_stage(
        model, layouts, Recompute.parse(c.mode, c.modules or None), pp=spec.pp, stage=stage,
        vpp=spec.vpp, stage_layers=list(layers) if layers else None,
    )  # fmt: skip


def test_a_pipeline_row_end_to_end(tmp_path: Path) -> None:
    """The generator's ranks (every stage of every CP rank, keyed stage * cp + cp_rank)
    equal the simulator's own figures on cpmem's plans, the committed ones too, and the
    row's stage columns are assembled from them."""
    pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    warnings.filterwarnings("ignore")
    c = _cheapest()
    cmd = [sys.executable, "-m", "oracles.sim_grid", "--engine", "local", "--workers", "2",
           "--only", f"^{re.escape(c.config_id)}$", "--out", str(tmp_path)]  # fmt: skip
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-4000:]
    ranks = {
        r["rank"]: r for r in map(json.loads, (tmp_path / sim_grid.RANKS).read_text().splitlines())
    }
    job = sim_grid.plan_job(c)
    assert sorted(ranks) == sim_grid.rank_keys(job)
    assert c.pipeline is not None
    for key, r in ranks.items():
        assert (r["stage"], r["cp_rank"]) == divmod(key, c.cp)
    for stage, cp_rank in ((0, 1), (c.pipeline.pp - 1, 0)):
        key = stage * c.cp + sim_grid.representatives(job)[cp_rank]
        res = _direct(c, stage, cp_rank)
        assert (ranks[key]["forward_peak_bytes"], ranks[key]["forward_backward_peak_bytes"]) == (
            res.forward_peak_bytes,
            res.forward_backward_peak_bytes,
        )
    committed = {
        r["rank"]: r
        for r in map(json.loads, (SIM_DIR / sim_grid.RANKS).read_text().splitlines())
        if r["config_id"] == c.config_id
    }
    drop = ("seconds",)
    for key, r in committed.items():  # the committed rows are this simulator's
        assert {k: v for k, v in r.items() if k not in drop} == {
            k: v for k, v in ranks[key].items() if k not in drop
        }
    (row,) = csv.DictReader((tmp_path / sim_grid.ROWS).open())
    reps = sim_grid.representatives(job)
    stage_fwd = [
        max(ranks[s * c.cp + reps[r]]["forward_peak_bytes"] for r in range(c.cp))
        for s in range(c.pipeline.pp)
    ]
    assert _ints(row["stage_forward_peak_bytes"]) == stage_fwd
    assert int(row["busiest_stage"]) == stage_fwd.index(max(stage_fwd))
    assert int(row["forward_peak_bytes"]) == max(stage_fwd)
    assert row["microbatch_lengths"] == ";".join(
        "+".join(map(str, mb)) for mb in c.pipeline.microbatch_lengths
    )
    assert (row["pp"], row["vpp"], row["microbatches"]) == (
        str(c.pipeline.pp), str(c.pipeline.vpp), str(c.pipeline.microbatches),
    )  # fmt: skip


def test_committed_rows_carry_the_pipeline_columns() -> None:
    """The new columns end the header; rows without stages carry the defaults (pp 1, their
    own peaks as the one stage's); pipeline rows are consistent with their stages."""
    with (SIM_DIR / sim_grid.ROWS).open(newline="") as fh:
        reader = csv.DictReader(fh)
        assert tuple(reader.fieldnames or ())[-len(NEW_COLUMNS) :] == NEW_COLUMNS
        assert tuple(reader.fieldnames or ()) == sim_grid.COLUMNS
        rows = list(reader)
    pipeline_ids = {c.config_id: c for c in pipeline_grid()}
    seen = 0
    for r in rows:
        c = pipeline_ids.get(r["config_id"])
        if c is None:
            assert (r["pp"], r["vpp"], r["microbatches"]) == ("1", "1", "1"), r["config_id"]
            assert r["stage_layers"] == r["microbatch_lengths"] == ""
            assert r["stage_forward_peak_bytes"] == r["forward_peak_bytes"]
            assert r["stage_forward_backward_peak_bytes"] == r["forward_backward_peak_bytes"]
            assert r["busiest_stage"] == "0"
            continue
        seen += 1
        assert c.pipeline is not None
        stage_fwd = _ints(r["stage_forward_peak_bytes"])
        stage_fb = _ints(r["stage_forward_backward_peak_bytes"])
        assert len(stage_fwd) == len(stage_fb) == c.pipeline.pp
        busiest = int(r["busiest_stage"])
        assert busiest == stage_fwd.index(max(stage_fwd))
        assert (
            int(r["forward_peak_bytes"])
            == stage_fwd[busiest]
            == max(_ints(r["rank_forward_peak_bytes"]))
        )
        assert int(r["forward_backward_peak_bytes"]) == stage_fb[busiest]
        assert len(_ints(r["rank_forward_peak_bytes"])) == c.cp
        assert _ints(r["lengths"]) == list(c.pipeline.microbatch_lengths[0])
        assert bool(r["microbatch_lengths"]) == c.pipeline.differ
        if r["stage_layers"]:
            assert sum(_ints(r["stage_layers"])) == int(r["layers"])
    assert seen == len(pipeline_ids)  # every pipeline configuration is generated
