"""What an MoE layer keeps that depends on its token dispatcher (``Runtime.moe_dispatcher``)
beyond the ``alltoall`` dispatcher the MoE kind's saved set restates
(``cpmem.pricing.kinds.moe``).

- ``alltoall`` and ``allgather``: nothing beyond it (the allgather's gathered tokens sit in
  megatron's global buffer, ``cpmem.pricing.workspaces``).
- ``hybridep``: megatron-core's flex dispatcher with the HybridEP backend
  (``--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep``;
  ``MoEFlexTokenDispatcher`` and ``_HybridEPManager``, Megatron-LM d98e8a64
  ``megatron/core/transformer/moe/token_dispatcher.py:1001-1216``). One fused kernel
  permutes, exchanges and sorts the tokens (``HybridEPDispatch``, ``fused_a2a.py:358-476``),
  so megatron's ``permute`` does not run: its saved sorted token indices (int64, one per
  routed slot) and transposed bool routing map (``E`` bytes a token), part of the
  ``alltoall`` set's ``MOE_ROUTER_PER_TOPK·top_k + E/2``, are not kept. Neither fused
  autograd function saves a tensor (``ctx.handle`` only, ``fused_a2a.py:437,495``), and the
  rows it hands the experts are the same ``[rows, H]`` bf16 tokens and ``[rows]`` fp32
  probabilities (DeepEP hybrid-ep 17cfb81 ``csrc/hybrid_ep/hybrid_ep.cu:314,316``, through
  PyTorch's allocator); what the handle holds is new (``HYBRIDEP_HANDLE_BYTES``). The
  communication buffers are outside PyTorch's allocator (``HYBRIDEP_BUFFERS_NOTE``).

The forward's transient at the combine stays the ``alltoall`` set's
(``MOE_DISPATCH_ROW_H``, three ``[rows, H]`` buffers): HybridEP's combine holds the
experts' output and the combined ``[tokens, H]`` output, two of them at most, so the
figure is a bound there.
"""

from __future__ import annotations

import math

from cpmem.model.geometry import ModelGeometry
from cpmem.pricing.components import OUTSIDE_FIGURE
from cpmem.pricing.widths import sp_divisor
from cpmem.step.step import Step

PERMUTE_INDEX_BYTES = 8
"""Bytes per routed slot of the int64 sorted token indices megatron's ``permute`` keeps
(``index_select`` saves them; the ``alltoall`` set's ``MOE_ROUTER_PER_TOPK`` counts them):
the HybridEP dispatch does not run that ``permute``."""
PERMUTE_MAP_BYTES_PER_EXPERT = 1
"""Bytes per expert and local token of the transposed bool routing map ``permute``'s
``masked_select`` saves (the ``alltoall`` set's ``E/2`` elements): not kept by HybridEP."""
HYBRIDEP_MAP_BYTES = 5
"""Bytes per (token, group rank, local expert) of a HybridEP handle's two dense maps:
``local_expert_routing_map`` (bool) and ``dense_to_expert_map`` (int32), each
``[tokens x ranks_per_node x nodes, experts_per_rank]`` (DeepEP hybrid-ep 17cfb81
``csrc/hybrid_ep/executor/executor.cu:110-112,124-126``). ``ranks x experts_per_rank`` is
the flex dispatcher's expert count, ``ETP x E`` (``MoEFlexTokenDispatcher`` builds
HybridEP over ``tp_size x num_moe_experts``, token_dispatcher.py:1846-1851); cpmem prices
HybridEP at ETP 1 (``cpmem.megatron.rules``)."""
HYBRIDEP_RANK_BYTES = 10
"""Bytes per (token, group rank) a HybridEP handle holds beside its dense maps, at most:
``sparse_to_dense_map`` int32 ``[tokens x nodes, ranks_per_node]`` (4, executor.cu:93-95);
``rdma_to_attn_map`` and ``attn_to_rdma_map`` bool, ``nodes`` and ``nodes - 1`` a token
(executor.cu:97-102); ``dense_chunk_layout`` int32, one per chunk of
``NUM_OF_TOKENS_PER_CHUNK_PREPROCESSING_API`` tokens and rank (executor.cu:120-123). The
nodes (``NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN``) and the chunk are the launcher's
environment: priced at their bounds, one rank a node and one token a chunk
(``4 + 1 + 1 + 4``), up to ``6 x ranks`` bytes a token above the handle (one byte less:
``nodes - 1``); ``rdma_to_attn_map``'s padding to 16 tokens (under ``16 x nodes`` bytes a
layer) is not counted."""
HYBRIDEP_BUFFERS_NOTE = (
    "hybridep: the flex dispatcher's HybridEP communication buffers are device memory "
    "outside PyTorch's allocator (cuMemCreate/cudaMalloc), " + OUTSIDE_FIGURE
)
"""DeepEP hybrid-ep 17cfb81: ``ExtendedMemoryAllocator::allocate`` is ``cuMemCreate`` or
``cudaMalloc`` (``csrc/hybrid_ep/allocator/allocator.cu:87-97``), and the coordinator's
dispatch and combine buffers (``[max tokens, H]`` tokens, fp32 probabilities, flags) are
allocated through it or ``cudaMalloc`` (``csrc/hybrid_ep/buffer/intranode.cu:171-280``):
``torch.cuda.memory_allocated`` does not count them."""


def hybridep_handle_bytes(geometry: ModelGeometry, step: Step) -> int:
    """Bytes per local token of one MoE layer's HybridEP handle, which both fused autograd
    functions keep (``ctx.handle``) until the layer's backward:
    ``HYBRIDEP_MAP_BYTES x ETP x E + HYBRIDEP_RANK_BYTES x ETP x EP``."""
    layout = step.plan.layout
    ranks = layout.etp * layout.ep
    return HYBRIDEP_MAP_BYTES * layout.etp * geometry.num_experts + HYBRIDEP_RANK_BYTES * ranks


def saved_beyond_alltoall(geometry: ModelGeometry, step: Step, tp: int, sp: bool) -> int:
    """bf16-equivalent elements per (global) token one MoE layer's saved set differs by
    from the ``alltoall`` set under the step's dispatcher: for ``hybridep`` its handle
    less ``permute``'s indices and map; 0 otherwise."""
    if not geometry.is_moe or step.settings.runtime.moe_dispatcher != "hybridep":
        return 0
    s = sp_divisor(tp, sp)
    permute = PERMUTE_INDEX_BYTES * geometry.moe_top_k
    permute += PERMUTE_MAP_BYTES_PER_EXPERT * geometry.num_experts
    return math.ceil((hybridep_handle_bytes(geometry, step) - permute) / 2) // s


DISPATCHED_PROBS_ROW = 2
"""bf16-equivalent elements per routed row the HybridEP manager keeps after its forward:
the fp32 dispatched probabilities (``self.dispatched_probs``, token_dispatcher.py:1150),
replaced only by the layer's next forward."""


def after_forward_rows(step: Step, tp: int) -> int:
    """Elements per (global) token the dispatcher keeps per routed row after its forward
    beyond the dense state: the HybridEP manager's dispatched probabilities; 0 otherwise."""
    if step.settings.runtime.moe_dispatcher != "hybridep":
        return 0
    return math.ceil(step.expert_rows_per_token(tp) * DISPATCHED_PROBS_ROW)
