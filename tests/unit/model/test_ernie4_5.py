"""ERNIE 4.5's dense family (``ernie4_5``) read from its config.json: the example's
parameters counted by hand from ``modular_ernie4_5.py`` (huggingface/transformers at
``cpmem.model.hf_families.SOURCE_COMMITS``), the biases ``use_bias`` switches, and the
fields that describe another model refused by name. Every expected value is written out
here from the classes and the published card, never computed by cpmem."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cpmem.errors import ConfigError
from cpmem.model.hf_config import load_config
from cpmem.pricing.weights import total_parameters

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def _example() -> dict[str, Any]:
    return json.loads((EXAMPLES / "ernie-4.5-0.3b" / "config.json").read_text())


def test_ernie_4_5_0_3b_counts_as_its_card_states() -> None:
    """ERNIE-4.5-0.3B counted from Ernie4_5DecoderLayer: q 1,024 x 16 x 128, k and v
    1,024 x 2 x 128, o 16 x 128 x 1,024 (head_dim 128, not 1,024 / 16), the SwiGLU 3 x
    1,024 x 3,072, two norms; 18 layers, the final norm, the tied 103,424 x 1,024
    embedding: 360,748,032 (the card's "Params 0.36B")."""
    h, q, kv, f, vocab = 1024, 16 * 128, 2 * 128, 3072, 103424
    layer = h * q + 2 * h * kv + q * h + 3 * h * f + 2 * h
    g = load_config(EXAMPLES / "ernie-4.5-0.3b" / "config.json")
    assert total_parameters(g) == 18 * layer + h + vocab * h == 360_748_032
    assert g.tied_embeddings and g.head_dim == 128 and not g.qk_norm
    assert not g.attention_bias and not g.mlp_bias and g.windows == ()


def test_use_bias_switches_the_attention_and_mlp_biases() -> None:
    """Ernie4_5Attention's q/k/v/o and Ernie4_5MLP's gate/up/down take bias=use_bias:
    q 2,048 + k 256 + v 256 + o 1,024 + gate 3,072 + up 3,072 + down 1,024 = 10,752 a
    layer, 193,536 over 18 layers."""
    g = load_config({**_example(), "use_bias": True})
    assert g.attention_bias and g.mlp_bias
    assert total_parameters(g) - 360_748_032 == 18 * (2048 + 256 + 256 + 1024 + 2 * 3072 + 1024)


def test_absent_fields_are_the_config_class_defaults() -> None:
    """Ernie4_5Config: head_dim=128, tie_word_embeddings=True, use_bias=False."""
    cfg = _example()
    for key in ("head_dim", "tie_word_embeddings", "use_bias"):
        cfg.pop(key)
    g = load_config(cfg)
    assert g.head_dim == 128 and g.tied_embeddings and not g.attention_bias and not g.mlp_bias


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"attention_bias": True}, "attention_bias"),  # use_bias is the field
        ({"mlp_bias": True}, "mlp_bias"),
        ({"sliding_window": 4096}, "sliding_window"),  # not an Ernie4_5Config field
        ({"layer_types": ["full_attention"] * 18}, "layer_types"),
        ({"hidden_act": "gelu_new"}, "hidden_act"),
        ({"moe_num_experts": 64}, "moe_num_experts"),  # ERNIE 4.5 MoE's field
    ],
)
def test_ernie_4_5_refuses_another_layer_by_name(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config({**_example(), **changes})
    assert err.value.field == field
