"""Rank simulator: Gemma 2 / 3, multi-head latent attention and sliding windows under CP.

Every expected figure is the per-token accounting of oracles/rank_sim/README.md
("Gemma 2 and Gemma 3", "Multi-head latent attention", "Sliding windows under CP")
written out here in the config's numbers. Per-layer bytes are the difference between
3 and 2 layers of one label's retained bytes (the first layer's input carries no grad
and the last layer's output feeds the harness, so neither is a whole layer).
"""

from __future__ import annotations

import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from oracles.rank_sim.geometry import SimInputError, SimModel, from_hf_config, load_config  # noqa: E402
from oracles.rank_sim.layout import GdnPiece, RankLayout  # noqa: E402
from oracles.rank_sim.recompute import Recompute  # noqa: E402
from oracles.rank_sim.runner import simulate_rank  # noqa: E402

warnings.filterwarnings("ignore")

CONFIGS = Path(__file__).resolve().parents[2] / "golden" / "simulated" / "configs"
NONE = Recompute.parse("none", "")
R = 1  # the harness's LoRA rank, on every projection
BF16 = 2  # bytes


def _config(name: str) -> SimModel:
    return load_config(CONFIGS / f"{name}.json")


def _layout(tokens: int, tp: int = 1, cp: int = 1, rank: int = 0) -> RankLayout:
    counts = (tokens,) * cp
    return RankLayout(tp, cp, rank, counts, counts, (GdnPiece(tokens),), tokens * cp, True)


def _dense(model: SimModel, ffn: int) -> SimModel:
    """Every layer's MLP dense (the MoE layers are moe.py's, not these tests')."""
    return replace(model, moe=False, mlp_kinds=("dense",) * model.layers, ffn=ffn)


def _per_layer(model: SimModel, layout: RankLayout, label: str, **kw: Any) -> int:
    """Retained bytes of ``label`` that one more layer adds."""
    got = [
        simulate_rank(model.truncated(n), layout, NONE, **kw).components["retained"].get(label, 0)
        for n in (2, 3)
    ]
    return got[1] - got[0]


def _gemma_attention(H: int, hq: int, hkv: int, d: int, qk_norm: bool) -> int:
    """bf16 elements per token, TP1: residual out H, input-norm rstd 2, norm out H (qkv
    A), qkv B R, the qkv output (hq + 2 hkv) d (pinned by the key view / value view), the
    query copy hq d and the q/k rstd 2 hq + 2 hkv (q/k norm only), rotated q hq d and k
    hkv d, out hq d, fp32 lse 2 hq, proj B R, post-attention norm input H + rstd 2."""
    width = H + 2 + H + R + (hq + 2 * hkv) * d + hq * d + hkv * d + hq * d + 2 * hq + R + H + 2
    if qk_norm:
        width += hq * d + 2 * hq + 2 * hkv
    return width


def _gemma_mlp(H: int, F: int, fused: bool) -> int:
    """bf16 elements per token, TP1: pre-norm rstd 2, norm out H (fc1 A), fc1 B R, the
    fc1 output 2F, eager GeGLU gelu(x0) F + (x1 + 0) F (fused: neither), the product F
    (fc2 A), fc2 B R, post-feedforward norm input H + rstd 2, residual out H."""
    return 2 + H + R + 2 * F + (0 if fused else 2 * F) + F + R + H + 2 + H


@pytest.mark.parametrize("name", ["gemma-3-12b", "gemma-2-9b"])
def test_gemma_saved_set_per_token(name: str) -> None:
    m = _config(name)
    H, F, hq, hkv, d = m.hidden, m.ffn, m.q_heads, m.kv_groups, m.head_dim
    n = 256
    lay = _layout(n)
    assert _per_layer(m, lay, "attention") == BF16 * n * _gemma_attention(H, hq, hkv, d, m.qk_norm)
    assert _per_layer(m, lay, "mlp") == BF16 * n * _gemma_mlp(H, F, fused=False)
    assert _per_layer(m, lay, "mlp", compiled=True) == BF16 * n * _gemma_mlp(H, F, fused=True)


def test_gemma_configs_read_their_families() -> None:
    g3, g2 = _config("gemma-3-12b"), _config("gemma-2-9b")
    assert g3.family == "gemma3_text" and g3.qk_norm and not g2.qk_norm
    # Gemma 3: 5 sliding (1024) then 1 full; Gemma 2: sliding (4096) and full alternating
    assert g3.windows[:12] == (1024,) * 5 + (0,) + (1024,) * 5 + (0,)
    assert g2.windows[:4] == (4096, 0, 4096, 0) and len(g2.windows) == 42
    assert (g2.attn_softcap, g2.final_softcap, g3.final_softcap) == (50.0, 30.0, 0.0)
    assert g3.tie_embeddings and g3.vocab == 262208 and g3.embed_scale


def test_gemma2_final_softcap_keeps_the_tanh_output() -> None:
    """The capped head keeps the bf16 tanh output (2 B per logit) more than the uncapped
    one, at the head's forward peak and after the forward."""
    m = _config("gemma-2-9b").truncated(1)
    n = 256
    vocab = -(-m.vocab // 128) * 128
    capped = simulate_rank(m, _layout(n), NONE, head="logits")
    plain = simulate_rank(replace(m, final_softcap=0.0), _layout(n), NONE, head="logits")
    for phase in ("forward_peak", "retained"):
        extra = capped.components[phase]["head"] - plain.components[phase]["head"]
        assert extra == BF16 * n * vocab, phase
    # the forward peak: capped bf16 logits + kept tanh + the loss's fp32 copy
    assert capped.components["forward_peak"]["head"] >= 8 * n * vocab


def _mla_attention(m: SimModel, t: int) -> float:
    """bf16 elements per token of the CP rank's row, TP t with SP (t = 1: no SP)."""
    H, h = m.hidden, m.q_heads
    qr, kvr, rope = m.q_lora_rank, m.kv_lora_rank, m.qk_rope_head_dim
    qhd, dv = m.qk_nope_head_dim + rope, m.v_head_dim
    width = H / t + 2 / t + H / t  # residual out, input-norm rstd, norm out (local)
    if qr:  # q down B, q_c + rstd, q norm out (local) and gathered, q up B
        width += R / t + qr / t + 2 / t + qr / t + (qr if t > 1 else 0) + R
    else:  # the gathered norm out (q proj A) under SP, q proj B
        width += (H if t > 1 else 0) + R
    width += R / t + (kvr + rope) / t + 2 / t  # kv down B, kv_combined pinned, rstd
    width += kvr / t + (kvr if t > 1 else 0) + R  # kv norm out local / gathered, kv up B
    width += 2 * (h / t) * qhd + 2 * (h / t) * dv + 2 * h / t  # q, k, v, out, fp32 lse
    return width + R / t  # proj B


@pytest.mark.parametrize("name", ["moonlight-16b-a3b", "deepseek-v3"])
@pytest.mark.parametrize("tp", [1, 2])
def test_mla_saved_set_per_token(name: str, tp: int) -> None:
    raw = __import__("json").loads((CONFIGS / f"{name}.json").read_text())
    m = _dense(_config(name), raw["intermediate_size"])
    n = 512
    expect = BF16 * n * _mla_attention(m, tp)
    assert _per_layer(m, _layout(n, tp=tp), "attention") == expect


def test_mla_forward_runs_on_the_configs_with_dense_mlps() -> None:
    """q_lora_rank null (Moonlight) and 1536 (DeepSeek-V3) both run; DeepSeek-V3's layer
    keeps more (the q down/up path and 128 heads)."""
    raw = __import__("json").loads((CONFIGS / "deepseek-v3.json").read_text())
    ds = _dense(_config("deepseek-v3"), raw["intermediate_size"]).truncated(1)
    mo = _dense(_config("moonlight-16b-a3b"), 11264).truncated(1)
    assert ds.q_lora_rank == 1536 and mo.q_lora_rank == 0 and ds.head_dim == 192
    a = simulate_rank(ds, _layout(256), NONE).components["retained"]["attention"]
    b = simulate_rank(mo, _layout(256), NONE).components["retained"]["attention"]
    assert a > b > 0


def test_sliding_windows_under_cp() -> None:
    """CP2, the second rank (offset 2,048 > the 1,024 window): Transformer Engine's
    all_gather gathers the whole row, so the window keeps the same bytes as full
    attention; the gathered K/V replace the local key: + 2·CP·KV·d − KV·d per token;
    a2a holds the same with or without a window; p2p is refused for a windowed layer."""
    m = _config("gemma-3-12b").truncated(3)
    full = replace(m, windows=())
    n, cp = 2048, 2
    lay = _layout(n, cp=cp, rank=1)
    hq, hkv, d, H = m.q_heads, m.kv_groups, m.head_dim, m.hidden
    for comm in ("all_gather", "a2a"):
        w = simulate_rank(m, lay, NONE, cp_comm=comm)
        f = simulate_rank(full, lay, NONE, cp_comm=comm)
        assert (w.forward_peak_bytes, w.retained_bytes) == (f.forward_peak_bytes, f.retained_bytes)
    per_layer = _per_layer(m, lay, "attention", cp_comm="all_gather")
    expect = _gemma_attention(H, hq, hkv, d, True) - hkv * d + 2 * cp * hkv * d
    assert per_layer == BF16 * n * expect
    with pytest.raises(SimInputError, match=r"cp_comm.*sliding window"):
        simulate_rank(m, lay, NONE, cp_comm="p2p")
    # p2p on layers without a window, and any type at CP1, are accepted
    simulate_rank(full.truncated(1), _layout(256, cp=2), NONE, cp_comm="p2p")
    simulate_rank(m.truncated(1), _layout(256), NONE, cp_comm="p2p")


def _gemma_raw(**extra: Any) -> dict[str, Any]:
    raw = {
        "model_type": "gemma3_text", "hidden_size": 256, "intermediate_size": 512,
        "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 64, "sliding_window": 128, "vocab_size": 1024,
    }  # fmt: skip
    raw.update(extra)
    return raw


def test_config_errors_name_the_field() -> None:
    cases = [
        (_gemma_raw(sliding_window=None), "config.sliding_window"),
        (_gemma_raw(layer_types=["full_attention"] * 5), "config.layer_types"),
        (_gemma_raw(layer_types=["linear_attention"] * 6), "config.layer_types"),
        (_gemma_raw(hidden_activation="silu"), "config.hidden_activation"),
        (_gemma_raw(sliding_window_pattern=0), "config.sliding_window_pattern"),
    ]
    mla = {
        "model_type": "deepseek_v3", "hidden_size": 256, "intermediate_size": 512,
        "num_hidden_layers": 2, "num_attention_heads": 4, "kv_lora_rank": 64,
        "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32,
    }  # fmt: skip
    for key in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
        cases.append(({**mla, key: None}, f"config.{key}"))
    cases.append(({**mla, "qk_rope_head_dim": 15}, "config.qk_rope_head_dim"))
    for raw, field in cases:
        with pytest.raises(SimInputError) as err:
            from_hf_config(raw)
        assert err.value.field == field, (field, err.value)
    g = from_hf_config(_gemma_raw())
    assert g.windows == (128,) * 5 + (0,) and g.kinds == ("attention",) * 6


def test_gathered_kv_per_token_under_all_gather() -> None:
    """CP2, the second rank: the whole row's gathered K/V replace the local rotated key
    (Gemma 2: no k norm, so the qkv output is freed as well); MLA: the gathered key and
    value replace the local key and value copy."""
    n, cp = 512, 2
    lay = _layout(n, cp=cp, rank=1)
    g2 = _config("gemma-2-9b")
    hq, hkv, d = g2.q_heads, g2.kv_groups, g2.head_dim
    base = _gemma_attention(g2.hidden, hq, hkv, d, qk_norm=False)
    expect = base - (hq + 2 * hkv) * d - hkv * d + 2 * cp * hkv * d
    assert _per_layer(g2, lay, "attention") == BF16 * n * expect
    mo = _dense(_config("moonlight-16b-a3b"), 11264)
    qhd, dv = mo.qk_nope_head_dim + mo.qk_rope_head_dim, mo.v_head_dim
    expect_mla = _mla_attention(mo, 1) + (cp - 1) * mo.q_heads * (qhd + dv)
    assert _per_layer(mo, lay, "attention") == BF16 * n * expect_mla
