"""Geometry from a Hugging Face ``config.json`` (a path or an already-parsed dict).

Families (``cpmem.model.hf_fields.FAMILIES``): dense ``qwen3``, ``qwen2``, ``llama``,
``mistral``, ``phi3``, ``ernie4_5``, ``gemma`` and ``starcoder2`` (LayerNorm, a plain GeLU
MLP, biases);
the post-norm ``olmo2`` / ``olmo3``; the hybrids ``qwen3_5`` /
``qwen3_5_moe`` (text config nested under ``text_config`` or not) and ``qwen3_next``; the
MoE ``qwen3_moe``, ``qwen2_moe`` (a sigmoid-gated shared expert), ``olmoe``, ``mixtral``,
``gpt_oss`` and ``glm4_moe`` (DeepSeek-V3's experts under
plain attention, with its MTP layer); ``gemma2`` and ``gemma3_text``; and multi-head latent
attention with DeepSeek-V3's experts, ``deepseek_v3`` / ``kimi_k2``, and with
DeepSeek-V2's (a softmax router), ``deepseek_v2``. Any other
``model_type`` is refused, with or without ``layer_types`` (the surveyed ones whose layers
cpmem's kinds do not express with the reason, ``hf_families.UNPRICED``), and so is every
field a family's reader does not read and that is not known to change no memory
(``hf_fields.check_fields``). No network and no
transformers dependency: the fields are read directly; what the family's modeling class
fixes whatever the config says (q/k norms, biases, the gated output) and the defaults of
absent fields are ``cpmem.model.hf_families``'.

A multimodal wrapper (``gemma3``, ``qwen3_5``, ``qwen3_5_moe``: ``hf_families.WRAPPERS``)
is read as its language model: its ``text_config``, completed with the text config class's
published defaults (a saved wrapper keeps only the fields that differ from them). Its
``vision_config`` is not priced; the geometry's ``unpriced_parts`` names it with its
parameters (``cpmem.model.vision``), and every estimate lists it.

Whether the runtime fuses the SwiGLU activation is a property of the runtime, not
of the checkpoint; the default follows the measurements (Qwen3.5 / Qwen3-Next
families fused, other families unfused) and callers may override it.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from cpmem.errors import ConfigError
from cpmem.model.geometry import MixerKind, MlpKind, ModelGeometry, RouterScoring, hybrid_layout
from cpmem.model.hf_families import FAMILIES as ARCHITECTURES
from cpmem.model.hf_families import UNPRICED, WRAPPERS
from cpmem.model.hf_fields import FAMILIES, check_fields
from cpmem.model.hf_nemotron import nemotron_h_geometry
from cpmem.model.hf_reader import Fields as _Fields
from cpmem.model.hf_reader import flag as _flag
from cpmem.model.quantization import read_quantization
from cpmem.model.vision import unpriced_vision

HYBRID_FAMILIES = ("qwen3_5", "qwen3_5_moe", "qwen3_5_text", "qwen3_5_moe_text", "qwen3_next")
DENSE_FAMILIES = ("qwen3", "qwen2", "llama", "mistral")
MLA_FAMILIES = ("deepseek_v3", "kimi_k2", "deepseek_v2")
NEXTN_FAMILIES = ("deepseek_v3", "kimi_k2", "glm4_moe")
"""DeepSeek-V3's experts (``first_k_dense_replace``, ``n_routed_experts``, ungated
``n_shared_experts``, sigmoid router) and its ``num_nextn_predict_layers`` MTP layer."""
CLASS_DEFAULTS: dict[str, dict[str, int]] = {
    "glm4_moe": {
        "n_routed_experts": 128,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 1408,
        "n_shared_experts": 1,
        "first_k_dense_replace": 1,
    },
    "mixtral": {"num_local_experts": 8, "num_experts_per_tok": 2},
    "qwen2_moe": {
        "num_experts": 60,
        "num_experts_per_tok": 4,
        "moe_intermediate_size": 1408,
        "shared_expert_intermediate_size": 5632,
    },
    "olmoe": {"num_experts": 64, "num_experts_per_tok": 8, "intermediate_size": 2048},
    "deepseek_v2": {
        "q_lora_rank": 1536,
        "n_routed_experts": 64,
        "n_shared_experts": 2,
        "moe_intermediate_size": 1407,
        "first_k_dense_replace": 0,
    },
}
"""The configuration classes' defaults of the expert fields a config may leave out
(``Glm4MoeConfig``, ``MixtralConfig``, ``Qwen2MoeConfig``, ``OlmoeConfig``,
``DeepseekV2Config``, whose absent ``q_lora_rank`` is 1,536 too, and whose
``num_experts_per_tok`` has no default a model can be built with;
``hf_families.SOURCE_COMMITS``); the DeepSeek-V3 and Qwen3 families' absent fields keep
the readers' own defaults (Qwen3-MoE's absent ``num_experts``: a dense model)."""
FUSED_BY_DEFAULT = HYBRID_FAMILIES
ACTIVATIONS = ("silu", "gelu_pytorch_tanh", "gelu")
"""The gated MLP activations priced: SwiGLU's ``silu`` and Gemma's GeGLU, tanh-approximated
or exact (the published Gemma 1 configs say ``hidden_act: gelu``, which ``GemmaMLP``
runs: ``ACT2FN[config.hidden_act]``), whose unfused forms keep the same tensors (the
activation's input, its output and the product's other factor)."""
PLAIN_ACTIVATIONS = ("gelu_pytorch_tanh", "gelu")
"""The activations of a plain (ungated) MLP priced: GeLU, tanh-approximated or exact; each
keeps its input, ``c_fc``'s output, and its output is ``c_proj``'s input
(``pricing.kinds.mlp.PLAIN_MLP_SAVED_F``)."""
GEMMA3_SLIDING_PATTERN = 6
"""Gemma 3: every sixth layer attends fully, the others over the sliding window
(``sliding_window_pattern``'s default in transformers' ``Gemma3TextConfig``)."""
QWEN_MAX_WINDOW_LAYERS = 28
"""Qwen2/Qwen3: the first layer that slides under ``use_sliding_window`` when
``max_window_layers`` is absent (``Qwen2Config``, ``Qwen3Config``: ``max_window_layers:
int = 28``). Qwen3-MoE's config class at the same commit has no such field: its layers
slide from ``max_window_layers`` where a config gives one, else none does."""


def load_config(
    source: str | Path | dict[str, Any],
    *,
    name: str | None = None,
    fused_swiglu: bool | None = None,
) -> ModelGeometry:
    """Read a config.json into a ModelGeometry; errors name the missing field."""
    if isinstance(source, dict):
        raw = source
        label = name or str(raw.get("_name_or_path") or raw.get("model_type") or "config")
    else:
        path = Path(source)
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigError("config", str(path), "file not found") from None
        except json.JSONDecodeError as exc:
            raise ConfigError("config", str(path), f"not valid JSON ({exc.msg})") from None
        if not isinstance(raw, dict):
            raise ConfigError("config", str(path), "must hold a JSON object")
        label = name or (path.parent.name if path.name == "config.json" else path.stem)
    text = raw.get("text_config", raw)
    if not isinstance(text, dict):
        raise ConfigError("text_config", text, "must be a JSON object")
    nested = text is not raw
    wrapper = raw.get("model_type") if nested else None
    if wrapper is not None and (not isinstance(wrapper, str) or wrapper not in WRAPPERS):
        why = UNPRICED.get(wrapper, "") if isinstance(wrapper, str) else ""
        raise ConfigError(
            "model_type",
            wrapper,
            f"a wrapper of a text_config cpmem does not read{': ' + why if why else ''}; "
            f"wrappers read: {list(WRAPPERS)}",
        )
    family = str(text.get("model_type") or (WRAPPERS[wrapper].text_family if wrapper else ""))
    family = family or str(raw.get("model_type") or "")
    if not family:
        raise ConfigError("model_type", None, "missing; cannot tell the model family")
    if family not in FAMILIES:
        why = f"not priced: {UNPRICED[family]}" if family in UNPRICED else "unsupported family"
        raise ConfigError("model_type", family, f"{why}; supported: {list(FAMILIES)}")
    if wrapper is not None and family != WRAPPERS[wrapper].text_family:
        raise ConfigError(
            "text_config.model_type",
            family,
            f"not the language model of a {wrapper!r} wrapper ({WRAPPERS[wrapper].text_family!r})",
        )
    check_fields(text, family, outer=raw if nested else None, wrapper=wrapper)
    if wrapper is not None:
        text = _completed(raw, text, wrapper)
    geometry = _read(raw, text, family, label, fused_swiglu)
    quantization = raw.get("quantization_config", text.get("quantization_config"))
    if quantization is not None:
        geometry = replace(geometry, quantization=read_quantization(quantization))
    if wrapper is not None and "vision_config" in raw:
        note = unpriced_vision(WRAPPERS[wrapper].vision, raw["vision_config"], geometry.hidden)
        geometry = replace(geometry, unpriced_parts=(note,))
    return geometry


ROOT_FIELDS = ("tie_word_embeddings", "vocab_size", "max_position_embeddings")
"""The fields a nested text config may leave to its wrapper."""


def _completed(raw: dict[str, Any], text: dict[str, Any], wrapper: str) -> dict[str, Any]:
    """A wrapper's ``text_config`` with every field it leaves out taken from the wrapper
    (``ROOT_FIELDS``) or else from the text config class's defaults."""
    tie_outer, tie_text = raw.get("tie_word_embeddings"), text.get("tie_word_embeddings")
    if tie_outer is not None and tie_text is not None and tie_outer != tie_text:
        raise ConfigError(
            "tie_word_embeddings",
            tie_text,
            f"text_config says {tie_text!r} and its wrapper {tie_outer!r}: say it once",
        )
    root = {k: raw[k] for k in ROOT_FIELDS if raw.get(k) is not None}
    return {**WRAPPERS[wrapper].text_defaults, **root, **text}


def _read(
    raw: dict[str, Any],
    text: dict[str, Any],
    family: str,
    label: str,
    fused_swiglu: bool | None,
) -> ModelGeometry:
    if family == "nemotron_h":
        return nemotron_h_geometry(raw, text, label, fused_swiglu)
    arch = ARCHITECTURES[family]
    reader = _Fields(text)
    layers = reader.int("num_hidden_layers")
    hidden = reader.int("hidden_size")
    q_heads = reader.int("num_attention_heads")
    mla = family in MLA_FAMILIES
    kv_groups = q_heads if mla else reader.int("num_key_value_heads", default=q_heads)
    head_dim = reader.int("head_dim", default=arch.head_dim or hidden // max(q_heads, 1))
    mla_dims: dict[str, int] = {}
    if mla:
        q_lora_absent = CLASS_DEFAULTS.get(family, {}).get("q_lora_rank", 0)
        mla_dims = {
            "q_lora_rank": 0
            if "q_lora_rank" in text and text["q_lora_rank"] is None
            else reader.int("q_lora_rank", default=q_lora_absent),
            "kv_lora_rank": reader.int("kv_lora_rank"),
            "qk_rope_head_dim": reader.int("qk_rope_head_dim"),
            "qk_nope_head_dim": reader.int("qk_nope_head_dim"),
            "v_head_dim": reader.int("v_head_dim"),
        }
        head_dim = mla_dims["qk_rope_head_dim"] + mla_dims["qk_nope_head_dim"]
    if mla and text.get("attention_bias"):
        raise ConfigError("attention_bias", True, "latent attention's biases are not priced")
    hybrid = family in HYBRID_FAMILIES
    mixers = _mixers(reader, layers, hybrid)
    mlps = _mlps(reader, layers, family)
    is_gdn = "gdn" in mixers
    is_moe = "moe" in mlps
    priced = ACTIVATIONS if arch.gated_mlp else PLAIN_ACTIVATIONS
    for key in ("hidden_activation", "hidden_act"):
        act = text.get(key)
        if act is not None and act not in priced:
            kind = "gated" if arch.gated_mlp else "plain"
            raise ConfigError(
                key, act, f"unsupported {kind} MLP activation; priced: {list(priced)}"
            )
    clamp = text.get("swiglu_limit") or text.get("activation_clamp")
    if fused_swiglu is None:
        fused_swiglu = family in FUSED_BY_DEFAULT
    softcap = text.get("final_logit_softcapping")
    if softcap is not None and (isinstance(softcap, bool) or not isinstance(softcap, int | float)):
        raise ConfigError("final_logit_softcapping", softcap, "must be a number or null")
    return ModelGeometry(
        name=label,
        family=family,
        hidden=hidden,
        ffn=reader.int("intermediate_size") if "dense" in mlps else 0,
        mixers=mixers,
        mlps=mlps,
        q_heads=q_heads,
        kv_groups=kv_groups,
        head_dim=head_dim,
        attention_output_gate=arch.gated_attention,
        gdn_key_heads=reader.int("linear_num_key_heads") if is_gdn else 0,
        gdn_key_dim=reader.int("linear_key_head_dim") if is_gdn else 0,
        gdn_value_heads=reader.int("linear_num_value_heads") if is_gdn else 0,
        gdn_value_dim=reader.int("linear_value_head_dim") if is_gdn else 0,
        gdn_conv_kernel=reader.int("linear_conv_kernel_dim") if is_gdn else 0,
        **(_experts(reader, family) if is_moe else {}),
        fused_swiglu=fused_swiglu,
        activation_clamp=float(clamp) if clamp else None,
        vocab=reader.int("vocab_size", root=raw),
        tied_embeddings=_flag(
            text, "tie_word_embeddings", _flag(raw, "tie_word_embeddings", arch.tied)
        ),
        windows=_windows(reader, layers, family),
        sandwich_norms=arch.sandwich_norms,
        pre_norms=arch.pre_norms,
        qk_norm=_flag(text, arch.qk_norm_field, arch.qk_norm)
        if arch.qk_norm_field
        else arch.qk_norm,
        qk_norm_projection=arch.qk_norm_projection,
        final_logit_softcap=float(softcap) if softcap is not None else None,
        attention_bias=(
            _flag(text, arch.bias_field, arch.attention_bias_default)
            if arch.attention_bias is None
            else arch.attention_bias
        ),
        mlp_bias=(
            _flag(text, arch.mlp_bias_field, arch.mlp_bias_default)
            if arch.mlp_bias is None
            else arch.mlp_bias
        ),
        norm="layernorm" if arch.norm == "layernorm" else "rmsnorm",
        gated_mlp=arch.gated_mlp,
        router_bias=arch.router_bias,
        attention_sinks=arch.attention_sinks,
        shared_expert_gate=arch.shared_expert_gate,
        router_scoring=_router_scoring(text, family),
        q_lora_rank=mla_dims.get("q_lora_rank", 0),
        kv_lora_rank=mla_dims.get("kv_lora_rank", 0),
        qk_rope_head_dim=mla_dims.get("qk_rope_head_dim", 0),
        qk_nope_head_dim=mla_dims.get("qk_nope_head_dim", 0),
        v_head_dim=mla_dims.get("v_head_dim", 0),
        max_position_embeddings=(
            reader.int("max_position_embeddings", root=raw)
            if text.get("max_position_embeddings", raw.get("max_position_embeddings")) is not None
            else None
        ),
        **_mtp(reader, family, layers, mlps),
    )


def _mtp(reader: _Fields, family: str, layers: int, mlps: tuple[MlpKind, ...]) -> dict[str, Any]:
    """The multi-token-prediction layers a checkpoint holds (transformers' models do not
    build them; a runtime that does prices them, ``Runtime.builds_mtp``):

    - DeepSeek-V3 / Kimi-K2's and GLM-4.5's ``num_nextn_predict_layers``: that many
      depths of one decoder layer each, the layer after the last (index
      ``num_hidden_layers``: an MoE layer by the family's rule where the model has routed
      experts), each with its ``enorm``, ``hnorm``, ``eh_proj`` and ``shared_head.norm``
      (the checkpoint's layer 61 of DeepSeek-V3; GLM-4.5's layer 92 and GLM-4.5-Air's 46,
      which ``Glm4MoeModel`` leaves unloaded: ``_keys_to_ignore_on_load_unexpected``);
    - Qwen3-Next / Qwen3.5's ``mtp_num_hidden_layers``: one MTP module of that many
      full-attention decoder layers (``mtp.layers.*``, with ``mtp.fc``, its two pre-fc
      norms and ``mtp.norm``), of the model's feed-forward kind (MoE where it has routed
      experts)."""
    attention: MixerKind = "attention"
    if family in NEXTN_FAMILIES:
        depths = reader.int("num_nextn_predict_layers", default=0)
        if not depths:
            return {}
        after = _mlps(reader, layers + 1, family)[-1]  # the layer after the last
        return {"mtp_mixers": (attention,), "mtp_mlps": (after,), "mtp_depths": depths}
    if family in HYBRID_FAMILIES:
        count = reader.int("mtp_num_hidden_layers", default=0)
        if not count:
            return {}
        kind: MlpKind = "moe" if "moe" in mlps else "dense"
        return {"mtp_mixers": (attention,) * count, "mtp_mlps": (kind,) * count, "mtp_depths": 1}
    return {}


def _layer_types(reader: _Fields, layers: int) -> list[str] | None:
    types = reader.text.get("layer_types")
    if types is None:
        return None
    if not isinstance(types, list) or len(types) != layers:
        raise ConfigError("layer_types", types, f"must list one type per layer ({layers})")
    return types


def _mixers(reader: _Fields, layers: int, hybrid: bool) -> tuple[MixerKind, ...]:
    text = reader.text
    types = _layer_types(reader, layers)
    if types is not None:
        out: list[MixerKind] = []
        for i, kind in enumerate(types):
            if kind in ("full_attention", "attention", "sliding_attention"):
                out.append("attention")
            elif kind in ("linear_attention", "gated_deltanet") and hybrid:
                out.append("gdn")
            else:
                raise ConfigError(f"layer_types[{i}]", kind, "unsupported layer type")
        return tuple(out)
    interval = text.get("full_attention_interval")
    if interval is not None:
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise ConfigError("full_attention_interval", interval, "must be a positive integer")
        return hybrid_layout(layers, interval)
    if hybrid:
        raise ConfigError(
            "layer_types", None, "missing (and no full_attention_interval) for a hybrid model"
        )
    attention: MixerKind = "attention"
    return (attention,) * layers


def _windows(reader: _Fields, layers: int, family: str) -> tuple[int, ...]:
    """Each layer's sliding window (0: full attention), by the family's rule:
    ``layer_types``' ``sliding_attention`` layers where listed; otherwise Gemma 2's
    alternation (even layers slide), Gemma 3's ``sliding_window_pattern``, gpt-oss's
    alternation (``GptOssConfig``: even layers slide), OLMo 3's three of four
    (``Olmo3Config``), every layer of Mistral, Mixtral, Phi-3 and StarCoder 2 (their
    attention passes ``config.sliding_window`` to every layer), Qwen2/Qwen3's layers from
    ``max_window_layers`` on (default 28) when ``use_sliding_window`` is set (``Qwen2Config``,
    ``Qwen3Config``: without it no layer slides, whatever ``layer_types`` says). An absent
    ``sliding_window`` is the family's default (``hf_families``); null is none."""
    text = reader.text
    arch = ARCHITECTURES[family]
    if family == "qwen2_moe" and "sliding_attention" in (_layer_types(reader, layers) or []):
        raise ConfigError(
            "layer_types",
            "sliding_attention",
            "Qwen2MoeConfig slides no layer without use_sliding_window, which is accepted "
            "only false (hf_fields)",
        )
    default = arch.window
    if default is None and not arch.slides:
        return ()
    qwen = family in ("qwen2", "qwen3", "qwen3_moe")
    if qwen and not _flag(text, "use_sliding_window", False):
        return ()
    window = text.get("sliding_window", default)
    if window is None:
        return ()
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ConfigError("sliding_window", window, "must be a positive integer or null")
    every_layer = ("mistral", "mixtral", "phi3", "starcoder2")
    types = _layer_types(reader, layers) if family not in every_layer else None
    sliding: list[bool]
    if types is not None:
        sliding = [t == "sliding_attention" for t in types]
    elif family in ("gemma2", "gpt_oss"):
        sliding = [i % 2 == 0 for i in range(layers)]
    elif family == "olmo3":
        sliding = [(i + 1) % 4 != 0 for i in range(layers)]
    elif family == "gemma3_text":
        pattern = reader.int("sliding_window_pattern", default=GEMMA3_SLIDING_PATTERN)
        if pattern < 1:
            raise ConfigError("sliding_window_pattern", pattern, "must be a positive integer")
        sliding = [(i + 1) % pattern != 0 for i in range(layers)]
    elif family in every_layer:
        sliding = [True] * layers
    else:
        first = QWEN_MAX_WINDOW_LAYERS if family != "qwen3_moe" else layers
        start = reader.int("max_window_layers", default=first)
        sliding = [i >= start for i in range(layers)]
    if not any(sliding):
        return ()
    return tuple(window if s else 0 for s in sliding)


def _mlps(reader: _Fields, layers: int, family: str) -> tuple[MlpKind, ...]:
    """Each layer's feed-forward kind, by the family's rule: Qwen's ``mlp_only_layers``
    and ``decoder_sparse_step``; DeepSeek-V3's ``first_k_dense_replace`` dense layers and
    ``moe_layer_freq``; GLM-4.5's and DeepSeek-V2's ``first_k_dense_replace``
    (``Glm4MoeDecoderLayer``, ``DeepseekV2DecoderLayer``: MoE from that layer on, no
    frequency); gpt-oss's, Mixtral's and OLMoE's experts in every
    layer (Qwen2-MoE's rule is Qwen3-MoE's, ``Qwen2MoeDecoderLayer``)."""
    text = reader.text
    dense: MlpKind = "dense"
    moe: MlpKind = "moe"
    if family == "glm4_moe":
        first = _expert_int(reader, family, "first_k_dense_replace")
        return tuple(moe if i >= first else dense for i in range(layers))
    if family == "mixtral":
        _expert_int(reader, family, "num_local_experts")
        return (moe,) * layers
    if family == "deepseek_v2":
        first = _expert_int(reader, family, "first_k_dense_replace")
        return tuple(moe if i >= first else dense for i in range(layers))
    if family in MLA_FAMILIES:
        if not text.get("n_routed_experts"):
            return (dense,) * layers
        first = reader.int("first_k_dense_replace", default=0)
        freq = reader.int("moe_layer_freq", default=1)
        if freq < 1:
            raise ConfigError("moe_layer_freq", freq, "must be a positive integer")
        kinds: tuple[MlpKind, ...] = tuple(
            "moe" if i >= first and i % freq == 0 else "dense" for i in range(layers)
        )
        return kinds
    if family == "gpt_oss":
        reader.int("num_local_experts")
        return (moe,) * layers
    if family == "olmoe":
        _expert_int(reader, family, "num_experts")
        return (moe,) * layers
    experts = _expert_int(reader, family, "num_experts") if family == "qwen2_moe" else None
    experts = text.get("num_experts") if experts is None else experts
    if not experts:
        return (dense,) * layers
    step = text.get("decoder_sparse_step", 1) or 1
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise ConfigError("decoder_sparse_step", step, "must be a positive integer")
    only = text.get("mlp_only_layers") or []
    if not isinstance(only, list) or any(
        isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < layers for i in only
    ):
        raise ConfigError("mlp_only_layers", only, f"must list layer indices below {layers}")
    dense_only = set(only)
    return tuple(
        "moe" if (i not in dense_only and (i + 1) % step == 0) else "dense" for i in range(layers)
    )


def _router_scoring(text: dict[str, Any], family: str) -> RouterScoring:
    """How the router scores the experts: DeepSeek's and GLM-4.5's sigmoid of every
    logit; DeepSeek-V2's softmax over every expert, never renormalised
    (``DeepseekV2Moe`` reads no ``norm_topk_prob``; its group-limited top-k masks groups
    of those scores, which changes values, not the tensors kept); Qwen3-MoE's, Qwen2-MoE's
    and OLMoE's softmax over every expert, which with
    ``norm_topk_prob`` (renormalised over the top-k) is the softmax of the top-k logits, as
    megatron computes it (no ``moe_router_pre_softmax``); Mixtral's the same, always renormalised
    (``MixtralSparseMoeBlock``); the others (Qwen3.5-MoE, gpt-oss) the top-k logits'
    softmax."""
    if family in NEXTN_FAMILIES:
        return "sigmoid"
    if family in ("qwen3_moe", "qwen2_moe", "olmoe") and not text.get("norm_topk_prob", False):
        return "softmax_topk"
    if family == "deepseek_v2":
        return "softmax_topk"
    return "topk_softmax"


def _experts(reader: _Fields, family: str) -> dict[str, Any]:
    """The routed and shared experts' shapes, under each family's field names."""
    if family == "glm4_moe":
        expert_ffn = _expert_int(reader, family, "moe_intermediate_size")
        return {
            "num_experts": _expert_int(reader, family, "n_routed_experts"),
            "moe_top_k": _expert_int(reader, family, "num_experts_per_tok"),
            "expert_ffn": expert_ffn,
            "shared_expert_ffn": _expert_int(reader, family, "n_shared_experts") * expert_ffn,
        }
    if family == "mixtral":
        return {
            "num_experts": _expert_int(reader, family, "num_local_experts"),
            "moe_top_k": _expert_int(reader, family, "num_experts_per_tok"),
            "expert_ffn": reader.int("intermediate_size"),
        }
    if family == "deepseek_v2":
        expert_ffn = _expert_int(reader, family, "moe_intermediate_size")
        return {
            "num_experts": _expert_int(reader, family, "n_routed_experts"),
            "moe_top_k": reader.int("num_experts_per_tok"),
            "expert_ffn": expert_ffn,
            "shared_expert_ffn": _expert_int(reader, family, "n_shared_experts") * expert_ffn,
        }
    if family in MLA_FAMILIES:
        expert_ffn = reader.int("moe_intermediate_size")
        return {
            "num_experts": reader.int("n_routed_experts"),
            "moe_top_k": reader.int("num_experts_per_tok"),
            "expert_ffn": expert_ffn,
            "shared_expert_ffn": reader.int("n_shared_experts", default=0) * expert_ffn,
        }
    if family == "olmoe":
        return {
            "num_experts": _expert_int(reader, family, "num_experts"),
            "moe_top_k": _expert_int(reader, family, "num_experts_per_tok"),
            "expert_ffn": _expert_int(reader, family, "intermediate_size"),
        }
    if family == "qwen2_moe":
        return {
            "num_experts": _expert_int(reader, family, "num_experts"),
            "moe_top_k": _expert_int(reader, family, "num_experts_per_tok"),
            "expert_ffn": _expert_int(reader, family, "moe_intermediate_size"),
            "shared_expert_ffn": _expert_int(reader, family, "shared_expert_intermediate_size"),
        }
    if family == "gpt_oss":
        return {
            "num_experts": reader.int("num_local_experts"),
            "moe_top_k": reader.int("num_experts_per_tok"),
            "expert_ffn": reader.int("intermediate_size"),
        }
    return {
        "num_experts": reader.int("num_experts"),
        "moe_top_k": reader.int("num_experts_per_tok"),
        "expert_ffn": reader.int("moe_intermediate_size"),
        "shared_expert_ffn": reader.int("shared_expert_intermediate_size", default=0),
    }


def _expert_int(reader: _Fields, family: str, key: str) -> int:
    """An expert field, its configuration class's default where absent
    (``CLASS_DEFAULTS``)."""
    return reader.int(key, default=CLASS_DEFAULTS[family][key])
