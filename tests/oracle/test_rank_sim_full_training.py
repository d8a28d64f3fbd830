"""Rank simulator: what one layer keeps for backward under full-parameter training
(Megatron-LM's step: every weight trains, no adapters) next to a LoRA step's, per kind,
at TP1 and at TP2 with SP.

Every expected count is written out here from the sources the layers restate, never from
the simulator's arithmetic:

- a trained megatron projection (``LinearWithGradAccumulationAndAsyncCommunication``,
  tensor_parallel/layers.py, installed) saves its input: under SP a column-parallel one
  the LOCAL shard (its gather goes to megatron's persistent "mpu" buffer, once per step,
  not per layer) and a row-parallel one its feature-sharded input; a frozen one with a
  rank-1 adapter (the LoRA step) keeps the adapter's input (under SP the gathered copy,
  beside the kept local norm output) and the rank-1 activation (README "Projections");
- the layers' own tensors as the README's per-kind accounting lists them.

Per token of the rank's row, t = TP (SP on at t > 1): the residual stream holds n/t rows.
Per-layer bytes are the difference between 3 and 2 layers of one label's retained bytes
(the last layer's output feeds the harness), at 1,024 tokens, so every tensor is whole
512-byte blocks.
"""

from __future__ import annotations

import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from oracles.rank_sim.geometry import SimInputError, SimModel, load_config  # noqa: E402
from oracles.rank_sim.layout import GdnPiece, RankLayout  # noqa: E402
from oracles.rank_sim.recompute import Recompute  # noqa: E402
from oracles.rank_sim.runner import RankResult, simulate_rank  # noqa: E402

warnings.filterwarnings("ignore")

CONFIGS = Path(__file__).resolve().parents[2] / "golden" / "simulated" / "configs"
NONE = Recompute.parse("none", "")
N = 1024  # tokens on the rank
R = 1  # the LoRA step's rank, on every projection
BF16 = 2
H, F, HQ, HKV, D = 256, 512, 8, 4, 32  # hidden, FFN, query heads, KV groups, head dim
Q, KV = HQ * D, HKV * D
BASE = SimModel(
    "small", H, F, HQ, HKV, D, False, True, ("attention",) * 3, vocab=1000, family="qwen3"
)


def _layout(tp: int, tokens: int = N) -> RankLayout:
    return RankLayout(tp, 1, 0, (tokens,), (tokens,), (GdnPiece(tokens),), tokens, True)


def _run(model: SimModel, tp: int, training: str, **kw: Any) -> RankResult:
    return simulate_rank(model, _layout(tp), NONE, training=training, **kw)


def _per_layer(model: SimModel, tp: int, training: str, label: str, **kw: Any) -> int:
    """Retained bytes of ``label`` that one more layer adds."""
    got = [
        _run(model.truncated(n), tp, training, **kw).components["retained"].get(label, 0)
        for n in (2, 3)
    ]
    return got[1] - got[0]


def _adapters(t: int, column: int, row: int, gathered: int) -> float:
    """What a LoRA step keeps beyond a trained one, elements per token: per
    column-parallel projection on a layer's norm output, under SP the gathered copy
    (``gathered`` wide) and its rank-1 activation over the gathered rows (R); per
    row-parallel projection the rank-1 partial, reduce-scattered under SP (R/t), else R."""
    sp = t > 1
    return column * ((gathered if sp else 0) + R) + row * (R / t if sp else R)


# ------------------------------------------------------------------------ attention


def _attention(t: int, gated: bool = False, qk_norm: bool = True, bias: bool = False) -> float:
    """A trained attention sub-layer, elements per token (megatron-core 0.16
    ``SelfAttention`` as layers.py restates it): the input norm's fp32 rstd 2/t; its
    output, linear_qkv's saved input (local: H/t); the QKV(+gate) output (Q + 2KV, + Q
    gated) pinned by the key view (q/k norm) or the value view (flash); with q/k norm the
    query copy Q/t (more than one group per partition) and the fp32 q/k rstd
    2(hq + hkv)/t; the rotated q and k (Q + KV)/t, the core's out Q/t and fp32 lse 2hq/t
    (flash); gated: the fp32 sigmoid of the gate 2Q/t and the bf16 gated output Q/t
    (linear_proj's saved input; else linear_proj saves the core's out); the residual
    output H/t. A bias add (gpt-oss) replaces a tensor by one of its size."""
    width = 2 / t + H / t + (2 * Q + 2 * KV if gated else Q + 2 * KV) / t
    if qk_norm:
        width += Q / t + 2 * (HQ + HKV) / t
    width += (Q + KV) / t + Q / t + 2 * HQ / t
    if gated:
        width += 2 * Q / t + Q / t
    return width + H / t


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("kind", ["dense", "gated", "sinks"])
def test_attention_trained_vs_lora(kind: str, tp: int) -> None:
    """Dense (Qwen3: q/k norm), gated (Qwen3.5's output gate) and gpt-oss's (biases, no
    q/k norm, one learned sink per head: the kernel keeps what a plain call keeps; the
    sinks' fp32 gradient is a backward transient). The trained layer keeps the LoRA
    layer's set less the adapters' (two projections: qkv on the norm output, proj)."""
    model = {
        "dense": BASE,
        "gated": replace(BASE, gated_attention=True),
        "sinks": replace(BASE, qk_norm=False, attention_bias=True, attention_sinks=True),
    }[kind]
    full = _attention(tp, gated=kind == "gated", qk_norm=kind != "sinks")
    lora = full + _adapters(tp, column=1, row=1, gathered=H)
    assert _per_layer(model, tp, "full", "attention") == BF16 * N * full
    assert _per_layer(model, tp, "lora", "attention") == BF16 * N * lora


@pytest.mark.parametrize("tp", [1, 2])
def test_sandwich_norms_trained_vs_lora(tp: int) -> None:
    """Gemma 3 (config gemma-3-12b): the post-attention norm keeps linear_proj's output
    H/t and its fp32 rstd 2/t beside the attention set (q/k norm, GQA, no gate)."""
    m = load_config(CONFIGS / "gemma-3-12b.json")
    m = replace(m, kinds=m.kinds[:3], windows=(0, 0, 0))
    hq, hkv, d = m.q_heads, m.kv_groups, m.head_dim
    q, kv, h = hq * d, hkv * d, m.hidden
    copy = q / tp if hkv // tp > 1 else 0  # the query copy
    full = (
        2 / tp + h / tp + (q + 2 * kv) / tp + copy + 2 * (hq + hkv) / tp
        + (q + kv) / tp + q / tp + 2 * hq / tp + h / tp + 2 / tp + h / tp
    )  # fmt: skip
    lora = full + _adapters(tp, column=1, row=1, gathered=h)
    assert _per_layer(m, tp, "full", "attention") == BF16 * N * full
    assert _per_layer(m, tp, "lora", "attention") == BF16 * N * lora


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("name", ["deepseek-v3", "moonlight-16b-a3b"])
def test_latent_attention_trained_vs_lora(name: str, tp: int) -> None:
    """megatron-core 0.16 ``MLASelfAttention`` (TE spec; README "Multi-head latent
    attention"), the dense-MLP variant of the config. Trained: the duplicated down
    projections save the local norm output (H/t, one tensor for both); the up projections
    (column-parallel) their norms' local outputs (qr/t, kvr/t); linear_proj the value-wide
    core output. LoRA adds per down projection a rank-1 activation over the local rows
    (R/t), per up projection the gathered norm output under SP (qr, kvr) and R, and
    linear_proj's R/t (SP) or R; Moonlight (no q_lora_rank) has one column-parallel q
    projection on the norm output instead of the q down/up pair."""
    m = load_config(CONFIGS / f"{name}.json")
    m = replace(m, kinds=m.kinds[:3], moe=False, mlp_kinds=("dense",) * 3, ffn=1024)
    h, heads = m.hidden, m.q_heads
    qr, kvr, rope = m.q_lora_rank, m.kv_lora_rank, m.qk_rope_head_dim
    qhd, dv = m.qk_nope_head_dim + rope, m.v_head_dim
    full = h / tp + 2 / tp + h / tp  # residual out, input-norm rstd, norm out (local)
    if qr:  # q down output + rstd, q norm out (q up's saved input)
        full += qr / tp + 2 / tp + qr / tp
    full += (kvr + rope) / tp + 2 / tp + kvr / tp  # kv down out pinned, rstd, kv norm out
    full += 2 * (heads / tp) * qhd + 2 * (heads / tp) * dv + 2 * heads / tp
    sp = tp > 1
    lora = full + R / tp + (kvr if sp else 0) + R + (R / tp if sp else R)  # kv down/up, proj
    lora += (R / tp + (qr if sp else 0) + R) if qr else ((h if sp else 0) + R)
    assert _per_layer(m, tp, "full", "attention") == BF16 * N * full
    assert _per_layer(m, tp, "lora", "attention") == BF16 * N * lora


# ------------------------------------------------------------------------ MLP, GDN


@pytest.mark.parametrize("tp", [1, 2])
def test_dense_mlp_trained_vs_lora(tp: int) -> None:
    """Fused SwiGLU MLP: norm rstd 2/t, fc1's saved input (the local norm output H/t),
    the fc1 output 2F/t (the fused kernel's input), fc2's saved input F/t, the residual
    output H/t; LoRA adds fc1's gathered copy and R, fc2's R/t (SP) or R."""
    full = 2 / tp + H / tp + 2 * F / tp + F / tp + H / tp
    lora = full + _adapters(tp, column=1, row=1, gathered=H)
    assert _per_layer(BASE, tp, "full", "mlp") == BF16 * N * full
    assert _per_layer(BASE, tp, "lora", "mlp") == BF16 * N * lora


GDN = replace(
    BASE, kinds=("gdn",) * 3, gdn_key_heads=4, gdn_key_dim=32, gdn_value_heads=8,
    gdn_value_dim=32, gdn_conv_kernel=4,
)  # fmt: skip


@pytest.mark.parametrize("tp", [1, 2])
def test_gdn_trained_vs_lora(tp: int) -> None:
    """Gated DeltaNet (layers.py, the stand-in kernel), value heads hv, key width kw,
    value width vw, per token: norm rstd 2/t; in_proj's saved input (local H/t); the
    in_proj output W/t (W = 2kw + 2vw + 2hv), pinned by the conv's saved input view and z;
    the conv output (2kw + vw)/t (v's view); q and k repeated to the value heads
    2·hv·dk/t; beta hv/t; the fp32 softplus input 2hv/t; the kernel's fp32 g cumsum, q
    and k rstd 3·2hv/t and per-64 A 64hv/t; the kernel output vw/t and the gated norm's
    fp32 rstd 2hv/t; out_proj's saved input vw/t; the residual output H/t. In
    ``-A_log.exp() * softplus(..)`` the product keeps the (hv,) fp32 ``-A_log.exp()``
    for the softplus output's gradient (one block per layer); trained only, it also keeps
    the fp32 softplus output for A_log's gradient, 2hv/t, and ``exp`` its (hv,) output
    (one block)."""
    hk, dk, hv, dv = 4, 32, 8, 32
    kw, vw = hk * dk, hv * dv
    w = 2 * kw + 2 * vw + 2 * hv
    common = (
        2 / tp + H / tp + w / tp + (2 * kw + vw) / tp + 2 * hv * dk / tp + hv / tp
        + 2 * hv / tp + 3 * 2 * hv / tp + 64 * hv / tp + vw / tp + 2 * hv / tp + vw / tp
        + H / tp
    )  # fmt: skip
    full = common + 2 * hv / tp
    lora = common + _adapters(tp, column=1, row=1, gathered=H)
    assert _per_layer(GDN, tp, "full", "gdn") == BF16 * N * full + 2 * 512
    assert _per_layer(GDN, tp, "lora", "gdn") == BF16 * N * lora + 512


# ------------------------------------------------------------------------ Mamba-2

MAMBA_ARGS = {
    "--hidden-size": 1024, "--num-attention-heads": 16, "--group-query-attention": True,
    "--num-query-groups": 8, "--vocab-size": 32000,
}  # fmt: skip


@pytest.mark.parametrize("tp", [1, 2])
def test_mamba_trained_vs_lora(tp: int) -> None:
    """megatron's ``MambaMixer`` at its defaults on hidden 1024 (README "Mamba-2 layers
    and hybrid stacks"): heads 32, head dim 64, d_inner 2048, state 128, 8 groups,
    W = 2·2048 + 2·8·128 + 32. Per token, bytes: the pre-norm input and rstd
    2H/t + 4/t, in_proj's saved input (the local norm output) 2H/t, zxbcdt 2W/t, out_x and
    y 2·2D/t, the gated norm's fp32 rstd 4G/t, out_proj's saved input 2D/t; LoRA adds the
    gathered norm output 2H (SP), in_proj's rank-1 2 and out_proj's 2/t (SP) or 2. Per
    layer: A and dt_bias.float() (one block each), trained also the exp output of
    ``-exp(A_log)`` that ExpBackward keeps for A_log's gradient (one block). The first
    layer's input needs no gradient under LoRA, so three layers "MMM" minus two."""
    from oracles.rank_sim.hybrid import from_megatron_args

    hh, d, g, heads, n_state = 1024, 2048, 8, 32, 128
    w = 2 * d + 2 * g * n_state + heads
    per_token = (
        2 * hh / tp + 4 / tp + 2 * hh / tp + 2 * w / tp + 2 * 2 * d / tp + 4 * g / tp
        + 2 * d / tp
    )  # fmt: skip
    lora = per_token + (2 * hh if tp > 1 else 0) + 2 + (2 / tp if tp > 1 else 2)

    def kept(pattern: str, training: str) -> int:
        m = from_megatron_args({**MAMBA_ARGS, "--hybrid-layer-pattern": pattern})
        return _run(m, tp, training).components["retained"]["mamba"]

    assert kept("MMM", "full") - kept("MM", "full") == N * per_token + 3 * 512
    assert kept("MMM", "lora") - kept("MM", "lora") == N * lora + 2 * 512


# ------------------------------------------------------------------------ MoE

FE, E, TOP_K, EP, TP = 32, 8, 2, 2, 2
MOE = SimModel(
    "small-moe", 64, 0, 2, 2, 32, False, False, ("attention",) * 2, vocab=1000, moe=True,
    num_experts=E, moe_top_k=TOP_K, expert_ffn=FE, family="qwen3_moe",
)  # fmt: skip


def test_grouped_experts_trained_vs_lora() -> None:
    """Per received expert row (TP2 SP, EP2; concentrated minus balanced rows): the
    experts' fc1 saves the sorted rows (H, the same tensor a LoRA adapter's A saves) and
    fc2 the probs-scaled activation (F_e); the eager GLU keeps the fc1 output 2F_e,
    silu(x0), x1 + 0 and the product (3F_e); the scaling the fp32 prob. LoRA adds two
    rank-1 activations (fc1's, fc2's) per row."""
    per_row_full = (64 + 2 * FE + 3 * FE + FE) * BF16 + 4
    per_row_lora = per_row_full + 2 * R * BF16
    layout = RankLayout(TP, 1, 0, (N,), (N,), (GdnPiece(N),), N, True)
    for training, per_row in (("full", per_row_full), ("lora", per_row_lora)):
        conc, bal = (
            simulate_rank(MOE, layout, NONE, ep=EP, routing=r, training=training)
            for r in ("concentrated", "balanced")
        )
        rows = conc.expert_rows - bal.expert_rows
        assert conc.retained_bytes - bal.retained_bytes == 2 * rows * per_row, training


# ------------------------------------------------------------------------ the step


def test_weight_gradients_with_and_without_fusion() -> None:
    """Backward of a trained two-layer MLP-only step at TP1 on 16 tokens (the weights
    outweigh the activations, so the backward peak is at its end, the embedding's dense
    table gradient): with gradient accumulation fusion every linear weight shape's bf16
    dummy is allocated once and kept (Transformer Engine's ``get_dummy_wgrad`` cache):
    fc1 2F x H, fc2 H x F and the output layer V x H (the shape-only norms return no
    weight gradient); one dummy serves every weight of its shape (V = 2F: the output
    layer's is fc1's). Without fusion there is no dummy, and the backward peak is the
    head's backward holding the output layer's bf16 V x H weight gradient."""
    lay = _layout(1, 16)
    for vocab, shapes in ((2000, 2 * F * H + H * F + 2048 * H), (1000, 2 * F * H + H * F)):
        m = replace(BASE, kinds=("",) * 2, mlp_kinds=("dense",) * 2, vocab=vocab)
        on = simulate_rank(m, lay, NONE, training="full", head="logits")
        off = simulate_rank(m, lay, NONE, training="full", head="logits", wgrad_fusion=False)
        on_peak, off_peak = (r.components["forward_backward_peak"] for r in (on, off))
        assert on_peak["dummy_wgrad"] == BF16 * shapes, vocab
        assert "dummy_wgrad" not in off_peak
        padded = -(-vocab // 128) * 128
        assert off_peak["head_backward"] >= BF16 * padded * H
        assert off.components["retained"] == on.components["retained"]


def test_trained_column_projection_gathers_into_megatrons_buffer() -> None:
    """Under SP a trained column-parallel projection's gather lands in megatron's
    persistent "mpu" buffer: one [tokens, H] bf16 tensor for the whole step (the largest
    gathered input), not one per layer."""
    one, three = (_run(BASE.truncated(k), 2, "full") for k in (1, 3))
    for r in (one, three):
        assert r.components["retained"]["mpu_buffer"] == BF16 * N * H
    assert "mpu_buffer" not in _run(BASE, 2, "lora").components["retained"]


def test_full_training_inputs_are_checked() -> None:
    with pytest.raises(SimInputError, match=r"^training='partial'"):
        _run(BASE, 1, "partial")
    with pytest.raises(SimInputError, match=r"^training='full'.*no adapters"):
        _run(BASE, 1, "full", lora_rank=16)
    with pytest.raises(SimInputError, match=r"^head='chunked:64'"):
        _run(BASE, 1, "full", head="chunked:64")
    with pytest.raises(SimInputError, match=r"^training='full'.*vocabulary"):
        _run(replace(BASE, vocab=0), 1, "full")
