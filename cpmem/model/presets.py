"""Built-in geometries: the four models the golden measurements were taken on, and one or
two published models of each family cpmem prices without a measurement.

Source of the measured four's figures: the geometry table of the measured sources
(`golden/sources/README.md`). The others restate their published ``config.json``
(`examples/<name>/config.json`, which a test reads back to the same geometry; their
parameter totals are held to the published model cards there too). ``Qwen/Qwen3.8-27B`` is the name the measurements
recorded for the Qwen3.5-27B geometry. ``max_position_embeddings`` is each model's
published ``config.json`` value (Qwen3-1.7B 40,960; the Qwen3.5 hybrids 262,144).

Each holds the multi-token-prediction layers its published checkpoint holds (Qwen3.5's
``mtp_num_hidden_layers: 1``, DeepSeek-V3's ``num_nextn_predict_layers: 1``); a runtime
that does not build them, as ART's trainer does not (``Runtime.builds_mtp``), prices the
model without them, as its measured cells were run. DeepSeek-V3, Kimi-K2 and gpt-oss hold
the quantization their checkpoints are published in (``FP8_BLOCK_128``, ``GPT_OSS_MXFP4``).
"""

from __future__ import annotations

from cpmem.errors import UnknownModelError
from cpmem.model.geometry import MixerKind, MlpKind, ModelGeometry, hybrid_layout, sliding_layout
from cpmem.model.quantization import read_quantization

FP8_BLOCK_128 = read_quantization(
    {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": [128, 128],
    }
)
"""The ``quantization_config`` of deepseek-ai/DeepSeek-V3 and moonshotai/Kimi-K2-Instruct."""

GPT_OSS_MXFP4 = read_quantization(
    {
        "modules_to_not_convert": [
            "model.layers.*.self_attn",
            "model.layers.*.mlp.router",
            "model.embed_tokens",
            "lm_head",
        ],
        "quant_method": "mxfp4",
    }
)
"""The ``quantization_config`` of openai/gpt-oss-20b (and -120b)."""


def _hybrid_pattern(pattern: str) -> tuple[tuple[MixerKind, ...], tuple[MlpKind, ...]]:
    """A Nemotron-H ``hybrid_override_pattern``'s layers: ``M`` Mamba-2, ``*`` attention,
    ``-`` an MLP, ``E`` an MoE block, one sub-layer each (``cpmem.model.hf_nemotron``)."""
    kinds: dict[str, tuple[MixerKind, MlpKind]] = {
        "M": ("mamba", "none"),
        "*": ("attention", "none"),
        "-": ("none", "dense"),
        "E": ("none", "moe"),
    }
    layers = [kinds[c] for c in pattern]
    return tuple(k[0] for k in layers), tuple(k[1] for k in layers)


NEMOTRON_3_NANO = _hybrid_pattern("MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME")
"""NVIDIA-Nemotron-3-Nano-30B-A3B's published ``hybrid_override_pattern``: 23 Mamba-2,
23 MoE and 6 attention layers."""

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
            mtp_mixers=("attention",),
            mtp_mlps=("dense",),
            mtp_depths=1,
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
            mtp_mixers=("attention",),
            mtp_mlps=("dense",),
            mtp_depths=1,
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
            mtp_mixers=("attention",),
            mtp_mlps=("moe",),
            mtp_depths=1,
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
        ModelGeometry(
            name="qwen3-30b-a3b",
            aliases=("Qwen/Qwen3-30B-A3B",),
            family="qwen3_moe",
            hidden=2048,
            mixers=("attention",) * 48,
            mlps=("moe",) * 48,
            q_heads=32,
            kv_groups=4,
            head_dim=128,
            num_experts=128,
            moe_top_k=8,
            expert_ffn=768,
            fused_swiglu=False,
            vocab=151936,
            max_position_embeddings=40960,
        ),
        ModelGeometry(
            name="gpt-oss-20b",
            aliases=("openai/gpt-oss-20b",),
            family="gpt_oss",
            hidden=2880,
            mixers=("attention",) * 24,
            mlps=("moe",) * 24,
            q_heads=64,
            kv_groups=8,
            head_dim=64,
            windows=sliding_layout(24, 128, 2),
            qk_norm=False,
            attention_bias=True,
            attention_sinks=True,
            num_experts=32,
            moe_top_k=4,
            expert_ffn=2880,
            mlp_bias=True,
            router_bias=True,
            fused_swiglu=False,
            activation_clamp=7.0,
            vocab=201088,
            max_position_embeddings=131072,
            quantization=GPT_OSS_MXFP4,
        ),
        ModelGeometry(
            name="gemma-3-12b",
            aliases=("google/gemma-3-12b-pt",),
            family="gemma3_text",
            hidden=3840,
            ffn=15360,
            mixers=("attention",) * 48,
            mlps=("dense",) * 48,
            q_heads=16,
            kv_groups=8,
            head_dim=256,
            windows=sliding_layout(48, 1024, 6),
            sandwich_norms=True,
            fused_swiglu=False,
            vocab=262208,
            tied_embeddings=True,
            max_position_embeddings=131072,
        ),
        ModelGeometry(
            name="gemma-2-9b",
            aliases=("google/gemma-2-9b",),
            family="gemma2",
            hidden=3584,
            ffn=14336,
            mixers=("attention",) * 42,
            mlps=("dense",) * 42,
            q_heads=16,
            kv_groups=8,
            head_dim=256,
            windows=sliding_layout(42, 4096, 2),
            sandwich_norms=True,
            qk_norm=False,
            final_logit_softcap=30.0,
            fused_swiglu=False,
            vocab=256000,
            tied_embeddings=True,
            max_position_embeddings=8192,
        ),
        ModelGeometry(
            name="deepseek-v3",
            aliases=("deepseek-ai/DeepSeek-V3",),
            family="deepseek_v3",
            hidden=7168,
            ffn=18432,
            mixers=("attention",) * 61,
            mlps=("dense",) * 3 + ("moe",) * 58,
            q_heads=128,
            kv_groups=128,
            head_dim=192,
            qk_norm=False,
            q_lora_rank=1536,
            kv_lora_rank=512,
            qk_rope_head_dim=64,
            qk_nope_head_dim=128,
            v_head_dim=128,
            num_experts=256,
            moe_top_k=8,
            expert_ffn=2048,
            shared_expert_ffn=2048,
            shared_expert_gate=False,
            router_scoring="sigmoid",
            fused_swiglu=False,
            vocab=129280,
            max_position_embeddings=163840,
            mtp_mixers=("attention",),
            mtp_mlps=("moe",),
            mtp_depths=1,
            quantization=FP8_BLOCK_128,
        ),
        ModelGeometry(
            name="kimi-k2",
            aliases=("moonshotai/Kimi-K2-Instruct", "moonshotai/Kimi-K2-Base"),
            family="kimi_k2",
            hidden=7168,
            ffn=18432,
            mixers=("attention",) * 61,
            mlps=("dense",) + ("moe",) * 60,
            q_heads=64,
            kv_groups=64,
            head_dim=192,
            qk_norm=False,
            q_lora_rank=1536,
            kv_lora_rank=512,
            qk_rope_head_dim=64,
            qk_nope_head_dim=128,
            v_head_dim=128,
            num_experts=384,
            moe_top_k=8,
            expert_ffn=2048,
            shared_expert_ffn=2048,
            shared_expert_gate=False,
            router_scoring="sigmoid",
            fused_swiglu=False,
            vocab=163840,
            max_position_embeddings=131072,
            quantization=FP8_BLOCK_128,
        ),
        ModelGeometry(
            name="moonlight-16b-a3b",
            aliases=("moonshotai/Moonlight-16B-A3B",),
            family="deepseek_v3",
            hidden=2048,
            ffn=11264,
            mixers=("attention",) * 27,
            mlps=("dense",) + ("moe",) * 26,
            q_heads=16,
            kv_groups=16,
            head_dim=192,
            qk_norm=False,
            kv_lora_rank=512,
            qk_rope_head_dim=64,
            qk_nope_head_dim=128,
            v_head_dim=128,
            num_experts=64,
            moe_top_k=6,
            expert_ffn=1408,
            shared_expert_ffn=2816,
            shared_expert_gate=False,
            router_scoring="sigmoid",
            fused_swiglu=False,
            vocab=163840,
            max_position_embeddings=8192,
        ),
        ModelGeometry(
            name="nemotron-3-nano-30b-a3b",
            aliases=("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",),
            family="nemotron_h",
            hidden=2688,
            mixers=NEMOTRON_3_NANO[0],
            mlps=NEMOTRON_3_NANO[1],
            q_heads=32,
            kv_groups=2,
            head_dim=128,
            qk_norm=False,
            positions="none",
            gated_mlp=False,
            mamba_heads=64,
            mamba_head_dim=64,
            mamba_state_dim=128,
            mamba_groups=8,
            mamba_conv_kernel=4,
            mamba_chunk=128,
            num_experts=128,
            moe_top_k=6,
            expert_ffn=1856,
            shared_expert_ffn=3712,
            shared_expert_gate=False,
            router_scoring="sigmoid",
            fused_swiglu=False,
            vocab=131072,
            max_position_embeddings=262144,
        ),
    )
}

MEASURED = ("qwen3.5-27b", "qwen3.5-4b", "qwen3.5-35b-a3b", "qwen3-1.7b")
"""The presets the golden cells were measured on; the others are priced by structure only
(their layers checked by the rank simulator's grid, golden/simulated/)."""

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
