"""Each family's layer as transformers builds it: the q/k norm, the biases, the gated
output and the defaults read from a config are the modeling and configuration classes'
(huggingface/transformers, ``src/transformers/models/<family>/``, at the commits of
``cpmem.model.hf_families.SOURCE_COMMITS``). Every expected value below is what the named
class does, written out here, never computed by cpmem."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cpmem.errors import ConfigError
from cpmem.model.hf_config import load_config
from cpmem.model.hf_fields import FAMILIES
from cpmem.pricing.weights import total_parameters

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"

DENSE = {
    "hidden_size": 1024,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "intermediate_size": 2048,
    "vocab_size": 32000,
}
HYBRID = {
    **DENSE,
    "head_dim": 128,
    "layer_types": ["linear_attention"] * 3 + ["full_attention"],
    "linear_num_key_heads": 4,
    "linear_key_head_dim": 64,
    "linear_num_value_heads": 8,
    "linear_value_head_dim": 64,
    "linear_conv_kernel_dim": 4,
}
QWEN_EXPERTS = {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 512}
MLA = {
    **DENSE,
    "q_lora_rank": 256,
    "kv_lora_rank": 128,
    "qk_rope_head_dim": 32,
    "qk_nope_head_dim": 64,
    "v_head_dim": 64,
}


NEMOTRON_H = {
    "hidden_size": 1024,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "hybrid_override_pattern": "M-M*E",
    "intermediate_size": 2048,
    "mamba_num_heads": 32,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 512,
    "moe_shared_expert_intermediate_size": 1024,
    "vocab_size": 32000,
}


def _config(family: str) -> dict[str, Any]:
    if family in ("qwen3_5", "qwen3_5_text", "qwen3_next"):
        return {**HYBRID, "model_type": family}
    if family in ("qwen3_5_moe", "qwen3_5_moe_text"):
        return {**HYBRID, **QWEN_EXPERTS, "model_type": family}
    if family in ("qwen3_moe", "qwen2_moe"):
        return {**DENSE, **QWEN_EXPERTS, "model_type": family}
    if family == "olmoe":
        return {**DENSE, "num_experts": 8, "num_experts_per_tok": 2, "model_type": family}
    if family == "gpt_oss":
        return {**DENSE, "num_local_experts": 8, "num_experts_per_tok": 2, "model_type": family}
    if family in ("deepseek_v3", "kimi_k2"):
        return {**MLA, "model_type": family}
    if family == "deepseek_v2":
        return {**MLA, "num_experts_per_tok": 2, "model_type": family}
    if family == "nemotron_h":
        return {**NEMOTRON_H, "model_type": family}
    return {**DENSE, "model_type": family}


# (qk_norm, attention_bias, mlp_bias, gated output, sandwich norms, tied by default), each
# as the named class builds it with its config's defaults
PUBLISHED = {
    # LlamaAttention: q/k/v/o Linear(bias=config.attention_bias), no q_norm/k_norm;
    # LlamaMLP: bias=config.mlp_bias; LlamaConfig: attention_bias, mlp_bias,
    # tie_word_embeddings all False
    "llama": (False, False, False, False, False, False),
    # MistralAttention: q/k/v/o Linear(bias=False), no q/k norm; MistralMLP bias=False;
    # MistralConfig: tie_word_embeddings=False
    "mistral": (False, False, False, False, False, False),
    # Qwen2Attention: q/k/v Linear(bias=True), o Linear(bias=False), no q/k norm
    "qwen2": (False, True, False, False, False, False),
    # Qwen3Attention: q_norm, k_norm = Qwen3RMSNorm(head_dim); Qwen3Config attention_bias=False
    "qwen3": (True, False, False, False, False, False),
    # Qwen3MoeAttention: q_norm, k_norm
    "qwen3_moe": (True, False, False, False, False, False),
    # Qwen3NextAttention / Qwen3_5Attention: q_norm, k_norm, the q projection's second half
    # gating the output (attn_output * sigmoid(gate))
    "qwen3_next": (True, False, False, True, False, False),
    "qwen3_5": (True, False, False, True, False, False),
    "qwen3_5_text": (True, False, False, True, False, False),
    "qwen3_5_moe": (True, False, False, True, False, False),
    "qwen3_5_moe_text": (True, False, False, True, False, False),
    # Gemma2Attention: no q/k norm; Gemma2DecoderLayer: post_attention_layernorm,
    # pre/post_feedforward_layernorm; Gemma2Config tie_word_embeddings=True
    "gemma2": (False, False, False, False, True, True),
    # Gemma3Attention: q_norm, k_norm = Gemma3RMSNorm(head_dim); Gemma3TextConfig tie=True
    "gemma3_text": (True, False, False, False, True, True),
    # GptOssAttention: no q/k norm, bias=config.attention_bias (GptOssConfig: True);
    # GptOssExperts: gate_up_proj_bias, down_proj_bias
    "gpt_oss": (False, True, True, False, False, False),
    # DeepseekV3Attention: q_a_layernorm, kv_a_layernorm on the compressed query and KV,
    # no per-head q/k norm; attention_bias=False
    "deepseek_v3": (False, False, False, False, False, False),
    "kimi_k2": (False, False, False, False, False, False),
    # DeepseekV2Attention: the same compressed-query and KV norms, bias=config.attention_bias
    # (DeepseekV2Config: False); DeepseekV2MLP (LlamaMLP's) bias=config.mlp_bias (False);
    # tie_word_embeddings=False
    "deepseek_v2": (False, False, False, False, False, False),
    # Ernie4_5Attention (LlamaAttention's): q/k/v/o bias=config.use_bias (Ernie4_5Config:
    # False), no q/k norm; Ernie4_5MLP bias=config.use_bias; tie_word_embeddings=True
    "ernie4_5": (False, False, False, False, False, True),
    # NemotronHAttention (Jamba's): q/k/v/o Linear(bias=config.attention_bias), no q/k
    # norm; NemotronHMLP: bias=config.mlp_bias (NemotronHConfig: False, and the experts
    # have none); NemotronHConfig tie_word_embeddings=False
    "nemotron_h": (False, False, False, False, False, False),
    # Phi3Attention: one qkv_proj and o_proj, bias=False, no q/k norm; Phi3MLP's
    # gate_up_proj bias=False; Phi3Config tie_word_embeddings=False
    "phi3": (False, False, False, False, False, False),
    # MixtralAttention (MistralAttention's): bias=False, no q/k norm; MixtralConfig
    # tie_word_embeddings=False
    "mixtral": (False, False, False, False, False, False),
    # Glm4MoeAttention: q/k/v bias=config.attention_bias (Glm4MoeConfig: False), q_norm /
    # k_norm only under use_qk_norm (False); Glm4MoeMLP bias=False; tie_word_embeddings=False
    "glm4_moe": (False, False, False, False, False, False),
    # Olmo2Attention: q_norm / k_norm over the whole projection, bias=config.attention_bias
    # (False); Olmo2MLP bias=False; Olmo2DecoderLayer: post_attention_layernorm and
    # post_feedforward_layernorm on the outputs; Olmo2Config tie_word_embeddings=False
    "olmo2": (True, False, False, False, True, False),
    "olmo3": (True, False, False, False, True, False),
    # Qwen2MoeAttention: q/k/v bias=config.qkv_bias (Qwen2MoeConfig: True), o bias=False,
    # no q/k norm; Qwen2MoeMLP bias=False; tie_word_embeddings=False
    "qwen2_moe": (False, True, False, False, False, False),
    # OlmoeAttention: q_norm / k_norm over the projections, bias=config.attention_bias
    # (False); OlmoeMLP (GemmaMLP's) bias=False; LlamaDecoderLayer's pre-norms only
    "olmoe": (True, False, False, False, False, False),
    # GemmaAttention (LlamaAttention's): bias=config.attention_bias (False), no q/k norm;
    # GemmaMLP bias=False; GemmaConfig tie_word_embeddings=True
    "gemma": (False, False, False, False, False, True),
    # Starcoder2Attention: q/k/v/o bias=config.use_bias (True); Starcoder2MLP c_fc / c_proj
    # bias=config.use_bias; Starcoder2Config tie_word_embeddings=True
    "starcoder2": (False, True, True, False, False, True),
}


def test_every_family_is_held_to_its_published_layer() -> None:
    assert set(PUBLISHED) == set(FAMILIES)


@pytest.mark.parametrize("family", sorted(PUBLISHED))
def test_the_family_layer_is_the_published_one(family: str) -> None:
    g = load_config(_config(family))
    built = (
        g.qk_norm,
        g.attention_bias,
        g.mlp_bias,
        g.attention_output_gate,
        g.sandwich_norms,
        g.tied_embeddings,
    )
    assert built == PUBLISHED[family]


def test_gpt_oss_router_and_sinks() -> None:
    """GptOssTopKRouter: weight and bias; GptOssAttention: one sink logit per head."""
    g = load_config(_config("gpt_oss"))
    assert g.router_bias and g.attention_sinks
    other = load_config(_config("qwen3_moe"))
    assert not other.router_bias and not other.attention_sinks


@pytest.mark.parametrize("family", ["deepseek_v3", "kimi_k2", "deepseek_v2"])
def test_latent_attention_shared_experts_are_ungated(family: str) -> None:
    """DeepseekV3MoE adds its shared experts' output ungated (Qwen's shared expert has a
    sigmoid gate)."""
    cfg = {**_config(family), "n_routed_experts": 8, "num_experts_per_tok": 2}
    cfg.update(moe_intermediate_size=256, n_shared_experts=1, first_k_dense_replace=1)
    assert not load_config(cfg).shared_expert_gate


@pytest.mark.parametrize(
    ("family", "value"), [("llama", True), ("gemma2", True), ("gemma", True), ("olmoe", True)]
)
def test_attention_bias_is_read_where_the_class_reads_it(family: str, value: bool) -> None:
    assert load_config({**_config(family), "attention_bias": value}).attention_bias is value


def test_llama_mlp_bias_is_read() -> None:
    assert load_config({**_config("llama"), "mlp_bias": True}).mlp_bias


@pytest.mark.parametrize("family", ["qwen2", "mistral", "qwen2_moe", "starcoder2"])
def test_attention_bias_is_refused_where_the_class_fixes_it(family: str) -> None:
    """Qwen2Attention's biases (q/k/v, no o) and MistralAttention's (none) do not follow
    the field, nor do Qwen2MoeAttention's (``qkv_bias``) and Starcoder2Attention's
    (``use_bias``): a config that sets it describes another model."""
    with pytest.raises(ConfigError) as err:
        load_config({**_config(family), "attention_bias": False})
    assert err.value.field == "attention_bias"


@pytest.mark.parametrize("family", ["qwen3_next", "qwen3_5"])
def test_the_hybrids_gate_is_not_a_switch(family: str) -> None:
    assert load_config({**_config(family), "attn_output_gate": True}).attention_output_gate
    with pytest.raises(ConfigError) as err:
        load_config({**_config(family), "attn_output_gate": False})
    assert err.value.field == "attn_output_gate"


# head_dim where a config omits it: Qwen3Config head_dim=128, Gemma2Config/Gemma3TextConfig
# head_dim=256, GptOssConfig head_dim=64, Qwen3NextConfig/Qwen3_5TextConfig head_dim=256;
# LlamaAttention/MistralConfig/Qwen2Attention: hidden_size // num_attention_heads
# GemmaConfig head_dim=256; Qwen2MoeAttention / Starcoder2Attention: hidden // heads;
# Ernie4_5Config head_dim=128 (here hidden // heads as well)
HEAD_DIM = {
    "qwen3": 128,
    "gemma2": 256,
    "gemma3_text": 256,
    "gpt_oss": 64,
    "llama": 128,
    "gemma": 256,
    "qwen2_moe": 128,
    "starcoder2": 128,
    "ernie4_5": 128,
}


@pytest.mark.parametrize("family", sorted(HEAD_DIM))
def test_an_absent_head_dim_is_the_config_class_default(family: str) -> None:
    cfg = _config(family)
    cfg.pop("head_dim", None)
    assert load_config(cfg).head_dim == HEAD_DIM[family]


def test_gemma_activation_defaults_to_its_config_class() -> None:
    """Gemma2Config / Gemma3TextConfig: hidden_activation="gelu_pytorch_tanh"; an
    unsupported one is still named."""
    cfg = {**_config("gemma2"), "hidden_activation": "relu"}
    with pytest.raises(ConfigError) as err:
        load_config(cfg)
    assert err.value.field == "hidden_activation"
    assert load_config(_config("gemma2")).sandwich_norms


# sliding windows where a config omits the field: MistralConfig sliding_window=4096 on
# every layer; GptOssConfig sliding_window=128 on the even layers (layer_types' default);
# Qwen2Config/Qwen3Config: only under use_sliding_window, from max_window_layers=28 on
@pytest.mark.parametrize(
    ("family", "extra", "windows"),
    [
        ("mistral", {}, (4096,) * 4),
        ("mistral", {"sliding_window": None}, ()),
        ("gpt_oss", {}, (128, 0, 128, 0)),
        # Olmo3Config: sliding_window=4096, layer_types' default three sliding of four
        ("olmo3", {}, (4096, 4096, 4096, 0)),
        # MixtralConfig / Phi3Config: sliding_window=None; when set, on every layer
        ("mixtral", {}, ()),
        ("mixtral", {"sliding_window": 2048}, (2048,) * 4),
        ("phi3", {}, ()),
        ("phi3", {"sliding_window": 2047}, (2047,) * 4),
        ("olmo2", {"sliding_window": 4096}, "sliding_window"),  # not an Olmo2Config field
        ("olmoe", {"sliding_window": 4096}, "sliding_window"),  # nor an OlmoeConfig one
        ("gemma", {"sliding_window": 4096}, "sliding_window"),  # nor a GemmaConfig one
        # Starcoder2Config: sliding_window=None; when set, on every layer
        ("starcoder2", {}, ()),
        ("starcoder2", {"sliding_window": 4096}, (4096,) * 4),
        # Qwen2MoeConfig: sliding_window 4096 read only under use_sliding_window
        ("qwen2_moe", {"sliding_window": 4096}, ()),
        ("qwen2_moe", {"use_sliding_window": True}, "use_sliding_window"),
        ("qwen2_moe", {"layer_types": ["sliding_attention"] * 4}, "layer_types"),
        ("qwen2", {"sliding_window": 4096}, ()),
        ("qwen2", {"use_sliding_window": True, "max_window_layers": 2}, (0, 0, 4096, 4096)),
        ("qwen3", {"use_sliding_window": True}, ()),  # 4 layers, all below layer 28
        (
            "qwen3",
            {"layer_types": ["sliding_attention"] * 4, "sliding_window": 512},
            (),  # Qwen3Config: sliding_window is None without use_sliding_window
        ),
    ],
)
def test_windows_follow_the_config_class(
    family: str, extra: dict[str, Any], windows: tuple[int, ...] | str
) -> None:
    if isinstance(windows, str):  # the field refused, named
        with pytest.raises(ConfigError) as err:
            load_config({**_config(family), **extra})
        assert err.value.field == windows
        return
    assert load_config({**_config(family), **extra}).windows == windows


def test_llama_3_1_8b_parameters_are_the_published_count() -> None:
    """meta-llama/Llama-3.1-8B holds 8,030,261,248 parameters (its safetensors index;
    the model card's 8.03B): no q/k norm weights (8,192 more with them)."""
    g = load_config(EXAMPLES / "llama-3.1-8b-style" / "config.json")
    assert total_parameters(g) == 8_030_261_248


QWEN2_5_7B = {
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151643,
    "hidden_act": "silu",
    "hidden_size": 3584,
    "initializer_range": 0.02,
    "intermediate_size": 18944,
    "max_position_embeddings": 131072,
    "max_window_layers": 28,
    "model_type": "qwen2",
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 131072,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.43.1",
    "use_cache": True,
    "use_mrope": False,
    "use_sliding_window": False,
    "vocab_size": 152064,
}
"""Qwen/Qwen2.5-7B's published config.json, written out from memory."""


def test_qwen2_5_published_config_prices_with_its_biases() -> None:
    """Qwen2.5-7B: 7,615,616,512 parameters (its safetensors index; the model card's
    7.61B), the q/k/v biases included. ``cpmem.pricing.weights`` counts an output bias
    with them (``ModelGeometry.attention_bias``), H = 3,584 a layer that Qwen2Attention
    does not hold: 28 x 3,584 over the published count."""
    g = load_config(QWEN2_5_7B)
    assert g.attention_bias and not g.qk_norm and g.windows == ()
    assert total_parameters(g) - 7_615_616_512 == 28 * 3584
    with pytest.raises(ConfigError) as err:
        load_config({**QWEN2_5_7B, "use_mrope": True})
    assert err.value.field == "use_mrope"


def test_the_examples_are_read_as_published() -> None:
    """Every example config reads; its family's layer is the published one."""
    for path in sorted(EXAMPLES.glob("*/config.json")):
        raw = json.loads(path.read_text())
        family = raw.get("text_config", raw).get("model_type")
        g = load_config(path)
        assert g.qk_norm is PUBLISHED[family][0], path


def test_olmo2_counts_its_post_norms_and_projection_wide_qk_norms() -> None:
    """OLMo-2-1124-7B counted by hand from Olmo2DecoderLayer: per layer q/k/v/o 4 x
    4,096^2, the MLP 3 x 4,096 x 11,008, the post-attention and post-feedforward norms
    (4,096 each, no input norms) and q_norm / k_norm over the whole projection (32 x 128
    and 32 x 128); 32 layers, untied 100,352 x 4,096 embedding and head, the final norm."""
    h, f, layers, vocab = 4096, 11008, 32, 100352
    layer = 4 * h * h + 3 * h * f + 2 * h + (32 * 128 + 32 * 128)
    g = load_config(EXAMPLES / "olmo-2-7b" / "config.json")
    assert total_parameters(g) == layers * layer + 2 * vocab * h + h == 7_298_617_344


def test_phi4_counts_its_fused_projections_as_their_parts() -> None:
    """phi-4 counted by hand from Phi3DecoderLayer: qkv_proj 5,120 x (40 + 2 x 10) x 128,
    o_proj 5,120^2, gate_up_proj 5,120 x 2 x 17,920, down_proj, two norms; 40 layers,
    untied 100,352 x 5,120 embedding and head, the final norm."""
    h, f, layers, vocab = 5120, 17920, 40, 100352
    layer = h * (40 + 2 * 10) * 128 + h * h + 3 * h * f + 2 * h
    g = load_config(EXAMPLES / "phi-4" / "config.json")
    assert total_parameters(g) == layers * layer + 2 * vocab * h + h == 14_659_507_200


def test_a_post_norm_layer_needs_its_post_norms_and_plain_attention() -> None:
    from dataclasses import replace

    from cpmem.api import describe_step
    from cpmem.errors import InputError

    g = load_config(EXAMPLES / "olmo-2-7b" / "config.json")
    for bad, field in (
        ({"sandwich_norms": False}, "pre_norms"),  # neither pre- nor post-norms
        ({"qk_norm": False}, "qk_norm_projection"),  # a projection-wide norm of nothing
    ):
        with pytest.raises(InputError) as err:
            replace(g, **bad)
        assert err.value.field == field
    with pytest.raises(InputError) as err:  # a TP shard cannot normalise the projection
        describe_step(g, [4096], tp=2)
    assert err.value.field == "tp"
    describe_step(g, [4096], tp=1, cp=2)
