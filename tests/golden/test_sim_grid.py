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


def test_requests_span_the_issue() -> None:
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
    from oracles.sim_grid.grid import by_id

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
