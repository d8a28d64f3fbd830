"""NVIDIA's Nemotron-H family (``model_type: nemotron_h``: Nemotron-H, Nemotron Nano 2,
Nemotron 3) from its Hugging Face ``config.json``, as transformers builds it
(``models/nemotron_h/modeling_nemotron_h.py``, ``configuration_nemotron_h.py``).

Every layer is one block (``NemotronHBlock``): an RMSNorm, then one mixer of the type
its layer names, then the residual add:

- ``M`` / ``mamba`` / ``linear_attention``: ``NemotronHMamba2Mixer``: ``in_proj`` to
  ``2d + 2GN + h`` with ``d = mamba_num_heads x mamba_head_dim`` (``expand`` is not
  read for the width), a depthwise causal conv over ``d + 2GN`` channels with its bias
  (``use_conv_bias``), ``dt_bias``, ``A_log`` and ``D`` per head, a gated RMSNorm of
  ``d``, ``out_proj``: the Mamba-2 mixer megatron-core builds (``cpmem.pricing.kinds.
  mamba``);
- ``*`` / ``attention`` / ``full_attention``: ``NemotronHAttention`` (Jamba's): q, k, v
  and o projections, no q/k norm and no rotary embedding;
- ``-`` / ``mlp``: ``NemotronHMLP``: ``up_proj`` and ``down_proj`` with the squared
  ReLU (``mlp_hidden_act: relu2``) between: a plain MLP, ``intermediate_size`` wide;
- ``E`` / ``moe``: ``NemotronHMoE``: the sigmoid top-k router of DeepSeek-V3
  (``NemotronHTopkRouter``), ``n_routed_experts`` plain experts of
  ``moe_intermediate_size`` and one plain shared expert of
  ``moe_shared_expert_intermediate_size``, no shared-expert gate.

The layers are ``hybrid_override_pattern`` (one symbol each) or ``layers_block_type``
(``layer_types``), one name each. Multi-token prediction: ``num_nextn_predict_layers``
depths of ``mtp_layers_block_type`` (or ``mtp_hybrid_override_pattern``); transformers'
model leaves their weights unloaded (``_keys_to_ignore_on_load_unexpected = [r"mtp.*"]``),
a runtime that builds them prices them (``Runtime.builds_mtp``). Absent fields take
``NemotronHConfig``'s defaults.
"""

from __future__ import annotations

from typing import Any

from cpmem.errors import ConfigError
from cpmem.model.geometry import MixerKind, MlpKind, ModelGeometry
from cpmem.model.hf_reader import Fields, flag

SOURCE_COMMIT = "13923c63d59f73faebae79b2ee3fafc7e3a35201"
"""huggingface/transformers' ``configuration_nemotron_h.py`` the defaults were read at."""

LAYER_NAMES: dict[str, tuple[MixerKind, MlpKind]] = {
    "mamba": ("mamba", "none"),
    "linear_attention": ("mamba", "none"),
    "attention": ("attention", "none"),
    "full_attention": ("attention", "none"),
    "mlp": ("none", "dense"),
    "moe": ("none", "moe"),
}
"""Each ``layers_block_type`` name's layer (the legacy names and ``NemotronHConfig``'s
current ones: its ``_pattern_to_list`` maps ``M`` to ``linear_attention``)."""

SYMBOLS = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
"""``hybrid_override_pattern``'s symbols (``NemotronHConfig._pattern_to_list``)."""

DEFAULTS: dict[str, Any] = {
    "num_key_value_heads": 8,
    "head_dim": 128,
    "mamba_head_dim": 64,
    "ssm_state_size": 128,
    "n_groups": 8,
    "conv_kernel": 4,
    "chunk_size": 128,
    "mlp_hidden_act": "relu2",
    "num_nextn_predict_layers": 0,
}
"""``NemotronHConfig``'s defaults of the fields read where a config leaves them out."""

MTP_DEFAULT_TYPES = ("full_attention", "moe")
"""``NemotronHConfig``'s MTP layers where a config names none."""


def _layers(
    reader: Fields, pattern_key: str, list_keys: tuple[str, ...]
) -> tuple[tuple[MixerKind, ...], tuple[MlpKind, ...]] | None:
    """The layers a pattern string or a list of block names gives (None: neither)."""
    text = reader.text
    pattern = text.get(pattern_key)
    names: object = None
    key = pattern_key
    if pattern is not None:
        if not isinstance(pattern, str) or any(c not in SYMBOLS for c in pattern):
            raise ConfigError(
                pattern_key, pattern, f"must be a string of the symbols {''.join(SYMBOLS)}"
            )
        names = [SYMBOLS[c] for c in pattern]
    else:
        for key in list_keys:
            if text.get(key) is not None:
                names = text[key]
                break
    if names is None:
        return None
    if not isinstance(names, list) or not names or any(n not in LAYER_NAMES for n in names):
        raise ConfigError(key, names, f"must list layer types, each one of {sorted(LAYER_NAMES)}")
    kinds = [LAYER_NAMES[n] for n in names]
    return tuple(k[0] for k in kinds), tuple(k[1] for k in kinds)


def _mtp(reader: Fields) -> dict[str, Any]:
    """The MTP depths and one depth's layers (none where ``num_nextn_predict_layers`` is
    0)."""
    depths = reader.int("num_nextn_predict_layers", default=DEFAULTS["num_nextn_predict_layers"])
    if not depths:
        return {}
    layers = _layers(reader, "mtp_hybrid_override_pattern", ("mtp_layers_block_type",))
    if layers is None:
        kinds = [LAYER_NAMES[n] for n in MTP_DEFAULT_TYPES]
        layers = tuple(k[0] for k in kinds), tuple(k[1] for k in kinds)
    return {"mtp_mixers": layers[0], "mtp_mlps": layers[1], "mtp_depths": depths}


def nemotron_h_geometry(
    raw: dict[str, Any], text: dict[str, Any], label: str, fused_swiglu: bool | None
) -> ModelGeometry:
    """A ``nemotron_h`` config's model (``raw``: the whole config, ``text``: its language
    model's fields)."""
    reader = Fields(text)
    stack = _layers(reader, "hybrid_override_pattern", ("layers_block_type", "layer_types"))
    if stack is None:
        raise ConfigError(
            "hybrid_override_pattern", None, "missing (and no layers_block_type): the layers"
        )
    mixers, mlps = stack
    declared = text.get("num_hidden_layers")
    if declared is not None and declared != len(mixers):
        raise ConfigError(
            "num_hidden_layers", declared, f"does not match the {len(mixers)} layers listed"
        )
    act = text.get("mlp_hidden_act", DEFAULTS["mlp_hidden_act"])
    if act != "relu2":
        raise ConfigError("mlp_hidden_act", act, "unsupported; priced: ['relu2'] (squared ReLU)")
    mtp = _mtp(reader)
    kinds = set(mixers) | set(mlps) | set(mtp.get("mtp_mixers", ())) | set(mtp.get("mtp_mlps", ()))
    heads = reader.int("num_attention_heads")
    fields: dict[str, Any] = {}
    if "mamba" in kinds:
        fields.update(
            mamba_heads=reader.int("mamba_num_heads"),
            mamba_head_dim=reader.int("mamba_head_dim", default=DEFAULTS["mamba_head_dim"]),
            mamba_state_dim=reader.int("ssm_state_size", default=DEFAULTS["ssm_state_size"]),
            mamba_groups=reader.int("n_groups", default=DEFAULTS["n_groups"]),
            mamba_conv_kernel=reader.int("conv_kernel", default=DEFAULTS["conv_kernel"]),
            mamba_chunk=reader.int("chunk_size", default=DEFAULTS["chunk_size"]),
        )
    if "moe" in kinds:
        fields.update(
            num_experts=reader.int("n_routed_experts"),
            moe_top_k=reader.int("num_experts_per_tok"),
            expert_ffn=reader.int("moe_intermediate_size"),
            shared_expert_ffn=reader.int("moe_shared_expert_intermediate_size"),
        )
    positions = reader.int("max_position_embeddings", root=raw, default=0)
    head_dim = reader.int("head_dim", default=DEFAULTS["head_dim"])
    return ModelGeometry(
        name=label,
        family="nemotron_h",
        hidden=reader.int("hidden_size"),
        mixers=mixers,
        mlps=mlps,
        q_heads=heads,
        kv_groups=reader.int("num_key_value_heads", default=DEFAULTS["num_key_value_heads"]),
        head_dim=reader.int("attention_head_dim", default=head_dim),
        vocab=reader.int("vocab_size", root=raw),
        ffn=reader.int("intermediate_size") if "dense" in kinds else 0,
        gated_mlp=False,
        positions="none",
        qk_norm=False,
        attention_bias=flag(text, "attention_bias", False),
        shared_expert_gate=False,
        router_scoring="sigmoid",
        tied_embeddings=flag(text, "tie_word_embeddings", flag(raw, "tie_word_embeddings", False)),
        fused_swiglu=bool(fused_swiglu),
        max_position_embeddings=positions or None,
        **fields,
        **mtp,
    )
