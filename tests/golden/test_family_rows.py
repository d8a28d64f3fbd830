"""The families priced by structure only against their simulated grid rows
(``family_grid``, golden/simulated/): 40 rows per model, each family's layers restated
in the rank simulator from its published structure.

The dense families' rows (Gemma 2, Gemma 3) are selected by the simulated tier's dense
targets as the measured families' are, and measured against them here (not every row
meets them); the MoE families' rows are reported, as Qwen3.5-MoE's
(``cpmem.samples.targets.SIMULATED_TARGETS``). What holds on every family
row: ``tight`` covers the simulator's central figure (its peak plus the cold set-up
every policy prices), forward and forward+backward; under its balanced routing each MoE
family row is within 15% of it on the simulator's structure (docs/simulated-grid.md,
"Family rows")."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from cpmem.errors import InputError
from cpmem.pricing.components import Component
from cpmem.pricing.registry import price
from cpmem.pricing.tight.policy import price_structure_only
from cpmem.samples.rows import central, family, load_rows, required, row_step, simulated_dir
from cpmem.samples.targets import SIMULATED_TARGETS
from cpmem.step.trainer import CP_COMMS

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
        estimate = price(step, "tight")
        if estimate.estimate_bytes < central(row.forward_peak):
            short.append((row.config_id, "forward"))
        assert estimate.forward_backward_bytes is not None
        if estimate.forward_backward_bytes < central(row.forward_backward_peak):
            short.append((row.config_id, "forward+backward"))
    assert short == []


TE_WINDOW_CP_COMMS = ("a2a", "all_gather")
"""The CP comm types Transformer Engine runs a sliding window under:
``attn_forward_func_with_cp`` asserts ``not sliding_window_attn or cp_comm_type in
["a2a", "all_gather"]`` (transformer_engine/pytorch/attention/dot_product_attention/
context_parallel.py, v2.9 lines 3803-3809, v2.10 and v2.11 lines 4023-4029; megatron-core
0.16 pins transformer-engine >=2.9,<2.12)."""


def _windowed_cp_rows(family_rows):
    rows = [(row, step) for row, step in family_rows if step.geometry.windowed and row.cp > 1]
    assert {step.geometry.family for _, step in rows} == {"gemma2", "gemma3_text", "gpt_oss"}
    return rows


def test_a_windowed_model_under_cp_is_refused_the_ring_and_runs_under_te_s_comm_types(
    family_rows,
):
    """Every windowed family row with CP > 1, restated under each CP comm type: ``p2p``
    is refused by an InputError naming ``cp_comm`` and the model, as Transformer Engine
    refuses it (``TE_WINDOW_CP_COMMS``); the types TE runs a window under are accepted."""
    assert set(TE_WINDOW_CP_COMMS) | {"p2p", "a2a+p2p"} == set(CP_COMMS)
    for row, step in _windowed_cp_rows(family_rows):
        for comm in TE_WINDOW_CP_COMMS:
            assert replace(step.settings, cp_comm=comm).cp_comm == comm, row.config_id
        with pytest.raises(InputError) as err:
            replace(step.settings, cp_comm="p2p")
        assert (err.value.field, err.value.value) == ("cp_comm", "p2p"), row.config_id
        assert step.geometry.name in err.value.reason
        assert "all_gather or a2a" in err.value.reason


def test_every_cp_comm_transformer_engine_refuses_a_window_under_is_refused(family_rows):
    refused = [c for c in CP_COMMS if c not in TE_WINDOW_CP_COMMS]
    _, step = _windowed_cp_rows(family_rows)[0]
    for comm in refused:
        with pytest.raises(InputError):
            replace(step.settings, cp_comm=comm)


SHORT_OF_THE_ALLOWANCE = {
    ("gemma-2-9b:tp1:cp1:pack4-uneven:full:head=logits:r1:d0:t=all:comm=all_gather", "forward"),
    (
        "gemma-2-9b:tp1:cp1:pack4-uneven:full:head=logits:r1:d0:t=all:comm=all_gather",
        "forward_backward",
    ),
    ("gemma-2-9b:tp1:cp2:pair-16k:full:head=logits:r1:d0:t=all:comm=a2a", "forward_backward"),
    ("gemma-2-9b:tp1:cp4:single-32k:full:head=logits:r16:d0:t=all:comm=a2a", "forward_backward"),
}
"""The dense family rows ``tight`` covers at the simulator's central figure but not with
the attention-only allowance (``required``: 3.9% forward, 4.7% forward+backward): Gemma 2
under full recompute, +4.1% to +4.4% over the central figure."""


def test_the_dense_families_rows_against_the_dense_targets(family_rows):
    """The tight targets that select the dense rows (``SIMULATED_TARGETS``), measured on
    Gemma 2's and Gemma 3's rows from their figures: ``tight`` against the simulator's
    peak with the cold set-up (``central``) and the family's validated allowance
    (``required``). Neither is met on every row: coverage with the allowance misses the
    rows of ``SHORT_OF_THE_ALLOWANCE``, and the forward headroom bound (8% on rows of
    >= 2,048 tokens) is exceeded on exactly the rows that checkpoint ``core_attn+mlp``
    (20 rows, up to +20.2%); every other row is within it. No MoE family row is selected."""
    by_name = {t.name: t for t in SIMULATED_TARGETS["tight"]}
    coverage = [by_name[f"every dense/hybrid row, {f}"] for f in ("forward", "forward+backward")]
    headroom = by_name["dense/hybrid >= 2,048 tokens, forward"]
    assert headroom.bound == 0.08
    dense = [(row, step) for row, step in family_rows if coverage[0].selects(step)]
    assert {step.geometry.family for _, step in dense} == {"gemma2", "gemma3_text"}
    short, over = set(), {}
    for row, step in dense:
        estimate = price(step, "tight")
        fam = family(step.geometry, step.compiled)
        figures = {
            "forward": (estimate.estimate_bytes, row.forward_peak),
            "forward_backward": (estimate.forward_backward_bytes, row.forward_backward_peak),
        }
        for target in coverage:
            got, peak = figures[target.figure]
            assert target.selects(step) and got is not None
            if got < required(peak, target.figure, fam):
                short.add((row.config_id, target.figure))
        if headroom.selects(step):
            assert row.logical_tokens >= 2048
            got, peak = figures["forward"]
            if got / central(peak) - 1 > headroom.bound:
                over[row.config_id] = got / central(peak) - 1
    assert short == SHORT_OF_THE_ALLOWANCE
    core_attn_mlp = {row.config_id for row, _ in dense if row.modules == "core_attn+mlp"}
    assert len(core_attn_mlp) == 20
    assert set(over) == core_attn_mlp
    assert max(over.values()) <= 0.21


def test_the_moe_families_balanced_rows_within_15_percent_on_the_simulators_structure(
    family_rows,
):
    """``MoE balanced rows, forward`` (``SIMULATED_TARGETS``): under the balanced routing
    each MoE family row's forward figure on the simulator's structure
    (``price_structure_only``) is within 15% of the simulator's central figure. The
    policy's own figure adds the measured runtime's query-wide tensor per ungated
    attention layer (``UNGATED_RUNTIME_Q``, which the simulator does not keep): read on
    it, the target fails, on ungated-attention models only (gpt-oss, Qwen3-MoE), and by
    no more than that tensor."""
    target = next(t for t in SIMULATED_TARGETS["tight"] if t.name == "MoE balanced rows, forward")
    assert target.bound == 0.15 and target.judged is price_structure_only
    rows = [(row, step) for row, step in family_rows if target.selects(step)]
    assert {step.geometry.family for _, step in rows} == {"qwen3_moe", "gpt_oss", "deepseek_v3"}
    assert len(rows) == 108
    over_own, over_structure = {}, {}
    for row, step in rows:
        own, structure = price(step, "tight"), price_structure_only(step)
        peak = central(row.forward_peak)
        if own.estimate_bytes / peak - 1 > target.bound:
            over_own[row.config_id] = step
        if structure.estimate_bytes / peak - 1 > target.bound:
            over_structure[row.config_id] = step
        if step.geometry.attention_output_gate or step.geometry.is_mla:
            assert own.estimate_bytes == structure.estimate_bytes
    assert over_structure == {}
    assert over_own  # the runtime's query tensor, read in, breaks the bound
    assert {s.geometry.family for s in over_own.values()} <= {"gpt_oss", "qwen3_moe"}


def test_the_structure_only_figure_leaves_out_the_runtime_query_tensor_alone():
    """``price_structure_only`` differs from ``tight`` by ``UNGATED_RUNTIME_Q`` query
    widths per ungated attention layer and token of the kept set, nothing else; on a
    gated (hybrid) model and under Megatron-LM's runtime (which keeps none) not at all."""
    from cpmem.api import describe_step as build_step
    from cpmem.pricing.tight.calibrated import UNGATED_RUNTIME_Q

    step = build_step(
        "qwen3-30b-a3b", [4096], tp=2, ep=2, recompute="selective", modules="core_attn"
    )
    own, structure = price(step, "tight"), price_structure_only(step)
    g = step.geometry
    query = UNGATED_RUNTIME_Q * g.q_width // 2 * g.attention_layers * 4096 * step.dtype_bytes
    kept = Component.RETAINED_ACTIVATIONS
    assert own.components[kept] - structure.components[kept] == query
    same = {k for k in own.components if own.components[k] == structure.components[k]}
    assert set(own.components) - same <= {kept, Component.MARGIN_FACTOR}
    for other in (
        build_step("qwen3.5-27b", [4096], tp=2),
        build_step("qwen3-30b-a3b", [4096], tp=2, ep=2, runtime="megatron-lm"),
    ):
        assert price(other, "tight").estimate_bytes == price_structure_only(other).estimate_bytes
