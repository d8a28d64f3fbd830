"""The families' terms against what the rank simulator keeps (oracles/rank_sim/README.md,
the families' sections; each expected figure is the README's count for the named
configuration, written out here, never computed by cpmem) and against the runtime's
rules (Transformer Engine's CP attention with sliding windows)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cpmem.api import describe_step
from cpmem.errors import InputError
from cpmem.model.presets import PRESETS
from cpmem.pricing.head import head_bytes
from cpmem.pricing.tight import attention, moe
from cpmem.pricing.tight.compose import tight_widths
from cpmem.pricing.widths import mla_core_width, moe_rows_per_token, sandwich_width


def _step(model: str, tokens: int = 4096, **kw):
    kw.setdefault("head", "hidden")
    kw.setdefault("step", "first")
    return describe_step(model, [tokens], **kw)


def test_latent_attention_keeps_the_simulators_wide_tensors():
    """oracles/rank_sim/README.md "Multi-head latent attention", TP1, rank-1 LoRA:
    Moonlight-16B-A3B keeps 15,464 elements per token per layer = 2H + 2h(d_nope+d_rope)
    + 2h·d_v + (r_kv + d_rope) + r_kv + 2h (lse) + 12 rank-1 / rstd elements; DeepSeek-V3
    (q_lora_rank 1536) 100,683 = the same with h = 128, H = 7168, and the query's
    2 r_q + 2."""
    # within 16: the rank-1 adapters' activations and the norms' fp32 rstd, which the
    # policy leaves to its margin
    moonlight = PRESETS["moonlight-16b-a3b"]
    priced = 2 * moonlight.hidden + attention.core_width(moonlight, 1, eager_none=False)
    assert abs(priced - 15_464) <= 16
    v3 = PRESETS["deepseek-v3"]
    priced_v3 = 2 * v3.hidden + attention.core_width(v3, 1, eager_none=False)
    assert abs(priced_v3 - 100_683) <= 16
    # without SP nothing is gathered; under SP the latents are sequence-sharded
    assert mla_core_width(v3, 2, sp=True) < mla_core_width(v3, 2, sp=False) + v3.q_lora_rank


def test_kv_pair_is_narrower_under_latent_attention():
    g = PRESETS["deepseek-v3"]
    assert g.kv_pair_width == 128 * (128 + 64) + 128 * 128  # K (nope + rope) and V
    dense = PRESETS["qwen3-1.7b"]
    assert dense.kv_pair_width == 2 * dense.kv_width


def test_sandwich_norms_keep_the_sub_layer_output_per_sub_layer():
    """Gemma's post-norms save their input: the simulator's Gemma 3 attention is the
    ungated layer plus H at TP1 (README "Gemma": 3H where the others keep 2H)."""
    gemma = PRESETS["gemma-3-12b"]
    assert sandwich_width(gemma, 1, False) == gemma.hidden
    assert sandwich_width(gemma, 4, True) == gemma.hidden // 4
    assert sandwich_width(PRESETS["qwen3-1.7b"], 1, False) == 0
    w = tight_widths(gemma, _step("gemma-3-12b"))
    assert w.mlp - w.mlp_core == 3 * gemma.hidden  # norm input + output + post-norm input


def test_soft_capped_logits_keep_tanhs_output():
    """README "Gemma 2": the final soft-cap keeps 2 B more per logit (its bf16 tanh)."""
    capped = _step("gemma-2-9b", 1024, head="logits")
    plain = _step("gemma-3-12b", 1024, head="logits")
    vt_capped = -(-256_000 // 128) * 128
    vt_plain = -(-262_208 // 128) * 128
    capped_extra = head_bytes(capped, 1024).kept - 1024 * vt_capped * 4
    plain_extra = head_bytes(plain, 1024).kept - 1024 * vt_plain * 4
    assert capped_extra - plain_extra == 1024 * vt_capped * 2


def test_expert_rows_span_the_cp_ranks_an_ep_group_covers():
    """oracles/rank_sim/moe.py ``expert_rows``: an EP group laid over TP x CP wider than
    TP routes the other CP ranks' tokens too: Qwen3-30B-A3B at TP2 CP2 EP4 receives 16
    rows per rank token concentrated (8 top-k x 2 CP ranks), 4 balanced."""
    g = PRESETS["qwen3-30b-a3b"]
    assert moe_rows_per_token(g, 4, "concentrated", tp=2) == 16
    assert moe_rows_per_token(g, 4, "balanced", tp=2) == 4
    assert moe_rows_per_token(g, 4, "concentrated", tp=4) == 8  # EP = TP: own tokens
    # never more copies per token than the rank has experts
    oss = PRESETS["gpt-oss-20b"]
    assert moe_rows_per_token(oss, 16, "concentrated", tp=16) == 2  # 32 experts / 16


def test_full_recompute_moe_backward_holds_the_row_gradients():
    """MOE_BACKWARD_ROW_H against the simulator's backward buffers under full recompute
    (Qwen3-30B-A3B, 8,192 tokens, 8 rows per token): 96,332 elements per token at TP1
    EP1, 48,178 at TP2 EP2 SP; the price covers both within 3% of the larger."""
    step = _step("qwen3-30b-a3b", 8192, recompute="full")
    w = tight_widths(step.geometry, step)
    priced = moe.backward_width(step.geometry, w, step)
    assert 96_332 <= priced <= 1.03 * 96_332
    sp_step = _step("qwen3-30b-a3b", 8192, tp=2, ep=2, recompute="full")
    sp_w = tight_widths(sp_step.geometry, sp_step)
    assert moe.backward_width(sp_step.geometry, sp_w, sp_step) >= 48_178


def test_p2p_ring_refused_for_sliding_windows_under_cp():
    """Transformer Engine's ``attn_forward_func_with_cp`` runs a sliding window only
    under all_gather or a2a."""
    with pytest.raises(InputError) as err:
        _step("gemma-3-12b", 8192, cp=2, cp_comm="p2p")
    assert err.value.field == "cp_comm"
    _step("gemma-3-12b", 8192, cp=2, cp_comm="a2a")
    _step("qwen3-30b-a3b", 8192, cp=2, cp_comm="p2p", ep=2)  # no window: the ring runs


def test_sliding_windows_change_no_all_gather_figure():
    """Transformer Engine gathers every rank's K/V whole whatever the window (README
    "Sliding windows under CP"): a windowed model prices what the same model without
    windows prices."""
    from dataclasses import replace

    from cpmem.api import estimate

    gemma = PRESETS["gemma-3-12b"]
    full = replace(gemma, windows=())
    for policy in ("reference", "tight"):
        a = estimate(gemma, [16384], cp=4, policy=policy)
        b = estimate(full, [16384], cp=4, policy=policy)
        assert a.estimate_bytes == b.estimate_bytes


def test_without_a_q_norm_the_query_copy_is_not_kept():
    """oracles/rank_sim/README.md "Gemma 2 and Gemma 3": Gemma 2 (no q/k norm, two query
    groups per rank at TP1) keeps the qkv output, the rotated q and k and the kernel's
    out, ``3Q + 3KV``; the runtime's extra Q (``UNGATED_RUNTIME_Q``) on top, and no
    per-group copy: megatron's reshape copy goes into the rope, which saves only its
    tables. With a q norm (saving the copy as its input) the copy is kept."""
    gemma2 = PRESETS["gemma-2-9b"]
    q, kv = 16 * 256, 8 * 256  # 16 query heads, 8 KV groups of head_dim 256
    assert attention.core_width(gemma2, 1, eager_none=False) == 4 * q + 3 * kv
    normed = replace(gemma2, qk_norm=True)
    assert attention.core_width(normed, 1, eager_none=False) == 5 * q + 3 * kv
    assert attention.core_width(normed, 8, eager_none=False) == (4 * q + 3 * kv) // 8


def test_the_cp_all_gather_frees_the_projection_without_a_k_norm():
    """oracles/rank_sim/README.md "Sliding windows under CP": under ``all_gather`` a
    Gemma 2 layer's flash kernel keeps the gathered K/V of every rank (its own rows
    included), so the local rotated key (KV) and the qkv output (Q + 2KV) are freed:
    Q + KV per token below the widths, at TP1; nothing where the core is checkpointed,
    under ``a2a``, without CP, or with a k norm holding the projection."""
    q, kv = 16 * 256, 8 * 256
    gathered = _step("gemma-2-9b", 8192, cp=2, recompute="none", cp_comm="all_gather")
    assert attention.gather_freed_width(gathered, 1) == q + kv
    assert attention.gather_freed_width(gathered, 2) == (q + kv) // 2
    for other in (
        _step("gemma-2-9b", 8192, cp=2, recompute="none", cp_comm="a2a"),
        _step("gemma-2-9b", 8192, cp=2, modules="core_attn"),
        _step("gemma-2-9b", 8192, recompute="none"),
        _step("qwen3-1.7b", 8192, cp=2, recompute="none", cp_comm="all_gather"),
    ):
        assert attention.gather_freed_width(other, 1) == 0
    # the width tight keeps per attention layer drops by exactly that
    kept = tight_widths(gathered.geometry, gathered).attention_core
    alone = tight_widths(gathered.geometry, _step("gemma-2-9b", 8192, recompute="none"))
    assert alone.attention_core - kept == q + kv
