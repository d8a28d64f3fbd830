"""Which global ranks agree on one admission: the TP x CP x PP block of a rank.

Under pipeline parallelism every stage prices the same step (``cpmem.pricing.pipeline``
prices all of its stages and answers with the busiest), so the ranks that must reach the
same fit/split/refuse are the whole TP x CP x PP block that runs one model replica: one
data-parallel index. Without stages that block is the TP x CP group.

megatron-core lays ranks out in the order ``tp-cp-ep-dp-pp`` by default
(``parallel_state.initialize_model_parallel(order=...)``, built by its ``RankGenerator``):
the first name varies fastest, so a rank is ``t + tp * (c + cp * (d + dp * p))`` for TP
index ``t``, CP index ``c``, data-parallel index ``d`` and stage ``p`` (the decoder's
generator has no expert dimension). A block is every rank with one ``d``; with ``dp > 1``
it is not contiguous. Pure Python: ``tests/oracle/test_rank_groups.py`` holds it to
megatron's own ``RankGenerator.get_ranks("tp-cp-pp")``.
"""

from __future__ import annotations

from cpmem.errors import InputError, require_positive_int

MEGATRON_ORDER = "tp-cp-ep-dp-pp"
"""megatron-core's default rank order (``initialize_model_parallel``'s ``order``)."""


def model_parallel_blocks(world: int, tp: int, cp: int, pp: int) -> tuple[tuple[int, ...], ...]:
    """Every TP x CP x PP block of a ``world``-rank job in megatron's default order, one
    per data-parallel index, each block's ranks ascending."""
    world = require_positive_int("world", world)
    tp, cp, pp = (require_positive_int(n, v) for n, v in (("tp", tp), ("cp", cp), ("pp", pp)))
    block = tp * cp * pp
    if world % block:
        raise InputError("tp x cp x pp", f"{tp}x{cp}x{pp}", f"must divide the world size ({world})")
    dp = world // block
    inner = tp * cp  # ranks of one TP x CP group, contiguous
    return tuple(
        tuple(start + (d + dp * p) * inner for p in range(pp) for start in range(inner))
        for d in range(dp)
    )


def block_of(rank: int, blocks: tuple[tuple[int, ...], ...]) -> tuple[int, ...]:
    """The block ``rank`` belongs to."""
    for members in blocks:
        if rank in members:
            return members
    raise InputError("rank", rank, "is in no block of this job")
