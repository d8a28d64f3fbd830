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
        "quantization_config",
    }
)
"""Read for every family but Mistral, whose ``MistralModel`` ignores ``layer_types``
(``MistralConfig`` warns of it); ``layer_types`` where the family has one."""

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

_NEMOTRON_H = frozenset(
    {
        "hybrid_override_pattern",
        "layers_block_type",
        "attention_head_dim",
        "mamba_num_heads",
        "mamba_head_dim",
        "ssm_state_size",
        "n_groups",
        "conv_kernel",
        "chunk_size",
        "mlp_hidden_act",
        "n_routed_experts",
        "num_experts_per_tok",
        "moe_intermediate_size",
        "moe_shared_expert_intermediate_size",
        "num_nextn_predict_layers",
        "mtp_layers_block_type",
        "mtp_hybrid_override_pattern",
    }
)

_GLM4_MOE = frozenset(
    {
        "n_routed_experts",
        "num_experts_per_tok",
        "moe_intermediate_size",
        "n_shared_experts",
        "first_k_dense_replace",
        "use_qk_norm",
        "num_nextn_predict_layers",
    }
)

_BIAS = frozenset({"attention_bias"})
_NO_LAYER_TYPES = COMMON - {"layer_types"}
READ: dict[str, frozenset[str]] = {
    "qwen3": COMMON | _BIAS | _SLIDING,
    "qwen2": COMMON | _SLIDING,
    "llama": COMMON | _BIAS | {"mlp_bias"},
    "mistral": (COMMON - {"layer_types"}) | {"sliding_window"},
    "qwen3_moe": COMMON | _BIAS | _SLIDING | _QWEN_MOE | {"norm_topk_prob"},
    "qwen3_5": COMMON | _BIAS | _HYBRID | _QWEN_MOE | {"mtp_num_hidden_layers"},
    "qwen3_5_text": COMMON | _BIAS | _HYBRID | _QWEN_MOE | {"mtp_num_hidden_layers"},
    "qwen3_5_moe": COMMON | _BIAS | _HYBRID | _QWEN_MOE | {"mtp_num_hidden_layers"},
    "qwen3_5_moe_text": COMMON | _BIAS | _HYBRID | _QWEN_MOE | {"mtp_num_hidden_layers"},
    "qwen3_next": COMMON | _BIAS | _HYBRID | _QWEN_MOE | {"mtp_num_hidden_layers"},
    "gpt_oss": COMMON
    | _BIAS
    | {"num_local_experts", "num_experts_per_tok", "sliding_window", "swiglu_limit"},
    "gemma2": COMMON
    | _BIAS
    | {"sliding_window", "hidden_activation", "final_logit_softcapping"}
    | {"attn_logit_softcapping"},
    "gemma3_text": COMMON
    | _BIAS
    | {"sliding_window", "sliding_window_pattern", "hidden_activation"}
    | {"final_logit_softcapping", "attn_logit_softcapping"},
    "deepseek_v3": COMMON | _BIAS | _MLA_MOE | {"num_nextn_predict_layers"},
    "kimi_k2": COMMON | _BIAS | _MLA_MOE | {"num_nextn_predict_layers"},
    "nemotron_h": (COMMON - {"hidden_act"}) | _BIAS | _NEMOTRON_H,
    "phi3": _NO_LAYER_TYPES | {"sliding_window"},
    "mixtral": _NO_LAYER_TYPES | {"sliding_window", "num_local_experts", "num_experts_per_tok"},
    "glm4_moe": _NO_LAYER_TYPES | _BIAS | _GLM4_MOE,
    "olmo2": _NO_LAYER_TYPES | _BIAS,
    "olmo3": COMMON | _BIAS | {"sliding_window"},
    "qwen2_moe": COMMON | {"qkv_bias"} | _SLIDING | _QWEN_MOE | {"norm_topk_prob"},
    "olmoe": (_NO_LAYER_TYPES - {"head_dim"})
    | _BIAS
    | {"num_experts", "num_experts_per_tok", "norm_topk_prob"},
    "gemma": _NO_LAYER_TYPES | _BIAS | {"hidden_activation"},
    "starcoder2": _NO_LAYER_TYPES | {"use_bias", "sliding_window"},
    "deepseek_v2": _NO_LAYER_TYPES | _BIAS | (_MLA_MOE - {"moe_layer_freq"}),
    "ernie4_5": _NO_LAYER_TYPES | {"use_bias"},
}
"""Per ``model_type``: the fields its reader reads. ``attention_bias`` is not read for
Qwen2, Mistral and Mixtral, whose attention classes fix their biases
(``cpmem.model.hf_families``): a config that sets it is refused rather than priced as
something the model is not (Phi-3's is accepted at false, ``FAMILY_HARMLESS_AT``).
``layer_types`` is read only where the family's model reads it (not Mistral, Mixtral,
Phi-3, GLM-4.5, OLMo 2, OLMoE, Gemma 1, StarCoder 2, DeepSeek-V2 or ERNIE 4.5, whose
configuration classes have no such field). Qwen2-MoE's biases are read from ``qkv_bias``,
StarCoder 2's and ERNIE 4.5's from ``use_bias`` (their attention classes' fields), and OLMoE's ``head_dim`` is not read: ``OlmoeAttention``'s
q norm is ``hidden_size`` wide, so a head width other than ``hidden_size / heads`` is
refused by name rather than priced as a model transformers cannot build."""

OUTER_READ = frozenset(
    {
        "model_type",
        "text_config",
        "tie_word_embeddings",
        "vocab_size",
        "max_position_embeddings",
        "quantization_config",
    }
)
"""The fields of the wrapper around a nested ``text_config`` that are read: its model type,
the text config, the three a text config may leave to its wrapper, and the checkpoint's
quantization (``cpmem.model.quantization``)."""

_HYBRIDS = ("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_next")
_NO_WINDOW = "the family's attention has no sliding window (every layer attends fully)"
FAMILY_HARMLESS_AT: dict[str, dict[str, tuple[tuple[Any, ...], str]]] = {
    "qwen2": {
        "use_mrope": (
            (False,),
            "Qwen2 rotates by one position per token; the multimodal rope (Qwen2-VL's "
            "three position streams) is not what Qwen2Attention runs",
        )
    },
    **{
        family: {
            "use_sliding_window": ((False,), _NO_WINDOW),
            "sliding_window": ((None,), _NO_WINDOW),
            "attn_output_gate": (
                (True,),
                "the family's attention always gates its output (Qwen3NextAttention, "
                "Qwen3_5Attention: a 2 x heads x head_dim query projection); "
                "attn_output_gate is not a field its model reads",
            ),
            "mamba_ssm_dtype": (
                ("float32",),
                "the dtype an inference server keeps the Gated DeltaNet state cache in "
                "(vLLM's mamba_ssm_cache_dtype); a training step keeps no cache; the "
                "published value is float32",
            ),
            "mtp_use_dedicated_embeddings": (
                (False,),
                "an MTP module with an embedding of its own is not priced (the published "
                "value is false: it reads the model's)",
            ),
        }
        for family in _HYBRIDS
    },
    "phi3": {
        "attention_bias": (
            (False,),
            "Phi3Attention's qkv_proj and o_proj carry no bias whatever the config says",
        ),
        **dict.fromkeys(
            ("resid_pdrop", "embd_pdrop"),
            ((0, 0.0), "a residual or embedding dropout keeps a mask cpmem does not price"),
        ),
    },
    "mixtral": {
        "router_jitter_noise": (
            (0, 0.0),
            "MixtralSparseMoeBlock multiplies the router input by a random tensor in "
            "training (kept for backward), which cpmem does not price",
        ),
    },
    "qwen2_moe": {
        "use_sliding_window": (
            (False,),
            "Qwen2MoeConfig's sliding layers (every other layer below max_window_layers) "
            "are not priced; the published Qwen1.5-MoE and Qwen2-MoE configs set false",
        ),
    },
    "olmoe": {
        "clip_qkv": (
            (None,),
            "OlmoeAttention clamps the normalised query, key and value in place, which "
            "keeps masks for backward cpmem does not price",
        ),
    },
    "gemma": {
        "use_bidirectional_attention": (
            (False,),
            "GemmaAttention attends bidirectionally when set (an embedding model); cpmem "
            "prices the causal language model",
        ),
    },
    "starcoder2": {
        **dict.fromkeys(
            ("residual_dropout", "embedding_dropout"),
            (
                (0, 0.0),
                "a residual or embedding dropout keeps a mask cpmem does not price from a "
                "config (Starcoder2Attention, Starcoder2MLP, Starcoder2Model)",
            ),
        ),
        "mlp_type": (
            ("default",),
            "a field Starcoder2Config does not define (the original checkpoints carry it); "
            "Starcoder2MLP is the plain c_fc / c_proj MLP cpmem prices",
        ),
        "norm_type": (
            ("layer_norm",),
            "a field Starcoder2Config does not define (the original checkpoints carry it); "
            "Starcoder2DecoderLayer builds nn.LayerNorm, which cpmem prices",
        ),
    },
    "deepseek_v2": {
        "moe_layer_freq": (
            (1,),
            "DeepseekV2DecoderLayer builds the MoE block in every layer from "
            "first_k_dense_replace on and does not read moe_layer_freq (the published "
            "DeepSeek-V2 configs set 1)",
        ),
    },
    "nemotron_h": {
        "mamba_ssm_cache_dtype": (
            ("float32",),
            "the dtype an inference server keeps the Mamba state cache in; a training step "
            "keeps no cache; the published value is float32",
        ),
        "mamba_hidden_act": (("silu",), "the Mamba-2 mixer's activation priced is silu"),
        "use_conv_bias": ((True,), "the Mamba-2 causal convolution priced carries its bias"),
        "use_bias": ((False,), "the Mamba-2 projections' biases are not priced"),
        "mamba_proj_bias": ((False,), "the Mamba-2 projections' biases are not priced"),
        "mlp_bias": ((False,), "the MLPs' biases are not priced (the experts never have one)"),
        "residual_in_fp32": ((False,), "a residual stream kept in fp32 is not priced"),
        "hidden_dropout": ((0, 0.0), "hidden-state dropout keeps a mask cpmem does not price"),
        "sliding_window": ((None,), _NO_WINDOW),
        "moe_latent_size": (
            (None,),
            "latent MoE projections (fc1_latent_proj, fc2_latent_proj and experts of the "
            "latent width: Nemotron 3 Super) are not priced",
        ),
        "n_shared_experts": (
            (1,),
            "NemotronHMoE builds one shared expert of moe_shared_expert_intermediate_size",
        ),
    },
}
"""Per ``model_type``: fields its model does not read, accepted only at the values that
describe the model it builds (Qwen2.5's published ``use_mrope: false``; Qwen3-Next's and
Qwen3.5's ``use_sliding_window: false``, ``sliding_window: null`` and
``attn_output_gate: true``). Checked before ``READ``, so a field read elsewhere (the
hybrids' ``sliding_window``) is held to these values here."""

WRAPPER_IGNORED: dict[str, dict[str, str]] = {
    "gemma3": dict.fromkeys(
        ("boi_token_index", "eoi_token_index", "image_token_index", "mm_tokens_per_image"),
        "the image tokens' ids and count: a text-only step holds no image token",
    ),
    **{
        wrapper: dict.fromkeys(
            ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id"),
            "the image and video tokens' ids: a text-only step holds none",
        )
        for wrapper in ("qwen3_5", "qwen3_5_moe")
    },
}
"""Per multimodal wrapper: the fields of its outer config that change nothing cpmem prices.
Its ``vision_config`` is read by ``cpmem.model.vision`` (named as not priced)."""

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
            "original_max_position_embeddings",
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
        ("expand", "use_mamba_kernels", "rescale_prenorm_residual", "num_logits_to_keep"),
        "Nemotron-H's Mamba width is mamba_num_heads x mamba_head_dim (NemotronHMamba2Mixer "
        "does not read expand for it); a kernel switch, an initialisation rule, a "
        "generation setting",
    ),
    **dict.fromkeys(
        (
            "time_step_min",
            "time_step_max",
            "time_step_floor",
            "time_step_limit",
            "norm_eps",
            "layer_norm_epsilon",
            "norm_epsilon",
        ),
        "a numeric constant: the Mamba-2 step's initialisation and limits, a norm's epsilon",
    ),
    "moe_shared_expert_overlap": "whether Megatron-LM runs the shared expert beside the "
    "token dispatch (a stream choice); Hugging Face's model does not read it",
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
    "vision_config": "a vision tower outside a multimodal wrapper cpmem reads "
    "(cpmem.model.hf_families.WRAPPERS): not priced",
    "audio_config": "an audio tower: not priced",
}
"""Fields refused whatever their value, with the reason."""


def _check(fields: Mapping[str, Any], accepted: frozenset[str], family: str) -> None:
    harmless = FAMILY_HARMLESS_AT.get(family, {})
    for key in sorted(fields):
        rule = harmless.get(key) or HARMLESS_AT.get(key)
        if rule is not None:
            allowed, why = rule
            if fields[key] not in allowed or isinstance(fields[key], bool) != isinstance(
                allowed[0], bool
            ):
                raise ConfigError(key, fields[key], why)
        elif key not in accepted and key not in IGNORED:
            raise ConfigError(
                key,
                fields[key],
                f"a field cpmem does not read for model_type {family!r} and cannot "
                "tell changes no memory; remove it if it does not apply, or ask for "
                "it to be priced",
            )


def check_fields(
    text: Mapping[str, Any],
    family: str,
    outer: Mapping[str, Any] | None = None,
    wrapper: str | None = None,
) -> None:
    """Raise ConfigError naming the first field of ``text`` (and of the ``outer`` config
    around a nested ``text_config``, a multimodal ``wrapper`` where it names one) that is
    not read and not known to change nothing cpmem prices; a field of ``REFUSED`` is named
    before any other (a wrapper's ``vision_config`` is read, not refused)."""
    vision = "vision_config" if wrapper in WRAPPER_IGNORED else ""
    for fields in (outer, text):
        for key in sorted(fields or {}):
            if key in REFUSED and not (fields is outer and key == vision):
                raise ConfigError(key, "...", REFUSED[key])
    if outer is not None:
        wrapped = frozenset(WRAPPER_IGNORED.get(wrapper or "", {}))
        _check(outer, OUTER_READ | wrapped | {vision}, family)
    _check(text, READ[family], family)
