"""Geometry from a Hugging Face ``config.json`` (a path or an already-parsed dict).

Families: ``qwen3`` (dense), ``qwen3_5`` / ``qwen3_5_moe`` (text config nested under
``text_config`` or not), ``qwen3_next``, and llama-like dense models. No network and
no transformers dependency: the fields are read directly.

Whether the runtime fuses the SwiGLU activation is a property of the runtime, not
of the checkpoint; the default follows the measurements (Qwen3.5 / Qwen3-Next
families fused, other dense families unfused) and callers may override it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cpmem.errors import ConfigError
from cpmem.model.geometry import MixerKind, MlpKind, ModelGeometry, hybrid_layout

HYBRID_FAMILIES = ("qwen3_5", "qwen3_5_moe", "qwen3_5_text", "qwen3_5_moe_text", "qwen3_next")
DENSE_FAMILIES = ("qwen3", "qwen2", "llama", "mistral")
FUSED_BY_DEFAULT = HYBRID_FAMILIES


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
    family = str(text.get("model_type") or raw.get("model_type") or "")
    if not family:
        raise ConfigError("model_type", None, "missing; cannot tell the model family")
    hybrid = family in HYBRID_FAMILIES
    if not hybrid and family not in DENSE_FAMILIES and "layer_types" not in text:
        raise ConfigError(
            "model_type",
            family,
            f"unsupported family; supported: {sorted(HYBRID_FAMILIES + DENSE_FAMILIES)}",
        )
    reader = _Fields(text)
    layers = reader.int("num_hidden_layers")
    hidden = reader.int("hidden_size")
    q_heads = reader.int("num_attention_heads")
    kv_groups = reader.int("num_key_value_heads", default=q_heads)
    head_dim = reader.int("head_dim", default=hidden // q_heads)
    mixers = _mixers(reader, layers, hybrid)
    mlps = _mlps(reader, layers)
    is_gdn = "gdn" in mixers
    is_moe = "moe" in mlps
    clamp = text.get("swiglu_limit") or text.get("activation_clamp")
    if fused_swiglu is None:
        fused_swiglu = family in FUSED_BY_DEFAULT
    return ModelGeometry(
        name=label,
        hidden=hidden,
        ffn=reader.int("intermediate_size") if "dense" in mlps else 0,
        mixers=mixers,
        mlps=mlps,
        q_heads=q_heads,
        kv_groups=kv_groups,
        head_dim=head_dim,
        attention_output_gate=bool(text.get("attn_output_gate", hybrid)),
        gdn_key_heads=reader.int("linear_num_key_heads") if is_gdn else 0,
        gdn_key_dim=reader.int("linear_key_head_dim") if is_gdn else 0,
        gdn_value_heads=reader.int("linear_num_value_heads") if is_gdn else 0,
        gdn_value_dim=reader.int("linear_value_head_dim") if is_gdn else 0,
        gdn_conv_kernel=reader.int("linear_conv_kernel_dim") if is_gdn else 0,
        num_experts=reader.int("num_experts") if is_moe else 0,
        moe_top_k=reader.int("num_experts_per_tok") if is_moe else 0,
        expert_ffn=reader.int("moe_intermediate_size") if is_moe else 0,
        shared_expert_ffn=(
            reader.int("shared_expert_intermediate_size", default=0) if is_moe else 0
        ),
        fused_swiglu=fused_swiglu,
        activation_clamp=float(clamp) if clamp else None,
        vocab=reader.int("vocab_size", root=raw),
        tied_embeddings=bool(
            text.get("tie_word_embeddings", raw.get("tie_word_embeddings", False))
        ),
        max_position_embeddings=(
            reader.int("max_position_embeddings", root=raw)
            if text.get("max_position_embeddings", raw.get("max_position_embeddings")) is not None
            else None
        ),
    )


class _Fields:
    """Typed field access that names the field on every failure."""

    def __init__(self, text: dict[str, Any]) -> None:
        self.text = text

    def int(self, key: str, default: int | None = None, root: dict[str, Any] | None = None) -> int:
        value = self.text.get(key)
        if value is None and root is not None:
            value = root.get(key)
        if value is None:
            if default is not None:
                return default
            raise ConfigError(key, None, "missing from config")
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(key, value, "must be a non-negative integer")
        return value


def _mixers(reader: _Fields, layers: int, hybrid: bool) -> tuple[MixerKind, ...]:
    text = reader.text
    types = text.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != layers:
            raise ConfigError("layer_types", types, f"must list one type per layer ({layers})")
        out: list[MixerKind] = []
        for i, kind in enumerate(types):
            if kind in ("full_attention", "attention", "sliding_attention"):
                out.append("attention")
            elif kind in ("linear_attention", "gated_deltanet"):
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


def _mlps(reader: _Fields, layers: int) -> tuple[MlpKind, ...]:
    text = reader.text
    experts = text.get("num_experts") or text.get("n_routed_experts")
    if not experts:
        dense: MlpKind = "dense"
        return (dense,) * layers
    if "num_experts" not in text:
        raise ConfigError("num_experts", None, "MoE configs must name num_experts")
    step = text.get("decoder_sparse_step", 1) or 1
    dense_only = set(text.get("mlp_only_layers") or [])
    return tuple(
        "moe" if (i not in dense_only and (i + 1) % step == 0) else "dense" for i in range(layers)
    )
