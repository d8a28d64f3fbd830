"""Hybrid layer stacks: Megatron-LM's ``--hybrid-layer-pattern``, Hugging Face
``nemotron_h``'s ``hybrid_override_pattern`` / ``layers_block_type``, and a
:class:`~oracles.rank_sim.geometry.SimModel` from Megatron-LM's arguments.

In a hybrid stack every symbol is ONE layer with one sub-layer and its residual
(megatron ``HybridStack`` / 0.16's ``MambaStack``: ``MambaLayer``, an attention-only
``TransformerLayer``, ``MLPLayer``, ``MoETransformerLayer``). The grammar is
Megatron-LM's (``megatron/core/models/hybrid/hybrid_layer_allocation.py``,
``parse_hybrid_pattern`` / ``_validate_pattern``, read at NVIDIA/Megatron-LM d98e8a6;
megatron-core 0.16's ``mamba_hybrid_layer_allocation.py`` knows M * - E only):
``M`` Mamba-2, ``G`` Gated DeltaNet, ``*`` attention, ``D`` DeepSeek sparse attention,
``+`` latent attention, ``-`` MLP, ``E`` MoE; ``|`` separates pipeline segments of the
main pattern; ``/`` starts the multi-token-prediction pattern, repeated once per depth
(all repeats identical, no ``|`` in it); ``*`` may not share a pattern with ``D`` or ``+``.

Simulated here: ``M``, ``*``, ``-``, ``E``, in the main stack and in the MTP pattern (one
depth's layers, mtp.py). Refused, naming the field: ``G``, ``D``, ``+`` from a pattern
(their shapes are not in these arguments), MoE layers with squared-ReLU experts (moe.py's
experts are GLUs).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oracles.rank_sim.geometry import SimInputError, SimModel

LAYER_SYMBOLS = "MG*D+-E"
PIPE, MTP = "|", "/"
# symbol -> (mixer kind, feed-forward kind) of SimModel.kinds / mlp_kinds
STACK = {"M": ("mamba", ""), "*": ("attention", ""), "-": ("", "dense"), "E": ("", "moe")}
NOT_SIMULATED = {
    "G": "Gated DeltaNet layers are not read from a hybrid pattern",
    "D": "DeepSeek sparse attention is not simulated",
    "+": "latent attention is not read from a hybrid pattern",
}
# HF nemotron_h ``layers_block_type`` names -> pattern symbols
BLOCK_TYPES = {"mamba": "M", "attention": "*", "mlp": "-", "moe": "E"}


@dataclass(frozen=True)
class HybridPattern:
    """A parsed pattern: the main stack's symbols, the layers of each pipeline segment,
    and the MTP pattern with its depth count (``""`` and 0 without MTP)."""

    layers: tuple[str, ...]
    segments: tuple[int, ...]
    mtp: str = ""
    mtp_depths: int = 0


def parse_pattern(text: str, field: str = "hybrid_layer_pattern") -> HybridPattern:
    """Megatron-LM's ``parse_hybrid_pattern`` rules; a bad pattern is a SimInputError
    naming ``field``."""
    if not isinstance(text, str) or not text:
        raise SimInputError(field, text, "needs at least one layer symbol")
    main, *mtp_parts = text.split(MTP)
    _validate(main, field, pipes=True)
    mtp = ""
    if any(mtp_parts):
        if any(part != mtp_parts[0] for part in mtp_parts):
            raise SimInputError(field, text, "every MTP pattern after '/' must be identical")
        mtp = mtp_parts[0]
        _validate(mtp, field, pipes=False)
    segments = tuple(len(seg) for seg in main.split(PIPE))
    layers = tuple(main.replace(PIPE, ""))
    if not layers:
        raise SimInputError(field, text, "the main pattern has no layer")
    return HybridPattern(layers, segments, mtp, len(mtp_parts) if mtp else 0)


def _validate(pattern: str, field: str, pipes: bool) -> None:
    allowed = LAYER_SYMBOLS + (PIPE if pipes else "")
    bad = sorted({c for c in pattern if c not in allowed})
    if bad:
        raise SimInputError(field, pattern, f"{bad[0]!r} is not one of {' '.join(allowed)}")
    if "*" in pattern and ("D" in pattern or "+" in pattern):
        raise SimInputError(field, pattern, "attention '*' cannot share a stack with 'D' or '+'")


def stack(pattern: HybridPattern, field: str = "hybrid_layer_pattern") -> dict[str, Any]:
    """The SimModel fields of a pattern: the main stack's ``kinds`` and ``mlp_kinds``, and
    with a ``/`` part one MTP depth's (``mtp_kinds``, ``mtp_mlp_kinds``) and the depth
    count (``mtp_depths``)."""
    for symbol in pattern.layers + tuple(pattern.mtp):
        if symbol in NOT_SIMULATED:
            raise SimInputError(field, symbol, NOT_SIMULATED[symbol])
    fields: dict[str, Any] = {
        "kinds": tuple(STACK[s][0] for s in pattern.layers),
        "mlp_kinds": tuple(STACK[s][1] for s in pattern.layers),
    }
    if pattern.mtp_depths:
        fields.update(
            mtp_kinds=tuple(STACK[s][0] for s in pattern.mtp),
            mtp_mlp_kinds=tuple(STACK[s][1] for s in pattern.mtp),
            mtp_depths=pattern.mtp_depths,
        )
    return fields


def _flag(flags: dict[str, Any], name: str, default: Any = None) -> Any:
    value = flags.get(name, default)
    return default if value is None else value


def _int(flags: dict[str, Any], name: str, default: int | None = None) -> int:
    value = _flag(flags, name, default)
    if value is None:
        raise SimInputError(f"--{name}", None, "missing")
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise SimInputError(f"--{name}", value, "expected an integer") from None
    if number < 1:
        raise SimInputError(f"--{name}", value, "must be >= 1")
    return number


def normalise_flags(raw: dict[str, Any]) -> dict[str, Any]:
    """Flag names without leading dashes, underscores as dashes."""
    return {str(k).lstrip("-").replace("_", "-"): v for k, v in raw.items()}


def from_megatron_args(raw: dict[str, Any], name: str = "megatron") -> SimModel:
    """A hybrid model from Megatron-LM's arguments (``pretrain_hybrid.py`` /
    ``pretrain_mamba.py``; defaults from megatron/training/arguments.py and
    ``TransformerConfig``): ``--hybrid-layer-pattern`` (or the deprecated
    ``--hybrid-override-pattern``; the pattern's count wins over ``--num-layers``, as
    Megatron-LM warns and does), ``--hidden-size``, ``--num-attention-heads``,
    ``--group-query-attention`` / ``--num-query-groups``, ``--kv-channels`` (hidden /
    heads), ``--ffn-hidden-size`` (4·hidden; ``--swiglu``: int(8·hidden/3 / 64)·64),
    ``--swiglu`` / ``--squared-relu`` (default GeLU, ungated), ``--qk-layernorm``,
    ``--position-embedding-type`` (rope only rotates), ``--disable-bias-linear``,
    ``--mamba-num-heads`` (hidden·2 / head dim: expand 2), ``--mamba-head-dim`` (64),
    ``--mamba-state-dim`` (128), ``--mamba-num-groups`` (8), and for ``E`` layers
    ``--num-experts``, ``--moe-router-topk`` (2), ``--moe-ffn-hidden-size``,
    ``--moe-shared-expert-intermediate-size``, ``--moe-shared-expert-gate``,
    ``--moe-router-score-function``, ``--moe-router-pre-softmax``,
    ``--moe-router-enable-expert-bias``, ``--moe-router-num-groups`` /
    ``--moe-router-group-topk``, ``--moe-router-topk-scaling-factor``; MTP: the pattern's
    '/' part (or the legacy ``--mtp-hybrid-override-pattern`` with ``--mtp-num-layers``),
    ``--mtp-use-repeated-layer``."""
    flags = normalise_flags(raw)
    layer_flag = "hybrid-layer-pattern"
    if flags.get(layer_flag) and flags.get("hybrid-override-pattern"):
        raise SimInputError(
            "--hybrid-override-pattern", flags["hybrid-override-pattern"],
            "cannot be given with --hybrid-layer-pattern",
        )  # fmt: skip
    if not flags.get(layer_flag) and flags.get("hybrid-override-pattern"):
        layer_flag = "hybrid-override-pattern"
    text = flags.get(layer_flag)
    if not text:
        raise SimInputError("--hybrid-layer-pattern", None, "missing: only hybrid stacks are read")
    field = f"--{layer_flag}"
    text = _with_legacy_mtp(str(text), flags)
    pattern = parse_pattern(text, field)
    mtp = _count_flag(flags, "mtp-num-layers")
    if mtp and not pattern.mtp_depths:
        raise SimInputError(
            "--mtp-num-layers", mtp, "a hybrid model's MTP layers come from '/' in "
            "--hybrid-layer-pattern (or --mtp-hybrid-override-pattern)",
        )  # fmt: skip
    if flags.get("multi-latent-attention"):
        raise SimInputError("--multi-latent-attention", True, "not read from Megatron-LM arguments")
    fields = stack(pattern, field)
    hidden = _int(flags, "hidden-size")
    attention = "*" in pattern.layers
    heads = _int(flags, "num-attention-heads") if attention else 0
    groups = (
        _int(flags, "num-query-groups") if flags.get("group-query-attention") and heads else heads
    )
    swiglu, relu2 = bool(flags.get("swiglu")), bool(flags.get("squared-relu"))
    if swiglu and relu2:
        raise SimInputError("--squared-relu", True, "cannot be given with --swiglu")
    default_ffn = int((4 * hidden * 2 / 3) / 64) * 64 if swiglu else 4 * hidden
    ffn = _int(flags, "ffn-hidden-size", default_ffn)
    head_dim = _int(flags, "kv-channels", hidden // heads if heads else 1)
    mamba_head_dim = _int(flags, "mamba-head-dim", 64)
    bias = not flags.get("disable-bias-linear")
    fields.update(
        name=name,
        hidden=hidden,
        ffn=ffn,
        q_heads=heads,
        kv_groups=groups,
        head_dim=head_dim,
        gated_attention=False,
        fused_swiglu=swiglu,  # megatron's bias_swiglu fusion (on by default)
        mlp_gated=swiglu,
        mlp_activation="silu" if swiglu else "squared_relu" if relu2 else "gelu",
        qk_norm=bool(flags.get("qk-layernorm")),
        rope=str(_flag(flags, "position-embedding-type", "learned_absolute")) == "rope",
        attention_bias=bias,  # frozen biases: nothing kept
        vocab=int(_flag(flags, "vocab-size", 0) or 0),
        tie_embeddings=not flags.get("untie-embeddings-and-output-weights"),
        family="megatron_hybrid",
        pipeline_segments=pattern.segments if len(pattern.segments) > 1 else (),
        mamba_heads=_int(flags, "mamba-num-heads", hidden * 2 // mamba_head_dim),
        mamba_head_dim=mamba_head_dim,
        mamba_state=_int(flags, "mamba-state-dim", 128),
        mamba_groups=_int(flags, "mamba-num-groups", 8),
        mtp_shared=bool(flags.get("mtp-use-repeated-layer")),
    )
    if "E" in pattern.layers + tuple(pattern.mtp):
        fields.update(_megatron_moe(flags, ffn, swiglu))
    return SimModel(**fields)


def _count_flag(flags: dict[str, Any], name: str) -> int:
    """An integer flag >= 0 (0 where absent)."""
    value = _flag(flags, name, 0)
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise SimInputError(f"--{name}", value, "expected an integer") from None
    if number < 0:
        raise SimInputError(f"--{name}", value, "must be >= 0")
    return number


def _with_legacy_mtp(text: str, flags: dict[str, Any]) -> str:
    """Megatron-LM's backward compatibility (training/arguments.py): a legacy
    ``--mtp-hybrid-override-pattern`` with ``--mtp-num-layers`` N and no '/' in the
    pattern becomes the unified ``main/mtp/mtp...`` (N times). With '/' the pattern's
    depth count wins over ``--mtp-num-layers`` (Megatron-LM warns and uses it)."""
    legacy = flags.get("mtp-hybrid-override-pattern")
    depths = _count_flag(flags, "mtp-num-layers")
    if not legacy or not depths or MTP in text:
        return text
    return text + MTP + MTP.join([str(legacy)] * depths)


def _megatron_moe(flags: dict[str, Any], ffn: int, swiglu: bool) -> dict[str, Any]:
    if not swiglu:
        raise SimInputError(
            "--num-experts", flags.get("num-experts"),
            "MoE layers with ungated (squared-ReLU / GeLU) experts are not simulated",
        )  # fmt: skip
    experts = _int(flags, "num-experts")
    top_k = _int(flags, "moe-router-topk", 2)
    if top_k > experts:
        raise SimInputError("--moe-router-topk", top_k, f"exceeds {experts} experts")
    score = str(_flag(flags, "moe-router-score-function", "softmax"))
    if score not in ("softmax", "sigmoid"):
        raise SimInputError("--moe-router-score-function", score, "softmax or sigmoid")
    groups = int(_flag(flags, "moe-router-num-groups", 0) or 0)
    return {
        "moe": True,
        "num_experts": experts,
        "moe_top_k": top_k,
        "expert_ffn": _int(flags, "moe-ffn-hidden-size", ffn),
        "shared_expert_ffn": int(_flag(flags, "moe-shared-expert-intermediate-size", 0) or 0),
        "shared_expert_gated": bool(flags.get("moe-shared-expert-gate")),
        "dense_ffn": ffn,
        "router_score": score,
        "router_pre_softmax": bool(flags.get("moe-router-pre-softmax")),
        "expert_score_bias": bool(flags.get("moe-router-enable-expert-bias")),
        "router_groups": groups,
        "router_group_topk": int(_flag(flags, "moe-router-group-topk", 0) or 0) if groups else 0,
        "routed_scaling": float(_flag(flags, "moe-router-topk-scaling-factor", 0.0) or 0.0),
    }


def load_megatron_args(path: str | Path) -> SimModel:
    """Megatron-LM arguments from a file: a functional test's ``model_config.yaml``
    (its ``MODEL_ARGS``), a JSON object of flags, or a text of ``--flag value`` words."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise SimInputError("megatron_args", str(path), f"cannot read: {exc}") from None
    raw: Any
    if p.suffix in (".yaml", ".yml"):
        import yaml

        try:
            raw = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise SimInputError("megatron_args", str(path), f"not YAML: {exc}") from None
        raw = raw.get("MODEL_ARGS", raw) if isinstance(raw, dict) else raw
    elif p.suffix == ".json":
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise SimInputError("megatron_args", str(path), f"not JSON: {exc}") from None
    else:
        raw = flags_from_words(shlex.split(text, comments=True))
    if not isinstance(raw, dict):
        raise SimInputError("megatron_args", str(path), "expected flags and their values")
    return from_megatron_args(raw, p.parent.name or p.stem)


def flags_from_words(words: list[str]) -> dict[str, Any]:
    """``--flag value`` / ``--switch`` words as a dict (a switch is True)."""
    flags: dict[str, Any] = {}
    for i, word in enumerate(words):
        if not word.startswith("--"):
            continue
        nxt = words[i + 1] if i + 1 < len(words) else None
        flags[word] = True if nxt is None or nxt.startswith("--") else nxt
    return flags


def nemotron_h_fields(text: dict[str, Any], layers: int, get: Any) -> dict[str, Any]:
    """The SimModel fields of a Hugging Face ``nemotron_h`` config (Nemotron-H, Nemotron
    Nano v2): the stack from ``hybrid_override_pattern`` or ``layers_block_type``;
    ``mamba_num_heads``, ``mamba_head_dim``, ``ssm_state_size``, ``n_groups`` and
    ``conv_kernel``; ``mlp_hidden_act`` relu2 (squared ReLU, ungated fc1); attention
    without rope or q/k norm. The scan's chunk is megatron's (128), the runtime modelled,
    not the config's ``chunk_size``. MoE layers (Nemotron 3: squared-ReLU experts) are
    refused; MTP (``num_nextn_predict_layers``, ``mtp_hybrid_override_pattern``) is not
    read."""
    if text.get("hybrid_override_pattern"):
        pattern = parse_pattern(
            str(text["hybrid_override_pattern"]), "config.hybrid_override_pattern"
        )
    elif text.get("layers_block_type"):
        types = list(text["layers_block_type"])
        unknown = sorted({t for t in types if t not in BLOCK_TYPES})
        if unknown:
            raise SimInputError("config.layers_block_type", unknown[0], "not a nemotron_h block")
        pattern = parse_pattern("".join(BLOCK_TYPES[t] for t in types), "config.layers_block_type")
    else:
        raise SimInputError("config.hybrid_override_pattern", None, "missing")
    if len(pattern.layers) != layers:
        raise SimInputError(
            "config.hybrid_override_pattern", len(pattern.layers), f"!= {layers} layers"
        )
    if "E" in pattern.layers:
        raise SimInputError(
            "config.hybrid_override_pattern", "E",
            "nemotron_h MoE layers (squared-ReLU experts) are not simulated",
        )  # fmt: skip
    act = str(text.get("mlp_hidden_act") or "relu2")
    if act != "relu2":
        raise SimInputError("config.mlp_hidden_act", act, "only relu2 (squared ReLU)")
    fields = stack(pattern, "config.hybrid_override_pattern")
    heads = int(get("num_attention_heads"))
    return {
        **fields,
        "head_dim": int(text.get("head_dim") or text.get("attention_head_dim") or 0)
        or int(get("hidden_size")) // heads,
        "gated_attention": False,
        "fused_swiglu": False,
        "mlp_gated": False,
        "mlp_activation": "squared_relu",
        "qk_norm": False,
        "rope": False,
        "attention_bias": bool(text.get("attention_bias", False)),
        "family": "nemotron_h",
        "mamba_heads": int(get("mamba_num_heads")),
        "mamba_head_dim": int(get("mamba_head_dim")),
        "mamba_state": int(get("ssm_state_size")),
        "mamba_groups": int(text.get("n_groups") or text.get("mamba_n_groups") or 8),
        "mamba_conv_kernel": int(text.get("conv_kernel") or text.get("mamba_d_conv") or 4),
    }
