"""Multimodal wrappers (``gemma3``, ``qwen3_5``, ``qwen3_5_moe``) read as their language
model: the ``text_config`` completed with its config class's published defaults, the
wrapper's token fields accepted, the ``vision_config`` left out and named with its
parameters on every estimate."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from cpmem.api import estimate
from cpmem.errors import ConfigError
from cpmem.model.geometry import sliding_layout
from cpmem.model.hf_config import load_config
from cpmem.model.presets import PRESETS
from cpmem.model.vision import qwen3_5_vision_parameters, siglip_vision_parameters
from cpmem.pricing.weights import total_parameters

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"

GEMMA_3_4B = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "boi_token_index": 255999,
    "eoi_token_index": 256000,
    "eos_token_id": [1, 106],
    "image_token_index": 262144,
    "initializer_range": 0.02,
    "mm_tokens_per_image": 256,
    "model_type": "gemma3",
    "text_config": {
        "hidden_size": 2560,
        "intermediate_size": 10240,
        "model_type": "gemma3_text",
        "num_hidden_layers": 34,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024,
    },
    "torch_dtype": "bfloat16",
    "transformers_version": "4.50.0.dev0",
    "vision_config": {
        "hidden_size": 1152,
        "image_size": 896,
        "intermediate_size": 4304,
        "model_type": "siglip_vision_model",
        "num_attention_heads": 16,
        "num_hidden_layers": 27,
        "patch_size": 14,
        "vision_use_head": False,
    },
}
"""google/gemma-3-4b-pt's published config.json, written out from memory (the structure
Megatron-Bridge's Gemma 3 VL conversion test restates,
tests/functional_tests/test_groups/models/gemma_vl/test_gemma3_vl_conversion.py): its
text_config names only what differs from Gemma3TextConfig's defaults."""

QWEN3_5_4B_VISION = {
    "deepstack_visual_indexes": [],
    "depth": 24,
    "hidden_act": "gelu_pytorch_tanh",
    "hidden_size": 1024,
    "in_channels": 3,
    "initializer_range": 0.02,
    "intermediate_size": 4096,
    "model_type": "qwen3_5",
    "num_heads": 16,
    "num_position_embeddings": 2304,
    "out_hidden_size": 2560,
    "patch_size": 16,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
}
"""Qwen/Qwen3.5-4B's vision_config as recalled (a 24-layer tower of width 1,024 whose
merger projects to the language model's 2,560); not checked against the published file."""


def _qwen3_5_4b_wrapper() -> dict[str, Any]:
    cfg = json.loads((EXAMPLES / "qwen3.5-4b" / "config.json").read_text())
    cfg["text_config"]["mamba_ssm_dtype"] = "float32"
    cfg["text_config"]["mtp_use_dedicated_embeddings"] = False
    cfg.update(
        image_token_id=248056,
        video_token_id=248057,
        vision_start_token_id=248053,
        vision_end_token_id=248054,
        vision_config=copy.deepcopy(QWEN3_5_4B_VISION),
    )
    return cfg


def test_the_gemma_3_4b_wrapper_reads_with_its_text_config_defaults() -> None:
    """Gemma3TextConfig's defaults fill what the published text_config leaves out: 8 query
    and 4 KV heads of 256, the 262,208 vocabulary, tied embeddings, every 6th layer full."""
    g = load_config(GEMMA_3_4B, name="gemma-3-4b")
    assert (g.hidden, g.layers, g.ffn) == (2560, 34, 10240)
    assert (g.q_heads, g.kv_groups, g.head_dim, g.vocab) == (8, 4, 256, 262_208)
    assert g.tied_embeddings and g.qk_norm and g.sandwich_norms
    assert g.windows == sliding_layout(34, 1024, 6)
    assert g.max_position_embeddings == 131_072
    (part,) = g.unpriced_parts
    assert part.startswith("vision_config: the vision tower (419,816,304 parameters")


def test_gemma_3_4b_sizes_are_the_published_ones() -> None:
    """The Gemma 3 technical report (arXiv 2503.19786, table 1), 4B: a 417M vision
    encoder and 3,209M non-embedding parameters. The encoder is SigLIP without the
    projector (Gemma3MultiModalProjector: 1,152 x 2,560 and a 1,152 norm)."""
    g = load_config(GEMMA_3_4B)
    encoder = siglip_vision_parameters(GEMMA_3_4B["vision_config"], 2560) - (1152 * 2560 + 1152)
    assert encoder / 1e6 == pytest.approx(417, abs=0.5)
    non_embedding = total_parameters(g) - g.vocab * g.hidden
    assert non_embedding / 1e6 == pytest.approx(3209, abs=0.5)


def test_the_qwen3_5_4b_wrapper_reads_to_its_preset() -> None:
    g = load_config(_qwen3_5_4b_wrapper(), name="qwen3.5-4b")
    assert replace(g, aliases=()) == replace(PRESETS["qwen3.5-4b"], aliases=())
    (part,) = g.unpriced_parts
    assert part.startswith("vision_config: the vision tower (333,514,240 parameters")


def test_the_qwen3_5_vision_count_restates_the_modules() -> None:
    """Qwen3_5VisionModel at Qwen3.5-4B's sizes, module by module (modeling_qwen3_5.py):
    patch_embed Conv3d(3, 1024, (2, 16, 16)) + bias; pos_embed 2,304 x 1,024; 24 blocks of
    two LayerNorm(1024), qkv 1024 -> 3072, proj 1024 -> 1024, fc1 1024 -> 4096, fc2
    4096 -> 1024 (biased); the merger's LayerNorm(1024), 4096 -> 4096, 4096 -> 2560."""
    patch = 3 * 2 * 16 * 16 * 1024 + 1024
    positions = 2304 * 1024
    block = 4 * 1024 + (1024 * 3072 + 3072) + (1024 * 1024 + 1024)
    block += (1024 * 4096 + 4096) + (4096 * 1024 + 1024)
    merger = 2 * 1024 + (4096 * 4096 + 4096) + (4096 * 2560 + 2560)
    assert qwen3_5_vision_parameters(QWEN3_5_4B_VISION) == patch + positions + 24 * block + merger


def test_the_qwen3_5_27b_wrapper_reads_to_its_preset() -> None:
    """Qwen3.5-27B's wrapper: the 27-layer tower of width 1,152 is Qwen3_5VisionConfig's
    default but for its output width, the language model's 5,120."""
    text = {
        "model_type": "qwen3_5_text",
        "hidden_size": 5120,
        "intermediate_size": 17408,
        "num_hidden_layers": 64,
        "num_attention_heads": 24,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "linear_num_value_heads": 48,
        "max_position_embeddings": 262144,
        "mtp_num_hidden_layers": 1,
    }
    cfg = {"model_type": "qwen3_5", "text_config": text, "vision_config": {"out_hidden_size": 5120}}
    g = load_config(cfg, name="qwen3.5-27b")
    assert replace(g, aliases=()) == replace(PRESETS["qwen3.5-27b"], aliases=())
    assert len(g.unpriced_parts) == 1


def test_every_estimate_names_the_vision_tower() -> None:
    g = load_config(_qwen3_5_4b_wrapper(), name="qwen3.5-4b")
    for policy in ("reference", "tight"):
        est = estimate(g, [4096], policy=policy)
        assert g.unpriced_parts[0] in est.ignored_options
        assert (
            est.estimate_bytes
            == estimate(PRESETS["qwen3.5-4b"], [4096], policy=policy).estimate_bytes
        )
    assert "vision_config" in est.to_dict()["ignored_options"]


def test_a_wrapper_text_config_takes_the_class_defaults() -> None:
    """Qwen3_5TextConfig: hidden 4096, FFN 12288, 32 layers, 16/4 heads of 256, GDN 16/32
    heads of 128, a full-attention layer every 4th, vocabulary 248,320, untied."""
    g = load_config({"model_type": "qwen3_5", "text_config": {}})
    assert (g.hidden, g.ffn, g.layers, g.q_heads, g.kv_groups, g.head_dim) == (
        4096,
        12288,
        32,
        16,
        4,
        256,
    )
    assert (g.gdn_key_heads, g.gdn_value_heads, g.gdn_layers, g.vocab) == (16, 32, 24, 248_320)
    assert not g.tied_embeddings


def test_the_wrapper_and_its_text_config_must_agree() -> None:
    cfg = _qwen3_5_4b_wrapper()
    cfg["tie_word_embeddings"] = False
    with pytest.raises(ConfigError) as err:
        load_config(cfg)
    assert err.value.field == "tie_word_embeddings"
    cfg = _qwen3_5_4b_wrapper()
    cfg["text_config"]["model_type"] = "qwen3_5_moe_text"
    with pytest.raises(ConfigError) as err:
        load_config(cfg)
    assert err.value.field == "text_config.model_type"


@pytest.mark.parametrize(
    ("where", "field", "value"),
    [
        ("text_config", "mamba_ssm_dtype", "bfloat16"),
        ("text_config", "use_sliding_window", True),
        ("text_config", "sliding_window", 4096),
        ("text_config", "attn_output_gate", False),
        ("outer", "some_new_field", 1),
        ("outer", "hidden_size", 4096),  # the wrapper's sizes are its text_config's
        ("vision_config", "patch_size", [16, 16]),
    ],
)
def test_a_harmful_value_is_refused_by_name(where: str, field: str, value: Any) -> None:
    cfg = _qwen3_5_4b_wrapper()
    target = cfg if where == "outer" else cfg[where]
    target[field] = value
    with pytest.raises(ConfigError) as err:
        load_config(cfg)
    assert err.value.field in (field, f"vision_config.{field}")


def test_the_hybrids_published_sliding_fields_are_accepted() -> None:
    cfg = _qwen3_5_4b_wrapper()
    cfg["text_config"].update(use_sliding_window=False, sliding_window=None)
    assert load_config(cfg).windows == ()
