"""cpmem.admission.comm.Communicator over torch.distributed, for real TP x CP groups.

Why: admission must reach the same fit/split/refuse on every rank of the TP x CP
group that prices one request, and a planning failure on one rank must raise on
all of them instead of leaving the others blocked in their next collective.
:mod:`cpmem.admission.comm` states the protocol; this module runs it on a process group:
MAX / MIN all-reduces of int64 byte counts and an ``all_gather_object`` of
planning errors.

The group is megatron-core's tensor-and-context-parallel group when megatron's
``parallel_state`` is initialized in this process, otherwise one built with
``torch.distributed.new_group``. torch (and megatron) are imported only when a
communicator is built, so ``import cpmem`` never needs them.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from typing import Any

from cpmem.errors import InputError, require_positive_int

__all__ = ["TorchCommunicator", "tensor_and_context_group", "torch_communicator"]


def _dist() -> Any:
    """torch.distributed, imported on first use (typed Any: torch is an optional extra)."""
    try:
        dist = importlib.import_module("torch.distributed")
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "cpmem.admission.torch_comm needs torch (pip install 'cpmem[oracle]')"
        ) from exc
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "torch.distributed is not initialized: call init_process_group before "
            "building a TorchCommunicator"
        )
    return dist


def _megatron_parallel_state() -> Any | None:
    """megatron's parallel_state if this process imported and initialized it, else None.

    Looked up in sys.modules rather than imported: a process that never imported
    megatron cannot have initialized it, and importing megatron costs seconds.
    """
    ps = sys.modules.get("megatron.core.parallel_state")
    if ps is None or not ps.model_parallel_is_initialized():
        return None
    return ps


def tensor_and_context_group(
    tp: int | None = None, cp: int | None = None, *, ranks: Sequence[int] | None = None
) -> Any:
    """This process's TP x CP group.

    - megatron initialized: its tensor-and-context-parallel group (``tp`` / ``cp``,
      if given, must match its sizes);
    - ``ranks`` given: ``new_group(ranks)``; every process of the world must call
      this with the same ``ranks`` (torch requires it), and only members may use it;
    - otherwise: the world is cut into contiguous blocks of ``tp * cp`` ranks
      (megatron's default tp-cp-ep-dp-pp order puts one TP x CP group in each
      block), every block gets a group, and this process's block is returned.
      Without ``tp`` and ``cp`` the group is the whole world.
    """
    dist = _dist()
    ps = _megatron_parallel_state()
    if ps is not None and ranks is None:
        getter = getattr(ps, "get_tensor_and_context_parallel_group", None)
        group = getter(check_initialized=False) if getter is not None else None
        if group is None:  # megatron builds the combined group only for CP > 1
            group = ps.get_tensor_model_parallel_group()
        size = dist.get_world_size(group)
        if tp is not None and cp is not None and size != tp * cp:
            raise InputError(
                "tp x cp", f"{tp}x{cp}", f"megatron's tensor-and-context group has {size} ranks"
            )
        return group
    world, me = dist.get_world_size(), dist.get_rank()
    if ranks is not None:
        members = sorted(set(ranks))
        if not members or members[0] < 0 or members[-1] >= world:
            raise InputError(
                "ranks", list(ranks), f"must be distinct ranks of a {world}-rank world"
            )
        group = dist.new_group(members)
        if me not in members:
            raise InputError("ranks", list(ranks), f"rank {me} is not a member of this group")
        return group
    if tp is None and cp is None:
        return dist.group.WORLD
    block = require_positive_int("tp", tp or 1) * require_positive_int("cp", cp or 1)
    if world % block:
        raise InputError("tp x cp", block, f"must divide the world size ({world})")
    if block == world:
        return dist.group.WORLD
    mine: Any = None
    for start in range(0, world, block):
        group = dist.new_group(list(range(start, start + block)))
        if start <= me < start + block:
            mine = group
    return mine


class TorchCommunicator:
    """The three collectives of :class:`cpmem.admission.comm.Communicator` on one process group.

    ``rank`` and ``size`` are within the group, so errors name the group rank.
    """

    def __init__(self, group: Any = None) -> None:
        dist = _dist()
        self._dist = dist
        self._group = group if group is not None else dist.group.WORLD
        self._rank = int(dist.get_rank(self._group))
        self._size = int(dist.get_world_size(self._group))
        if self._rank < 0:
            raise InputError("group", group, "this process is not a member of the group")
        torch = importlib.import_module("torch")
        self._torch = torch
        # NCCL reduces only CUDA tensors; gloo (and the rest) take CPU tensors
        if dist.get_backend(self._group) == "nccl":
            self._device = torch.device("cuda", torch.cuda.current_device())
        else:
            self._device = torch.device("cpu")

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def size(self) -> int:
        return self._size

    @property
    def group(self) -> Any:
        return self._group

    def _all_reduce(self, value: int, op: Any) -> int:
        tensor = self._torch.tensor([int(value)], dtype=self._torch.int64, device=self._device)
        self._dist.all_reduce(tensor, op=op, group=self._group)
        return int(tensor.item())

    def max_int(self, value: int) -> int:
        return self._all_reduce(value, self._dist.ReduceOp.MAX)

    def min_int(self, value: int) -> int:
        return self._all_reduce(value, self._dist.ReduceOp.MIN)

    def gather_errors(self, error: str | None) -> list[str | None]:
        gathered: list[Any] = [None] * self._size
        self._dist.all_gather_object(gathered, error, group=self._group)
        return [None if e is None else str(e) for e in gathered]


def torch_communicator(
    tp: int | None = None, cp: int | None = None, *, ranks: Sequence[int] | None = None
) -> TorchCommunicator:
    """A communicator over this process's TP x CP group (see tensor_and_context_group)."""
    return TorchCommunicator(tensor_and_context_group(tp, cp, ranks=ranks))
