"""Saved-tensor counts behind ``tight``'s counted constants, from dtype sizes.

Each constant whose docstring names the tensors it counts is restated here as the sum of
those tensors' element sizes in bf16-equivalent elements (2 bytes), and, where the
tensors are megatron-core's, the installed megatron-core source is read (as text, no
import) for the dtype that sets their size. The rank simulator's own figures for the
same constants are produced in tests/oracle/test_tight_simulated_facts.py.
"""

from __future__ import annotations

import importlib.util
import struct
from pathlib import Path

import pytest

from cpmem.pricing.kinds.attention import FLASH_BACKWARD_DQ_Q
from cpmem.pricing.kinds.moe import (
    FUSED_ROUTER_DROPS_PER_TOPK,
    MOE_ROUTER_PER_TOPK,
    MOE_ROW_SMALL,
)

# element sizes in bytes (struct's standard sizes: "e" half, "f" float, "q" long long)
BF16 = struct.calcsize("<e")  # bf16 has the half's 2 bytes
FP32 = struct.calcsize("<f")
INT64 = struct.calcsize("<q")
RANK_1 = 1  # a rank-1 LoRA activation: one element per row


def _elements(*sizes: int) -> float:
    """Bytes as bf16-equivalent elements."""
    return sum(sizes) / BF16


def test_dtype_sizes() -> None:
    assert (BF16, FP32, INT64) == (2, 4, 8)


def test_router_keeps_fp32_probs_and_two_int64_indices_per_routed_slot() -> None:
    """``MOE_ROUTER_PER_TOPK``, per local token and routed slot: the fp32 top-k softmax
    output, the int64 top-k indices and the int64 sorted token indices (4 + 8 + 8 bytes)."""
    assert _elements(FP32, INT64, INT64) == 10
    assert _elements(FP32, INT64, INT64) == MOE_ROUTER_PER_TOPK


def test_the_fused_router_drops_the_top_k_s_fp32_probability_and_int64_index() -> None:
    """``FUSED_ROUTER_DROPS_PER_TOPK``, per local token and routed slot: what the unfused
    top-k keeps and Transformer Engine's fused kernel does not (4 + 8 bytes); the int64
    sorted token indices of the permutation stay."""
    assert _elements(FP32, INT64) == 6
    assert _elements(FP32, INT64) == FUSED_ROUTER_DROPS_PER_TOPK
    assert _elements(INT64) == MOE_ROUTER_PER_TOPK - FUSED_ROUTER_DROPS_PER_TOPK


def test_expert_row_small_terms_are_its_fp32_prob_and_two_rank_1_activations() -> None:
    """``MOE_ROW_SMALL``, per routed expert row besides its H- and F_e-wide tensors: the
    row's fp32 routing prob (saved by the probs scaling) and the rank-1 activations of the
    fc1 and fc2 adapters (one bf16 element each)."""
    assert _elements(FP32) + 2 * RANK_1 == 4
    assert _elements(FP32) + 2 * RANK_1 == MOE_ROW_SMALL


def test_flash_backward_query_gradient_is_bf16_dq_and_its_fp32_accumulator() -> None:
    """``FLASH_BACKWARD_DQ_Q``, per query element: FlashAttention-2's backward writes dq
    (bf16) through an fp32 accumulator of the same shape (2 + 4 bytes = 3 query widths)."""
    assert _elements(BF16, FP32) == 3
    assert _elements(BF16, FP32) == FLASH_BACKWARD_DQ_Q


def _megatron_source(relative: str) -> str:
    spec = importlib.util.find_spec("megatron")  # a namespace package: imports nothing
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("megatron-core is not installed")
    for root in spec.submodule_search_locations:
        path = Path(root) / relative
        if path.is_file():
            return path.read_text(encoding="utf-8")
    pytest.skip(f"megatron/{relative} not found")


def test_megatron_router_tensors_have_those_dtypes() -> None:
    """megatron-core's unfused routing (the path the simulator restates): the top-k
    indices come from ``torch.topk`` (int64), the top-k probs from a softmax computed in
    fp32 and cast to the router logits' dtype (fp32: Qwen3.5-MoE routes in fp32), and
    ``permute``'s sorted token indices are an int64 ``arange`` masked by the routing map."""
    text = _megatron_source("core/transformer/moe/moe_utils.py")
    assert "return torch.topk(scores, k=topk, dim=1)" in text
    assert "probs = torch.softmax(scores, dim=-1, dtype=torch.float32).type_as(logits)" in text
    assert "torch.arange(num_tokens, device=routing_map.device)" in text
    assert "sorted_indices = token_indices.masked_select(routing_map)" in text
