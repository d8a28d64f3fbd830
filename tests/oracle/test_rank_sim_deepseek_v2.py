"""Rank simulator against ``tight`` for DeepSeek-V2's layer.

The simulator reads no ``deepseek_v2`` config, but the layer is one it runs with its
existing switches, set here on the model it reads from the same config as
``deepseek_v3`` (``oracles/rank_sim/geometry.py``' ``SimModel``):

- ``DeepseekV2Attention`` is ``DeepseekV3Attention``'s latent attention (a null
  ``q_lora_rank``: a plain query projection, as Moonlight's);
- ``DeepseekV2Moe`` scores every expert with a softmax before the top-k and never
  renormalises (``router_pre_softmax``, ``scoring_func`` softmax, no correction bias),
  its shared experts ungated, the MoE block from ``first_k_dense_replace`` on.

Per-layer elements per token are the difference between 3 and 2 layers of one label's
retained bytes (layer 0 dense, layers 1 and 2 MoE). The terms set aside are the ones
tests/oracle/test_rank_sim_post_norms.py names: the simulator's rank-1 adapters and each
norm's fp32 rstd, which tight leaves to its fitted margin on ART's runtime. Tight's
latent attention holds no ``UNGATED_RUNTIME_Q`` query copy (its widths here are the same
with ``runtime_q=0``), so none is set aside.
"""

from __future__ import annotations

import warnings
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from cpmem.model.geometry import ModelGeometry  # noqa: E402
from cpmem.model.hf_config import load_config  # noqa: E402
from oracles.rank_sim.geometry import SimModel, from_hf_config  # noqa: E402
from tests.oracle.family_layers import R, example_config, layer_per_token, tight_first_layer  # noqa: E402

warnings.filterwarnings("ignore")

SMALL = dict(
    hidden_size=1024,
    num_attention_heads=8,
    num_key_value_heads=8,
    kv_lora_rank=128,
    qk_nope_head_dim=64,
    qk_rope_head_dim=32,
    v_head_dim=64,
    n_routed_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=512,
    intermediate_size=2048,
)


def _models() -> tuple[SimModel, ModelGeometry]:
    cfg = example_config("deepseek-v2-lite", **SMALL)
    sim = replace(from_hf_config({**cfg, "model_type": "deepseek_v3"}), router_pre_softmax=True)
    assert sim.router_score == "softmax" and not sim.expert_score_bias
    assert sim.q_lora_rank == 0 and sim.shared_expert_ffn == 2 * 512
    assert not sim.shared_expert_gated and sim.mlp_kinds[:3] == ("dense", "moe", "moe")
    return sim, load_config(cfg, name="deepseek-v2-small")


def _per_token(model: SimModel, label: str, tp: int) -> float:
    return layer_per_token(model, label, tp, sp=tp > 1)


@pytest.mark.parametrize("tp", [1, 2])
def test_deepseek_v2_attention_is_the_simulated_one(tp: int) -> None:
    """Four rank-1 adapters' outputs (q, KV down, KV up, out: 4R) and two fp32 rstd (the
    input norm's and the KV norm's: 2 each per row, 1 each on the SP shard at TP 2)."""
    sim, g = _models()
    assert g.router_scoring == "softmax_topk" and g.q_lora_rank == 0
    rstd = 2 * (2 // tp)
    assert (
        _per_token(sim, "attention", tp) == tight_first_layer(g, tp).of("attention") + 4 * R + rstd
    )


def test_deepseek_v2_moe_block_is_within_a_fifth_of_a_percent_of_the_simulated_one() -> None:
    """The MoE block at TP 1 EP 1, 8 experts top-2 and two ungated shared experts of 512:
    the simulator keeps 15,432 elements per token, tight 15,408 (the softmax over every
    expert's E-wide fp32 scores included). The 24 left are not accounted term by term
    here (adapters', norms' and the router's small terms, as Qwen2-MoE's 21:
    tests/oracle/test_rank_sim_more_families.py); tight's fitted margin (x1.04) covers
    them."""
    sim, g = _models()
    simulated, priced = _per_token(sim, "moe", 1), tight_first_layer(g, 1).of("moe")
    assert (simulated, priced) == (15_432, 15_408)
    assert 0 <= simulated - priced <= 0.002 * simulated
