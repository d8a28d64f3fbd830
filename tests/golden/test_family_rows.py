"""The families priced by structure only against their simulated grid rows
(``family_grid``, golden/simulated/): 40 rows per model, each family's layers restated
in the rank simulator from its published structure.

The dense families' rows (Gemma 2, Gemma 3) are selected by the simulated tier's dense
targets as the measured families' are; the MoE families' rows are reported, as
Qwen3.5-MoE's (``cpmem.samples.targets.SIMULATED_TARGETS``). What holds on every family
row: ``tight`` covers the simulator's central figure (its peak plus the cold set-up
every policy prices), forward and forward+backward, but on the MoE rows whose experts
sit behind a ``moe`` checkpoint with EP wider than TP, whose recompute's row gradients
``tight`` does not price there (docs/simulated-grid.md, "Family rows")."""

from __future__ import annotations

from collections import Counter

import pytest

from cpmem.pricing.registry import price
from cpmem.samples.rows import central, load_rows, row_step, simulated_dir
from cpmem.samples.targets import SIMULATED_TARGETS
from cpmem.step.recompute import Module

SIM = simulated_dir()
GRID_FAMILIES = frozenset({"qwen3_moe", "gpt_oss", "gemma3_text", "gemma2", "deepseek_v3"})
"""The families ``family_grid`` checks, one published model each."""


@pytest.fixture(scope="module")
def family_rows():
    cache: dict = {}
    out = []
    for row in load_rows(SIM):
        step = row_step(row, SIM, cache)
        if step.geometry.family in GRID_FAMILIES:
            out.append((row, step))
    return out


def test_every_family_has_forty_rows_over_the_layouts_heads_adapters_and_recompute(
    family_rows,
):
    families = Counter(step.geometry.family for _, step in family_rows)
    assert set(families) == set(GRID_FAMILIES)
    assert all(n >= 40 for n in families.values())
    layouts = {(row.tp, row.cp) for row, _ in family_rows}
    assert {(8, 1), (1, 8), (2, 4), (4, 2)} <= layouts and max(t * c for t, c in layouts) == 8
    assert {row.head for row, _ in family_rows} >= {"logits", "hidden"}
    assert 16 in {row.lora_rank for row, _ in family_rows}
    assert {row.mode for row, _ in family_rows} >= {"selective", "full", "none"}


def test_tight_covers_the_simulators_central_figure(family_rows):
    short = []
    for row, step in family_rows:
        spanned = step.plan.layout.ep > step.plan.layout.tp
        if step.geometry.is_moe and step.recompute.checkpoints(Module.MOE) and spanned:
            continue
        estimate = price(step, "tight")
        if estimate.estimate_bytes < central(row.forward_peak):
            short.append((row.config_id, "forward"))
        assert estimate.forward_backward_bytes is not None
        if estimate.forward_backward_bytes < central(row.forward_backward_peak):
            short.append((row.config_id, "forward+backward"))
    assert short == []


def test_a_windowed_model_never_rides_the_p2p_ring(family_rows):
    """Transformer Engine refuses a sliding window under p2p: no such row exists."""
    for row, step in family_rows:
        if step.geometry.windowed and row.cp > 1:
            assert row.cp_comm in ("all_gather", "a2a")


def test_the_dense_families_rows_meet_the_dense_targets_and_the_moe_rows_are_reported(
    family_rows,
):
    """Every tight target that selects rows by what they are selects Gemma's rows as it
    selects the measured dense families', and no MoE family's row."""
    by_name = {t.name: t for t in SIMULATED_TARGETS["tight"]}
    dense = by_name["every dense/hybrid row, forward"]
    headroom = by_name["dense/hybrid >= 2,048 tokens, forward"]
    for row, step in family_rows:
        assert dense.selects(step) is (not step.geometry.is_moe), row.config_id
        assert headroom.selects(step) is (not step.geometry.is_moe), row.config_id
    assert {step.geometry.family for _, step in family_rows if dense.selects(step)} == {
        "gemma2",
        "gemma3_text",
    }
