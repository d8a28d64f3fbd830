"""Which fields of a Hugging Face ``config.json`` cpmem reads, per family, and which it
may pass over because they change no memory cpmem prices.

A config is read only when every field in it is accounted for: read by its family's
reader (``cpmem.model.hf_config``), or named here as changing nothing cpmem prices (with
the reason), or fine at the value it has (``HARMLESS_AT``). Any other field is refused by
name (``check_fields``): it may change memory in a way cpmem does not model (a vision
tower, quantised weights, attention dropout, an MoE field on a dense family), and a
silent wrong number is worse than a refusal.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cpmem.errors import ConfigError

COMMON = frozenset(
    {
        "model_type",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "intermediate_size",
        "vocab_size",
        "tie_word_embeddings",
        "max_position_embeddings",
        "hidden_act",
        "layer_types",
        "text_config",
        "attention_bias",
    }
)
"""Read for every family (``layer_types`` where the family has one)."""

_SLIDING = frozenset({"sliding_window", "use_sliding_window", "max_window_layers"})
_QWEN_MOE = frozenset(
    {
        "num_experts",
        "num_experts_per_tok",
        "moe_intermediate_size",
        "shared_expert_intermediate_size",
        "decoder_sparse_step",
        "mlp_only_layers",
    }
)
_HYBRID = frozenset(
    {
        "attn_output_gate",
        "full_attention_interval",
        "linear_num_key_heads",
        "linear_key_head_dim",
        "linear_num_value_heads",
        "linear_value_head_dim",
        "linear_conv_kernel_dim",
        "swiglu_limit",
        "activation_clamp",
    }
)
_MLA_MOE = frozenset(
    {
        "q_lora_rank",
        "kv_lora_rank",
        "qk_rope_head_dim",
        "qk_nope_head_dim",
        "v_head_dim",
        "n_routed_experts",
        "num_experts_per_tok",
        "moe_intermediate_size",
        "n_shared_experts",
        "first_k_dense_replace",
        "moe_layer_freq",
    }
)

READ: dict[str, frozenset[str]] = {
    "qwen3": COMMON | _SLIDING,
    "qwen2": COMMON | _SLIDING,
    "llama": COMMON | {"attention_bias", "mlp_bias"},
    "mistral": COMMON | {"sliding_window"},
    "qwen3_moe": COMMON | _SLIDING | _QWEN_MOE | {"norm_topk_prob"},
    "qwen3_5": COMMON | _HYBRID | _QWEN_MOE,
    "qwen3_5_text": COMMON | _HYBRID | _QWEN_MOE,
    "qwen3_5_moe": COMMON | _HYBRID | _QWEN_MOE,
    "qwen3_5_moe_text": COMMON | _HYBRID | _QWEN_MOE,
    "qwen3_next": COMMON | _HYBRID | _QWEN_MOE,
    "gpt_oss": COMMON
    | {"num_local_experts", "num_experts_per_tok", "sliding_window", "swiglu_limit"},
    "gemma2": COMMON
    | {"sliding_window", "hidden_activation", "final_logit_softcapping"}
    | {"attn_logit_softcapping"},
    "gemma3_text": COMMON
    | {"sliding_window", "sliding_window_pattern", "hidden_activation"}
    | {"final_logit_softcapping", "attn_logit_softcapping"},
    "deepseek_v3": COMMON | _MLA_MOE,
    "kimi_k2": COMMON | _MLA_MOE,
}
"""Per ``model_type``: the fields its reader reads. Gemma 3's multimodal wrapper
(``gemma3``) is read through its ``text_config`` only when no vision tower is given."""

FAMILIES = tuple(sorted(READ))

IGNORED: dict[str, str] = {
    **dict.fromkeys(
        (
            "architectures",
            "transformers_version",
            "_name_or_path",
            "auto_map",
            "bos_token_id",
            "eos_token_id",
            "pad_token_id",
            "sep_token_id",
            "decoder_start_token_id",
            "tokenizer_class",
            "id2label",
            "label2id",
            "problem_type",
            "prefix",
            "task_specific_params",
            "finetuning_task",
        ),
        "identifies the checkpoint or its tokenizer",
    ),
    **dict.fromkeys(
        (
            "initializer_range",
            "rms_norm_eps",
            "layer_norm_eps",
            "rope_theta",
            "rope_scaling",
            "rope_parameters",
            "rope_local_base_freq",
            "query_pre_attn_scalar",
            "norm_topk_prob",
            "routed_scaling_factor",
            "n_group",
            "topk_group",
            "topk_method",
            "scoring_func",
            "router_aux_loss_coef",
            "aux_loss_alpha",
            "seq_aux",
            "router_jitter_noise",
            "attention_multiplier",
            "final_logit_softcapping_enabled",
        ),
        "a numeric constant or routing rule: changes values, not the shapes kept",
    ),
    **dict.fromkeys(
        (
            "use_cache",
            "cache_implementation",
            "output_router_logits",
            "output_attentions",
            "output_hidden_states",
            "return_dict",
            "torchscript",
            "use_bfloat16",
            "is_encoder_decoder",
            "is_decoder",
            "add_cross_attention",
            "tie_encoder_decoder",
            "pruned_heads",
            "chunk_size_feed_forward",
            "pretraining_tp",
            "ep_size",
            "_attn_implementation_autoset",
        ),
        "a generation or loading switch: a training step runs the same layers",
    ),
    **dict.fromkeys(
        ("mtp_num_hidden_layers", "num_nextn_predict_layers"),
        "multi-token-prediction layers: Hugging Face's model does not build them",
    ),
    "partial_rotary_factor": "narrower rope tables: cpmem prices head_dim-wide ones (an upper bound)",
    "attention_dropout": "0 is the only value accepted (HARMLESS_AT)",
    "experts_per_token": "gpt-oss's copy of num_experts_per_tok, which is read",
    "initial_context_length": "gpt-oss's rope context before scaling",
    **dict.fromkeys(
        ("torch_dtype", "dtype"),
        "the dtype the checkpoint is stored in; the step's dtype is the runtime's (bf16)",
    ),
}
"""Fields that change nothing cpmem prices, with the reason. The value checks of
``HARMLESS_AT`` apply on top."""

HARMLESS_AT: dict[str, tuple[tuple[Any, ...], str]] = {
    "attention_dropout": ((0, 0.0, None), "attention dropout keeps a mask cpmem does not price"),
}
"""Fields accepted only at the listed values; any other value is refused with the reason."""

REFUSED: dict[str, str] = {
    "vision_config": "a vision tower: its weights and activations are not priced; pass the "
    "language model's text_config alone",
    "audio_config": "an audio tower: not priced",
    "quantization_config": "quantised weights: cpmem prices bf16 weights",
}
"""Fields refused whatever their value, with the reason."""


def check_fields(
    text: Mapping[str, Any], family: str, outer: Mapping[str, Any] | None = None
) -> None:
    """Raise ConfigError naming the first field of ``text`` (and of the ``outer`` wrapper
    of a nested ``text_config``) that ``family`` does not read and that is not known to
    change nothing cpmem prices; a field of ``REFUSED`` is named before any other."""
    read = READ[family]
    dicts = [d for d in (outer, text) if d is not None]
    for fields in dicts:
        for key in sorted(fields):
            if key in REFUSED:
                raise ConfigError(key, "...", REFUSED[key])
    for fields in dicts:
        for key in sorted(fields):
            if key in HARMLESS_AT:
                allowed, why = HARMLESS_AT[key]
                if fields[key] not in allowed:
                    raise ConfigError(key, fields[key], why)
            elif key not in read and key not in IGNORED:
                raise ConfigError(
                    key,
                    fields[key],
                    f"a field cpmem does not read for model_type {family!r} and cannot "
                    "tell changes no memory; remove it if it does not apply, or ask for "
                    "it to be priced",
                )
