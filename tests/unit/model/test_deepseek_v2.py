"""DeepSeek-V2 (``deepseek_v2``) read from its config.json: each example's parameters
counted by hand from ``modular_deepseek_v2.py`` (huggingface/transformers at
``cpmem.model.hf_families.SOURCE_COMMITS``), the router and the layers its classes build,
and the fields that describe another model refused by name. Every expected value is
written out here from the classes and the published cards, never computed by cpmem."""

from __future__ import annotations

from typing import Any

import pytest

from cpmem.model.hf_config import load_config
from cpmem.pricing.weights import total_parameters
from tests.unit.model.published import EXAMPLES, example, refused


def test_deepseek_v2_lite_counts_its_plain_query_and_softmax_experts() -> None:
    """DeepSeek-V2-Lite counted from DeepseekV2DecoderLayer: q_proj 2,048 x 16 x 192 (a
    null q_lora_rank: no q_a_layernorm), kv_a_proj_with_mqa 2,048 x (512 + 64),
    kv_a_layernorm 512, kv_b_proj 512 x 16 x (128 + 128), o_proj 16 x 128 x 2,048; two
    norms; layer 0 a dense SwiGLU of 10,944, layers 1-26 64 experts of 3 x 2,048 x 1,408,
    the ungated shared DeepseekV2MLP of 2 x 1,408 and the router's 64 x 2,048 (no bias, no
    correction bias); untied 102,400 x 2,048 embedding and head, the final norm:
    15,706,484,224 (the DeepSeek-V2 paper's and card's 15.7B)."""
    h, heads, vocab = 2048, 16, 102400
    attention = h * heads * 192 + h * 576 + 512 + 512 * heads * 256 + heads * 128 * h
    dense = attention + 2 * h + 3 * h * 10944
    moe = attention + 2 * h + 64 * 3 * h * 1408 + 3 * h * 2 * 1408 + 64 * h
    g = load_config(EXAMPLES / "deepseek-v2-lite" / "config.json")
    assert total_parameters(g) == dense + 26 * moe + 2 * vocab * h + h == 15_706_484_224
    assert g.q_lora_rank == 0 and g.mlps == ("dense",) + ("moe",) * 26
    assert (g.num_experts, g.moe_top_k, g.expert_ffn, g.shared_expert_ffn) == (64, 6, 1408, 2816)
    assert not g.shared_expert_gate and g.mtp_depths == 0


def test_deepseek_v2_5_counts_its_compressed_query() -> None:
    """DeepSeek-V2.5 (DeepSeek-V2's hyper-parameters, the paper's section 3.1.2): q_a_proj
    5,120 x 1,536, q_a_layernorm 1,536, q_b_proj 1,536 x 128 x 192, kv_a 5,120 x 576,
    kv_a_layernorm 512, kv_b 512 x 128 x 256, o 128 x 128 x 5,120; layer 0 dense of
    12,288, 59 layers of 160 experts of 1,536, a shared 2 x 1,536 and the 160 x 5,120
    router: 235,741,434,880 (the paper's 236B)."""
    h, heads, vocab = 5120, 128, 102400
    attention = (
        h * 1536 + 1536 + 1536 * heads * 192 + h * 576 + 512 + 512 * heads * 256 + heads * 128 * h
    )
    dense = attention + 2 * h + 3 * h * 12288
    moe = attention + 2 * h + 160 * 3 * h * 1536 + 3 * h * 2 * 1536 + 160 * h
    g = load_config(EXAMPLES / "deepseek-v2.5" / "config.json")
    assert total_parameters(g) == dense + 59 * moe + 2 * vocab * h + h == 235_741_434_880
    assert g.q_lora_rank == 1536 and g.moe_layers == 59


def test_the_router_is_a_softmax_over_every_expert_never_renormalised() -> None:
    """DeepseekV2Moe.route_tokens_to_experts: softmax over every expert, then the top-k
    (greedy or group-limited), scaled, not renormalised; norm_topk_prob is not read."""
    for name in ("deepseek-v2-lite", "deepseek-v2.5"):
        assert load_config(EXAMPLES / name / "config.json").router_scoring == "softmax_topk"
    cfg = {**example("deepseek-v2-lite"), "norm_topk_prob": True}
    assert load_config(cfg).router_scoring == "softmax_topk"


def test_absent_fields_are_the_config_class_defaults() -> None:
    """DeepseekV2Config: q_lora_rank=1536, n_routed_experts=64, n_shared_experts=2,
    moe_intermediate_size=1407, first_k_dense_replace=0; num_experts_per_tok has no
    default a model is built with, so its absence is named."""
    cfg = example("deepseek-v2-lite")
    for key in (
        "q_lora_rank",
        "n_routed_experts",
        "n_shared_experts",
        "moe_intermediate_size",
        "first_k_dense_replace",
    ):
        cfg.pop(key)
    g = load_config(cfg)
    assert g.q_lora_rank == 1536 and g.mlps == ("moe",) * 27
    assert (g.num_experts, g.expert_ffn, g.shared_expert_ffn) == (64, 1407, 2 * 1407)
    cfg.pop("num_experts_per_tok")
    assert refused(cfg).field == "num_experts_per_tok"


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"moe_layer_freq": 2}, "moe_layer_freq"),  # DeepseekV2DecoderLayer does not read it
        ({"num_nextn_predict_layers": 1}, "num_nextn_predict_layers"),  # DeepSeek-V3's field
        ({"attention_bias": True}, "attention_bias"),  # latent attention's biases
        ({"mlp_bias": True}, "mlp_bias"),
        ({"hidden_act": "gelu_new"}, "hidden_act"),
        ({"layer_types": ["full_attention"] * 27}, "layer_types"),
    ],
)
def test_deepseek_v2_refuses_another_layer_by_name(changes: dict[str, Any], field: str) -> None:
    assert refused({**example("deepseek-v2-lite"), **changes}).field == field
