"""Built-in geometries: the four models the golden measurements were taken on.

Source of every figure: the geometry table of the measured sources
(`golden/sources/README.md`). ``Qwen/Qwen3.8-27B`` is the name the measurements
recorded for the Qwen3.5-27B geometry. ``max_position_embeddings`` is each model's
published ``config.json`` value (Qwen3-1.7B 40,960; the Qwen3.5 hybrids 262,144).
"""

from __future__ import annotations

from cpmem.errors import UnknownModelError
from cpmem.model.geometry import ModelGeometry, hybrid_layout

PRESETS: dict[str, ModelGeometry] = {
    g.name: g
    for g in (
        ModelGeometry(
            name="qwen3.5-27b",
            aliases=("Qwen/Qwen3.5-27B", "Qwen/Qwen3.8-27B"),
            hidden=5120,
            ffn=17408,
            mixers=hybrid_layout(64, 4),
            mlps=("dense",) * 64,
            q_heads=24,
            kv_groups=4,
            head_dim=256,
            attention_output_gate=True,
            gdn_key_heads=16,
            gdn_key_dim=128,
            gdn_value_heads=48,
            gdn_value_dim=128,
            gdn_conv_kernel=4,
            fused_swiglu=True,
            vocab=248320,
            max_position_embeddings=262144,
        ),
        ModelGeometry(
            name="qwen3.5-4b",
            aliases=("Qwen/Qwen3.5-4B",),
            hidden=2560,
            ffn=9216,
            mixers=hybrid_layout(32, 4),
            mlps=("dense",) * 32,
            q_heads=16,
            kv_groups=4,
            head_dim=256,
            attention_output_gate=True,
            gdn_key_heads=16,
            gdn_key_dim=128,
            gdn_value_heads=32,
            gdn_value_dim=128,
            gdn_conv_kernel=4,
            fused_swiglu=True,
            vocab=248320,
            tied_embeddings=True,
            max_position_embeddings=262144,
        ),
        ModelGeometry(
            name="qwen3.5-35b-a3b",
            aliases=("Qwen/Qwen3.5-35B-A3B",),
            hidden=2048,
            mixers=hybrid_layout(40, 4),
            mlps=("moe",) * 40,
            q_heads=16,
            kv_groups=2,
            head_dim=256,
            attention_output_gate=True,
            gdn_key_heads=16,
            gdn_key_dim=128,
            gdn_value_heads=32,
            gdn_value_dim=128,
            gdn_conv_kernel=4,
            num_experts=256,
            moe_top_k=8,
            expert_ffn=512,
            shared_expert_ffn=512,
            fused_swiglu=True,
            vocab=248320,
            max_position_embeddings=262144,
        ),
        ModelGeometry(
            name="qwen3-1.7b",
            aliases=("Qwen/Qwen3-1.7B",),
            hidden=2048,
            ffn=6144,
            mixers=("attention",) * 28,
            mlps=("dense",) * 28,
            q_heads=16,
            kv_groups=8,
            head_dim=128,
            attention_output_gate=False,
            fused_swiglu=False,
            vocab=151936,
            tied_embeddings=True,
            max_position_embeddings=40960,
        ),
    )
}

_BY_KEY: dict[str, ModelGeometry] = {}
for _g in PRESETS.values():
    for _key in (_g.name, *_g.aliases):
        _BY_KEY[_key.lower()] = _g


def get_preset(name: str) -> ModelGeometry:
    """Look up a preset by name or recorded Hugging Face id (case-insensitive)."""
    try:
        return _BY_KEY[name.strip().lower()]
    except (KeyError, AttributeError):
        known = ", ".join(sorted(PRESETS))
        raise UnknownModelError(
            "model", name, f"unknown model; built-in presets are {known} (or pass --config)"
        ) from None
