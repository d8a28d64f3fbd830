"""How attention's CP communication shapes what an attention layer holds, for every
policy: the K/V of other CP ranks kept until backward, what a layer's forward holds in
flight, and how many CP ranks' keys its flash backward expands over.

Restated from Transformer Engine's ``context_parallel.py`` (TE does not install without
CUDA here; the rank simulator restates the same algorithms, oracles/rank_sim):

- ``all_gather``: K/V all-gathered to the full sequence and saved by the kernel (the
  measured runtime's); backward gathers again and expands dk/dv over every rank's keys.
- ``p2p`` (ring): each step receives one other rank's K/V chunk; the buffers live until
  the attention function returns (up to CP - 1 remote chunks in flight), nothing remote is
  kept; backward re-runs the ring with a double K/V buffer and one chunk's dk/dv.
- ``a2a`` (Ulysses): an all-to-all turns ``[s, h]`` into ``[CP·s, h/CP]``: the kernel keeps
  the local element count, no other rank's K/V; the exchange holds one more copy of q, k
  and v while it runs.
"""

from __future__ import annotations

from cpmem.step.step import Step


def gathered_ranks(step: Step) -> int:
    """Other CP ranks whose K/V an attention layer gathers whole while it runs."""
    cp = step.plan.layout.cp
    return cp - 1 if step.cp_comm == "all_gather" else 0


def kept_remote_ranks(step: Step) -> int:
    """Other CP ranks' K/V chunks an attention kernel keeps until backward, each the
    largest rank's size: every one under ``all_gather``, the last received under ``p2p``
    (Transformer Engine saves that one chunk; the rank simulator's small ranks of the
    ``p2p`` rows peak on it), none under ``a2a``."""
    cp = step.plan.layout.cp
    if cp == 1:
        return 0
    return {"all_gather": cp - 1, "p2p": 1}.get(step.cp_comm, 0)


def kv_local_width(step: Step) -> int:
    """K and V of the rank's own tokens, per token, at its TP share of the KV heads."""
    g, tp = step.geometry, step.plan.layout.tp
    return g.kv_pair_width // min(tp, g.kv_groups)


def forward_in_flight_width(step: Step) -> int:
    """Elements per token an attention layer's forward holds in flight for CP, beyond its
    kept set: ``p2p``'s remote K/V chunks, ``a2a``'s exchanged copy of q, k and v."""
    cp, tp = step.plan.layout.cp, step.plan.layout.tp
    if cp == 1:
        return 0
    if step.cp_comm == "p2p":
        return (cp - 1) * kv_local_width(step)
    if step.cp_comm == "a2a":
        return step.geometry.q_width // tp + kv_local_width(step)
    return 0


def backward_key_ranks(step: Step) -> int:
    """CP ranks' worth of keys a flash backward expands dk/dv over at once: every rank's
    under ``all_gather``, one chunk (and the next in flight) under ``p2p``, the local count
    under ``a2a``."""
    cp = step.plan.layout.cp
    if step.cp_comm == "all_gather":
        return cp
    if step.cp_comm == "p2p":
        return min(cp, 2)
    return 1
