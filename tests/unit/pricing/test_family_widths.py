"""The families' terms against what the rank simulator keeps (oracles/rank_sim/README.md,
the families' sections; each expected figure is the README's count for the named
configuration, written out here, never computed by cpmem) and against the runtime's
rules (Transformer Engine's CP attention with sliding windows)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from cpmem.api import describe_step, estimate, price_step
from cpmem.errors import InputError
from cpmem.model.presets import PRESETS
from cpmem.pricing.cold import COLD_SETUP
from cpmem.pricing.components import Component
from cpmem.pricing.head import head_bytes
from cpmem.pricing.kinds import attention
from cpmem.pricing.tight.compose import tight_widths
from cpmem.pricing.widths import mla_core_width, moe_rows_per_token, sandwich_width
from cpmem.step.routing import rows_per_token

SIM_CONFIGS = Path(__file__).resolve().parents[3] / "golden" / "simulated" / "configs"


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


def test_latent_attention_keeps_the_published_key_and_value_widths_under_cp():
    """DeepSeek-V3's published config.json (deepseek-ai/DeepSeek-V3): 61 layers, 128
    heads, ``qk_nope_head_dim`` 128, ``qk_rope_head_dim`` 64, ``v_head_dim`` 128.
    megatron-core 0.16.1's ``MLASelfAttention`` (transformer/multi_latent_attention.py
    796-800, 824-830) splits the up projection into ``k_no_pe`` ``[n, 128]`` and
    ``value`` ``[n, 128]`` and concatenates the rope key expanded to every head: K is
    ``n x 192``, V ``n x 128``. Under ``p2p`` (the type Transformer Engine's CP attention
    runs MLA under, with ``a2a+p2p``: context_parallel.py v2.10 4031-4035) the kernel
    keeps the last received chunk's K and V: at TP8 (16 heads a rank), 4,096 tokens a
    rank, ``61 x 16 x (192 + 128) x 4,096 x 2`` bytes, whatever the CP size."""
    g = PRESETS["deepseek-v3"]
    published = (61, 128, 128, 64, 128)
    assert (g.layers, g.q_heads, g.qk_nope_head_dim, g.qk_rope_head_dim, g.v_head_dim) == published
    layers, heads_per_rank, key, value = 61, 128 // 8, 128 + 64, 128
    for cp in (2, 4):
        est = estimate(
            "deepseek-v3",
            logical_tokens=4096 * cp,
            packed_tokens=4096 * cp,
            rank_tokens=(4096,) * cp,
            segments=1,
            tp=8,
            ep=8,
            cp=cp,
            cp_comm="p2p",
            recompute="none",
            policy="tight",
        )
        kept = est.components[Component.CP_GATHERED_KV]
        assert kept == layers * heads_per_rank * (key + value) * 4096 * 2 == 2_558_525_440


def test_sandwich_norms_keep_the_sub_layer_output_per_sub_layer():
    """Gemma's post-norms save their input: the simulator's Gemma 3 attention is the
    ungated layer plus H at TP1 (README "Gemma": 3H where the others keep 2H)."""
    gemma = PRESETS["gemma-3-12b"]
    assert sandwich_width(gemma, 1, False) == gemma.hidden
    assert sandwich_width(gemma, 4, True) == gemma.hidden // 4
    assert sandwich_width(PRESETS["qwen3-1.7b"], 1, False) == 0
    w = tight_widths(gemma, _step("gemma-3-12b"))
    assert w.of("dense") - w.mlp_core == 3 * gemma.hidden  # norm input + output + post-norm input


def test_soft_capped_logits_keep_tanhs_output():
    """Gemma 2's final soft-cap as transformers' ``Gemma2ForCausalLM.forward`` runs it
    (modeling_gemma2.py at 006e86931247d7bacf94ad00ada1fb6baf11e94b: ``logits / cap``,
    ``torch.tanh``, ``* cap``), run by torch on bf16 logits under autograd's saved-tensor
    hooks (``oracles.saved_tensors.SavedTensorCounter``): it saves 2 B per logit, tanh's
    output; the division and the product by a number save nothing. cpmem's head keeps
    exactly that per logit more than the same model uncapped (Gemma 2's 256,000 logits
    padded to 128 at TP1, megatron's ``make_vocab_size_divisible_by``)."""
    torch = pytest.importorskip("torch")
    from oracles.saved_tensors import SavedTensorCounter

    tokens, vocab, cap = 64, 1024, 30.0
    logits = torch.randn(tokens, vocab, dtype=torch.bfloat16, requires_grad=True)
    counter = SavedTensorCounter()
    with counter():
        capped = torch.tanh(logits / cap) * cap
    assert capped.dtype == torch.bfloat16 and capped.requires_grad
    saved_per_logit = counter.bytes() / (tokens * vocab)
    assert saved_per_logit == 2
    gemma2 = PRESETS["gemma-2-9b"]
    assert gemma2.final_logit_softcap == cap
    n, padded = 1024, -(-256_000 // 128) * 128
    kept = {
        name: head_bytes(describe_step(g, [n], head="logits", step="first"), n).kept
        for name, g in (("capped", gemma2), ("plain", replace(gemma2, final_logit_softcap=None)))
    }
    assert kept["capped"] - kept["plain"] == saved_per_logit * n * padded


def test_expert_rows_span_the_cp_ranks_an_ep_group_covers():
    """oracles/rank_sim/moe.py ``expert_rows``: an EP group laid over TP x CP wider than
    TP routes the other CP ranks' tokens too: Qwen3-30B-A3B at TP2 CP2 EP4 receives 16
    rows per rank token concentrated (8 top-k x 2 CP ranks), 4 balanced. The reference
    charges the same whole rows there."""
    g = PRESETS["qwen3-30b-a3b"]
    assert rows_per_token(g, 4, "concentrated", tp=2) == 16
    assert rows_per_token(g, 4, "balanced", tp=2) == 4
    assert rows_per_token(g, 4, "concentrated", tp=4) == 8  # EP = TP: own tokens
    assert moe_rows_per_token(g, 4, tp=2) == 16 and moe_rows_per_token(g, 4, tp=4) == 8
    # never more copies per token than the rank has experts
    oss = PRESETS["gpt-oss-20b"]
    assert rows_per_token(oss, 16, "concentrated", tp=16) == 2  # 32 experts / 16
    assert moe_rows_per_token(oss, 16, tp=16) == 2


def test_the_reference_keeps_its_whole_rows_where_the_runtime_routes_the_shard():
    """At EP 1 under TP2 SP each rank routes only its sequence shard (the simulator's
    ``expert_rows``: T/2 x 1 x 8 rows for T tokens, 4 per token); the reference keeps
    its published top-k per token of the CP rank (8), a bound above it."""
    g = PRESETS["qwen3-30b-a3b"]
    assert rows_per_token(g, 1, "concentrated", tp=2) == 4
    assert moe_rows_per_token(g, 1, tp=2) == 8


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_full_recompute_moe_backward_holds_the_layers_input_gradients():
    """``moe.full_backward_width`` against the rank simulator, run now: Qwen3-30B-A3B's
    published structure (golden/simulated/configs/qwen3-30b-a3b.json, 48 MoE layers, 8
    rows a token), 8,192 tokens at TP1 EP1 under full recompute, where the peak is the
    first MoE layer's recomputed dispatch beside the 47 input gradients the MoE layers
    already through their backward keep (``ACCUMULATED_INPUT_GRADS``: 47 x 2,048
    elements a token, 1.5 GB here). ``tight``'s forward+backward covers the simulator's
    peak with the cold set-up, within 5% (about +3.8%)."""
    pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    from oracles.rank_sim.geometry import load_config
    from oracles.rank_sim.layout import GdnPiece, RankLayout
    from oracles.rank_sim.recompute import Recompute
    from oracles.rank_sim.runner import simulate_rank

    n = 8192
    model = load_config(SIM_CONFIGS / "qwen3-30b-a3b.json")
    layout = RankLayout(1, 1, 0, (n,), (n,), (GdnPiece(n),), n, True)
    sim = simulate_rank(model, layout, Recompute.parse("full", ""), ep=1)
    assert sim.expert_rows == 8 * n
    central = sim.forward_backward_peak_bytes + COLD_SETUP
    priced = price_step(_step("qwen3-30b-a3b", n, recompute="full"), "tight")
    assert priced.forward_backward_bytes is not None
    assert central <= priced.forward_backward_bytes <= 1.05 * central


def test_p2p_ring_refused_for_sliding_windows_under_cp():
    """Transformer Engine's ``attn_forward_func_with_cp`` runs a sliding window only
    under all_gather or a2a."""
    with pytest.raises(InputError) as err:
        _step("gemma-3-12b", 8192, cp=2, cp_comm="p2p")
    assert err.value.field == "cp_comm"
    _step("gemma-3-12b", 8192, cp=2, cp_comm="a2a")
    _step("qwen3-30b-a3b", 8192, cp=2, cp_comm="p2p", ep=2)  # no window: the ring runs


def test_sliding_windows_change_no_all_gather_figure():
    """Transformer Engine's ``AttnFuncWithCPAndKVAllGather`` gathers every rank's K/V whole
    (``gather_along_first_dim``) and only narrows what each step's kernel reads, a view
    (docs/model-families.md, "Sliding windows under CP"; oracles/rank_sim/cp_comm.py):
    Gemma 3 12B, 40 of its 48 layers sliding over 1,024 tokens, at CP4 with 4,096 tokens a
    rank and no recompute keeps the other 3 ranks' K and V (8 groups x 256, twice) in
    every layer: ``48 x 3 x 4,096 x 4,096 x 2`` bytes in ``tight``; ``reference`` prices
    the ranks beyond its calibrated CP 2 (2 of the 3). A window-bounded gather would keep
    at most 1,023 remote rows on a sliding layer, not 12,288."""
    gemma = PRESETS["gemma-3-12b"]
    assert sum(1 for w in gemma.windows if w == 1024) == 40 and gemma.layers == 48
    layers, remote, kv_pair, rank_tokens = 48, 3, 2 * 8 * 256, 4096
    for policy, ranks in (("tight", remote), ("reference", remote - 1)):
        est = estimate(
            gemma,
            logical_tokens=4 * rank_tokens,
            packed_tokens=4 * rank_tokens,
            rank_tokens=(rank_tokens,) * 4,
            segments=1,
            cp=4,
            cp_comm="all_gather",
            recompute="none",
            policy=policy,
        )
        kept = est.components[Component.CP_GATHERED_KV]
        assert kept == layers * ranks * kv_pair * rank_tokens * 2, policy


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
