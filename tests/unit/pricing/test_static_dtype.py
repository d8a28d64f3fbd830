"""``--dtype`` reaches every tensor it names: the frozen base, the adapters and full
training's weights in the parameters' dtype, the optimizer's buffers as megatron-core
0.16.1 keeps them for it, and an fp32 step's attention as Transformer Engine runs it.

Expected figures are counted by hand from Qwen3-1.7B's published config (hidden 2,048;
28 layers; 16 query heads and 8 KV groups of 128; FFN 6,144; tied embeddings over a
vocabulary of 151,936 = 128 x 1,187, unpadded at TP 1; RMSNorm with q/k norms):

- a layer: Q 2,048 x 2,048, K and V 2,048 x 1,024 each, the output projection
  2,048 x 2,048, the SwiGLU MLP 3 x 2,048 x 6,144 = 37,748,736, the two input norms
  2 x 2,048 and the q/k norms 2 x 128: 50,336,000 parameters; 28 layers 1,409,408,000;
- the embedding 151,936 x 2,048 = 311,164,928 and the final norm 2,048:
  1,720,574,976 parameters in all;
- rank-1 adapters on every projection, per layer: QKV (A 2,048 in + B 4,096 out) 6,144,
  the output projection 2,048 + 2,048, fc1 2,048 + 12,288, fc2 6,144 + 2,048: 32,768;
  28 layers 917,504 trainable parameters.

The optimizer buffers: megatron-core copies a 2-byte parameter into an fp32 master
(optimizer.py:672-674, distrib_optimizer.py:395-399) and steps an fp32 one itself
(``FP32Optimizer``, optimizer/__init__.py:463-465; the distributed optimizer's view,
distrib_optimizer.py:419-424); a 2-byte ``main_grad`` is copied to fp32 at the step
(optimizer.py:759, distrib_optimizer.py:2419). Adam's moments are two fp32 elements.
"""

from __future__ import annotations

from typing import Any

import pytest

from cpmem.api import describe_megatron, estimate
from cpmem.errors import InputError
from cpmem.pricing.registry import price

PARAMS = 1_720_574_976
TRAINABLE = 917_504
MEGATRON_CASE = (
    "golden/megatron/cases/gpt/gpt3_mcore_te_tp1_pp1_dist_optimizer_no_mmap_bin_files/"
    "model_config.yaml"
)


def _static(**settings: Any) -> dict[str, int]:
    est = estimate("qwen3-1.7b", [2048], policy="tight", **settings)
    assert est.static is not None
    return est.static.components


@pytest.mark.parametrize(
    ("dtype", "param", "grad", "master", "master_grad"),
    [
        ("bf16", 2, 4, 4, 0),  # fp32 main_grad (bf16 forces it), an fp32 master
        ("fp16", 2, 2, 4, 4),  # fp16 main_grad, copied to fp32 at the step
        ("fp32", 4, 4, 0, 0),  # the fp32 parameters are the optimizer's own
    ],
)
def test_lora_prices_the_base_and_adapters_in_the_dtype(
    dtype: str, param: int, grad: int, master: int, master_grad: int
) -> None:
    static = _static(dtype=dtype)
    assert static["base_weights"] == param * PARAMS
    assert static["adapter_params"] == param * TRAINABLE
    assert static["adapter_grads"] == grad * TRAINABLE
    assert static["optimizer_states"] == (master + 8) * TRAINABLE  # a steady step: moments
    assert static.get("master_gradients", 0) == master_grad * TRAINABLE


@pytest.mark.parametrize(
    ("dtype", "param", "grad", "master", "master_grad"),
    [("bf16", 2, 4, 4, 0), ("fp16", 2, 2, 4, 4), ("fp32", 4, 4, 0, 0)],
)
def test_full_training_prices_the_weights_and_optimizer_in_the_dtype(
    dtype: str, param: int, grad: int, master: int, master_grad: int
) -> None:
    """One rank holds every parameter (TP 1, no distributed optimizer: no padding)."""
    static = _static(dtype=dtype, runtime="megatron-lm", training="full")
    assert static["weights"] == param * PARAMS
    assert static["gradient_buffer"] == grad * PARAMS
    assert static["optimizer_states"] == (master + 8) * PARAMS
    assert static.get("master_gradients", 0) == master_grad * PARAMS


def test_fp32_attention_is_transformer_engines_unfused_never_flash_or_fused() -> None:
    """Transformer Engine turns flash and fused attention off for an fp32 qkv
    (utils.py:435-465 at TE v2.11): unasked, the backend is its choice, unfused."""
    est = estimate("qwen3-1.7b", [2048], dtype="fp32", policy="tight")
    assert (est.attention_backend, est.backend_asked) == ("unfused", "auto")
    for backend in ("flash", "fused"):
        with pytest.raises(InputError, match="bf16 and fp16 only") as err:
            estimate("qwen3-1.7b", [2048], dtype="fp32", attention_backend=backend)
        assert err.value.field == "attention_backend"
    unfused = estimate("qwen3-1.7b", [2048], dtype="fp32", attention_backend="unfused")
    assert unfused.attention_backend == "unfused"


def test_fp32_under_context_parallelism_is_refused() -> None:
    """Unfused attention never runs under CP and flash and fused take no fp32: Transformer
    Engine has no backend for the step."""
    with pytest.raises(InputError, match="no backend"):
        estimate("qwen3-1.7b", [2048, 2048], dtype="fp32", cp=2)


def test_a_megatron_runs_dtype_override_follows_megatrons_gradient_rule() -> None:
    """The case runs --bf16 (fp32 main_grad); as --fp16 its main_grad is fp16 (half the
    gradient buffer) and the optimizer's fp32 copy of it appears."""
    bf16 = price(describe_megatron(MEGATRON_CASE, world_size=8)).static
    fp16 = price(describe_megatron(MEGATRON_CASE, world_size=8, dtype="fp16")).static
    assert bf16 is not None and fp16 is not None
    b, f = bf16.components, fp16.components
    assert f["gradient_buffer"] * 2 == b["gradient_buffer"]
    assert f["weights"] == b["weights"] and f["optimizer_states"] == b["optimizer_states"]
    assert "master_gradients" not in b and f["master_gradients"] > 0
