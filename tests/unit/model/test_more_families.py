"""Qwen2-MoE, OLMoE, Gemma 1 and StarCoder 2 read from their config.json: each example's
parameters counted by hand from the modeling classes (huggingface/transformers at
``cpmem.model.hf_families.SOURCE_COMMITS``), the layer each class builds, and the fields
that describe something else refused by name. Every expected value is written out here
from the class, never computed by cpmem."""

from __future__ import annotations

from typing import Any

import pytest

from cpmem.api import describe_step
from cpmem.errors import InputError
from cpmem.model.hf_config import load_config
from cpmem.pricing.weights import total_parameters
from tests.unit.model.published import EXAMPLES, example, refused


def test_qwen1_5_moe_counts_its_shared_expert_and_gate() -> None:
    """Qwen1.5-MoE-A2.7B counted from Qwen2MoeDecoderLayer: q/k/v/o 4 x 2,048^2 with
    q/k/v biases (3 x 2,048), 60 experts of 3 x 2,048 x 1,408, the router's 60 x 2,048, the
    shared expert 3 x 2,048 x 5,632 and its gate Linear(2,048, 1), two norms; 24 layers,
    untied 151,936 x 2,048 embedding and head, the final norm: 14,315,784,192 (its card's
    "14.3B in total"). cpmem prices an output bias with the q/k/v ones
    (``ModelGeometry.attention_bias``): 2,048 a layer over the model, as for Qwen2."""
    h, layers, vocab = 2048, 24, 151936
    layer = 4 * h * h + 3 * h + 60 * 3 * h * 1408 + 60 * h + 3 * h * 5632 + h + 2 * h
    published = layers * layer + 2 * vocab * h + h
    assert published == 14_315_784_192
    g = load_config(EXAMPLES / "qwen1.5-moe-a2.7b" / "config.json")
    assert total_parameters(g) - published == layers * h
    assert g.shared_expert_ffn == 5632 and g.shared_expert_gate and g.moe_layers == 24
    assert g.router_scoring == "softmax_topk" and g.windows == ()


def test_qwen2_moe_defaults_layers_and_router_follow_its_config_class() -> None:
    """Qwen2MoeConfig's defaults (60 experts, top-4, 1,408, a 5,632 shared expert);
    Qwen2MoeDecoderLayer's dense layers (mlp_only_layers, decoder_sparse_step, num_experts
    0); norm_topk_prob renormalises the top-k; qkv_bias false drops the biases."""
    cfg = example("qwen1.5-moe-a2.7b")
    for key in ("num_experts", "num_experts_per_tok", "moe_intermediate_size"):
        cfg.pop(key)
    cfg.pop("shared_expert_intermediate_size")
    g = load_config(cfg)
    assert (g.num_experts, g.moe_top_k, g.expert_ffn, g.shared_expert_ffn) == (60, 4, 1408, 5632)
    cfg = {**example("qwen1.5-moe-a2.7b"), "mlp_only_layers": [0], "decoder_sparse_step": 2}
    assert load_config(cfg).mlps[:4] == ("dense", "moe", "dense", "moe")
    cfg = {**example("qwen1.5-moe-a2.7b"), "num_experts": 0}
    assert load_config(cfg).mlps == ("dense",) * 24
    cfg = {**example("qwen1.5-moe-a2.7b"), "norm_topk_prob": True, "qkv_bias": False}
    g = load_config(cfg)
    assert g.router_scoring == "topk_softmax" and not g.attention_bias


def test_olmoe_counts_its_projection_wide_qk_norms() -> None:
    """OLMoE-1B-7B counted from OlmoeDecoderLayer: q/k/v/o 4 x 2,048^2, q_norm
    RMSNorm(2,048) and k_norm RMSNorm(2,048 / 16 x 16), 64 experts of 3 x 2,048 x 1,024,
    the router's 64 x 2,048, the input and post-attention norms; 16 layers, untied 50,304 x
    2,048 embedding and head, the final norm: 6,919,161,856 (its model page's 6.92B)."""
    h, layers, vocab = 2048, 16, 50304
    layer = 4 * h * h + 2 * h + 64 * 3 * h * 1024 + 64 * h + 2 * h
    g = load_config(EXAMPLES / "olmoe-1b-7b" / "config.json")
    assert total_parameters(g) == layers * layer + 2 * vocab * h + h == 6_919_161_856
    assert g.qk_norm_projection and g.pre_norms and not g.sandwich_norms
    assert (g.num_experts, g.moe_top_k, g.expert_ffn, g.shared_expert_ffn) == (64, 8, 1024, 0)


def test_olmoe_refuses_what_it_does_not_price() -> None:
    """A TP shard cannot normalise the whole projection; clip_qkv's in-place clamps keep
    masks; a head width OlmoeAttention's q norm does not span is no model it builds."""
    g = load_config(EXAMPLES / "olmoe-1b-7b" / "config.json")
    with pytest.raises(InputError) as err:
        describe_step(g, [4096], tp=2)
    assert err.value.field == "tp"
    describe_step(g, [4096], tp=1, ep=8)
    assert refused({**example("olmoe-1b-7b"), "clip_qkv": 8.0}).field == "clip_qkv"
    assert refused({**example("olmoe-1b-7b"), "head_dim": 64}).field == "head_dim"


def test_gemma_7b_counts_as_the_report_states() -> None:
    """Gemma 7B: the Gemma report's 786,432,000 embedding (256,000 x 3,072, tied) and
    7,751,248,896 non-embedding parameters; by hand from GemmaDecoderLayer: q/k/v 3 x 3,072
    x 16 x 256, o 16 x 256 x 3,072, the GeGLU 3 x 3,072 x 24,576, two norms, 28 layers and
    the final norm."""
    h, f, layers = 3072, 24576, 28
    layer = 4 * h * 16 * 256 + 3 * h * f + 2 * h
    assert layers * layer + h == 7_751_248_896
    g = load_config(EXAMPLES / "gemma-7b" / "config.json")
    assert total_parameters(g) == 7_751_248_896 + 786_432_000
    assert g.tied_embeddings and g.head_dim == 256 and not g.sandwich_norms and not g.qk_norm


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"hidden_act": "relu"}, "hidden_act"),  # GemmaMLP runs ACT2FN[hidden_act]
        ({"hidden_activation": "relu"}, "hidden_activation"),
        ({"use_bidirectional_attention": True}, "use_bidirectional_attention"),
        ({"final_logit_softcapping": 30.0}, "final_logit_softcapping"),  # Gemma 2's field
    ],
)
def test_gemma_refuses_another_layer_by_name(changes: dict[str, Any], field: str) -> None:
    assert refused({**example("gemma-7b"), **changes}).field == field


def test_starcoder2_7b_counts_its_layernorms_and_biases() -> None:
    """StarCoder2-7B counted from Starcoder2DecoderLayer: q 4,608^2, k and v 4,608 x 4 x
    128, o 4,608^2, each with its bias; c_fc 4,608 x 18,432 and c_proj back, with biases;
    two LayerNorms of weight and bias; 32 layers, the final LayerNorm, the tied 49,152 x
    4,608 embedding: 7,173,923,840 (bigcode/starcoder2-7b's model page: 7.17B)."""
    h, f, kv, layers, vocab = 4608, 18432, 4 * 128, 32, 49152
    attention = 2 * (h * h + h) + 2 * (h * kv + kv)
    mlp = h * f + f + f * h + h
    layer = attention + mlp + 2 * 2 * h
    g = load_config(EXAMPLES / "starcoder2-7b" / "config.json")
    assert total_parameters(g) == layers * layer + 2 * h + vocab * h == 7_173_923_840
    assert g.norm == "layernorm" and not g.gated_mlp and g.windows == (4096,) * 32
    g = load_config({**example("starcoder2-7b"), "use_bias": False})
    assert not g.attention_bias and not g.mlp_bias


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"residual_dropout": 0.1}, "residual_dropout"),
        ({"embedding_dropout": 0.1}, "embedding_dropout"),
        ({"attention_dropout": 0.1}, "attention_dropout"),
        ({"mlp_type": "moe"}, "mlp_type"),
        ({"norm_type": "rms_norm"}, "norm_type"),
        ({"hidden_act": "silu"}, "hidden_act"),  # a plain MLP: GeLU priced
        ({"attention_bias": True}, "attention_bias"),  # use_bias is the field
    ],
)
def test_starcoder2_refuses_what_it_does_not_price(changes: dict[str, Any], field: str) -> None:
    assert refused({**example("starcoder2-7b"), **changes}).field == field
