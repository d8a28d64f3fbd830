"""The rank simulator's figures behind ``tight``'s MoE backward under recompute, produced
here (oracles/rank_sim/, CPU, fake tensors): what each MoE layer through its backward
keeps (``moe.ACCUMULATED_INPUT_GRADS``), what the eager GLU's backward holds
(``moe.MOE_GLU_BACKWARD_F``), and where the shared expert takes its activation. The
expected values are the simulator's, derived from what it allocates; nothing here prices
a step with cpmem.
"""

from __future__ import annotations

import itertools
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

import torch.nn.functional as F  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from cpmem.pricing.kinds.moe import ACCUMULATED_INPUT_GRADS, MOE_GLU_BACKWARD_F  # noqa: E402
from oracles.rank_sim.geometry import load_config  # noqa: E402
from oracles.rank_sim.layout import GdnPiece, RankLayout  # noqa: E402
from oracles.rank_sim.recompute import Recompute  # noqa: E402
from oracles.rank_sim.runner import simulate_rank  # noqa: E402
from oracles.rank_sim.tracker import LiveBytesTracker  # noqa: E402

warnings.filterwarnings("ignore")

CONFIGS = Path(__file__).resolve().parents[2] / "golden" / "simulated" / "configs"
BF16 = 2


def _backward_at_peak(config: str, layers: int, n: int, recompute: str = "full") -> int:
    """Bytes the simulated rank's backward (label ``backward``) holds at its
    forward+backward peak: the first ``layers`` layers of ``config``, ``n`` tokens, TP1."""
    model = load_config(CONFIGS / config).truncated(layers)
    layout = RankLayout(1, 1, 0, (n,), (n,), (GdnPiece(n),), n, True)
    sim = simulate_rank(model, layout, Recompute.parse(recompute, ""), ep=1)
    return sim.components["forward_backward_peak"].get("backward", 0)


def test_each_moe_layer_through_its_backward_keeps_its_input_gradient() -> None:
    """Under full recompute every MoE layer already through its backward keeps one
    ``H``-wide gradient (its checkpoint's detached input, held through the recomputed
    graph its dispatcher's ``probs`` keep): Qwen3-30B-A3B's structure, 1,024 tokens, each
    MoE layer more adds 2,048 elements per token (plus a few bytes) at the peak; a dense
    model's layers (Qwen3-1.7B's shape as a config) add none."""
    n = 1024
    moe = [_backward_at_peak("qwen3-30b-a3b.json", layers, n) for layers in (2, 3, 4)]
    per_layer = [(b - a) / (n * BF16) for a, b in itertools.pairwise(moe)]
    hidden = 2048
    assert all(p == pytest.approx(ACCUMULATED_INPUT_GRADS * hidden, rel=0.01) for p in per_layer)


def test_a_dense_model_keeps_no_gradient_per_layer_through_its_backward() -> None:
    """The same count on a dense model (Llama-3.1-8B's structure): nothing accumulates."""
    n = 1024
    dense = [_backward_at_peak("llama-3.1-8b-style.json", layers, n) for layers in (2, 4)]
    assert dense[1] == dense[0]


def test_the_eager_glu_backward_rises_seven_ffn_widths_a_row() -> None:
    """megatron's eager probs-weighted GLU as the simulator runs it (``MoE.activation``:
    ``(silu(x0) * (x1 + 0)) * probs`` in fp32, cast to bf16): its backward rises 7
    ``F_e``-wide bf16 elements per row above the saved set, its output and the incoming
    gradient (the fp32 gradients and their casts). By then fc2's backward has freed the
    output it saved (1 ``F_e``), so ``tight`` prices 7 - 1 beyond the whole saved set."""
    rows, fe = 4096, 1408
    with FakeTensorMode():
        h = torch.empty(rows, 2 * fe, dtype=torch.bfloat16, requires_grad=True)
        probs = torch.empty(rows, 1, dtype=torch.float32, requires_grad=True)
        with LiveBytesTracker([h, probs]) as tracker:
            x0, x1 = torch.chunk(h, 2, dim=-1)
            out = ((F.silu(x0) * (x1 + 0.0)) * probs).to(h.dtype)
            grad = torch.empty_like(out)
            tracker.set_phase("backward")
            before = tracker.live
            out.backward(grad)
            rise = tracker.peaks["backward"].bytes - before
    assert rise == 7 * rows * fe * BF16
    assert MOE_GLU_BACKWARD_F == 7 - 1


def test_a_shared_expert_takes_the_dense_mlps_activation() -> None:
    """megatron-core 0.16 ``SharedExpertMLP.forward`` is ``MLP.forward``: with the model's
    SwiGLU unfused (Moonlight-16B-A3B read from its config), the shared expert keeps the
    unfused GLU's set, ``2F_s`` more per token than the fused one (fc1's output, silu's
    and ``x1 + 0``'s outputs and the product, against the fused kernel's input and
    output). Recompute none, two layers (one dense, one MoE), 1,024 tokens."""
    from dataclasses import replace

    n = 1024
    base = load_config(CONFIGS / "moonlight-16b-a3b.json").truncated(2)
    layout = RankLayout(1, 1, 0, (n,), (n,), (GdnPiece(n),), n, True)
    kept = {}
    for fused in (False, True):
        model = replace(base, fused_swiglu=fused)
        sim = simulate_rank(model, layout, Recompute.parse("none", ""), ep=1)
        kept[fused] = sim.components["retained"]
    assert base.fused_swiglu is False and base.shared_expert_ffn == 2816
    shared_gap = (kept[False]["moe"] - kept[True]["moe"]) / (n * BF16)
    assert shared_gap == 2 * base.shared_expert_ffn
    dense_gap = (kept[False]["mlp"] - kept[True]["mlp"]) / (n * BF16)
    assert dense_gap == 2 * base.dense_ffn
