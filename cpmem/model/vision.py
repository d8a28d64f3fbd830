"""The vision tower of a multimodal wrapper's ``vision_config``: its parameter count, so an
estimate that leaves it out can say how large what it left out is.

cpmem prices a wrapper's language model (its ``text_config``): the measured Qwen3.5
runtime trains the text tower (its recorded baselines match cpmem's static memory within
1.7% without the vision tower). The tower is not priced; ``unpriced_vision`` names it with
its parameters, which ``cpmem.pricing.registry.inapplicable_options`` lists on every
estimate of the model.

The counts restate the modules transformers builds (``cpmem.model.hf_families``' commits),
each a field of the ``vision_config`` with its config class's default where absent:

- ``qwen3_5`` (``Qwen3_5VisionModel``, and ``Qwen3_5MoeVisionModel`` alike, defaults of
  ``Qwen3_5VisionConfig``): the patch embedding ``Conv3d(C, D, (T, P, P), bias=True)``, the
  learned positions ``Embedding(N_pos, D)``, ``depth`` blocks (two ``LayerNorm(D)``, a
  ``qkv`` ``Linear(D, 3D)`` and a ``proj`` ``Linear(D, D)``, an MLP ``Linear(D, I)``,
  ``Linear(I, D)``, all biased), and the merger (``LayerNorm(D)``, ``Linear(M, M)``,
  ``Linear(M, out_hidden_size)`` with ``M = D x spatial_merge_size^2``); no deepstack
  mergers and no parameters in the rotary embedding.
- ``siglip`` (Gemma 3: ``SiglipVisionModel`` with ``SiglipVisionConfig``'s defaults, and
  ``Gemma3MultiModalProjector``): the patch embedding ``Conv2d(C, D, P, bias=True)``, the
  positions ``Embedding((image_size / P)^2, D)``, ``num_hidden_layers`` encoder layers (two
  ``LayerNorm(D)``, q/k/v/out ``Linear(D, D)``, ``fc1``/``fc2``, all biased), the
  ``post_layernorm``, the attention-pooling head where ``vision_use_head`` is not false
  (``SiglipMultiheadAttentionPoolingHead``: the probe, ``nn.MultiheadAttention``, a
  ``LayerNorm`` and an MLP), and the projector's ``mm_input_projection_weight``
  (``D x text hidden``) and ``mm_soft_emb_norm`` (``D``).

Fields of the ``vision_config`` that change no count (heads, activation, token ids) are
not read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cpmem.errors import ConfigError

QWEN3_5_VISION_DEFAULTS = {
    "depth": 27,
    "hidden_size": 1152,
    "intermediate_size": 4304,
    "in_channels": 3,
    "patch_size": 16,
    "temporal_patch_size": 2,
    "spatial_merge_size": 2,
    "out_hidden_size": 3584,
    "num_position_embeddings": 2304,
}
"""``Qwen3_5VisionConfig``'s defaults (configuration_qwen3_5.py)."""

SIGLIP_VISION_DEFAULTS = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_channels": 3,
    "image_size": 224,
    "patch_size": 16,
}
"""``SiglipVisionConfig``'s defaults (configuration_siglip.py), which ``Gemma3Config``
completes its ``vision_config`` with."""


def _size(vision: Mapping[str, Any], defaults: Mapping[str, int], key: str) -> int:
    value = vision.get(key, defaults[key])
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"vision_config.{key}", value, "must be a positive integer")
    return value


def _linear(n_in: int, n_out: int) -> int:
    return n_in * n_out + n_out


def qwen3_5_vision_parameters(vision: Mapping[str, Any]) -> int:
    """``Qwen3_5VisionModel``'s parameters for ``vision`` (its ``vision_config``)."""

    def size(key: str) -> int:
        return _size(vision, QWEN3_5_VISION_DEFAULTS, key)

    d, inner = size("hidden_size"), size("intermediate_size")
    patch = size("in_channels") * size("temporal_patch_size") * size("patch_size") ** 2
    block = 2 * 2 * d + _linear(d, 3 * d) + _linear(d, d) + _linear(d, inner) + _linear(inner, d)
    merged = d * size("spatial_merge_size") ** 2
    merger = 2 * d + _linear(merged, merged) + _linear(merged, size("out_hidden_size"))
    embeddings = patch * d + d + size("num_position_embeddings") * d
    return embeddings + size("depth") * block + merger


def siglip_vision_parameters(vision: Mapping[str, Any], text_hidden: int) -> int:
    """Gemma 3's ``SiglipVisionModel`` and ``Gemma3MultiModalProjector`` parameters for
    ``vision`` (its ``vision_config``) under a language model of width ``text_hidden``."""

    def size(key: str) -> int:
        return _size(vision, SIGLIP_VISION_DEFAULTS, key)

    d, inner, patch = size("hidden_size"), size("intermediate_size"), size("patch_size")
    positions = (size("image_size") // patch) ** 2
    embeddings = size("num_channels") * patch * patch * d + d + positions * d
    mlp = _linear(d, inner) + _linear(inner, d)
    layer = 2 * 2 * d + 4 * _linear(d, d) + mlp
    use_head = vision.get("vision_use_head", True)
    if not isinstance(use_head, bool):
        raise ConfigError("vision_config.vision_use_head", use_head, "must be true or false")
    head = d + _linear(d, 3 * d) + _linear(d, d) + 2 * d + mlp if use_head else 0
    projector = d * text_hidden + d
    return embeddings + size("num_hidden_layers") * layer + 2 * d + head + projector


def unpriced_vision(kind: str, vision: Any, text_hidden: int) -> str:
    """The ``unpriced_parts`` entry naming a wrapper's vision tower and its size."""
    if not isinstance(vision, dict):
        raise ConfigError("vision_config", vision, "must be a JSON object")
    if kind == "qwen3_5":
        n = qwen3_5_vision_parameters(vision)
    else:
        n = siglip_vision_parameters(vision, text_hidden)
    return (
        f"vision_config: the vision tower ({n:,} parameters, {2 * n / 2**30:.2f} GiB in bf16) "
        "is not priced: cpmem prices the language model of text_config, as a runtime that "
        "trains the text tower alone holds it"
    )
