"""Presets, aliases and config.json loading."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from cpmem.errors import ConfigError, InputError, UnknownModelError
from cpmem.model.hf_config import load_config
from cpmem.model.presets import PRESETS, get_preset


def test_presets_match_the_measured_geometry_table():
    g = get_preset("qwen3.5-27b")
    assert (g.hidden, g.ffn, g.layers, g.gdn_layers) == (5120, 17408, 64, 48)
    assert [i for i, k in enumerate(g.mixers) if k == "attention"][:3] == [3, 7, 11]
    moe = get_preset("qwen3.5-35b-a3b")
    assert (moe.num_experts, moe.moe_top_k, moe.expert_ffn, moe.shared_expert_ffn) == (
        256,
        8,
        512,
        512,
    )
    dense = get_preset("qwen3-1.7b")
    assert dense.gdn_layers == 0 and not dense.fused_swiglu and not dense.attention_output_gate


@pytest.mark.parametrize("alias", ["Qwen/Qwen3.8-27B", "qwen/qwen3.5-27b", "QWEN3.5-27B"])
def test_aliases(alias):
    assert get_preset(alias).name == "qwen3.5-27b"


def test_unknown_model_names_value():
    with pytest.raises(UnknownModelError, match="model='llama-9000'"):
        get_preset("llama-9000")


def _qwen35_27b_config(nested: bool) -> dict:
    text = {
        "model_type": "qwen3_5_text",
        "hidden_size": 5120,
        "intermediate_size": 17408,
        "num_hidden_layers": 64,
        "num_attention_heads": 24,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "attn_output_gate": True,
        "layer_types": [
            "linear_attention",
            "linear_attention",
            "linear_attention",
            "full_attention",
        ]
        * 16,
        "linear_num_key_heads": 16,
        "linear_key_head_dim": 128,
        "linear_num_value_heads": 48,
        "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4,
        "vocab_size": 248320,
        "mtp_num_hidden_layers": 1,
    }
    if nested:
        return {"model_type": "qwen3_5", "text_config": text, "tie_word_embeddings": False}
    return {**text, "model_type": "qwen3_5"}


@pytest.mark.parametrize("nested", [True, False])
def test_qwen3_5_config_equals_preset(nested):
    g = load_config(_qwen35_27b_config(nested), name="qwen3.5-27b")
    assert replace(g, aliases=()) == replace(PRESETS["qwen3.5-27b"], aliases=())


def test_qwen3_next_moe_with_interval(tmp_path):
    cfg = {
        "model_type": "qwen3_next",
        "hidden_size": 2048,
        "num_hidden_layers": 48,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "full_attention_interval": 4,
        "linear_num_key_heads": 16,
        "linear_key_head_dim": 128,
        "linear_num_value_heads": 32,
        "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4,
        "num_experts": 512,
        "num_experts_per_tok": 10,
        "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "vocab_size": 151936,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    g = load_config(path)
    assert g.name == tmp_path.name
    assert (g.gdn_layers, g.attention_layers, g.moe_layers) == (36, 12, 48)
    assert g.fused_swiglu and g.attention_output_gate


def test_qwen3_dense_defaults_unfused():
    cfg = {
        "model_type": "qwen3",
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
    }
    g = load_config(cfg, name="qwen3-1.7b")
    assert replace(g, aliases=()) == replace(PRESETS["qwen3-1.7b"], aliases=())
    assert load_config(cfg, fused_swiglu=True).fused_swiglu


def test_llama_head_dim_derived():
    cfg = {
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
    }
    g = load_config(cfg)
    assert g.head_dim == 128 and g.gdn_layers == 0 and not g.fused_swiglu


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (
            lambda c: c["text_config"].__setitem__("linear_num_value_heads", "48"),
            "linear_num_value_heads",
        ),
        (lambda c: c["text_config"].__setitem__("layer_types", ["full_attention"]), "layer_types"),
        (lambda c: c["text_config"]["layer_types"].__setitem__(5, "mamba"), "layer_types[5]"),
        (lambda c: c["text_config"].__setitem__("model_type", "gpt2"), "model_type"),
    ],
)
def test_config_errors_name_the_field(mutate, field):
    cfg = _qwen35_27b_config(nested=True)
    mutate(cfg)
    if field == "model_type":
        cfg["model_type"] = "gpt2"
        cfg["text_config"].pop("layer_types")
    with pytest.raises(ConfigError) as err:
        load_config(cfg)
    assert err.value.field == field


def test_a_flat_config_names_a_missing_field():
    """A config that is not a wrapper's text_config is read as written: a missing size is
    named, not guessed."""
    cfg = _qwen35_27b_config(nested=False)
    cfg.pop("hidden_size")
    with pytest.raises(ConfigError) as err:
        load_config(cfg)
    assert err.value.field == "hidden_size"


def test_malformed_config_file(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_config(path)
    with pytest.raises(ConfigError, match="file not found"):
        load_config(tmp_path / "missing.json")


@pytest.mark.parametrize(
    ("model", "tp", "message"),
    [("qwen3-1.7b", 3, "q_heads"), ("qwen3.5-27b", 16, "q_heads"), ("qwen3.5-27b", 8, None)],
)
def test_check_tp(model, tp, message):
    g = get_preset(model)
    if message is None:
        g.check_tp(tp)  # 24 q heads, 4 kv groups (replicated), 16/48 GDN heads: fine
    else:
        with pytest.raises(InputError, match=message):
            g.check_tp(tp)


def test_layer_kinds_count_every_layer_once():
    """The distinct (mixer, MLP) kinds sums and maxima over layers read: Qwen3.5-35B-A3B
    is 30 GDN and 10 attention layers, every one with routed experts; the 27B is dense
    with the same 3:1 interleave over 64 layers."""
    moe = get_preset("qwen3.5-35b-a3b")
    assert moe.layer_kinds == (("gdn", "moe", 30), ("attention", "moe", 10))
    dense = get_preset("qwen3.5-27b")
    assert dense.layer_kinds == (("gdn", "dense", 48), ("attention", "dense", 16))
    assert (dense.gdn_layers, dense.attention_layers, dense.moe_layers) == (48, 16, 0)
