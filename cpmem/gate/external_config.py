"""A geometry as a Hugging Face style ``config.json`` dict, in its family's field names:
the ``config`` of every external estimator's description (``cpmem.gate.external``,
docs/external-estimators.md). ``cpmem.model.hf_config.load_config`` reads each back to
the same geometry (tests/golden/test_external.py holds this for every preset), so it
carries every field cpmem prices with, the checkpoint's ``quantization_config`` where it
is quantized, and none a family's reader refuses (``cpmem.model.hf_fields.READ``).
"""

from __future__ import annotations

from typing import Any

from cpmem.model.geometry import ModelGeometry
from cpmem.model.hf_fields import READ
from cpmem.model.quantization import quantization_config

__all__ = ["FAMILY_EXPORTS", "hf_config"]


def hf_config(geometry: ModelGeometry) -> dict[str, Any]:
    """A Hugging Face style ``config.json`` dict for ``geometry``, with the checkpoint's
    ``quantization_config`` where it is quantized.

    ``cpmem.model.hf_config.load_config`` reads it back to the same geometry (a test
    holds this), so it carries every field cpmem prices with.
    """
    g = geometry
    cfg = _family_config(g) if g.family in FAMILY_EXPORTS else _qwen_config(g)
    if g.quantization is not None:
        cfg["quantization_config"] = quantization_config(g.quantization)
    return cfg


def _qwen_config(g: ModelGeometry) -> dict[str, Any]:
    """The config of a geometry of the measured families, as a Qwen3 / Qwen3.5 config."""
    family = ("qwen3_5_moe" if g.is_moe else "qwen3_5") if g.is_hybrid or g.is_moe else "qwen3"
    cfg: dict[str, Any] = {
        "_name_or_path": g.aliases[0] if g.aliases else g.name,
        "model_type": family,
        "hidden_size": g.hidden,
        "num_hidden_layers": g.layers,
        "num_attention_heads": g.q_heads,
        "num_key_value_heads": g.kv_groups,
        "head_dim": g.head_dim,
        "layer_types": ["linear_attention" if m == "gdn" else "full_attention" for m in g.mixers],
        "vocab_size": g.vocab,
        "tie_word_embeddings": g.tied_embeddings,
        "hidden_act": "silu",
        "torch_dtype": "bfloat16",
    }
    if g.ffn:
        cfg["intermediate_size"] = g.ffn
    if family != "qwen3":
        cfg["attn_output_gate"] = g.attention_output_gate
    if g.gdn_layers:
        cfg.update(
            linear_num_key_heads=g.gdn_key_heads,
            linear_key_head_dim=g.gdn_key_dim,
            linear_num_value_heads=g.gdn_value_heads,
            linear_value_head_dim=g.gdn_value_dim,
            linear_conv_kernel_dim=g.gdn_conv_kernel,
        )
    if g.is_moe:
        cfg.update(_qwen_experts(g), shared_expert_intermediate_size=g.shared_expert_ffn)
    if g.activation_clamp is not None:
        cfg["swiglu_limit"] = g.activation_clamp
    max_positions = getattr(g, "max_position_embeddings", None)  # recorded by newer presets
    if max_positions is not None:
        cfg["max_position_embeddings"] = max_positions
    if g.mtp_depths:  # Qwen3.5's one MTP module of mtp_num_hidden_layers layers
        cfg["mtp_num_hidden_layers"] = len(g.mtp_mixers)
    return cfg


def _qwen_experts(g: ModelGeometry) -> dict[str, Any]:
    """The Qwen families' expert fields: the routed experts and which layers are dense."""
    return {
        "num_experts": g.num_experts,
        "num_experts_per_tok": g.moe_top_k,
        "moe_intermediate_size": g.expert_ffn,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [i for i, m in enumerate(g.mlps) if m == "dense"],
    }


FAMILY_EXPORTS = (
    "qwen3_moe",
    "gpt_oss",
    "gemma2",
    "gemma3_text",
    "deepseek_v3",
    "kimi_k2",
    "nemotron_h",
    "phi3",
    "mixtral",
    "glm4_moe",
    "olmo2",
    "olmo3",
)

NEMOTRON_SYMBOLS = {
    ("mamba", "none"): "M",
    ("attention", "none"): "*",
    ("none", "dense"): "-",
    ("none", "moe"): "E",
}
"""Nemotron-H's pattern symbol of each layer (``cpmem.model.hf_nemotron``)."""


def _nemotron_config(g: ModelGeometry) -> dict[str, Any]:
    """A ``nemotron_h`` geometry's config in its family's field names."""
    cfg: dict[str, Any] = {
        "_name_or_path": g.aliases[0] if g.aliases else g.name,
        "model_type": "nemotron_h",
        "hidden_size": g.hidden,
        "hybrid_override_pattern": "".join(
            NEMOTRON_SYMBOLS[p] for p in zip(g.mixers, g.mlps, strict=True)
        ),
        "num_attention_heads": g.q_heads,
        "num_key_value_heads": g.kv_groups,
        "head_dim": g.head_dim,
        "vocab_size": g.vocab,
        "tie_word_embeddings": g.tied_embeddings,
        "attention_bias": g.attention_bias,
        "mlp_hidden_act": "relu2",
    }
    if g.ffn:
        cfg["intermediate_size"] = g.ffn
    if g.max_position_embeddings is not None:
        cfg["max_position_embeddings"] = g.max_position_embeddings
    if "mamba" in g.all_mixers:
        cfg.update(
            mamba_num_heads=g.mamba_heads,
            mamba_head_dim=g.mamba_head_dim,
            ssm_state_size=g.mamba_state_dim,
            n_groups=g.mamba_groups,
            conv_kernel=g.mamba_conv_kernel,
            chunk_size=g.mamba_chunk,
        )
    if g.is_moe or "moe" in g.mtp_mlps:
        cfg.update(
            n_routed_experts=g.num_experts,
            num_experts_per_tok=g.moe_top_k,
            moe_intermediate_size=g.expert_ffn,
            moe_shared_expert_intermediate_size=g.shared_expert_ffn,
        )
    if g.mtp_depths:
        cfg["num_nextn_predict_layers"] = g.mtp_depths
        cfg["mtp_hybrid_override_pattern"] = "".join(
            NEMOTRON_SYMBOLS[p] for p in zip(g.mtp_mixers, g.mtp_mlps, strict=True)
        )
    return cfg


def _family_config(g: ModelGeometry) -> dict[str, Any]:
    """The config of a geometry of a family read by name (``g.family``), in that family's
    field names: what ``load_config`` reads back to the same geometry."""
    if g.family == "nemotron_h":
        return _nemotron_config(g)
    mla = g.family in ("deepseek_v3", "kimi_k2")
    gemma = g.family in ("gemma2", "gemma3_text")
    cfg: dict[str, Any] = {
        "_name_or_path": g.aliases[0] if g.aliases else g.name,
        "model_type": g.family,
        "hidden_size": g.hidden,
        "num_hidden_layers": g.layers,
        "num_attention_heads": g.q_heads,
        "num_key_value_heads": g.kv_groups,
        "vocab_size": g.vocab,
        "tie_word_embeddings": g.tied_embeddings,
    }
    read = READ[g.family]
    if "attention_bias" in read:  # not where the attention class fixes its biases
        cfg["attention_bias"] = g.attention_bias
    if not mla:
        cfg["head_dim"] = g.head_dim
    if g.max_position_embeddings is not None:
        cfg["max_position_embeddings"] = g.max_position_embeddings
    if g.ffn:
        cfg["intermediate_size"] = g.ffn
    if g.windowed:  # layer_types where the family reads it, else every layer slides
        cfg["sliding_window"] = max(g.windows)
        if "layer_types" in read:
            cfg["layer_types"] = ["sliding_attention" if w else "full_attention" for w in g.windows]
    if gemma:
        cfg["hidden_activation"] = "gelu_pytorch_tanh"
        cfg["final_logit_softcapping"] = g.final_logit_softcap
    if g.family == "qwen3_moe":
        cfg.update(_qwen_experts(g), norm_topk_prob=g.router_scoring == "topk_softmax")
    if g.family in ("gpt_oss", "mixtral"):
        cfg.update(
            num_local_experts=g.num_experts,
            num_experts_per_tok=g.moe_top_k,
            intermediate_size=g.expert_ffn,
        )
        if g.activation_clamp is not None:
            cfg["swiglu_limit"] = g.activation_clamp
    if g.family == "glm4_moe":
        cfg.update(_nextn_experts(g), use_qk_norm=g.qk_norm)
    if mla:
        cfg.update(
            q_lora_rank=g.q_lora_rank or None,
            kv_lora_rank=g.kv_lora_rank,
            qk_rope_head_dim=g.qk_rope_head_dim,
            qk_nope_head_dim=g.qk_nope_head_dim,
            v_head_dim=g.v_head_dim,
        )
        cfg.update(_nextn_experts(g))
    return cfg


def _nextn_experts(g: ModelGeometry) -> dict[str, Any]:
    """DeepSeek-V3's expert fields (GLM-4.5's too) and its MTP depths, where it has them."""
    cfg: dict[str, Any] = {}
    if g.is_moe:
        cfg.update(
            n_routed_experts=g.num_experts,
            num_experts_per_tok=g.moe_top_k,
            moe_intermediate_size=g.expert_ffn,
            n_shared_experts=g.shared_expert_ffn // g.expert_ffn,
            first_k_dense_replace=g.mlps.index("moe"),
        )
    if g.mtp_depths:
        cfg["num_nextn_predict_layers"] = g.mtp_depths
    return cfg
