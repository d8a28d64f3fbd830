"""Rank simulator Mamba-2 layers and hybrid stacks.

Every expected byte count below is written out by hand from the sources the simulator
restates (megatron-core 0.16 ``MambaMixer.__init__`` / ``forward`` / ``_ssm_training``;
mamba_ssm ``MambaSplitConv1dScanCombinedFn`` and its helpers, ``LayerNormFn``; the
simulator's LoRA convention, oracles/rank_sim/README.md), never computed by the
simulator's code. The geometry is the Megatron-LM functional case
``hybrid_mr_mcore_te_tp1_pp1_cp1_dgx_a100_1N8G`` (hidden 1024, 16 heads in 8 query
groups, Mamba at megatron's defaults: head dim 64, state 128, 8 groups, heads
2·1024 / 64 = 32, conv kernel 4, chunk 128). Token counts keep every tensor whole
512-byte blocks."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from oracles.rank_sim.__main__ import main  # noqa: E402
from oracles.rank_sim.geometry import SimInputError, from_hf_config  # noqa: E402
from oracles.rank_sim.hybrid import from_megatron_args, parse_pattern, stack  # noqa: E402
from oracles.rank_sim.layout import GdnPiece, RankLayout  # noqa: E402
from oracles.rank_sim.recompute import Recompute  # noqa: E402
from oracles.rank_sim.runner import RankResult, simulate_rank  # noqa: E402

warnings.filterwarnings("ignore")

# the functional case's MODEL_ARGS (golden-sources megatron-lm cases/hybrid), restated
PATTERN = "M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M-"
CASE = {
    "--hidden-size": 1024,
    "--num-attention-heads": 16,
    "--group-query-attention": True,
    "--num-query-groups": 8,
    "--hybrid-layer-pattern": PATTERN,
    "--micro-batch-size": 4,
    "--seq-length": 1024,
}
H = 1024
HEADS, P, N, G, Q = 32, 64, 128, 8, 128  # Mamba heads, head dim, d_state, groups, chunk
D = HEADS * P  # d_inner 2048
W = 2 * D + 2 * G * N + HEADS  # in_proj out: z, x, B, C, dt = 6176
BF16, FP32 = 2, 4
TOKENS = 2048


def _model(pattern: str, **flags: Any) -> Any:
    return from_megatron_args({**CASE, "--hybrid-layer-pattern": pattern, **flags})


def _layout(tokens: int = TOKENS, tp: int = 1, cp: int = 1, pieces: int = 1) -> RankLayout:
    split = (GdnPiece(tokens // pieces),) * pieces
    return RankLayout(tp, cp, 0, (tokens,) * cp, (tokens,) * cp, split, tokens * cp, True)


def _run(pattern: str, layout: RankLayout, mode: str = "none", **kw: Any) -> RankResult:
    return simulate_rank(_model(pattern), layout, Recompute.parse(mode), **kw)


def _kept_one_layer(layout: RankLayout, **kw: Any) -> int:
    """What a Mamba layer whose input needs a gradient keeps: stack "MM" minus "M"."""
    return _run("MM", layout, **kw).retained_bytes - _run("M", layout, **kw).retained_bytes


def test_megatron_geometry_is_megatrons_defaults() -> None:
    m = _model(PATTERN)
    assert (m.mamba_heads, m.mamba_head_dim, m.mamba_state, m.mamba_groups) == (HEADS, P, N, G)
    assert (m.mamba_conv_kernel, m.mamba_chunk) == (4, Q)
    # no --swiglu / --squared-relu: Megatron's GeLU, ungated, ffn 4·hidden
    assert (m.ffn, m.mlp_gated, m.mlp_activation) == (4 * H, False, "gelu")
    assert (m.q_heads, m.kv_groups, m.head_dim, m.rope) == (16, 8, 64, False)


def test_kept_bytes_tp1_by_hand() -> None:
    """TP1, LoRA rank 1 on every projection, per token (bytes):
    pre-norm input 2H + fp32 rstd 4; in_proj LoRA A's input, the norm output, 2H; its
    rank-1 activation 2; the kernel's zxbcdt 2W and out_x 2D; the gated norm's input y
    2D and fp32 rstd 4G; out_proj LoRA A's input (the norm output) 2D and its rank-1
    activation 2. Per layer, not per token: A = -exp(A_log) and dt_bias.float(), each
    32 fp32 in one 512-byte block, kept by the kernel."""
    per_token = 2 * H + 4 + 2 * H + 2 + 2 * W + 2 * D + 2 * D + 4 * G + 2 * D + 2
    assert per_token == 28776
    assert _kept_one_layer(_layout()) == per_token * TOKENS + 2 * 512


def test_kept_bytes_tp2_sp_by_hand() -> None:
    """TP2 with SP: the residual stream and the local norm output (kept next to the
    gathered adapter input) are H/2 wide; in_proj's rank-1 activation covers the gathered
    rows; the mixer's tensors are per TP rank: W/2, D/2 and G/2 groups; out_proj's
    rank-1 partial is reduce-scattered (TOKENS/2 rows)."""
    t = 2
    per_token = (
        2 * H // t + 4 // t + 2 * H // t + 2 * H + 2
        + 2 * W // t + 2 * D // t + 2 * D // t + 4 * G // t + 2 * D // t + 2 // t
    )  # fmt: skip
    assert per_token == 16437
    assert _kept_one_layer(_layout(tp=2)) == per_token * TOKENS + 2 * 512


def test_micro_batch_and_packing() -> None:
    """Four rows of [s, b, h]: ``rearrange(...).contiguous()`` copies zxbcdt and y, but the
    kernel and the norm keep the copies in place of the originals (the same bytes).
    A packed row of two sequences: the kernel also keeps megatron's int32 seq_idx
    (4 bytes per token and layer)."""
    one = _kept_one_layer(_layout())
    assert _kept_one_layer(_layout(), micro_batch=4) == one
    assert _kept_one_layer(_layout(pieces=2)) == one + 4 * TOKENS


def test_cp_kept_bytes_follow_the_head_split() -> None:
    """CP2: megatron's all-to-all gives each rank all tokens of half the heads and
    groups, so zxbcdt is (2·tokens, W/2) per rank and out_x (2·tokens, D/2): per local
    token the same as CP1. CP16 with 8 groups: each group's B and C are repeated over 2
    ranks (``group_repeat_count``), so zxbcdt per local token is 2D + 2·16·N + heads,
    2·(16 - 8)·N elements more than W (the B/C columns of the 8 extra group copies)."""
    one = _kept_one_layer(_layout())
    assert _kept_one_layer(_layout(cp=2)) == one
    heads_per_rank = HEADS // 16
    zx16 = 16 * (2 * (D // 16) + 2 * 1 * N + heads_per_rank)
    assert zx16 - W == 2 * (16 - G) * N
    assert (
        _kept_one_layer(_layout(cp=16, tokens=1024))
        == ((one - 2 * 512) // TOKENS + 2 * (zx16 - W)) * 1024 + 2 * 512
    )
    with pytest.raises(SimInputError, match=r"^rank_tokens="):
        lay = RankLayout(1, 2, 0, (TOKENS, TOKENS - 2), (TOKENS, TOKENS - 2),
                         (GdnPiece(TOKENS),), 2 * TOKENS - 2, True)  # fmt: skip
        simulate_rank(_model("M"), lay, Recompute.parse("none"))


def _kernel_forward_bytes(tokens: int, rows: int = 1) -> int:
    """``MambaSplitConv1dScanCombinedFn.forward`` at its last allocation, TP1: zxbcdt
    2W, the conv output over x, B, C 2(D + 2GN), fp32 dt and dA cumsum 2·4·heads, the
    bf16 passed states 2·D·N/Q, C·Bᵀ fp32 4·G·Q, out and out_x 2·2D per token; the fp32
    final states 4·heads·P·N per row; megatron's A = -exp(A_log) and dt_bias.float()
    (32 fp32 each, one 512-byte block each)."""
    per_token = 2 * W + 2 * (D + 2 * G * N) + 8 * HEADS + 2 * D * N // Q + 4 * G * Q + 4 * D
    return per_token * tokens + rows * 4 * HEADS * P * N + 2 * 512


def test_no_grad_peak_by_hand() -> None:
    """No-grad forward of one layer with a frozen in_proj (only out_proj adapted): the
    peak is the scan's last allocation, over the embedding output (2H per token). With
    in_proj adapted the LoRA sum is the peak instead: input 2H, norm output 2H, base
    output, adapter output and their sum, 3·2W."""
    lay = _layout()
    frozen_in = _run("M", lay, "no-grad", lora_targets="mamba_out")
    assert frozen_in.forward_peak_bytes == 2 * H * TOKENS + _kernel_forward_bytes(TOKENS)
    four = _run("M", lay, "no-grad", lora_targets="mamba_out", micro_batch=4)
    assert four.forward_peak_bytes == 2 * H * TOKENS + _kernel_forward_bytes(TOKENS, rows=4)
    adapted = _run("M", lay, "no-grad")
    assert adapted.forward_peak_bytes == (2 * H + 2 * H + 3 * 2 * W) * TOKENS


def test_backward_transient_by_hand() -> None:
    """One layer, first in the stack (its input needs no gradient): what backward has
    allocated and still holds at its peak, which is inside
    ``_mamba_chunk_scan_combined_bwd`` after the dCB split sum (one split at this size:
    ceil(1·16·32 / 132) = 4 = heads / groups heads per program). Per token: the norm's
    dx (the kernel's dout) 2D; dzxbcdt 2W; the recomputed conv 2(D + 2GN) and dxBC
    2(D + 2GN); dt's clone 2·heads; fp32 dA cumsum and dt 8·heads; C·Bᵀ 4GQ; dout_x
    2D; bf16 state gradients and states 2·2·D·N/Q; the ddt workspace, ddA next and
    ddA prev 12·heads; dB and dC 2·4GN; dCB per split and summed 2·4GQ. Per row:
    the fp32 final states 4·heads·P·N. Not per token: the ddA per chunk, summed over
    its blocks ((1, heads, chunks) fp32: 32·16·4 bytes), the two dD ((heads,) fp32, a
    512-byte block each), the loss's scalar gradient (one block), and out_proj's LoRA
    gradients, A (1 x D) and B (H x 1) bf16."""
    conv = D + 2 * G * N
    per_token = (
        2 * D + 2 * W + 4 * conv + 2 * HEADS + 8 * HEADS + 4 * G * Q + 2 * D
        + 4 * D * N // Q + 12 * HEADS + 8 * G * N + 8 * G * Q
    )  # fmt: skip
    assert per_token == 66304
    chunks = TOKENS // Q
    small = 4 * HEADS * chunks + 2 * 512 + 512 + 2 * D + 2 * H
    r = _run("M", _layout())
    held = r.components["forward_backward_peak"]["backward"]
    assert held == per_token * TOKENS + 4 * HEADS * P * N + small


def test_pattern_grammar() -> None:
    p = parse_pattern("M-M*|EM-/*E/*E")
    assert p.layers == ("M", "-", "M", "*", "E", "M", "-")
    assert (p.segments, p.mtp, p.mtp_depths) == ((4, 3), "*E", 2)
    assert stack(parse_pattern("M*-E")) == {
        "kinds": ("mamba", "attention", "", ""),
        "mlp_kinds": ("", "", "dense", "moe"),
    }
    for bad, why in (
        ("MX", "'X' is not one of"),
        ("M*D", "cannot share"),
        ("M*/MM/M*", "identical"),
        ("M/M|M", "'|' is not one of"),
        ("", "at least one"),
    ):
        with pytest.raises(SimInputError, match=why):
            parse_pattern(bad)
    # the '/' part is one MTP depth's layers, once per depth (mtp.py)
    assert stack(parse_pattern("M*/*-/*-")) == {
        "kinds": ("mamba", "attention"),
        "mlp_kinds": ("", ""),
        "mtp_kinds": ("attention", ""),
        "mtp_mlp_kinds": ("", "dense"),
        "mtp_depths": 2,
    }
    with pytest.raises(SimInputError, match="Gated DeltaNet"):
        stack(parse_pattern("MG"))
    with pytest.raises(SimInputError, match="Gated DeltaNet"):
        stack(parse_pattern("M*/G"))


def test_hybrid_builds_one_sub_layer_per_symbol() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    from oracles.rank_sim.adapters import AdapterSpec
    from oracles.rank_sim.layers import RankContext, build_layers
    from oracles.rank_sim.runner import init_groups, release_groups

    model = from_megatron_args({
        **CASE, "--hybrid-layer-pattern": "M-*ME", "--swiglu": True, "--num-experts": 4,
    })  # fmt: skip
    lay = _layout()
    try:
        group = init_groups(1, 1, 0)
        with FakeTensorMode(allow_non_fake_inputs=True):
            ctx = RankContext(model, lay, Recompute.parse("none"), False, group,
                              adapters=AdapterSpec())  # fmt: skip
            built = [
                (
                    type(x.mixer).__name__ if x.mixer else None,
                    type(x.mlp).__name__ if x.mlp else None,
                )
                for x in build_layers(ctx)
            ]
    finally:
        release_groups()
    assert built == [
        ("MambaMixer", None), (None, "MLP"), ("Attention", None), ("MambaMixer", None),
        (None, "MoE"),
    ]  # fmt: skip


def test_megatron_case_runs_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The functional case's first 9 layers (M-M-M-M*-: Mamba, MLP, attention) at one
    micro-batch of 4 x 1024 tokens, TP1 and TP2, through the command line."""
    args = tmp_path / "model_config.json"
    args.write_text(json.dumps(CASE))
    base = ["--megatron-args", str(args), "--rank-tokens", "4096", "--micro-batch", "4",
            "--layers", "9", "--recompute", "none", "--json"]  # fmt: skip
    for tp in ("1", "2"):
        assert main([*base, "--tp", tp]) == 0
        out = json.loads(capsys.readouterr().out)
        (rank,) = out["ranks"]
        assert {"mamba", "mlp", "attention"} <= set(rank["components"]["retained"])
        assert rank["forward_backward_peak_bytes"] >= rank["forward_peak_bytes"] > 0
        assert rank["step"]["micro_batch"] == 4
    assert main([*base[:-1], "--micro-batch", "3"]) == 2
    assert capsys.readouterr().err.startswith("error: micro_batch=")


def test_megatron_args_refusals() -> None:
    for flags, field in (
        ({"--mtp-num-layers": 2}, "--mtp-num-layers"),
        ({"--hybrid-override-pattern": "M*"}, "--hybrid-override-pattern"),
        ({"--hybrid-layer-pattern": "ME", "--squared-relu": True, "--num-experts": 8},
         "--num-experts"),
        ({"--hybrid-layer-pattern": "M*/+"}, "--hybrid-layer-pattern"),
    ):  # fmt: skip
        with pytest.raises(SimInputError) as err:
            from_megatron_args({**CASE, **flags})
        assert err.value.field == field
    relu2 = _model("M-", **{"--squared-relu": True})
    assert (relu2.mlp_gated, relu2.mlp_activation) == (False, "squared_relu")


def test_squared_relu_mlp_keeps_two_f() -> None:
    """An MLP-only layer with --squared-relu (ungated fc1, F = 4H): megatron's
    ``squared_relu`` is ``torch.pow(F.relu(x), 2)``: relu keeps its output (F), pow its
    input (the same tensor), fc2's LoRA A the result (F). Per token with the norm input
    2H + rstd 4, fc1 LoRA A's input 2H and the two rank-1 activations 2 + 2."""
    f = 4 * H
    per_token = 2 * H + 4 + 2 * H + 2 + 2 * f + 2 * f + 2
    lay = _layout()
    one = _run("M-", lay).retained_bytes
    relu2 = simulate_rank(_model("M-", **{"--squared-relu": True}), lay, Recompute.parse("none"))
    plain = simulate_rank(_model("M"), lay, Recompute.parse("none"))
    assert relu2.retained_bytes - plain.retained_bytes == per_token * TOKENS
    assert one == relu2.retained_bytes  # GeLU (its input, then fc2's) keeps the same 2F


def test_nemotron_h_config() -> None:
    cfg = {
        "model_type": "nemotron_h", "hidden_size": 1024, "num_hidden_layers": 4,
        "hybrid_override_pattern": "M-M*", "num_attention_heads": 8,
        "num_key_value_heads": 2, "head_dim": 128, "intermediate_size": 4096,
        "mlp_hidden_act": "relu2", "mamba_num_heads": 32, "mamba_head_dim": 64,
        "ssm_state_size": 128, "n_groups": 8, "conv_kernel": 4, "vocab_size": 1000,
    }  # fmt: skip
    m = from_hf_config(cfg)
    assert m.kinds == ("mamba", "", "mamba", "attention")
    assert m.mlp_kinds == ("", "dense", "", "")
    assert (m.mamba_heads, m.mamba_groups, m.mlp_gated, m.mlp_activation, m.rope) == (
        32, 8, False, "squared_relu", False,
    )  # fmt: skip
    blocks = {**cfg, "hybrid_override_pattern": None,
              "layers_block_type": ["mamba", "mlp", "mamba", "attention"]}  # fmt: skip
    assert from_hf_config(blocks).kinds == m.kinds
    with pytest.raises(SimInputError, match=r"^config\.hybrid_override_pattern="):
        from_hf_config({**cfg, "hybrid_override_pattern": "M-ME"})
    with pytest.raises(SimInputError, match=r"^config\.hybrid_override_pattern="):
        from_hf_config({**cfg, "hybrid_override_pattern": "M-M"})
