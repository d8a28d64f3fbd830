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

from cpmem.pricing.inputs import PricingInput


def keeps_gathered_kv(inputs: PricingInput) -> bool:
    """Whether the step keeps the gathered K/V of the other CP ranks until backward."""
    layout, rc = inputs.plan.layout, inputs.recompute
    if layout.cp == 1 or not rc.keeps_gradients or rc.mode == "full":
        return False
    return not (rc.mode == "selective" and "core_attn" in rc.modules)


def gathered_kv_bytes(inputs: PricingInput, tokens: int, remote_ranks: int) -> int:
    """K and V of ``remote_ranks`` other CP ranks of ``tokens`` tokens each, in every
    attention layer, at the rank's TP share of the KV heads (0 where none are kept)."""
    if remote_ranks <= 0 or not keeps_gathered_kv(inputs):
        return 0
    g, tp = inputs.geometry, inputs.plan.layout.tp
    kv_local = g.kv_width // min(tp, g.kv_groups)
    return g.attention_layers * 2 * kv_local * remote_ranks * tokens * inputs.dtype_bytes
