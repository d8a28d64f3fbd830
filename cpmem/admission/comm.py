"""Agreement across the TP x CP group: every rank must take the same decision.

Required bytes are all-reduced with MAX, available bytes with MIN, and planning
errors are exchanged so that a failure on one rank raises on every rank (its own
error there, an error naming it elsewhere) instead of leaving the others hanging
in the next collective. A communicator that can bound its collectives offers
``with_timeout(seconds)`` (``bounded``): a peer that exited or is stuck then raises
``CollectiveTimeoutError`` on the others instead of blocking them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

from cpmem.errors import InputError, PlanningError, require_positive_seconds

T = TypeVar("T")


class Communicator(Protocol):
    """The three collectives admission needs. ``rank`` is this process's index."""

    @property
    def rank(self) -> int: ...

    @property
    def size(self) -> int: ...

    def max_int(self, value: int) -> int: ...

    def min_int(self, value: int) -> int: ...

    def gather_errors(self, error: str | None) -> list[str | None]: ...


class LocalCommunicator:
    """A single-process group: every collective is the identity."""

    rank = 0
    size = 1

    def max_int(self, value: int) -> int:
        return value

    def min_int(self, value: int) -> int:
        return value

    def gather_errors(self, error: str | None) -> list[str | None]:
        return [error]

    def with_timeout(self, seconds: float) -> LocalCommunicator:
        """Nothing waits on a peer: the same communicator."""
        require_positive_seconds("timeout", seconds)
        return self


def bounded(comm: Communicator, timeout: float | None) -> Communicator:
    """``comm`` with every collective bounded by ``timeout`` seconds (None: as given).

    The communicator must offer ``with_timeout(seconds)`` (LocalCommunicator and
    TorchCommunicator do); a timeout it cannot honour is refused, never ignored.
    """
    if timeout is None:
        return comm
    seconds = require_positive_seconds("timeout", timeout)
    method = getattr(comm, "with_timeout", None)
    if method is None:
        raise InputError("timeout", timeout, f"{type(comm).__name__} has no with_timeout(seconds)")
    result: Communicator = method(seconds)
    return result


def collective_plan(comm: Communicator, build: Callable[[], T]) -> T:
    """Run ``build`` on every rank; if any rank failed, raise on every rank.

    The failed rank re-raises its own error; the others raise a PlanningError
    naming the first failed rank and its message.
    """
    results: list[T] = []
    own: BaseException | None = None
    message: str | None = None
    try:
        results.append(build())
    except Exception as exc:  # every failure must reach the other ranks
        own = exc
        message = f"{type(exc).__name__}: {exc}"
    errors = comm.gather_errors(message)
    if own is not None:
        raise own
    for rank, error in enumerate(errors):
        if error is not None:
            raise PlanningError(f"planning failed on rank {rank}: {error}", failed_rank=rank)
    return results[0]


def agree_on_bytes(comm: Communicator, required: int, available: int) -> tuple[int, int]:
    """(MAX of required, MIN of available) over the group."""
    return comm.max_int(required), comm.min_int(available)
