"""Which rank a step's answer is for, and a global rank's coordinates.

megatron-core's default rank order is ``tp-cp-ep-dp-pp`` (``parallel_state.py``'s
``RankGenerator``): TP varies fastest, PP slowest, so global rank
``r = tp + TP·(cp + CP·(dp + DP·pp))`` (EP folds into DP for the dense layers). Megatron-LM
logs memory on the last global rank (``rank == world_size - 1``: the TensorBoard writer,
``megatron/training/global_vars.py``): the last pipeline stage's last TP, CP and
data-parallel rank.

A step is answered for one of:

- ``busiest``: the pipeline stage whose static memory and activations together are
  largest, on the data-parallel rank whose distributed-optimizer shard holds the most
  (the first: the last one's slice carries the buffer's trailing padding);
- ``last``: the last global rank;
- a global rank number.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from cpmem.errors import InputError

RankChoice = Literal["busiest", "last"] | int


@dataclass(frozen=True)
class RankCoordinates:
    """A global rank's place in each parallel group."""

    tp: int
    cp: int
    dp: int
    pp: int


def check_rank(rank: object, world_size: int) -> RankChoice:
    """``busiest``, ``last``, or a global rank in ``[0, world_size)``."""
    if rank in ("busiest", "last"):
        return rank
    if isinstance(rank, bool) or not isinstance(rank, int):
        raise InputError("rank", rank, "must be busiest, last or a global rank number")
    if not 0 <= rank < world_size:
        raise InputError("rank", rank, f"must be in 0..{world_size - 1} (the run's ranks)")
    return rank


def parse_rank(text: str | int) -> RankChoice:
    """A rank from the command line: ``busiest``, ``last`` or a number."""
    if isinstance(text, int) or text in ("busiest", "last"):
        return text  # type: ignore[return-value]
    try:
        return int(text)
    except ValueError:
        raise InputError("rank", text, "must be busiest, last or a global rank number") from None


def coordinates(rank: int, tp: int, cp: int, dp: int, pp: int) -> RankCoordinates:
    """Global rank ``rank``'s (tp, cp, dp, pp) ranks in megatron's ``tp-cp-ep-dp-pp`` order."""
    r = rank
    tp_rank, r = r % tp, r // tp
    cp_rank, r = r % cp, r // cp
    dp_rank, pp_rank = r % dp, r // dp
    if pp_rank >= pp:
        raise InputError("rank", rank, f"must be below the world size {tp * cp * dp * pp}")
    return RankCoordinates(tp_rank, cp_rank, dp_rank, pp_rank)


def global_rank(c: RankCoordinates, tp: int, cp: int, dp: int) -> int:
    """The global rank of coordinates ``c``."""
    return c.tp + tp * (c.cp + cp * (c.dp + dp * c.pp))
