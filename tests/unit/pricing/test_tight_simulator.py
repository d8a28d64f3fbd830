"""tight's structure against the rank simulator's figures (oracles/rank_sim/).

The expected figures are the simulator's, recorded here from
``python -m oracles.rank_sim --model M --rank-tokens 8192 --recompute R --json`` (TP1,
CP1, eager; elements per token: bytes / 8,192 / 2, the simulator's per-label components
summed), not computed by tight. tight's unmargined structure (no cold set-up, no segment
states) must cover each and stay within the stated bound of it.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import pytest
from harness import HARNESS

from cpmem.model.geometry import ModelGeometry
from cpmem.model.load import load_model
from cpmem.plan.layout import ParallelLayout
from cpmem.plan.plan import Plan, explicit_plan
from cpmem.pricing.tight.calibrated import LOSS_BACKWARD_OUTPUTS
from cpmem.pricing.tight.compose import priced_tokens, structural_terms, tight_widths
from cpmem.pricing.tight.policy import price_tight
from cpmem.step.describe import describe_step as _describe_step
from cpmem.step.step import Step

# every figure here is recorded for the calibration harness's step (tests/unit/harness.py)
describe_step = partial(_describe_step, **HARNESS)

CONFIGS = Path(__file__).resolve().parents[3] / "golden" / "simulated" / "configs"
TOKENS = 8192


def _model(name: str) -> ModelGeometry:
    path = CONFIGS / f"{name}.json"
    return load_model(config=path) if path.is_file() else load_model(name)


def _step(g: ModelGeometry, plan: Plan, **settings: Any) -> Step:
    """``plan`` under ``settings``, at the plan's own layout."""
    layout = plan.layout
    return describe_step(
        g, plan=plan, tp=layout.tp, cp=layout.cp, sp=layout.sp, ep=layout.ep, **settings
    )


def _inputs(
    g: ModelGeometry, mode: str, modules: str | None = None, ranks: tuple[int, ...] = (TOKENS,)
) -> Step:
    plan = _plan(ParallelLayout(tp=1, cp=len(ranks), sp=False), ranks)
    return _step(g, plan, recompute=mode, modules=modules, step="steady")


def _plan(layout: ParallelLayout, ranks: tuple[int, ...]) -> Plan:
    """One segment, the given per-CP-rank token counts, attention and GDN alike."""
    return explicit_plan(
        layout,
        logical_tokens=sum(ranks),
        packed_tokens=sum(ranks),
        grad_segments=1,
        rank_tokens=ranks,
        gdn_rank_tokens=ranks,
    )


def _per_token(terms: dict[str, int]) -> float:
    body = {k: v for k, v in terms.items() if k not in ("cold_setup", "segment_states")}
    return sum(body.values()) / TOKENS / 2


# (model, simulated forward peak, simulated forward+backward peak), full recompute
FULL = [
    ("qwen3.5-4b", 142_848.0, 187_437.5),
    ("qwen3-1.7b", 98_560.0, 124_248.1),
    ("qwen3-next-style-dense", 154_720.0, 195_914.7),
]


@pytest.mark.parametrize(("model", "sim_fwd", "sim_fb"), FULL)
def test_full_recompute_covers_the_simulated_rank(
    model: str, sim_fwd: float, sim_fb: float
) -> None:
    """Layer inputs + one layer's no-grad pass (forward); + the widest layer's recompute
    and backward (forward+backward)."""
    g = _model(model)
    fwd, fb = structural_terms(_inputs(g, "full"))
    # the rope tables (2·head_dim) and the last layer's output are priced: no allowance
    assert sim_fwd <= _per_token(fwd) <= 1.05 * sim_fwd
    assert sim_fb <= _per_token(fb) <= 1.07 * sim_fb


# (model, simulated forward peak) of a no-grad forward
NO_GRAD = [("qwen3.5-4b", 63_488.0), ("qwen3-next-style-dense", 60_512.0)]


@pytest.mark.parametrize(("model", "sim_fwd"), NO_GRAD)
def test_no_grad_covers_the_simulated_rank(model: str, sim_fwd: float) -> None:
    """The running layer's input + its widest no-grad pass: the 4B's MLP (three-copy sum
    of the gate‖up projection), the Qwen3-Next-style GDN mixer (saved set + kernel
    workspace; the simulator peaks in it at 57,824 + the input). Both figures hold the
    rope tables (512 per token on these models), which tight prices as the model-level
    ``rope_tables``; the GDN pass is an envelope of fla's (tight +9.3% over the simulator
    on the Qwen3-Next-style model, +6.6% on the 4B)."""
    fwd, fb = structural_terms(_inputs(_model(model), "no-grad"))
    assert _per_token(fwd) == _per_token(fb)  # no backward
    assert sim_fwd <= _per_token(fwd) <= 1.10 * sim_fwd


def test_full_recompute_under_cp_prices_the_busiest_rank() -> None:
    """Under CP each rank's checkpoints keep its own tokens' layer inputs: the busiest
    rank's count is priced, not the packed count the reference keeps under full recompute."""
    g = _model("qwen3.5-4b")
    ranks = (4096, 2048, 1024, 1024)
    inputs = _inputs(g, "full", ranks=ranks)
    assert priced_tokens(inputs) == 4096
    alone = price_tight(_inputs(g, "full", ranks=(4096,)))
    cp = price_tight(inputs)
    assert cp.busiest_rank == 0 and cp.busiest_tokens == 4096
    packed = price_tight(_inputs(g, "full", ranks=(8192,)))
    # the CP rank adds only what CP adds (gathered outputs, the recomputed attention
    # layer's gathered K/V and head-expanded dk/dv), far below the packed count's cost
    assert alone.estimate_bytes <= cp.estimate_bytes < 1.2 * alone.estimate_bytes
    assert cp.estimate_bytes < 0.7 * packed.estimate_bytes


def test_ungated_attention_is_the_simulators_plus_the_measured_q() -> None:
    """Qwen3-1.7B TP1, no recompute, eager: the simulator keeps 15,444 elements per token
    per attention layer (its `attention` component / 28 layers), the same as under a
    core_attn checkpoint bar the softmax statistics. tight prices that set plus the one
    Q-wide tensor the measured runtime keeps beyond the simulator (Q = 2,048), and no
    eager-none extra (measured on gated attention only)."""
    g = _model("qwen3-1.7b")
    for mode, modules in (("none", None), ("selective", "core_attn")):
        w = tight_widths(g, _inputs(g, mode, modules))
        # tight leaves the simulator's small terms (fp32 softmax statistics: 84) to the margin
        assert -128 <= w.of("attention") - (15_444 + g.q_width) <= 0


# ----------------------------------------------------------------------------------- MoE
# python -m oracles.rank_sim --model qwen3.5-35b-a3b --rank-tokens 8192 --tp 4 --ep 4
#   --routing R --recompute selective --modules core_attn [--compiled] --json
# per MoE layer and token (bf16 elements): the `moe` component of `retained` / 8,192 / 2
# / 40 layers; the forward transient: (forward peak - (retained - output)) / 8,192 / 2.
MOE_SIM = [
    # (routing, compiled, retained per MoE layer, forward peak beyond the saved sets)
    ("concentrated", False, 45_001.2, 49_808.0),
    ("balanced", False, 14_257.2, 12_932.0),
    ("concentrated", True, 32_713.2, 49_808.0),
    ("balanced", True, 11_185.2, 12_932.0),
]


def _moe_inputs(
    routing: str, compiled: bool, ranks: tuple[int, ...] = (TOKENS,), modules: str = "core_attn"
) -> Step:
    plan = _plan(ParallelLayout(tp=4, cp=len(ranks), sp=True, ep=4), ranks)
    return _step(
        _model("qwen3.5-35b-a3b"),
        plan,
        recompute="selective",
        modules=modules,
        compiled=compiled,
        moe_routing=routing,
        step="steady",
    )


@pytest.mark.parametrize(("routing", "compiled", "sim_layer", "sim_transient"), MOE_SIM)
def test_moe_width_is_the_simulators(
    routing: str, compiled: bool, sim_layer: float, sim_transient: float
) -> None:
    """Qwen3.5-35B-A3B TP4 EP4 SP: per expert row ``H + 6·F_e`` eager (megatron's unfused
    probs-weighted GLU), ``H + 3·F_e`` compiled (the fused kernel) and 4 small elements,
    the router and the shared expert per token; no second H-wide copy per row (the
    reference's ``2H``). Compiled runs add the measured fp32 ``F_e`` per row the simulator
    lacks (2 KB per row, oracles/rank_sim/README.md "Balanced (compiled) cells")."""
    inputs = _moe_inputs(routing, compiled)
    g = inputs.geometry
    w = tight_widths(g, inputs)
    rows = 8 if routing == "concentrated" else 2
    measured_extra = rows * 2 * g.expert_ffn if compiled else 0
    # tight counts the router's per-token terms and the rank-1 intermediates as the
    # simulator lays them out; within 16 elements per token (0.05%)
    assert abs(w.of("moe") - (sim_layer + measured_extra)) <= 16
    # the reference's width keeps 2H per row: 7-8% over the simulator concentrated
    if routing == "concentrated" and not compiled:
        from cpmem.pricing.widths import moe_width

        assert moe_width(g, 4, True, 4) > 1.07 * sim_layer


@pytest.mark.parametrize(("routing", "compiled", "sim_layer", "sim_transient"), MOE_SIM)
def test_moe_forward_peak_holds_the_dispatch_buffers(
    routing: str, compiled: bool, sim_layer: float, sim_transient: float
) -> None:
    """The last MoE layer's forward peak beyond its saved set: the fc2 output, its
    un-sorted copy and the dispatched all-to-all output per row (``3H + 2``), the dense
    fp32 probs and one H-wide buffer per local token: exactly the simulator's."""
    inputs = _moe_inputs(routing, compiled)
    fwd, _ = structural_terms(inputs)
    assert fwd["layer_transient"] / TOKENS / 2 == sim_transient


def test_moe_under_cp_prices_the_busiest_rank() -> None:
    """Each CP rank dispatches its own tokens (the EP group is the TP ranks of one CP
    rank): the busiest rank's count is priced, as the simulator's CP 2 MoE rows do (tight
    priced the packed count: +109-131% over them). No MoE CP cell was measured."""
    ranks = (TOKENS, TOKENS // 2)
    inputs = _moe_inputs("concentrated", False, ranks=ranks)
    assert priced_tokens(inputs) == TOKENS
    alone = price_tight(_moe_inputs("concentrated", False))
    cp = price_tight(inputs)
    assert cp.busiest_tokens == TOKENS and cp.busiest_rank == 0
    assert alone.estimate_bytes <= cp.estimate_bytes < 1.02 * alone.estimate_bytes


def test_rope_tables_are_the_simulators() -> None:
    """Two bf16 (tokens x head_dim) tables per step, live through backward: the
    simulator's `rope` component, 10,444,800 bytes at 10,200 tokens (35B-A3B, head_dim
    256: 512 elements per token), whatever the TP degree; none on an attention-free model."""
    inputs = _moe_inputs("concentrated", False, ranks=(10_200,))
    fwd, fb = structural_terms(inputs)
    assert fwd["rope_tables"] == fb["rope_tables"] == 10_444_800
    est = price_tight(inputs)
    assert est.retained_bytes is not None and est.retained_bytes >= 10_444_800


def test_gathered_outputs_are_padded_to_the_largest_rank() -> None:
    """``qwen3-1.7b:tp2:cp8:single-32k:full``, busiest rank (7,680 tokens): the simulator's
    `output` component at the forward peak is 385,875,968 bytes = 8 x 7,680 tokens x H
    (the gather buffer, padded to the largest rank) + the 32,768 unpacked logical tokens;
    its `embedding` + `mlp` components (the layer inputs the checkpoints keep and the last
    layer's output) 456,130,560; its `rope` 3,932,160. tight priced the logical count twice
    (268,435,456) and the L layer inputs only (440,401,920)."""
    g = _model("qwen3-1.7b")
    ranks = (7680, 5120, 4096, 4096, 3072, 3584, 3072, 2048)
    layout = ParallelLayout(tp=2, cp=8, sp=True)
    plan = explicit_plan(
        layout,
        logical_tokens=32_768,
        packed_tokens=32_768,
        grad_segments=1,
        rank_tokens=ranks,
        gdn_rank_tokens=ranks,
    )
    inputs = _step(g, plan, recompute="full", step="steady")
    fwd, _ = structural_terms(inputs)
    assert fwd["outputs"] + fwd["gathered_outputs"] == 385_875_968
    assert fwd["retained_activations"] + fwd["layer_transient"] == 456_130_560
    assert fwd["rope_tables"] == 3_932_160
    simulated_peak = 845_938_688
    body = sum(v for k, v in fwd.items() if k not in ("cold_setup", "segment_states"))
    assert simulated_peak <= body <= 1.01 * simulated_peak


def test_selective_mlp_transient_is_the_simulators_no_grad_pass() -> None:
    """A selective ``mlp`` checkpoint's forward runs without gradients: the simulator's
    ``mlp`` component rises from its retained 1,300,234,240 bytes to 2,248,146,944 at the
    forward peak (Qwen3.5-4B, TP1, 8,192 tokens, ``core_attn+mlp``): 57,856 elements per
    token, ``H + 6F`` (the gate-up projection as base + LoRA delta + sum beside the
    checkpoint's residual input). tight prices exactly that as the layer transient, not
    the checkpointed MLP's saved set, ``H + 3F``."""
    g = _model("qwen3.5-4b")
    fwd, _ = structural_terms(_inputs(g, "selective", "core_attn+mlp"))
    sim_rise = (2_248_146_944 - 1_300_234_240) / TOKENS / 2
    assert sim_rise == 57_856
    assert fwd["layer_transient"] / TOKENS / 2 == sim_rise


def test_loss_backward_runs_over_the_returned_outputs_under_cp() -> None:
    """``python -m oracles.rank_sim --model qwen3-1.7b --lengths 16384,16384 --tp 4 --cp 4
    --rank 0 --recompute none``: rank 0 (9,728 tokens) backs the loss through the gathered
    and unpacked outputs; its `backward` component at the forward+backward peak is
    536,871,424 bytes, four bf16 copies of the 32,768 logical outputs (134,217,728 each),
    not of its own 9,728. tight prices the measured driver's fp32 loss
    (``LOSS_BACKWARD_OUTPUTS`` x the returned outputs), which covers it; it priced the
    rank's share (201 MiB), 0.1% under the grid's bar on this row."""
    g = _model("qwen3-1.7b")
    # the two sequences' segments matter only to GDN layers: one segment will do here
    plan = _plan(ParallelLayout(tp=4, cp=4, sp=True), (9728, 6656, 9728, 6656))
    inputs = _step(g, plan, recompute="none", step="steady")
    _, fb = structural_terms(inputs)
    outputs = 32_768 * g.hidden * 2
    assert inputs.outputs == outputs
    assert fb["backward_transient"] == LOSS_BACKWARD_OUTPUTS * outputs
    assert fb["backward_transient"] >= 536_871_424


def test_last_layer_backward_runs_its_ffn_then_its_mixer() -> None:
    """``python -m oracles.rank_sim --model qwen3.5-4b --rank-tokens 8192 --recompute
    selective --modules core_attn+mlp --layers 4``: the `backward` component at the
    forward+backward peak is 989,905,408 bytes, 60,419 elements per token: the last MLP's
    recomputed set beyond its kept input (``H + 3F``), its backward buffers (``3F``) and
    the incoming gradient (``H``) = ``2H + 6F`` = 60,416, plus 3 small. The attention
    mixer's recompute and flash backward come after the MLP's are freed, so tight prices
    the larger of the two phases, not their sum (it summed the modules' recomputes and
    left out the backward buffers)."""
    g = _model("qwen3.5-4b")
    _, fb = structural_terms(_inputs(g, "selective", "core_attn+mlp"))
    sim = 989_905_408 / TOKENS / 2
    assert sim == pytest.approx(60_419, abs=0.5)
    assert 2 * g.hidden + 6 * g.ffn == 60_416
    assert abs(fb["backward_transient"] / TOKENS / 2 - sim) <= 16


# python -m oracles.rank_sim --model M --rank-tokens 8192 --tp T --recompute full --json:
# the `attention` component at the forward peak / 8,192 / 2 (the last attention layer's
# no-grad pass; fewer KV groups than TP ranks, so megatron all-gathers the projection)
ATTENTION_NO_GRAD = [
    ("qwen3.5-4b", 8, 24_320),
    ("qwen3.5-27b", 8, 35_584),
    ("qwen3-next-style-dense", 4, 22_784),
]


@pytest.mark.parametrize(("model", "tp", "sim"), ATTENTION_NO_GRAD)
def test_attention_no_grad_pass_is_the_simulators(model: str, tp: int, sim: int) -> None:
    """The gathered norm output ``H``, then the larger of the LoRA'd projection's three
    copies and the all-gather's two full-width copies beside the local projection:
    exactly the simulator's peak. tight priced the layer's ``common`` and three copies at
    the gather (+3,200 to +5,632 per token)."""
    from cpmem.pricing.kinds.attention import nograd_width

    g = _model(model)
    plan = _plan(ParallelLayout(tp=tp, cp=1, sp=True), (TOKENS,))
    inputs = _step(g, plan, recompute="full", step="steady")
    assert g.kv_groups < tp
    assert nograd_width(g, tight_widths(g, inputs), inputs) == sim


def test_ungated_query_copy_only_where_a_rank_holds_several_groups() -> None:
    """Qwen3-32B-style (8 KV groups) at TP8, ``core_attn``, 4,096 tokens: the simulator's
    attention keeps 80,899,072 bytes per layer (its `attention` component with 4 layers
    less with 2, halved), 9,875.4 elements per token = ``common + (3Q + 3KV)/t`` + the
    softmax statistics: one query group per rank, so the query's reshape is a view and
    no per-group copy. tight prices that plus the measured runtime's ``Q/t``; at TP1
    (8 groups per rank) the copy as well (it priced the copy at every TP)."""
    g = _model("qwen3-32b-style")
    plan = _plan(ParallelLayout(tp=8, cp=1, sp=True), (4096,))
    inputs = _step(g, plan, recompute="selective", modules="core_attn", step="steady")
    sim = 80_899_072 / 4096 / 2
    q_t = g.q_width // 8
    w = tight_widths(g, inputs)
    assert -32 <= w.of("attention") - (sim + q_t) <= 0
    tp1 = tight_widths(g, _inputs(g, "selective", "core_attn"))
    assert tp1.attention_core == (5 * g.q_width + 3 * g.kv_width)


def test_each_cp_rank_is_priced_at_its_own_tokens() -> None:
    """``python -m oracles.rank_sim --model qwen3-1.7b --lengths 16384,16384 --tp 4 --cp 4
    --recompute none``: ranks of 9,728 and 6,656 tokens peak at 10,342,590,976 and
    7,521,551,872 bytes in forward. tight's per-rank figures follow each rank's count (it
    repeated the busiest's for every rank): the busiest's is the estimate, the smaller
    rank's covers its own peak, with the attention-only allowance, and stays below the
    busiest's; the smaller rank keeps its own slot of the K/V buffer padded to the
    largest rank."""
    g = _model("qwen3-1.7b")
    plan = _plan(ParallelLayout(tp=4, cp=4, sp=True), (9728, 6656, 9728, 6656))
    est = price_tight(_step(g, plan, recompute="none", step="steady"))
    sims = (10_342_590_976, 7_521_551_872, 10_342_590_976, 7_521_551_872)
    assert est.per_rank_bytes[0] == est.per_rank_bytes[2] == est.estimate_bytes
    assert est.per_rank_bytes[1] == est.per_rank_bytes[3] < est.estimate_bytes
    for got, sim in zip(est.per_rank_bytes, sims, strict=True):
        assert got >= sim * 1.039  # the attention-only allowance (SIM_WORST_UNDER)
        assert got <= sim * 1.12


def test_the_last_layer_receives_its_own_ranks_rows_under_cp() -> None:
    """``python -m oracles.rank_sim --model qwen3-1.7b --lengths 4096,4096 --shared-prefix
    1228 --cp 2 --recompute selective --modules core_attn+mlp`` lays the 8,192 logical
    tokens (6,964 packed) out as 5,120 + 1,844; the gradient of the last layer's output
    (``GatherTokens``' backward, after the unpacking's) is 5,120 rows of H on rank 0 and
    1,844 on rank 1, not an even 4,096 of the logical outputs; rank 0's `backward`
    component at its forward+backward peak is 503,364,096 bytes. So rank 0's last-layer
    backward is a lone rank's of its own 5,120 tokens, and the same whether or not the
    unpacking repeats a prefix (6,964 logical tokens: none shared)."""
    g = _model("qwen3-1.7b")

    def backward(layout: ParallelLayout, logical: int, ranks: tuple[int, ...], mods: str) -> int:
        plan = explicit_plan(
            layout,
            logical_tokens=logical,
            packed_tokens=min(logical, 6964),
            grad_segments=3,
            rank_tokens=ranks,
        )
        inputs = _step(g, plan, recompute="selective", modules=mods, step="steady")
        return structural_terms(inputs)[1]["backward_transient"]

    cp2 = ParallelLayout(cp=2)
    skewed = (5120, 1844)
    for mods in ("core_attn", "core_attn+mlp"):
        assert backward(cp2, 8192, skewed, mods) == backward(cp2, 6964, skewed, mods)
    mlp_phase = backward(cp2, 8192, skewed, "core_attn+mlp")
    assert mlp_phase == backward(ParallelLayout(cp=1), 5120, (5120,), "core_attn+mlp")
    assert mlp_phase >= 503_364_096
