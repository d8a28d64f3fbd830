"""The model families cpmem reads from a Hugging Face config: each family's published
config reads back to its preset, its parameter total is the published one, its layer
pattern follows the family's rule, and no other family (nor any field cpmem does not
read) is priced by accident."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path

import pytest

from cpmem.errors import ConfigError
from cpmem.model.hf_config import load_config
from cpmem.model.hf_fields import FAMILIES
from cpmem.model.presets import MEASURED, PRESETS
from cpmem.pricing.weights import total_parameters

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"

UNMEASURED = [name for name in PRESETS if name not in MEASURED]


def _example(name: str) -> dict:
    return json.loads((EXAMPLES / name / "config.json").read_text())


@pytest.mark.parametrize("name", UNMEASURED)
def test_example_config_reads_back_to_its_preset(name):
    geometry = load_config(EXAMPLES / name / "config.json", name=name)
    assert replace(geometry, aliases=()) == replace(PRESETS[name], aliases=())
    assert geometry.family == PRESETS[name].family != ""


# Published totals (model cards and papers), in billions, with the tolerance of their
# rounding, of the model without its multi-token-prediction layers (the figure cards
# publish; tests/unit/model/test_published_totals.py holds them with MTP where published):
# Qwen3-30B-A3B "30.5B in total"; gpt-oss-20b 20.91B (OpenAI's gpt-oss model
# card, table of parameter counts); Gemma 2 9B 0.918B embedding + 8.32B non-embedding
# (Gemma 2 report, table 2); DeepSeek-V3 "671B total parameters" (its report; the 685B of
# the checkpoint include the 14B multi-token-prediction module); Moonlight-16B-A3B "16B";
# Gemma 3 12B "12B" with a 0.4B SigLIP vision
# tower the text config leaves out. Kimi-K2: the model card's "1T" total, 61 layers of
# which 1 dense, 384 experts of 2,048 and one shared, 64 heads, a 160K vocabulary: 60 x 384
# experts of 3 x 7,168 x 2,048 are 1,014.7B, the attention 6.2B, the embedding and head
# 2.3B: 1,026.4B counted from that table (the technical report, arXiv 2507.20534, says 1.04T).
# Nemotron-3-Nano-30B-A3B: 31.6B total (its technical report, arXiv 2512.20848).
# phi-4: 14.7B (microsoft/phi-4's model page, the safetensors' count); Mixtral-8x7B: 46.7B
# total (Mistral AI's announcement and model card); GLM-4.5-Air: "106 billion total
# parameters" (zai-org's model card; held within 1%: 0.8% over, the model without its MTP
# layer); OLMo-2-1124-7B and Olmo-3-1025-7B: 7.3B (their model pages' safetensors counts).
PUBLISHED = {
    "qwen3-30b-a3b": (30.5, 0.05),
    "gpt-oss-20b": (20.91, 0.01),
    "gemma-2-9b": (0.918 + 8.32, 0.01),
    "deepseek-v3": (671, 0.5),
    "moonlight-16b-a3b": (16, 0.1),
    "kimi-k2": (1026.4, 0.5),
    "gemma-3-12b": (12 - 0.4, 0.25),
    "nemotron-3-nano-30b-a3b": (31.6, 0.05),
    "phi-4": (14.7, 0.05),
    "mixtral-8x7b": (46.7, 0.05),
    "glm-4.5-air": (106, 1.06),
    "olmo-2-7b": (7.3, 0.05),
    "olmo-3-7b": (7.3, 0.05),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_total_is_the_published_one(name):
    billions, tolerance = PUBLISHED[name]
    total = total_parameters(PRESETS[name], mtp=False)
    assert total / 1e9 == pytest.approx(billions, abs=tolerance)


def test_every_unmeasured_preset_has_a_published_total():
    assert set(PUBLISHED) == set(UNMEASURED)


def test_layer_patterns_follow_each_family():
    gemma3 = PRESETS["gemma-3-12b"]
    assert [i for i, w in enumerate(gemma3.windows) if w == 0][:3] == [5, 11, 17]
    assert set(gemma3.windows) == {0, 1024}
    gemma2 = PRESETS["gemma-2-9b"]
    assert gemma2.windows[:4] == (4096, 0, 4096, 0)  # even layers slide (transformers' rule)
    oss = PRESETS["gpt-oss-20b"]
    assert oss.windows[:2] == (128, 0) and oss.moe_layers == 24 and oss.activation_clamp == 7.0
    v3 = PRESETS["deepseek-v3"]
    assert v3.mlps[:4] == ("dense", "dense", "dense", "moe") and v3.moe_layers == 58
    assert v3.is_mla and v3.head_dim == 192 and v3.kv_pair_width == 128 * (192 + 128)
    moonlight = PRESETS["moonlight-16b-a3b"]
    assert moonlight.q_lora_rank == 0 and moonlight.shared_expert_ffn == 2 * 1408
    kimi = PRESETS["kimi-k2"]
    assert kimi.mlps[:2] == ("dense", "moe") and kimi.moe_layers == 60 and kimi.is_mla


def test_qwen3_moe_dense_layers_and_sliding_window():
    cfg = _example("qwen3-30b-a3b")
    cfg["mlp_only_layers"] = [0, 47]
    assert load_config(cfg).mlps[:2] == ("dense", "moe")
    cfg["mlp_only_layers"] = []
    cfg["decoder_sparse_step"] = 2
    assert load_config(cfg).mlps[:2] == ("dense", "moe")
    cfg = _example("qwen3-30b-a3b")
    cfg.update(use_sliding_window=True, sliding_window=4096, max_window_layers=40)
    windows = load_config(cfg).windows
    assert windows[39] == 0 and windows[40] == 4096


def test_unknown_family_refused_even_with_layer_types():
    cfg = {
        "model_type": "falcon_h1",
        "hidden_size": 1024,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "intermediate_size": 4096,
        "vocab_size": 32000,
        "layer_types": ["full_attention", "full_attention"],
    }
    with pytest.raises(ConfigError) as err:
        load_config(cfg)
    assert err.value.field == "model_type"
    for family in ("gemma3_text", "gpt_oss", "qwen3_moe", "deepseek_v3", "llama"):
        assert family in str(err.value)
    assert "falcon_h1" not in FAMILIES


@pytest.mark.parametrize(
    ("example", "mutate", "field"),
    [
        # an MoE field on a dense family: its experts would be priced as a dense MLP
        ("llama-3.1-8b-style", lambda c: c.__setitem__("num_experts", 8), "num_experts"),
        # a vision tower outside a multimodal wrapper
        ("gemma-3-12b", lambda c: c.__setitem__("vision_config", {}), "vision_config"),
        # a wrapper cpmem does not read, around a text config it does
        (
            "gemma-3-12b",
            lambda c: c.update(model_type="paligemma", text_config=copy.deepcopy(c)),
            "model_type",
        ),
        (
            "gpt-oss-20b",
            lambda c: c.__setitem__("quantization_config", {}),
            "quantization_config.quant_method",
        ),
        ("qwen3-1.7b", lambda c: c.__setitem__("attention_dropout", 0.1), "attention_dropout"),
        ("qwen3-30b-a3b", lambda c: c.__setitem__("n_routed_experts", 64), "n_routed_experts"),
        ("gemma-2-9b", lambda c: c.__setitem__("hidden_activation", "relu"), "hidden_activation"),
        ("deepseek-v3", lambda c: c.__setitem__("attention_bias", True), "attention_bias"),
        ("gemma-3-12b", lambda c: c.__setitem__("some_new_field", 1), "some_new_field"),
        (
            "kimi-k2",
            lambda c: c.__setitem__("quantization_config", {"quant_method": "fp8"}),
            "quantization_config.weight_block_size",  # per-tensor fp8: not priced
        ),
    ],
)
def test_fields_cpmem_does_not_read_are_refused_by_name(example, mutate, field):
    cfg = _example(example)
    mutate(cfg)
    with pytest.raises(ConfigError) as err:
        load_config(cfg)
    assert err.value.field == field


def test_gemma3_text_config_nested_without_a_vision_tower_reads():
    text = _example("gemma-3-12b")
    wrapped = {"model_type": "gemma3", "text_config": text, "architectures": ["x"]}
    geometry = load_config(wrapped, name="gemma-3-12b")
    assert replace(geometry, aliases=()) == replace(PRESETS["gemma-3-12b"], aliases=())


@pytest.mark.parametrize(
    ("family", "reason"),
    [
        ("smollm3", "no_rope_layers"),
        ("llama4_text", "no_rope_layers"),
        ("granite", "logits"),
        ("ernie4_5_moe", "e_score_correction_bias"),
    ],
)
def test_a_surveyed_family_cpmem_does_not_price_is_refused_with_its_reason(family, reason):
    """SmolLM3Config's and Llama4TextConfig's no_rope_layers, Granite's logits_scaling,
    ERNIE 4.5 MoE's bias-chosen, renormalised softmax router: layers no kind of cpmem's
    expresses; the refusal names the family and why."""
    cfg = {**_example("llama-3.1-8b-style"), "model_type": family}
    with pytest.raises(ConfigError) as err:
        load_config(cfg)
    assert err.value.field == "model_type" and family not in FAMILIES
    assert "not priced" in str(err.value) and reason in str(err.value)
