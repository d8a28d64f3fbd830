"""The flex token dispatcher with its HybridEP backend against the ``alltoall`` set the MoE
kind restates (``cpmem.pricing.kinds.moe_dispatch``), each figure counted by hand from
Megatron-LM d98e8a64 (``megatron/core/transformer/moe/token_dispatcher.py``,
``fused_a2a.py``) and DeepEP hybrid-ep 17cfb81 (``csrc/hybrid_ep/executor/executor.cu``,
``hybrid_ep.cu``, ``allocator/allocator.cu``), on the functional tests' tiny GPT made MoE:
8 experts, top-2, EP 8 over 8 GPUs (ETP 1, TP 1, no SP), 4 x 1024 tokens a rank, 12 MoE
layers, an fp32 router.
"""

from __future__ import annotations

from typing import Any

from megatron_lm.tiny import priced, step_of, tiny

from cpmem.megatron.args import MegatronArgs
from cpmem.pricing.kinds.moe_dispatch import (
    HYBRIDEP_BUFFERS_NOTE,
    after_forward_rows,
    hybridep_handle_bytes,
)
from cpmem.pricing.tight.compose import tight_widths
from cpmem.reports.cli_render import render_basis

E, TOP_K, EP, TOKENS, LAYERS, BF16 = 8, 2, 8, 4096, 12, 2
MOE: dict[str, Any] = {
    "num_experts": E,
    "moe_router_topk": TOP_K,
    "expert_model_parallel_size": EP,
    "add_bias_linear": False,
    "moe_router_dtype": "fp32",
}


def _moe(dispatcher: str, **changes: Any) -> MegatronArgs:
    if dispatcher == "hybridep":
        return tiny(
            moe_token_dispatcher_type="flex",
            moe_flex_dispatcher_backend="hybridep",
            **{**MOE, **changes},
        )
    return tiny(moe_token_dispatcher_type=dispatcher, **{**MOE, **changes})


def test_the_handle_is_the_executor_s_maps_per_token() -> None:
    """Per local token, with 8 ranks of 1 local expert each (executor.cu:93-126):
    ``local_expert_routing_map`` bool [T x 8, 1] (8 B) and ``dense_to_expert_map`` int32
    [T x 8, 1] (32 B); ``sparse_to_dense_map`` int32 [T x nodes, 8 / nodes] (32 B);
    ``rdma_to_attn_map`` and ``attn_to_rdma_map`` (nodes and nodes - 1 B) and
    ``dense_chunk_layout`` (4 B per chunk and rank) at their bounds, 8 nodes and one-token
    chunks (8 + 8 + 32 B): 120 B."""
    step = step_of(_moe("hybridep"))
    assert hybridep_handle_bytes(step.geometry, step) == 8 + 32 + 32 + 8 + 8 + 32


def test_hybridep_keeps_its_handle_and_not_permute_s_indices_and_map() -> None:
    """Per token and MoE layer the saved set gains the handle (120 B) and loses megatron's
    ``permute``: the int64 sorted indices (8 B per routed slot, 16 B) and the transposed
    bool routing map (1 B per expert, 8 B): (120 - 24) / 2 = 48 bf16 elements; the rows
    the experts take are the same tensors (hybrid_ep.cu:312-317)."""
    alltoall, hybridep = step_of(_moe("alltoall")), step_of(_moe("hybridep"))
    assert hybridep.settings.runtime.moe_dispatcher == "hybridep"
    moe = tight_widths(hybridep.geometry, hybridep).of("moe")
    assert moe - tight_widths(alltoall.geometry, alltoall).of("moe") == 48


def test_the_whole_step_keeps_the_handle_on_every_moe_layer() -> None:
    """12 MoE layers x 4,096 tokens x 48 elements x 2 B more retained than ``alltoall``."""
    a = priced(_moe("alltoall")).components["retained_activations"]
    h = priced(_moe("hybridep")).components["retained_activations"]
    assert h - a == LAYERS * TOKENS * 48 * BF16


def test_the_manager_keeps_the_dispatched_probabilities_after_the_forward() -> None:
    """``self.dispatched_probs`` (token_dispatcher.py:1150): fp32, one per routed row, 2
    elements; the step's routing is the worst case, every EP rank's tokens on this one's
    one expert, one row from each EP rank's token (8 rows a local token): 16 elements a token."""
    step = step_of(_moe("hybridep"))
    assert step.expert_rows_per_token(1) == 8
    assert after_forward_rows(step, 1) == 8 * 2
    assert after_forward_rows(step_of(_moe("alltoall")), 1) == 0


def test_the_communication_buffers_are_named_outside_the_allocator() -> None:
    """cuMemCreate / cudaMalloc (allocator.cu:87-97): not in any figure, named."""
    assert HYBRIDEP_BUFFERS_NOTE in priced(_moe("hybridep")).notes
    assert HYBRIDEP_BUFFERS_NOTE not in priced(_moe("alltoall")).notes


def test_the_text_answer_says_the_buffers_are_outside_the_figure() -> None:
    """The note reaches the text answer as memory outside the figure, not only the JSON's
    notes."""
    lines = render_basis(priced(_moe("hybridep")))
    assert f"outside the figure: {HYBRIDEP_BUFFERS_NOTE}" in lines
    assert not any("hybridep" in line for line in render_basis(priced(_moe("alltoall"))))
