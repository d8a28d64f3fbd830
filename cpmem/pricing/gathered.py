"""K and V all-gathered over the CP group and kept for backward.

Under context parallelism each rank's core attention all-gathers the K and V of every
other CP rank (uneven counts padded to the largest in transit) and the flash kernel
saves the gathered tensors for backward. Only where no ``core_attn`` checkpoint drops
them: recompute ``none``, or ``selective`` without ``core_attn``; under full recompute
one layer holds them at a time, within its working set. Source: the rank simulator
(oracles/rank_sim/README.md, "Under CP the K/V of every rank are all-gathered"); the
simulated grid's dense CP 4/8 rows without recompute need it (docs/simulated-grid.md).
"""

from __future__ import annotations

from cpmem.step.recompute import Module
from cpmem.step.step import Step


def keeps_gathered_kv(inputs: Step) -> bool:
    """Whether the step keeps other CP ranks' K/V until backward (how many:
    ``cpmem.pricing.cp_comm.kept_remote_ranks``)."""
    layout, rc = inputs.plan.layout, inputs.recompute
    if layout.cp == 1 or not rc.keeps_saved_sets:
        return False
    return not rc.checkpoints(Module.CORE_ATTN)


def gathered_kv_width(inputs: Step, remote_ranks: int) -> int:
    """Elements per token of ``remote_ranks`` other CP ranks' K and V that one attention
    layer's core holds, at the rank's TP share of the KV heads: ``remote x (K + V)_local``
    (``2 x KV`` where V is as wide as K; MLA's values are narrower than its keys)."""
    if remote_ranks <= 0:
        return 0
    g, tp = inputs.geometry, inputs.plan.layout.tp
    return remote_ranks * (g.kv_pair_width // min(tp, g.kv_groups))


def gathered_kv_bytes(inputs: Step, tokens: int, remote_ranks: int) -> int:
    """K and V of ``remote_ranks`` other CP ranks of ``tokens`` tokens each, kept in every
    attention layer until backward (0 where ``keeps_gathered_kv`` is false)."""
    if not keeps_gathered_kv(inputs):
        return 0
    width = gathered_kv_width(inputs, remote_ranks)
    return inputs.geometry.attention_layers * width * tokens * inputs.dtype_bytes
