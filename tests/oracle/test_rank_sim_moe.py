"""Rank simulator MoE layers: routing, the experts' saved set counted by hand, recompute,
input errors, and one measured 35B-A3B cell at full depth."""

from __future__ import annotations

import warnings
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from oracles.rank_sim.__main__ import main  # noqa: E402
from oracles.rank_sim.geometry import SimInputError, SimModel, from_hf_config, get_model  # noqa: E402
from oracles.rank_sim.layout import GdnPiece, RankLayout  # noqa: E402
from oracles.rank_sim.moe import expert_rows  # noqa: E402
from oracles.rank_sim.recompute import Recompute  # noqa: E402
from oracles.rank_sim.runner import simulate_rank  # noqa: E402
from oracles.rank_sim.validation import COLD_BYTES, read_cells, simulate_cell  # noqa: E402

warnings.filterwarnings("ignore")

H, FE, E, TOP_K, EP, TP, LAYERS = 64, 32, 8, 2, 2, 2, 2
SMALL = SimModel(
    "small-moe", H, FE, 2, 2, 32, False, True, ("attention",) * LAYERS, vocab=1000,
    moe=True, num_experts=E, moe_top_k=TOP_K, expert_ffn=FE, shared_expert_ffn=FE,
)  # fmt: skip
TOKENS = 1024  # 512 per rank under SP (TP2): every tensor below is a whole 512-byte block


def _layout(tokens: int = TOKENS, tp: int = TP) -> RankLayout:
    return RankLayout(tp, 1, 0, (tokens,), (tokens,), (GdnPiece(tokens),), tokens, True)


def _run(routing: str, modules: str = "core_attn", compiled: bool = False) -> object:
    rc = Recompute.parse("selective", modules)
    return simulate_rank(SMALL, _layout(), rc, compiled=compiled, ep=EP, routing=routing)


def test_routing_sets_the_rows_the_rank_experts_receive() -> None:
    local = TOKENS // TP
    group_copies = local * EP * TOP_K  # the EP group's routed copies
    # balanced: each expert gets tokens x top-k / experts; the rank holds E / EP experts
    assert expert_rows(SMALL, local, EP, "balanced") == group_copies // E * (E // EP) == 1024
    # concentrated: every routed copy of the group lands on this rank's experts
    assert expert_rows(SMALL, local, EP, "concentrated") == group_copies == 2048
    # top-k above the local experts: at most one copy per token and local expert
    assert expert_rows(replace(SMALL, moe_top_k=6), local, EP, "concentrated") == local * EP * 4
    # 35B-A3B at TP4 EP4 per global token: 8 rows concentrated, 2 balanced (cpmem's rows)
    m = get_model("qwen3.5-35b-a3b")
    assert expert_rows(m, 2550, 4, "concentrated") == 8 * 10200
    assert expert_rows(m, 2550, 4, "balanced") == 64 * -(-2550 * 32 // 256)
    assert _run("balanced").expert_rows == 1024
    assert _run("concentrated").expert_rows == 2048


def _per_row_bytes(compiled: bool) -> int:
    """Bytes the local experts keep for backward per received row, from megatron-core
    0.16's expert MLP read by hand (frozen linears keep no input; a rank-1 LoRA keeps its
    input and its 1-wide activation; bf16 activations, fp32 routing probs)."""
    bf16, fp32 = 2, 4
    fc1_lora = H * bf16 + 1 * bf16  # sorted dispatched rows + rank-1 activation
    fc2_lora = FE * bf16 + 1 * bf16  # the scaled activation + rank-1 activation
    probs = fp32  # the sorted per-row prob, kept by the scaling
    if compiled:  # one fused kernel: its fc1 (gate‖up) input
        act = 2 * FE * bf16
    else:  # silu(x0) * (x1 + 0) then * probs: fc1 output, silu(x0), x1 + 0, the GLU product
        act = 2 * FE * bf16 + FE * bf16 + FE * bf16 + FE * bf16
    return fc1_lora + fc2_lora + probs + act


@pytest.mark.parametrize("compiled", [False, True])
def test_expert_saved_set_matches_a_hand_count(compiled: bool) -> None:
    conc, bal = _run("concentrated", compiled=compiled), _run("balanced", compiled=compiled)
    extra_rows = conc.expert_rows - bal.expert_rows
    expected = LAYERS * extra_rows * _per_row_bytes(compiled)
    assert conc.retained_bytes - bal.retained_bytes == expected


def test_moe_recompute_keeps_no_expert_rows() -> None:
    conc, bal = _run("concentrated", "core_attn+moe"), _run("balanced", "core_attn+moe")
    # only the layer input survives: no routing dependence, less than without recompute
    assert conc.retained_bytes == bal.retained_bytes < _run("balanced").retained_bytes
    # one layer's expert rows come back in backward: the concentrated peak is higher
    assert conc.forward_backward_peak_bytes > bal.forward_backward_peak_bytes


def _sim(model: SimModel, modules: str, routing: str = "concentrated") -> object:
    rc = Recompute.parse("selective", modules)
    return simulate_rank(model, _layout(), rc, ep=EP, routing=routing)


@pytest.mark.parametrize("modules", ["core_attn", "core_attn+moe"])
def test_dispatcher_state_is_kept_per_layer(modules: str) -> None:
    """megatron-core 0.16 ``MoEAlltoAllTokenDispatcher.dispatch_preprocess`` stores
    ``self.probs`` (fp32, tokens x experts), ``self.routing_map`` (bool, tokens x experts)
    and ``self.reversed_local_input_permutation_mapping`` (int64, tokens x top-k) on the
    dispatcher, and nothing clears them: every MoE layer keeps them after its forward,
    also under ``moe`` recompute. Without recompute ``permute``'s ``masked_select`` also
    saves the transposed routing map (bool) and ``index_select`` the same indices."""
    local = TOKENS // TP
    base = _sim(SMALL, modules)
    more_experts = _sim(replace(SMALL, num_experts=2 * E), modules)
    more_k = _sim(replace(SMALL, moe_top_k=2 * TOP_K), modules)
    per_expert = 4 + 1 + (0 if "moe" in modules else 1)  # probs, map (+ transposed map)
    assert more_experts.retained_bytes - base.retained_bytes == LAYERS * local * E * per_expert
    if "moe" in modules:  # the indices: the only top-k-wide tensor left after the forward
        assert more_k.retained_bytes - base.retained_bytes == LAYERS * local * TOP_K * 8


def test_moe_forward_frames_keep_the_routed_rows() -> None:
    """The forward peak of a recomputed MoE layer (no-grad forward, nothing saved) is at
    ``combine_preprocess``'s un-sort: ``MoELayer.forward``'s frame still holds the
    all-to-all output and its probs, ``routed_experts_compute``'s frame the sorted rows,
    their probs and the experts' output, and the un-sorted copy is being written. Per
    extra routed row: four H-wide bf16 rows and two fp32 probs."""
    narrow = replace(SMALL, expert_ffn=8, shared_expert_ffn=8)  # the un-sort is the peak
    conc = _sim(narrow, "core_attn+moe", "concentrated")
    bal = _sim(narrow, "core_attn+moe", "balanced")
    extra = conc.expert_rows - bal.expert_rows
    assert extra == 1024
    assert conc.forward_peak_bytes - bal.forward_peak_bytes == extra * (4 * H * 2 + 2 * 4)


def test_bad_moe_input_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--model", "qwen3.5-35b-a3b", "--rank-tokens", "1024", "--tp", "4", "--layers", "1"]
    for extra, field in (
        (["--ep", "3"], "ep=3"),
        (["--ep", "8"], "ep=8"),  # does not divide the TP x CP world
        (["--ep", "4", "--routing", "even"], "routing="),
    ):
        assert main(base + extra) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"error: {field}") and "\n" not in err, err
    assert main(["--model", "qwen3.5-27b", "--rank-tokens", "1024", "--tp", "4", "--ep", "4"]) == 2
    assert "no experts" in capsys.readouterr().err
    with pytest.raises(SimInputError, match="ep"):
        SMALL.check_ep(3, 2)


def test_hf_moe_config_matches_preset() -> None:
    preset = get_model("Qwen/Qwen3.5-35B-A3B")
    cfg = {
        "text_config": {
            "hidden_size": 2048, "num_hidden_layers": 40, "num_attention_heads": 16,
            "num_key_value_heads": 2, "head_dim": 256, "full_attention_interval": 4,
            "linear_num_key_heads": 16, "linear_key_head_dim": 128,
            "linear_num_value_heads": 32, "linear_value_head_dim": 128,
            "linear_conv_kernel_dim": 4, "vocab_size": 248320, "model_type": "qwen3_5_moe",
            "num_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 512,
            "shared_expert_intermediate_size": 512,
        }
    }  # fmt: skip
    assert replace(from_hf_config(cfg), name=preset.name) == preset


def test_measured_concentrated_cell_at_full_depth() -> None:
    """The 12k-token concentrated TP4 EP4 cell: forward within the 3% target."""
    cells, _ = read_cells()
    cell = next(
        c for c in cells
        if "35B-A3B" in c.cell_id and c.modules == "core_attn" and not c.compiled
        and c.packed == 10200
    )  # fmt: skip
    assert cell.routing == "concentrated" and cell.ep == 4
    r = simulate_cell(cell)
    assert r.expert_rows == 8 * cell.packed
    ratio = (r.forward_peak_bytes + COLD_BYTES) / cell.forward_peak
    assert abs(ratio - 1) <= 0.03, ratio


def test_moe_grid_configurations_are_expressible() -> None:
    """The simulated grid's MoE configurations (kept out of the dense grid) name valid
    EP layouts and routings, with ids of their own."""
    from oracles.sim_grid.grid import grid, moe_grid

    dense = {c.config_id for c in grid()}
    moe = moe_grid()
    assert len({c.config_id for c in moe}) == len(moe) and not dense & {c.config_id for c in moe}
    assert [c.order for c in moe] == list(range(len(dense), len(dense) + len(moe)))
    for c in moe:
        model = get_model(c.model)
        model.check_tp(c.tp)
        model.check_ep(c.ep, c.tp * c.cp)
        assert (
            c.routing in ("balanced", "concentrated") and f":ep{c.ep}:{c.routing}:" in c.config_id
        )
    assert {c.modules for c in moe} >= {"core_attn", "core_attn+moe"}


def test_expert_adapters_train_under_lora() -> None:
    """The routed experts' grouped adapters (moe.py's ``fc1_a`` .. ``fc2_b``) train under
    LoRA like every linear's ``lora_a``/``lora_b``, so adapters on the MLPs alone (no
    attention adapter upstream) still give the backward a graph; the frozen experts'
    weights and the router do not train."""
    from oracles.rank_sim.training import trainable

    for name in ("layers.0.mlp.fc1_a", "layers.1.mlp.fc2_b", "layers.0.mixer.qkv.lora_a"):
        assert trainable(name, full=False), name
    for name in ("layers.0.mlp.fc1_w", "layers.0.mlp.router_w", "layers.0.mlp.sh_gate_w"):
        assert not trainable(name, full=False), name
    rc = Recompute.parse("none", "")
    only_mlp = simulate_rank(SMALL, _layout(), rc, ep=EP, lora_targets="mlp")
    every = simulate_rank(SMALL, _layout(), rc, ep=EP, lora_targets="all")
    assert 0 < only_mlp.forward_backward_peak_bytes < every.forward_backward_peak_bytes
