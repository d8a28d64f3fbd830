"""Rank simulator MoE families (Qwen3-MoE, DeepSeek-V3 / Kimi-K2's MoE side, gpt-oss):
each family's saved set counted by hand from oracles/rank_sim/README.md's accounting,
the dense/MoE layer placement, and the config fields' errors.

Every expected figure below is the README's formula written out; each run is 2 small
layers at 512 local tokens (TP2 SP), sizes chosen so every tensor is whole 512-byte
blocks."""

from __future__ import annotations

import json
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from oracles.rank_sim.geometry import SimInputError, SimModel, from_hf_config, load_config  # noqa: E402
from oracles.rank_sim.layout import GdnPiece, RankLayout  # noqa: E402
from oracles.rank_sim.recompute import Recompute  # noqa: E402
from oracles.rank_sim.runner import RankResult, simulate_rank  # noqa: E402

warnings.filterwarnings("ignore")

CONFIGS = Path(__file__).resolve().parents[2] / "golden" / "simulated" / "configs"
H, FE, E, TOP_K, EP, TP, LAYERS = 64, 32, 8, 2, 2, 2, 2
TOKENS = 1024  # 512 local tokens per layer under SP (TP2)
LOCAL = TOKENS // TP
BF16, FP32, INT64 = 2, 4, 8
# one qwen3_moe-shaped model: q/k norm, ungated attention, no shared expert
QWEN3_MOE = SimModel(
    "small-qwen3-moe", H, 0, 2, 2, 32, False, False, ("attention",) * LAYERS, vocab=1000,
    moe=True, num_experts=E, moe_top_k=TOP_K, expert_ffn=FE, family="qwen3_moe",
)  # fmt: skip


def _run(
    model: SimModel, routing: str = "concentrated", modules: str = "core_attn", **kw: Any
) -> RankResult:
    layout = RankLayout(TP, 1, 0, (TOKENS,), (TOKENS,), (GdnPiece(TOKENS),), TOKENS, True)
    rc = Recompute.parse("selective", modules)
    return simulate_rank(model, layout, rc, ep=EP, routing=routing, **kw)


def _row_bytes(glu_saved_widths: int) -> int:
    """README "MoE": per received row the experts keep the sorted input (H, fc1's LoRA
    input), the fc1 output (2·F_e), what the GLU keeps (``glu_saved_widths`` · F_e),
    the scaled activation (F_e, fc2's LoRA input), two rank-1 activations (bf16) and
    the fp32 prob."""
    return (H + 2 * FE + glu_saved_widths * FE + FE + 2) * BF16 + FP32


def _extra_rows_bytes(model: SimModel, per_row: int, **kw: Any) -> tuple[int, int]:
    conc, bal = _run(model, "concentrated", **kw), _run(model, "balanced", **kw)
    extra = conc.expert_rows - bal.expert_rows
    return conc.retained_bytes - bal.retained_bytes, LAYERS * extra * per_row


# ---------------------------------------------------------------- qwen3_moe


def test_qwen3_moe_config_reads_the_family() -> None:
    m = load_config(CONFIGS / "qwen3-30b-a3b.json")
    assert (m.family, m.hidden, m.layers, m.q_heads, m.kv_groups, m.head_dim) == (
        "qwen3_moe", 2048, 48, 32, 4, 128,
    )  # fmt: skip
    assert (m.num_experts, m.moe_top_k, m.expert_ffn, m.shared_expert_ffn) == (128, 8, 768, 0)
    assert m.mlp_kinds == ("moe",) * 48 and m.dense_ffn == 0
    assert not m.router_pre_softmax and m.qk_norm and not m.gated_attention


def test_qwen3_moe_dense_layers_follow_mlp_only_layers_and_sparse_step() -> None:
    cfg = json.loads((CONFIGS / "qwen3-30b-a3b.json").read_text())
    cfg.update(num_hidden_layers=6, mlp_only_layers=[0], decoder_sparse_step=2)
    m = from_hf_config(cfg)
    # Qwen3MoeDecoderLayer: MoE iff not in mlp_only_layers and (i + 1) % step == 0
    assert m.mlp_kinds == ("dense", "moe", "dense", "moe", "dense", "moe")
    assert m.dense_ffn == 6144


def test_qwen3_moe_experts_keep_the_unfused_glu_per_row() -> None:
    """Eager megatron GLU: silu keeps x0 (a view of the fc1 output), the product keeps
    silu(x0) and x1 + 0, the scaling keeps the GLU output: 3·F_e beyond the fc1 output."""
    got, expected = _extra_rows_bytes(QWEN3_MOE, _row_bytes(3))
    assert got == expected


def test_qwen3_moe_pre_softmax_router_keeps_every_experts_score() -> None:
    """``norm_topk_prob`` false: softmax over all experts, then top-k (megatron's
    ``use_pre_softmax``): the softmax keeps its fp32 tokens x E output where the top-k
    softmax keeps tokens x top-k; the top-k indices are kept either way."""
    pre = _run(replace(QWEN3_MOE, router_pre_softmax=True))
    post = _run(QWEN3_MOE)
    assert pre.retained_bytes - post.retained_bytes == LAYERS * LOCAL * (E - TOP_K) * FP32


def test_dense_and_moe_layers_are_placed_per_layer() -> None:
    model = replace(QWEN3_MOE, mlp_kinds=("dense", "moe"), dense_ffn=FE)
    first = _run(model.truncated(1)).components["retained"]
    both = _run(model).components["retained"]
    assert "mlp" in first and "moe" not in first
    assert "mlp" in both and "moe" in both
    assert _run(replace(model, mlp_kinds=("moe", "dense"))).expert_rows == 2048


# ---------------------------------------------------------------- deepseek_v3 / kimi_k2

DEEPSEEK: dict[str, Any] = {
    "model_type": "deepseek_v3", "hidden_size": 7168, "num_hidden_layers": 61,
    "num_attention_heads": 128, "num_key_value_heads": 128, "intermediate_size": 18432,
    "moe_intermediate_size": 2048, "n_routed_experts": 256, "num_experts_per_tok": 8,
    "n_shared_experts": 1, "first_k_dense_replace": 3, "n_group": 8, "topk_group": 4,
    "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
    "norm_topk_prob": True, "q_lora_rank": 1536, "kv_lora_rank": 512,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 129280,
}  # fmt: skip
# the DeepSeek router on the small model: sigmoid + correction bias, 4 groups keep 2
SIGMOID = replace(
    QWEN3_MOE, family="deepseek_v3", router_score="sigmoid", expert_score_bias=True,
    router_groups=4, router_group_topk=2, routed_scaling=2.5,
)  # fmt: skip


def test_deepseek_config_reads_the_moe_side() -> None:
    m = from_hf_config(DEEPSEEK)
    assert m.mlp_kinds == ("dense",) * 3 + ("moe",) * 58 and m.dense_ffn == 18432
    assert (m.num_experts, m.moe_top_k, m.expert_ffn) == (256, 8, 2048)
    assert m.shared_expert_ffn == 2048 and not m.shared_expert_gated
    assert (m.router_score, m.expert_score_bias, m.router_groups, m.router_group_topk) == (
        "sigmoid", True, 8, 4,
    )  # fmt: skip
    assert m.routed_scaling == 2.5
    kimi = from_hf_config({**DEEPSEEK, "model_type": "kimi_k2", "n_routed_experts": 384,
                           "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1})  # fmt: skip
    assert kimi.mlp_kinds[:2] == ("dense", "moe") and kimi.num_experts == 384


def test_sigmoid_router_keeps_the_scores_and_the_normaliser() -> None:
    """``topk_routing_with_score_function``, sigmoid with ``expert_bias``: the sigmoid
    keeps its fp32 tokens x E output (``gather`` saves the same tensor), top-k runs on
    the biased scores and is discarded (nothing of the group-limited top-k is kept), the
    normalising division keeps the gathered top-k scores and their fp32 sum (tokens x
    1); the scaling keeps nothing. The softmax-after-top-k router keeps its fp32 top-k
    output. Both keep the top-k indices."""
    sig, soft = _run(SIGMOID), _run(QWEN3_MOE)
    assert sig.retained_bytes - soft.retained_bytes == LAYERS * LOCAL * (E + 1) * FP32
    plain = _run(replace(SIGMOID, router_groups=0, router_group_topk=0, routed_scaling=0.0))
    assert plain.retained_bytes == sig.retained_bytes


def test_deepseek_shared_expert_is_ungated() -> None:
    """The Qwen3.5-MoE gate ``out * sigmoid(linear(x))`` keeps the shared expert's
    output (H per local token, bf16) and the gate score (1 per local token, bf16); the
    DeepSeek shared experts (``n_shared_experts`` x ``moe_intermediate_size``) add
    their output to the routed one, keeping neither."""
    shared = replace(SIGMOID, shared_expert_ffn=FE, shared_expert_gated=False)
    gated = replace(shared, shared_expert_gated=True)
    diff = _run(gated).retained_bytes - _run(shared).retained_bytes
    assert diff == LAYERS * LOCAL * (H + 1) * BF16


def test_first_k_dense_replace_places_the_dense_layers() -> None:
    cfg = {**DEEPSEEK, "num_hidden_layers": 4, "first_k_dense_replace": 1}
    assert from_hf_config(cfg).mlp_kinds == ("dense", "moe", "moe", "moe")
    model = replace(SIGMOID, mlp_kinds=("dense", "moe"), dense_ffn=FE)
    assert "moe" not in _run(model.truncated(1)).components["retained"]


# ---------------------------------------------------------------- gpt_oss

GPT_OSS = replace(
    QWEN3_MOE, family="gpt_oss", expert_bias=True, expert_activation="clamped_swiglu",
    swiglu_limit=7.0, attention_bias=True, attention_sinks=True, qk_norm=False,
    windows=(128, 0),
)  # fmt: skip


def test_gpt_oss_config_reads_the_family() -> None:
    m = load_config(CONFIGS / "gpt-oss-20b.json")
    assert (m.hidden, m.layers, m.q_heads, m.kv_groups, m.head_dim) == (2880, 24, 64, 8, 64)
    assert (m.num_experts, m.moe_top_k, m.expert_ffn, m.shared_expert_ffn) == (32, 4, 2880, 0)
    assert m.windows == (128, 0) * 12 and m.kinds == ("attention",) * 24
    assert m.mlp_kinds == ("moe",) * 24
    assert (m.expert_activation, m.swiglu_limit, m.expert_bias) == ("clamped_swiglu", 7.0, True)
    assert m.attention_bias and m.attention_sinks and not m.qk_norm


def test_gpt_oss_experts_keep_the_clamped_glu_per_row() -> None:
    """megatron's unfused GLU with clamps: both clamps keep their input (a view of the
    fc1 output), the compiled quick_gelu keeps the clamped gate, the product keeps
    quick_gelu's output and up + 1, the scaling the GLU output: 4·F_e beyond the fc1
    output; the fc2 bias keeps nothing. Compiled: inductor keeps the fc1 output only."""
    got, expected = _extra_rows_bytes(GPT_OSS, _row_bytes(4))
    assert got == expected
    got, expected = _extra_rows_bytes(GPT_OSS, _row_bytes(0), compiled=True)
    assert got == expected  # fc1 output, scaled activation, input, prob, rank-1s


def test_gpt_oss_fc2_bias_is_a_forward_transient() -> None:
    """``TEGroupedMLP._apply_bias``: per received row the fp32 pieces ``t + b * p`` and
    their fp32 concatenation (4·H bytes each) live next to the bf16 fc2 output, where
    without a bias the peak row set is the un-sort's four bf16 copies; with the MoE
    recomputed (nothing saved) and a narrow F_e both layers' peaks are there:
    (2H + 2H + 2H + 4H + 4H) - 4·2H = 6H bytes more per received row."""
    narrow = replace(GPT_OSS, expert_ffn=8)
    bias = _run(narrow, modules="core_attn+moe")
    plain = _run(replace(narrow, expert_bias=False), modules="core_attn+moe")
    assert bias.retained_bytes == plain.retained_bytes
    assert bias.forward_peak_bytes - plain.forward_peak_bytes == bias.expert_rows * 6 * H


def test_gpt_oss_attention_bias_and_sinks_keep_nothing_more() -> None:
    """The frozen q/k/v and output biases are added in place of the projection outputs
    (the sum replaces them) and the sinks change no saved tensor of the flash kernel; only
    the q/k norms' saved tensors go: per attention layer the fp32 rstd of every query and
    key head (each SP-gathered token; the query reshape is a view at one group per
    partition)."""
    plain = replace(GPT_OSS, attention_bias=False, attention_sinks=False)
    assert _run(GPT_OSS).retained_bytes == _run(plain).retained_bytes
    normed = _run(replace(plain, qk_norm=True)).retained_bytes
    heads = (2 + 2) // TP  # local query + key heads
    assert normed - _run(plain).retained_bytes == LAYERS * TOKENS * heads * FP32


def test_sink_gradient_is_allocated_in_backward() -> None:
    from oracles.rank_sim.gpt_oss_kernels import AttentionSinks

    out = torch.empty(4, 3, 8, requires_grad=True)
    sinks = torch.empty(3, requires_grad=True)
    y = AttentionSinks.apply(out, sinks)
    assert y.data_ptr() == out.data_ptr()
    y.sum().backward()
    assert sinks.grad is not None and sinks.grad.shape == (3,) and sinks.grad.dtype == torch.float32


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"model_type": "mixtral"}, "config.model_type"),
        ({"n_group": 3}, "config.n_group"),
        ({"topk_group": 3}, "config.topk_group"),
        ({"first_k_dense_replace": 99}, "config.first_k_dense_replace"),
        ({"moe_intermediate_size": None}, "config.moe_intermediate_size"),
        ({"num_experts_per_tok": 300}, "config.num_experts_per_tok"),
        ({"scoring_func": "relu"}, "config.scoring_func"),
    ],
)
def test_deepseek_errors_name_the_field(change: dict[str, Any], field: str) -> None:
    with pytest.raises(SimInputError) as err:
        from_hf_config({**DEEPSEEK, **change})
    assert err.value.field == field and "\n" not in str(err.value)


def test_a_latent_attention_config_without_experts_is_dense() -> None:
    """As cpmem reads it: no ``n_routed_experts``, every layer's MLP dense."""
    dense = from_hf_config({**DEEPSEEK, "n_routed_experts": None})
    assert not dense.moe and dense.ffn == DEEPSEEK["intermediate_size"]


def test_other_families_errors_name_the_field() -> None:
    oss = json.loads((CONFIGS / "gpt-oss-20b.json").read_text())
    qwen = json.loads((CONFIGS / "qwen3-30b-a3b.json").read_text())
    cases = [
        ({**oss, "num_local_experts": None}, "config.num_local_experts"),
        ({**oss, "sliding_window": None}, "config.sliding_window"),
        ({**oss, "layer_types": ["chunked_attention"] * 24}, "config.layer_types"),
        ({**qwen, "mlp_only_layers": [48]}, "config.mlp_only_layers"),
        ({**qwen, "moe_intermediate_size": None}, "config.moe_intermediate_size"),
        ({**qwen, "mlp_only_layers": [0], "intermediate_size": None}, "config.intermediate_size"),
    ]
    for cfg, field in cases:
        with pytest.raises(SimInputError) as err:
            from_hf_config(cfg)
        assert err.value.field == field, (field, err.value)
    with pytest.raises(SimInputError, match=r"supported: .*qwen3_moe.*gpt_oss.*deepseek_v3"):
        from_hf_config({**qwen, "model_type": "mixtral"})
