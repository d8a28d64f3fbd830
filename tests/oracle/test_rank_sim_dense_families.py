"""Rank simulator: the dense families' attention as transformers builds it.

``LlamaAttention``, ``MistralAttention`` and ``Qwen2Attention`` have no q_norm / k_norm;
``Qwen3Attention`` has (``q_norm``/``k_norm = Qwen3RMSNorm(head_dim)``). Qwen2's q/k/v
projections always carry biases (``bias=True``), its output projection none; Llama's
follow ``config.attention_bias``; Mistral's never do. Every expected figure below is the
per-token accounting of oracles/rank_sim/README.md ("Where each modelled tensor comes
from") written out in the Llama-3.1-8B config's numbers. Per-layer bytes are the
difference between 3 and 2 layers of one label's retained bytes (the first layer's input
carries no grad and the last layer's output feeds the harness).
"""

from __future__ import annotations

import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from oracles.rank_sim.geometry import SimModel, from_hf_config, load_config  # noqa: E402
from oracles.rank_sim.layout import GdnPiece, RankLayout  # noqa: E402
from oracles.rank_sim.recompute import Recompute  # noqa: E402
from oracles.rank_sim.runner import simulate_rank  # noqa: E402

warnings.filterwarnings("ignore")

CONFIGS = Path(__file__).resolve().parents[2] / "golden" / "simulated" / "configs"
NONE = Recompute.parse("none", "")
R = 1  # the harness's LoRA rank, on every projection
BF16 = 2  # bytes
N = 256  # tokens on the rank


def _config(name: str) -> SimModel:
    return load_config(CONFIGS / f"{name}.json")


def _layout(tokens: int, tp: int = 1) -> RankLayout:
    return RankLayout(tp, 1, 0, (tokens,), (tokens,), (GdnPiece(tokens),), tokens, True)


def _per_layer(model: SimModel, layout: RankLayout, label: str) -> int:
    """Retained bytes of ``label`` that one more layer adds."""
    got = [
        simulate_rank(model.truncated(n), layout, NONE).components["retained"].get(label, 0)
        for n in (2, 3)
    ]
    return got[1] - got[0]


def _small(model_type: str, **extra: Any) -> dict[str, Any]:
    return {
        "model_type": model_type, "hidden_size": 256, "intermediate_size": 512,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 1024, **extra,
    }  # fmt: skip


def test_configs_read_each_familys_q_k_norm_and_biases() -> None:
    llama = _config("llama-3.1-8b-style")
    assert (llama.family, llama.qk_norm, llama.attention_bias, llama.qkv_bias) == (
        "llama", False, False, False,
    )  # fmt: skip
    qwen3 = _config("qwen3-32b-style")  # Qwen3Attention: q_norm, k_norm
    assert (qwen3.family, qwen3.qk_norm) == ("", True)
    assert _config("qwen3-next-style-dense").qk_norm  # Qwen3NextAttention: q_norm, k_norm
    mistral = from_hf_config(_small("mistral", attention_bias=True))  # bias=False always
    assert (mistral.family, mistral.qk_norm, mistral.attention_bias) == ("mistral", False, False)
    qwen2 = from_hf_config(_small("qwen2"))  # q/k/v bias=True, o_proj bias=False
    assert (qwen2.family, qwen2.qk_norm, qwen2.qkv_bias, qwen2.attention_bias) == (
        "qwen2", False, True, False,
    )  # fmt: skip
    assert from_hf_config(_small("llama", attention_bias=True)).attention_bias  # the field's


def test_llama_layer_saved_set_per_token() -> None:
    """Llama-3.1-8B at TP1, bf16 elements per token and layer (H 4096, F 14336, 32 query
    heads and 8 KV heads of 128). Attention: residual out H (the pre-MLP norm's input),
    input-norm rstd 2 (fp32), norm out H (qkv LoRA A), qkv B R, the qkv output
    (hq + 2 hkv) d (pinned by the value view), rotated q hq d and k hkv d, out hq d, fp32
    lse 2 hq, proj B R: no query copy and no q/k rstd. MLP (unfused SwiGLU): pre-norm
    rstd 2, norm out H, fc1 B R, fc1 output 2F (pinned by silu's input view), silu(x0) F,
    x1 + 0 F, the product F (fc2 A), fc2 B R, residual out H."""
    m = _config("llama-3.1-8b-style")
    H, F, hq, hkv, d = m.hidden, m.ffn, m.q_heads, m.kv_groups, m.head_dim
    assert (H, F, hq, hkv, d, m.fused_swiglu) == (4096, 14336, 32, 8, 128, False)
    attention = H + 2 + H + R + (hq + 2 * hkv) * d + hq * d + hkv * d + hq * d + 2 * hq + R
    assert attention == 23_620
    mlp = 2 + H + R + 2 * F + F + F + F + R + H
    assert mlp == 79_876
    lay = _layout(N)
    assert _per_layer(m, lay, "attention") == BF16 * N * attention
    assert _per_layer(m, lay, "mlp") == BF16 * N * mlp


@pytest.mark.parametrize(
    ("tp", "extra"),
    [
        # TP1: 8 query groups on the rank, so the query reshape is a copy the q norm keeps,
        # beside the fp32 rstd of every query and key head
        (1, 32 * 128 + 2 * 32 + 2 * 8),
        # TP8: one group per rank, the query a view of the projection; only the rstd
        # of the rank's 4 query heads and 1 KV head
        (8, (2 * 32 + 2 * 8) // 8),
    ],
)
def test_a_q_k_norm_would_keep_the_query_copy_and_the_rstd(tp: int, extra: int) -> None:
    """What the q/k norm the Llama layer does not have would keep (elements per token):
    the difference between the published layer and the same shapes with Qwen3's norm."""
    m = _config("llama-3.1-8b-style")
    lay = _layout(N, tp=tp)
    normed = _per_layer(replace(m, qk_norm=True), lay, "attention")
    assert normed - _per_layer(m, lay, "attention") == BF16 * N * extra


def _attention_biases(model: SimModel) -> tuple[Any, Any]:
    """The first layer's (q/k/v bias, output bias) shapes as the simulator builds them."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from oracles.rank_sim.layers import RankContext, build_layers
    from oracles.rank_sim.runner import init_groups, release_groups

    init_groups(1, 1, 0)
    try:
        with FakeTensorMode(allow_non_fake_inputs=True):
            mixer = build_layers(RankContext(model, _layout(N), NONE, False, None))[0].mixer
            return tuple(None if b is None else tuple(b.shape) for b in (
                mixer.qkv_bias, mixer.proj_bias,
            ))  # fmt: skip
    finally:
        release_groups()


def test_qwen2_has_q_k_v_biases_and_they_keep_nothing() -> None:
    """Qwen2Attention: a bias on q, k and v ((4 + 2 x 2) x 64 = 512 wide here), none on the
    output; Llama without ``attention_bias`` and Mistral: none. A frozen bias saves
    nothing for backward (``output + bias``): the q/k/v biases move no retained byte."""
    m = from_hf_config(_small("qwen2", num_hidden_layers=3))
    assert _attention_biases(m) == ((512,), None)
    assert _attention_biases(from_hf_config(_small("llama"))) == (None, None)
    assert _attention_biases(from_hf_config(_small("mistral"))) == (None, None)
    lay = _layout(N)
    biased = simulate_rank(m, lay, NONE).retained_bytes
    assert biased == simulate_rank(replace(m, qkv_bias=False), lay, NONE).retained_bytes
