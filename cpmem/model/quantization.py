"""A checkpoint's quantized weights, as its ``config.json`` publishes them
(``quantization_config``): which linears are stored quantized, in what format, with which
scales.

Two formats are read, each as the checkpoints that publish it store it:

- ``fp8`` (DeepSeek-V3, Kimi-K2, Qwen3's ``-FP8`` releases): every linear of the decoder
  layers (attention's projections, dense MLPs, shared and routed experts) stored as one
  byte per value (``e4m3``), with one fp32 scale per ``weight_block_size`` block of the
  matrix (``[128, 128]``: output rows x input columns, the ``weight_scale_inv`` tensor of
  ``ceil(rows / 128) x ceil(cols / 128)``). The router, the norms, the embedding, the
  output layer and the MTP depths' ``eh_proj`` stay bf16 (DeepSeek-V3's router is a
  parameter, not a linear; vLLM's DeepSeek MTP builds ``eh_proj`` unquantized).
  ``modules_to_not_convert`` may keep more of them bf16.
- ``mxfp4`` (gpt-oss): the routed experts' two weights stored as 4-bit ``e2m1`` values
  (two a byte) with one ``e8m0`` scale byte per 32 values along the input
  (``gate_up_proj_blocks`` ``[E, 2F, H/32, 16]`` beside ``gate_up_proj_scales``
  ``[E, 2F, H/32]``); ``modules_to_not_convert`` names what stays bf16 (attention, the
  router, the embedding, the output layer), and the experts' biases are bf16.

Anything else is refused naming the field: another ``quant_method``, another ``fmt``, a
static activation scheme, a pattern of ``modules_to_not_convert`` that names no part
cpmem can place.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from cpmem.errors import ConfigError

Role = Literal["attention", "mlp", "shared_expert", "experts"]
ROLES: tuple[Role, ...] = ("attention", "mlp", "shared_expert", "experts")
"""The linears of a layer by the part of the layer that holds them."""

UNCONVERTED_PARTS = frozenset({"router", "embedding", "output"})
"""Parts no format here converts (they are no decoder linear): naming them in
``modules_to_not_convert`` changes nothing."""

PATTERN_PARTS: dict[str, tuple[str, ...]] = {
    "self_attn": ("attention",),
    "mlp.router": ("router",),
    "mlp.gate": ("router",),
    "embed_tokens": ("embedding",),
    "lm_head": ("output",),
    "mlp.experts": ("experts",),
    "mlp.shared_experts": ("shared_expert",),
    "mlp.shared_expert": ("shared_expert",),
    "mlp": ("mlp", "shared_expert", "experts"),
}
"""The last components of a ``modules_to_not_convert`` pattern and the parts each names
(``model.layers.*.self_attn`` keeps every layer's attention bf16; ``mlp`` is a dense MLP's
module and an MoE block's alike, so it keeps the experts too)."""


@dataclass(frozen=True)
class Quantization:
    """How a checkpoint stores its quantized linears: ``value_bits`` per value, one scale of
    ``scale_bytes`` per ``block`` (rows x columns of the ``[out, in]`` matrix), for the
    linears of the ``converted`` roles."""

    method: Literal["fp8", "mxfp4"]
    value_bits: int
    block: tuple[int, int]
    scale_bytes: int
    converted: frozenset[str]

    @property
    def label(self) -> str:
        """The format in words, as answers name it."""
        if self.method == "fp8":
            rows, cols = self.block
            return f"fp8 e4m3 with {rows}x{cols} fp32 block scales"
        return f"mxfp4 e2m1 with one e8m0 scale per {self.block[1]} values"

    def converts(self, role: str) -> bool:
        return role in self.converted


FP8_FIELDS = frozenset({"quant_method", "fmt", "activation_scheme", "weight_block_size"})
MXFP4_FIELDS = frozenset({"quant_method", "modules_to_not_convert"})


def read_quantization(value: Any) -> Quantization:
    """A ``quantization_config`` as a ``Quantization``; every field read or refused."""
    field = "quantization_config"
    if not isinstance(value, Mapping):
        raise ConfigError(field, value, "must be a JSON object")
    method = value.get("quant_method")
    if method == "fp8":
        return _fp8(value)
    if method == "mxfp4":
        _only(value, MXFP4_FIELDS)
        kept = _kept_parts(value.get("modules_to_not_convert", []))
        return Quantization("mxfp4", 4, (1, 32), 1, frozenset({"experts"}) - kept)
    raise ConfigError(
        f"{field}.quant_method", method, "priced formats: fp8 (block-scaled e4m3), mxfp4"
    )


def _fp8(value: Mapping[str, Any]) -> Quantization:
    _only(value, FP8_FIELDS | {"modules_to_not_convert"})
    fmt = value.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise ConfigError("quantization_config.fmt", fmt, "priced: e4m3 (one byte a value)")
    scheme = value.get("activation_scheme", "dynamic")
    if scheme != "dynamic":
        raise ConfigError(
            "quantization_config.activation_scheme",
            scheme,
            "priced: dynamic (a static scheme stores activation scales cpmem does not count)",
        )
    block = value.get("weight_block_size")
    if (
        not isinstance(block, list | tuple)
        or len(block) != 2
        or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)
    ):
        raise ConfigError(
            "quantization_config.weight_block_size",
            block,
            "must be two positive integers (rows, columns of one scale's block); "
            "per-tensor fp8 is not priced",
        )
    kept = _kept_parts(value.get("modules_to_not_convert") or [])
    return Quantization("fp8", 8, (block[0], block[1]), 4, frozenset(ROLES) - kept)


def _only(value: Mapping[str, Any], fields: frozenset[str]) -> None:
    for key in sorted(value):
        if key not in fields:
            raise ConfigError(
                f"quantization_config.{key}",
                value[key],
                f"a field cpmem does not read for quant_method {value.get('quant_method')!r} "
                f"(read: {sorted(fields)})",
            )


def _kept_parts(patterns: Any) -> frozenset[str]:
    """The parts ``modules_to_not_convert`` keeps unquantized, each pattern read by its
    last components (``model.layers.*.mlp.router``: the router)."""
    field = "quantization_config.modules_to_not_convert"
    if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
        raise ConfigError(field, patterns, "must be a list of module names")
    parts: set[str] = set()
    for pattern in patterns:
        named = next(
            (
                p
                for tail, p in PATTERN_PARTS.items()
                if pattern == tail or pattern.endswith(f".{tail}")
            ),
            None,
        )
        if named is None:
            raise ConfigError(
                field,
                pattern,
                f"a module cpmem cannot place; read: every layer's {sorted(PATTERN_PARTS)}",
            )
        parts.update(named)
    return frozenset(parts)


ROLE_PATTERNS: dict[str, str] = {
    "attention": "model.layers.*.self_attn",
    "mlp": "model.layers.*.mlp",
    "shared_expert": "model.layers.*.mlp.shared_experts",
    "experts": "model.layers.*.mlp.experts",
}
"""The ``modules_to_not_convert`` pattern that keeps each role in the float dtype."""


def quantization_config(q: Quantization) -> dict[str, Any]:
    """``q`` as a ``quantization_config`` that ``read_quantization`` reads back to it (the
    published form where ``q`` is a published checkpoint's)."""
    if q.method == "mxfp4":
        kept = ["model.layers.*.self_attn", "model.layers.*.mlp.router"]
        kept += [] if q.converts("experts") else [ROLE_PATTERNS["experts"]]
        return {
            "modules_to_not_convert": [*kept, "model.embed_tokens", "lm_head"],
            "quant_method": "mxfp4",
        }
    out: dict[str, Any] = {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": list(q.block),
    }
    kept = [r for r in ROLES if not q.converts(r)]
    if "mlp" in kept:  # ``mlp`` keeps every feed-forward block, the experts with it
        kept = [r for r in kept if r not in ("shared_expert", "experts")]
    kept_roles = [ROLE_PATTERNS[r] for r in kept]
    if kept_roles:
        out["modules_to_not_convert"] = kept_roles
    return out
