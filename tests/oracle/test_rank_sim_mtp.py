"""Rank simulator: what one multi-token-prediction depth keeps (mtp.py), counted by hand
from Megatron-LM's ``MultiTokenPredictionLayer`` / ``process_mtp_loss`` at the
recordings' snapshot (d98e8a64, megatron/core/transformer/multi_token_prediction.py) and
megatron-core 0.16's mappings and cross entropy (installed), never from the simulator's
arithmetic.

One depth after a two-layer decoder (attention + dense MLP, the small model of
test_rank_sim_full_training.py), head ``logits``, 1,024 tokens, TP1 and TP2 with SP,
LoRA and full training; the expected bytes are what ``mtp_depths=1`` retains after the
forward beyond ``mtp_depths=0``, per token of the rank (t = TP):

- ``hnorm`` keeps its input, the decoder's normed output (2H/t; under full training the
  output layer kept it without MTP, so it is no extra there), and its fp32 rstd 4/t;
- the depth's layer input: ``eh_proj``'s output all-gathered along the hidden dim, and
  under SP ``scatter_to_sequence_parallel_region`` hands the layer a VIEW of that
  ``[tokens, H]`` tensor (``_split_along_first_dim``): the layer's input norm keeps all
  of it, 2H, not 2H/t;
- the depth's layer: the decoder layer's kept set (test_rank_sim_full_training.py's
  counts), and the final layernorm's fp32 rstd 4/t;
- its head: the cross entropy's fp32 softmax 4·V/t, its bool target mask and int64
  masked targets (1 + 8), ``loss_mask * loss`` keeps the rolled fp32 mask (4),
  ``MTPLossAutoScaler`` the per-token fp32 scaled loss (4), whose division by the
  clamped token count keeps that 0-d divisor (one 512-byte block per depth);
- full training only: the lookup keeps the ids it read (8; at TP > 1 its shifted copy
  and the output's bool mask, 8 + 1), ``enorm`` its input (the embedding output, 2H/t)
  and rstd 4/t, ``eh_proj`` the 2H concatenation (its local shard, 4H/t), and the
  output layers (main and depth) keep their inputs, views of the one
  ``[(1 + D) tokens/t, H]`` concatenation of the block: 2(1 + D)H/t where the main
  output layer kept the decoder's normed output (2H/t) alone.

Outside that per-token set and checked on their own: the batch's position ids and fp32
loss mask (and the token ids the lookup reads: label ``labels``), and under full training
with SP megatron's "mpu" gather buffer, which grows to ``eh_proj``'s 2H input.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import replace
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from oracles.rank_sim.__main__ import main  # noqa: E402
from oracles.rank_sim.geometry import SimInputError, SimModel  # noqa: E402
from oracles.rank_sim.hybrid import from_megatron_args  # noqa: E402
from oracles.rank_sim.layout import GdnPiece, RankLayout  # noqa: E402
from oracles.rank_sim.recompute import Recompute  # noqa: E402
from oracles.rank_sim.runner import RankResult, simulate_rank  # noqa: E402

warnings.filterwarnings("ignore")

NONE = Recompute.parse("none", "")
N, R, BF16 = 1024, 1, 2
H, F, HQ, HKV, D = 256, 512, 8, 4, 32
Q, KV = HQ * D, HKV * D
V = 1024  # vocabulary 1000 padded to a multiple of 128·TP
MODEL = SimModel(
    "small", H, F, HQ, HKV, D, False, True, ("attention",) * 2, vocab=1000, family="qwen3"
)
BATCH = ("labels", "mpu_buffer")  # checked on their own


def _layout(tp: int) -> RankLayout:
    return RankLayout(tp, 1, 0, (N,), (N,), (GdnPiece(N),), N, True)


def _run(tp: int, depths: int, training: str = "lora", **kw: Any) -> RankResult:
    return simulate_rank(
        MODEL, _layout(tp), NONE, head="logits", mtp_depths=depths, training=training, **kw
    )


def _kept(r: RankResult) -> int:
    return sum(v for k, v in r.components["retained"].items() if k not in BATCH)


def _layer_elements(t: int, training: str) -> float:
    """The decoder layer's kept set, elements per token (test_rank_sim_full_training's
    ``_attention`` and ``test_dense_mlp_trained_vs_lora`` counts): attention and MLP,
    each with its residual output; LoRA adds per sub-layer the column projection's
    gathered norm output (SP) and R, the row projection's R/t (SP) or R."""
    attention = (
        2 / t + H / t + (Q + 2 * KV) / t + Q / t + 2 * (HQ + HKV) / t + (Q + KV) / t + Q / t
        + 2 * HQ / t + H / t
    )  # fmt: skip
    mlp = 2 / t + H / t + 2 * F / t + F / t + H / t
    if training == "full":
        return attention + mlp
    sp = t > 1
    adapters = (H if sp else 0) + R + (R / t if sp else R)
    return attention + mlp + 2 * adapters


def _depth_bytes(t: int, training: str) -> float:
    """One depth's kept bytes per token beyond the step without MTP (module docstring)."""
    head = 4 * V / t + 1 + 8 + 4 + 4
    common = 4 / t + 2 * H + BF16 * _layer_elements(t, training) + 4 / t + head
    if training == "lora":
        return common + 2 * H / t  # hnorm's input
    ids = 8 + (1 if t > 1 else 0)
    return common + ids + 2 * H / t + 4 / t + 4 * H / t + 2 * 2 * H / t


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("training", ["lora", "full"])
def test_one_depth_keeps_by_hand(training: str, tp: int) -> None:
    got = _kept(_run(tp, 1, training)) - _kept(_run(tp, 0, training))
    assert got == N * _depth_bytes(tp, training) + 512


@pytest.mark.parametrize("tp", [1, 2])
def test_batch_and_gather_buffer(tp: int) -> None:
    """An MTP step's batch holds the token ids, position ids (int64) and the fp32 loss mask
    beside the labels; under full training the lookup of the decoder's input reads the
    same ids. With SP megatron's persistent gather buffer grows from H (the widest
    column-parallel input of the decoder and head) to eh_proj's 2H."""
    for training in ("lora", "full"):
        with_mtp, without = _run(tp, 1, training), _run(tp, 0, training)
        extra = 8 + 8 + 4 if training == "lora" else 8 + 4  # the ids are there already
        labels = [r.components["retained"]["labels"] for r in (with_mtp, without)]
        assert labels[0] - labels[1] == N * extra
    mpu = [_run(tp, k, "full").components["retained"].get("mpu_buffer", 0) for k in (1, 0)]
    assert mpu == ([BF16 * N * 2 * H, BF16 * N * H] if tp > 1 else [0, 0])


def test_a_second_depth_and_a_shared_layer() -> None:
    """Depth 2 keeps what depth 1 does, and its ``hnorm`` keeps depth 1's normed output
    (2H/t) where depth 1's keeps the decoder's (TP2 SP, LoRA). One layer run for both
    depths (``mtp_use_repeated_layer``) keeps the same activations."""
    one, two = (_kept(_run(2, k)) for k in (1, 2))
    assert two - one == N * _depth_bytes(2, "lora") + 512
    shared = _run(2, 2, mtp_shared=True)
    assert _kept(shared) == two
    assert shared.forward_backward_peak_bytes == _run(2, 2).forward_backward_peak_bytes


def test_depth_layers_follow_the_decoder_or_the_pattern() -> None:
    """Megatron GPT: one layer of the decoder's last kind (an attention layer with the
    last layer's feed-forward, labels ``mtp.attention`` / ``mtp.moe``); a hybrid
    pattern's '/' part: its layers ("*-": attention then MLP), twice for two '/'s."""
    from oracles.rank_sim.mtp import depth_stack

    moe = replace(MODEL, moe=True, num_experts=4, moe_top_k=2, expert_ffn=64)
    assert depth_stack(moe) == (("attention",), ("moe",))
    r = simulate_rank(moe, _layout(1), NONE, head="logits", mtp_depths=1)
    assert {"mtp", "mtp.attention", "mtp.moe", "mtp_head"} <= set(r.components["retained"])
    flags = {
        "--hidden-size": 256, "--num-attention-heads": 8, "--vocab-size": 1000,
        "--hybrid-layer-pattern": "M*-/*-/*-",
    }  # fmt: skip
    hybrid = from_megatron_args(flags)
    assert (hybrid.mtp_kinds, hybrid.mtp_mlp_kinds, hybrid.mtp_depths) == (
        ("attention", ""), ("", "dense"), 2,
    )  # fmt: skip
    legacy = from_megatron_args(
        {**flags, "--hybrid-layer-pattern": "M*-", "--mtp-hybrid-override-pattern": "*-",
         "--mtp-num-layers": 2, "--mtp-use-repeated-layer": True}
    )  # fmt: skip
    assert (legacy.mtp_kinds, legacy.mtp_depths, legacy.mtp_shared) == (
        hybrid.mtp_kinds, 2, True,
    )  # fmt: skip
    r = simulate_rank(hybrid, _layout(2), NONE, head="logits")
    assert r.step["mtp_depths"] == 2 and "mtp.mlp" in r.components["retained"]


def test_mtp_inputs_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SimInputError, match=r"^mtp_depths=1: .*logits or fused"):
        simulate_rank(MODEL, _layout(1), NONE, mtp_depths=1)
    with pytest.raises(SimInputError, match=r"^mtp_depths=-1"):
        simulate_rank(MODEL, _layout(1), NONE, head="logits", mtp_depths=-1)
    with pytest.raises(SimInputError, match=r"^mtp_depths=1: .*vocabulary"):
        simulate_rank(replace(MODEL, vocab=0), _layout(1), NONE, head="logits", mtp_depths=1)
    hybrid = from_megatron_args({"--hidden-size": 256, "--hybrid-layer-pattern": "M-"})
    with pytest.raises(SimInputError, match=r"^mtp_depths=1: .*'/'"):
        simulate_rank(hybrid, _layout(1), NONE, head="logits", mtp_depths=1)
    argv = ["--model", "qwen3-1.7b", "--rank-tokens", "256", "--layers", "1"]
    assert main([*argv, "--mtp-depths", "1"]) == 2
    assert "mtp_depths=1" in capsys.readouterr().err
    assert main([*argv, "--mtp-depths", "1", "--pp", "2"]) == 2
    assert "pipeline stages run no MTP" in capsys.readouterr().err
    assert main([*argv, "--head", "logits", "--mtp-depths", "1", "--training", "full",
                 "--mtp-shared", "--json"]) == 0  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert out["step"] == {
        "head": "logits", "training": "full", "gradient_accumulation_fusion": True,
        "cp_comm": "all_gather", "mtp_depths": 1, "mtp_shared": True,
    }  # fmt: skip
