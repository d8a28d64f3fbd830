"""The ``nemotron_h`` family and the MTP layers of Hugging Face configs: the stack each
config gives, listed by hand from its pattern or fields, the Mamba-2 and MoE shapes, the
MTP depths (Nemotron-H's ``num_nextn_predict_layers``, DeepSeek-V3's, Qwen3.5's
``mtp_num_hidden_layers``), and the refusals.

Expected values: the published NVIDIA-Nemotron-3-Nano-30B-A3B ``config.json``
(``examples/nemotron-3-nano-30b-a3b``) and transformers' ``NemotronHConfig`` /
``modeling_nemotron_h.py`` (``cpmem.model.hf_nemotron`` cites the commit).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cpmem.errors import ConfigError
from cpmem.model.hf_config import load_config

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def _nano() -> dict[str, Any]:
    return json.loads((EXAMPLES / "nemotron-3-nano-30b-a3b" / "config.json").read_text())


def test_the_nano_pattern_is_its_stack() -> None:
    """'MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME': attention at 5, then every
    7th to 33, then 42; Mamba-2 and an MoE block alternating around them (23 each)."""
    g = load_config(_nano())
    attention = [5, 12, 19, 26, 33, 42]
    assert [i for i, m in enumerate(g.mixers) if m == "attention"] == attention
    mamba = [0, 2, 4, 7, 9, 11, 14, 16, 18, 21, 23, 25, 28, 30, 32, 35, 37, 39, 41, 44]
    mamba += [46, 48, 50]
    assert [i for i, m in enumerate(g.mixers) if m == "mamba"] == mamba
    moe = [i for i in range(52) if i not in attention and i not in mamba]
    assert [i for i, f in enumerate(g.mlps) if f == "moe"] == moe
    assert (len(mamba), len(moe), g.layers) == (23, 23, 52)
    assert all(g.mixers[i] == "none" for i in moe) and all(g.mlps[i] == "none" for i in mamba)


def test_the_nano_shapes() -> None:
    g = load_config(_nano())
    assert (g.mamba_heads, g.mamba_head_dim, g.mamba_groups) == (64, 64, 8)
    assert (g.mamba_state_dim, g.mamba_conv_kernel, g.mamba_chunk) == (128, 4, 128)
    assert (g.q_heads, g.kv_groups, g.head_dim, g.hidden) == (32, 2, 128, 2688)
    assert (g.num_experts, g.moe_top_k, g.expert_ffn, g.shared_expert_ffn) == (128, 6, 1856, 3712)
    # NemotronHMoE: DeepSeek-V3's sigmoid router, no shared-expert gate; relu2 MLPs (plain);
    # Jamba's attention: no rope, no q/k norm
    assert g.router_scoring == "sigmoid" and not g.shared_expert_gate
    assert not g.gated_mlp and g.positions == "none" and not g.qk_norm
    assert not g.tied_embeddings and g.ffn == 0 and g.mtp_depths == 0
    assert g.family == "nemotron_h"


def test_layers_block_type_reads_as_the_pattern() -> None:
    """``layers_block_type``, legacy names or NemotronHConfig's current ones (its
    ``_pattern_to_list`` maps 'M' to ``linear_attention``)."""
    cfg = _nano()
    names = {"M": "mamba", "E": "moe", "*": "attention", "-": "mlp"}
    listed = [names[c] for c in cfg.pop("hybrid_override_pattern")]
    assert load_config({**cfg, "layers_block_type": listed}) == load_config(_nano())
    current = ["linear_attention" if n == "mamba" else n for n in listed]
    current = ["full_attention" if n == "attention" else n for n in current]
    assert load_config({**cfg, "layers_block_type": current}) == load_config(_nano())


def test_mtp_depths_of_a_nemotron_config() -> None:
    """num_nextn_predict_layers 2 of ``mtp_layers_block_type`` (default: attention then
    MoE, NemotronHConfig)."""
    g = load_config({**_nano(), "num_nextn_predict_layers": 2})
    assert (g.mtp_mixers, g.mtp_mlps, g.mtp_depths) == (("attention", "none"), ("none", "moe"), 2)
    g = load_config({**_nano(), "num_nextn_predict_layers": 1, "mtp_hybrid_override_pattern": "*-"})
    assert (g.mtp_mixers, g.mtp_mlps) == (("attention", "none"), ("none", "dense"))


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"moe_latent_size": 1024}, "moe_latent_size"),
        ({"mlp_hidden_act": "silu"}, "mlp_hidden_act"),
        ({"num_hidden_layers": 51}, "num_hidden_layers"),
        ({"hybrid_override_pattern": "MEX"}, "hybrid_override_pattern"),
        ({"use_conv_bias": False}, "use_conv_bias"),
        ({"residual_in_fp32": True}, "residual_in_fp32"),
    ],
)
def test_what_nemotron_h_does_not_price_is_refused_by_name(
    changes: dict[str, Any], field: str
) -> None:
    with pytest.raises(ConfigError) as err:
        load_config({**_nano(), **changes})
    assert err.value.field == field


def test_deepseek_v3_s_mtp_depth_is_one_moe_layer() -> None:
    """num_nextn_predict_layers 1: the checkpoint's layer 61, past first_k_dense_replace
    (3): attention and an MoE block."""
    g = load_config(EXAMPLES / "deepseek-v3" / "config.json")
    assert (g.mtp_mixers, g.mtp_mlps, g.mtp_depths, g.mtp_shared) == (
        ("attention",),
        ("moe",),
        1,
        False,
    )
    kimi = load_config(EXAMPLES / "kimi-k2" / "config.json")  # num_nextn_predict_layers 0
    assert kimi.mtp_depths == 0 and kimi.mtp_mixers == ()


def test_qwen3_5_s_mtp_module_holds_its_layers() -> None:
    """mtp_num_hidden_layers: one MTP module of that many full-attention layers, dense on
    the dense Qwen3.5, MoE on the MoE ones."""
    g = load_config(EXAMPLES / "qwen3.5-4b" / "config.json")
    assert (g.mtp_mixers, g.mtp_mlps, g.mtp_depths) == (("attention",), ("dense",), 1)
    cfg = json.loads((EXAMPLES / "qwen3.5-4b" / "config.json").read_text())
    cfg["text_config"]["mtp_num_hidden_layers"] = 2
    g = load_config(cfg)
    assert (g.mtp_mixers, g.mtp_mlps, g.mtp_depths) == (("attention",) * 2, ("dense",) * 2, 1)
    cfg["text_config"]["mtp_use_dedicated_embeddings"] = True
    with pytest.raises(ConfigError) as err:
        load_config(cfg)
    assert err.value.field == "mtp_use_dedicated_embeddings"
