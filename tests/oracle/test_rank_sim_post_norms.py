"""Rank simulator: OLMo 2's post-norms and projection-wide q/k norms.

``Olmo2DecoderLayer`` normalises each sub-layer's output and has no input norm;
``Olmo2Attention``'s ``q_norm`` / ``k_norm`` are ``RMSNorm(heads x head_dim)`` /
``RMSNorm(kv_heads x head_dim)`` on the whole projections (transformers,
``models/olmo2/modeling_olmo2.py``). Every expected figure is the per-token accounting of
oracles/rank_sim/README.md ("OLMo 2 and OLMo 3") written out here in the config's
numbers. Per-layer bytes are the difference between 3 and 2 layers of one label's
retained bytes.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from oracles.rank_sim.geometry import SimInputError, SimModel, from_hf_config  # noqa: E402
from oracles.rank_sim.layout import GdnPiece, RankLayout  # noqa: E402
from oracles.rank_sim.runner import simulate_rank  # noqa: E402
from tests.oracle.family_layers import BF16, EXAMPLES, NONE, N, R, layer_per_token, rank_layout  # noqa: E402

warnings.filterwarnings("ignore")


def _olmo(name: str = "olmo-2-7b") -> SimModel:
    return from_hf_config(json.loads((EXAMPLES / name / "config.json").read_text()))


def _layout(tp: int = 1) -> RankLayout:
    return rank_layout(tp, sp=True)


def _per_token(model: SimModel, label: str, tp: int = 1) -> float:
    """Retained bf16 elements per token of ``label`` that one more layer adds (SP on)."""
    return layer_per_token(model, label, tp, sp=True)


def _olmo_attention(H: int, hq: int, hkv: int, d: int) -> int:
    """TP1: the residual stream (qkv A) is the previous layer's; qkv B R, the projection
    (hq + 2 hkv) d (the value view), the flattened query and key copies with one fp32
    rstd each, rotated q and k, out, fp32 lse 2 hq, proj B R, the post-attention norm's
    input H + rstd 2, the residual output H (the MLP's fc1 A)."""
    return (
        (R + (hq + 2 * hkv) * d + hq * d + 2 + hkv * d + 2 + hq * d + hkv * d + hq * d)
        + 2 * hq
        + R
        + H
        + 2
        + H
    )


def _olmo_mlp(H: int, F: int) -> int:
    """TP1, eager SwiGLU: fc1 B R, fc1 output 2F, silu(x0) F, x1 + 0 F, the product F
    (fc2 A), fc2 B R, the post-feedforward norm's input H + rstd 2, the residual output H."""
    return R + 2 * F + F + F + F + R + H + 2 + H


def test_olmo2_reads_its_layer() -> None:
    m = _olmo()
    assert (m.pre_norms, m.sandwich_norms, m.qk_norm, m.qk_norm_projection) == (
        False,
        True,
        True,
        True,
    )
    assert m.family == "olmo2" and m.windows == ()
    olmo3 = _olmo("olmo-3-7b")
    assert olmo3.windows[:4] == (4096, 4096, 4096, 0) and len(olmo3.windows) == 32


@pytest.mark.parametrize("shape", ["published", "gqa"])
def test_olmo2_saved_set_per_token(shape: str) -> None:
    """OLMo-2-1124-7B (MHA, 32 groups) and the same layer at OLMo-2-0325-32B's grouping
    (4 query heads a group), small: the flattened query is a copy either way."""
    m = _olmo()
    if shape == "gqa":
        m = replace(m, hidden=1024, q_heads=16, kv_groups=4, head_dim=64, ffn=2048)
    H, F, hq, hkv, d = m.hidden, m.ffn, m.q_heads, m.kv_groups, m.head_dim
    assert _per_token(m, "attention") == _olmo_attention(H, hq, hkv, d)
    if shape == "published":
        assert _per_token(m, "attention") == 41_032
        assert _per_token(m, "mlp") == _olmo_mlp(H, F) == 63_236


def test_post_norms_under_sp_keep_no_local_residual() -> None:
    """A post-norm layer at TP 2 with SP (per-head q/k norms: the projection-wide ones
    run at TP 1 only): the adapters keep the gathered residual stream (H), the
    post-norms their local input (H/t + one fp32 rstd per local row), nothing the local
    residual. Attention: the gathered input H, qkv B R, the projection (hq + 2 hkv) d/t,
    the query's group copy hq d/t, the per-head q/k rstd 2 (hq + hkv)/t, rotated q and k
    (hq + hkv) d/t, out hq d/t, lse 2 hq/t, proj B R, the post-norm's input H/t and rstd
    1: 4,007. MLP: H, fc1 B R, fc1 output 2F/t, SiLU output, x1 + 0 and product 3F/t,
    fc2 B R, the post-norm's H/t and rstd 1: 6,659."""
    m = replace(
        _olmo(), hidden=1024, q_heads=16, kv_groups=4, head_dim=64, ffn=2048,
        qk_norm_projection=False,
    )  # fmt: skip
    t, H, F, hq, hkv, d = 2, 1024, 2048, 16, 4, 64
    attention = (
        H + R + (hq + 2 * hkv) * d // t + hq * d // t + 2 * (hq + hkv) // t
        + (hq + hkv) * d // t + hq * d // t + 2 * hq // t + R + H // t + 1
    )  # fmt: skip
    mlp = H + R + 2 * F // t + 3 * F // t + R + H // t + 1
    assert (attention, mlp) == (4007, 6659)
    assert _per_token(m, "attention", tp=t) == attention
    assert _per_token(m, "mlp", tp=t) == mlp


def test_projection_wide_norms_are_simulated_at_tp1_only() -> None:
    with pytest.raises(SimInputError) as err:
        _olmo().check_tp(2)
    assert err.value.field == "tp"


def _small_config() -> dict[str, object]:
    """OLMo-2-1124-7B's published config at a small width with OLMo-2-0325-32B's grouping
    (4 query heads a group)."""
    cfg = json.loads((EXAMPLES / "olmo-2-7b" / "config.json").read_text())
    cfg.update(hidden_size=1024, num_attention_heads=16, num_key_value_heads=4)
    cfg.update(intermediate_size=2048)
    return cfg


@pytest.mark.parametrize("tp", [1, 2])
def test_tight_prices_the_simulated_post_norm_layer(tp: int) -> None:
    """cpmem's ``tight`` widths for the same config, against the simulator's retained
    bytes per token per layer: equal once the terms each side names are set aside. The
    simulator keeps, beyond tight's widths, the rank-1 adapters' activations (2R a
    sub-layer), the norms' fp32 rstd (2 elements per normalised row: per head under
    per-head q/k norms, per token for a projection-wide or post-norm; halved per local
    row under SP) and the softmax's fp32 lse (2 per local head): what tight leaves to its
    fitted margin on ART's runtime. tight keeps beyond the simulator the measured
    runtime's query copy (``UNGATED_RUNTIME_Q`` Q/t, fitted on ART's cells). At TP 2 the
    per-head q/k norms (the projection-wide ones are priced at TP 1 only), with SP."""
    from cpmem.api import describe_step
    from cpmem.model.hf_config import load_config
    from cpmem.pricing.tight.calibrated import UNGATED_RUNTIME_Q
    from cpmem.pricing.tight.compose import tight_widths

    cfg = _small_config()
    sim, geometry = from_hf_config(cfg), load_config(cfg, name="olmo-2-small")
    if tp > 1:
        sim = replace(sim, qk_norm_projection=False)
        geometry = replace(geometry, qk_norm_projection=False)
    step = describe_step(
        geometry, [N], head="hidden", step="first", recompute="none", tp=tp, sp=tp > 1
    )
    widths = tight_widths(geometry, step)
    hq = geometry.q_heads
    runtime_q = UNGATED_RUNTIME_Q * geometry.q_width // tp
    if tp == 1:  # rstd: the flattened q and k (one row each), the post-norm
        attention_rest = 2 * R + 2 + 2 + 2 + 2 * hq
        mlp_rest = 2 * R + 2
    else:  # rstd: per local head of q and k, then the post-norm's local row (half)
        attention_rest = 2 * R + 2 * (hq + geometry.kv_groups) // tp + 1 + 2 * hq // tp
        mlp_rest = 2 * R + 1
    assert _per_token(sim, "attention", tp) == widths.of("attention") - runtime_q + attention_rest
    assert _per_token(sim, "mlp", tp) == widths.of("dense") + mlp_rest


def test_the_cp_all_gather_frees_what_tight_frees_for_flattened_norms() -> None:
    """CP 2 under ``all_gather`` against CP 1, per token of the rank and layer: the flash
    kernel saves the gathered K and V (the other rank's, ``2 KV``, beside its own slot)
    and the flattened k copy the k norm saves holds no view of the projection, so the
    projection output and the local rotated key go as in a layer without a k norm. The
    simulator's change is cpmem's remote K/V less ``gather_freed_width``."""
    from cpmem.api import describe_step
    from cpmem.model.hf_config import load_config
    from cpmem.pricing.gathered import gathered_kv_width
    from cpmem.pricing.kinds.attention import gather_freed_width

    cfg = _small_config()
    sim = from_hf_config(cfg)
    geometry = load_config(cfg, name="olmo-2-small")
    step = describe_step(
        geometry, [2 * N], head="hidden", step="first", recompute="none", cp=2,
        cp_comm="all_gather",
    )  # fmt: skip
    counts = (N, N)
    layout = RankLayout(1, 2, 0, counts, counts, (GdnPiece(N),), 2 * N, True)
    got = [
        simulate_rank(sim.truncated(n), layout, NONE, cp_comm="all_gather")
        .components["retained"]
        .get("attention", 0)
        for n in (2, 3)
    ]
    cp2 = (got[1] - got[0]) / BF16 / N
    freed = gather_freed_width(step, 1)
    assert freed == geometry.q_width + geometry.kv_width  # (Q + KV)/t at TP 1
    assert cp2 - _per_token(sim, "attention") == gathered_kv_width(step, 1) - freed
