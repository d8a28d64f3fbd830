"""The parallel layout a step runs under: tensor, sequence, context and expert parallelism."""

from __future__ import annotations

from dataclasses import dataclass

from cpmem.errors import require_positive_int


@dataclass(frozen=True)
class ParallelLayout:
    """TP x CP ranks price one request; SP shards activations outside the TP region."""

    tp: int = 1
    cp: int = 1
    sp: bool = False
    ep: int = 1
    dp: int = 1
    etp: int = 1
    """Expert tensor parallelism: each routed expert's linears split over ``etp`` ranks
    (megatron's ``--expert-tensor-parallel-size``); the measured runtime's experts are
    whole on their EP rank (1)."""
    """Data-parallel replicas: they price nothing of a step's activations; a distributed
    optimizer shards its states over them (``cpmem.pricing.static``)."""

    def __post_init__(self) -> None:
        require_positive_int("tp", self.tp)
        require_positive_int("cp", self.cp)
        require_positive_int("ep", self.ep)
        require_positive_int("dp", self.dp)
        require_positive_int("etp", self.etp)

    @property
    def sp_active(self) -> bool:
        """Sequence parallelism only changes shapes when TP > 1."""
        return self.sp and self.tp > 1


def round_up(value: int, multiple: int) -> int:
    """Smallest multiple of ``multiple`` that is >= ``value``."""
    return -(-value // multiple) * multiple
