"""The simulated grid's definition and its plans (no simulation: torch is not imported)."""

from __future__ import annotations

import pytest

from cpmem.model.load import load_model
from oracles.rank_sim.geometry import get_model, load_config
from oracles.sim_grid.__main__ import plan_job, representatives
from oracles.sim_grid.grid import CONFIG_DIR, LAYOUTS, MODELS, RECOMPUTE, REQUESTS, grid


def test_grid_size_and_axes() -> None:
    g = grid()
    assert len(g) >= 400
    assert len({c.config_id for c in g}) == len(g)
    assert {c.tp for c in g} == {1, 2, 4, 8}
    assert {c.cp for c in g} == {1, 2, 4, 8}
    assert all(c.tp * c.cp <= 16 for c in g)
    assert any(c.tp > 1 and c.cp > 1 for c in g)
    assert {(c.tp, c.cp) for c in g} == set(LAYOUTS)
    assert {c.model for c in g} == set(MODELS)
    assert {(c.mode, c.modules) for c in g} == set(RECOMPUTE)
    assert {c.request.name for c in g} == {r.name for r in REQUESTS}
    # every model meets every recompute path
    assert len({(c.model, c.mode, c.modules) for c in g}) == len(MODELS) * len(RECOMPUTE)


def test_requests_span_2k_to_128k_singles_pairs_and_uneven_packs() -> None:
    singles = [r for r in REQUESTS if len(r.lengths) == 1]
    assert min(r.lengths[0] for r in singles) == 2048
    assert max(r.lengths[0] for r in singles) == 128 * 1024
    pairs = [r for r in REQUESTS if len(r.lengths) == 2]
    assert {r.shared_prefix > 0 for r in pairs} == {True, False}
    packs = [r for r in REQUESTS if len(r.lengths) >= 4 and not r.skew]
    assert {len(r.lengths) for r in packs} == {4, 8, 16}
    assert all(len(set(r.lengths)) == len(r.lengths) for r in packs)  # uneven


def test_a_skewed_request_per_cp_size() -> None:
    """At every CP size > 1 some configuration's busiest rank holds far more than
    packed / CP (at least 1.5x)."""
    for cp in (2, 4, 8):
        ratios = []
        for c in grid():
            if c.cp != cp or not c.request.skew:
                continue
            job = plan_job(c)
            tokens = [
                max(a, b) for a, b in zip(job["attention_tokens"], job["gdn_tokens"], strict=True)
            ]
            ratios.append(max(tokens) / (job["packed_tokens"] / cp))
        assert ratios and max(ratios) >= 1.5, (cp, ratios)


def test_plans_add_up() -> None:
    """Every configuration's plan holds at least its real tokens, one count per CP rank,
    multiples of TP under SP; ranks with equal counts and pieces are simulated once."""
    simulated = 0
    for c in grid():
        job = plan_job(c)
        assert len(job["attention_tokens"]) == c.cp == len(job["gdn_tokens"])
        assert sum(job["attention_tokens"]) == sum(job["gdn_tokens"])
        assert sum(job["gdn_tokens"]) >= job["packed_tokens"] - (c.tp - 1)
        if c.tp > 1:
            assert all(n % c.tp == 0 for n in job["attention_tokens"])
        reps = representatives(job)
        assert reps[0] == 0 and all(r <= i for i, r in enumerate(reps))
        simulated += len(set(reps))
    assert simulated < sum(c.cp for c in grid())


@pytest.mark.parametrize("name", sorted(n for n, src in MODELS.items() if src != "preset"))
def test_configs_load_in_cpmem_and_the_simulator(name: str) -> None:
    path = CONFIG_DIR / f"{name}.json"
    g = load_model(config=path)
    s = load_config(path)
    assert (g.hidden, g.ffn, g.layers, g.gdn_layers) == (s.hidden, s.ffn, s.layers, s.gdn_layers)
    assert (g.q_heads, g.kv_groups, g.head_dim) == (s.q_heads, s.kv_groups, s.head_dim)
    assert g.fused_swiglu == s.fused_swiglu
    assert g.attention_output_gate == s.gated_attention
    assert g.qk_norm == s.qk_norm  # the family's attention class (llama: none; qwen3*: on)
    assert not g.is_moe
    for tp in (1, 2, 4, 8):
        g.check_tp(tp)
        s.check_tp(tp)


def test_presets_are_simulated() -> None:
    for name, src in MODELS.items():
        if src == "preset":
            assert get_model(name).name == name
            assert not load_model(name).is_moe


def test_committed_rows_hold_the_grids_plans() -> None:
    """Every committed row is a grid configuration and records the plan the generator
    gives it today (the tier prices that plan)."""
    from cpmem.samples.rows import load_rows, simulated_dir
    from oracles.sim_grid.configs import by_id

    grid_by_id = by_id()
    for row in load_rows(simulated_dir()):
        job = plan_job(grid_by_id[row.config_id])
        assert list(row.attention_tokens) == job["attention_tokens"]
        assert list(row.gdn_tokens) == job["gdn_tokens"]
        assert (row.packed_tokens, row.logical_tokens, row.grad_segments) == (
            job["packed_tokens"],
            job["logical_tokens"],
            job["grad_segments"],
        )
        assert len(row.rank_forward) == row.cp == len(row.rank_forward_backward)
        assert row.forward_peak == max(row.rank_forward)


# ---------------------------------------------------------------- the trainer's step rows


def test_trainer_grid_is_a_designed_subset_meeting_every_model_and_layout() -> None:
    """At least 300 rows; every level of every trainer factor meets every model and every
    layout (the rotation's promise, docs: golden/simulated/README.md); no row is the
    harness; 4k-128k requests."""
    from oracles.sim_grid.grid import (
        TRAINER_DROPOUTS,
        TRAINER_HEADS,
        TRAINER_RANKS,
        TRAINER_TARGETS,
        TrainerSpec,
        trainer_grid,
    )

    t = trainer_grid()
    assert len(t) >= 300 and len({c.config_id for c in t}) == len(t)
    assert not {c.config_id for c in t} & {c.config_id for c in grid()}
    assert all(c.trainer is not None and c.trainer != TrainerSpec() for c in t)
    specs = [(c, c.trainer) for c in t if c.trainer is not None]
    for factor, levels in (
        ("head", TRAINER_HEADS),
        ("lora_rank", TRAINER_RANKS),
        ("lora_dropout", TRAINER_DROPOUTS),
        ("lora_targets", TRAINER_TARGETS),
    ):
        assert {getattr(s, factor) for _, s in specs} == set(levels), factor
        assert len({(c.model, getattr(s, factor)) for c, s in specs}) == len(MODELS) * len(levels)
        assert len({(c.tp, c.cp, getattr(s, factor)) for c, s in specs}) == len(LAYOUTS) * len(
            levels
        ), factor
    comms = {s.cp_comm for c, s in specs if c.cp > 1}
    assert comms == {"all_gather", "p2p", "a2a"}
    assert all(s.cp_comm == "all_gather" for c, s in specs if c.cp == 1)
    tokens = {sum(c.request.lengths) for c in t}
    assert min(tokens) == 4096 and max(tokens) == 128 * 1024


def test_a2a_rows_have_heads_that_divide() -> None:
    """The grid's own head table is each model's (the configs and presets cpmem reads), and
    every a2a row has its heads per TP rank divisible by CP (Ulysses)."""
    from oracles.sim_grid.grid import A2A_HEADS, SIM_DIR, trainer_grid

    for model, src in MODELS.items():
        g = load_model(model) if src == "preset" else load_model(config=SIM_DIR / src)
        assert A2A_HEADS[model] == (g.q_heads, g.kv_groups), model
    for c in trainer_grid():
        if c.trainer is not None and c.trainer.cp_comm == "a2a":
            q, kv = A2A_HEADS[c.model]
            kv_rank = kv // c.tp if kv >= c.tp else 1
            assert (q // c.tp) % c.cp == 0 and kv_rank % c.cp == 0, c.config_id


def test_a_trainer_job_carries_its_step() -> None:
    from oracles.sim_grid.grid import trainer_grid

    c = next(c for c in trainer_grid() if c.trainer is not None and c.trainer.head == "logits")
    job = plan_job(c)
    assert c.trainer is not None
    assert (job["head"], job["lora_rank"], job["cp_comm"]) == (
        "logits",
        c.trainer.lora_rank,
        c.trainer.cp_comm,
    )
    assert "head" not in plan_job(grid()[0])  # a harness job simulates as it always did
