"""cpmem.admission.comm.Communicator over torch.distributed, for real TP x CP groups.

Why: admission must reach the same fit/split/refuse on every rank of the TP x CP
group that prices one request, and a planning failure on one rank must raise on
all of them instead of leaving the others blocked in their next collective.
:mod:`cpmem.admission.comm` states the protocol; this module runs it on a process group:
MAX / MIN all-reduces of int64 byte counts and an all-gather of planning errors
(their lengths, then, only where a rank failed, their UTF-8 bytes).

Every collective is issued asynchronously and waited on with the communicator's
``timeout`` (None: the process group's own): a peer that exited (gloo reports the
closed connection at once) or is stuck raises ``CollectiveTimeoutError`` naming the
collective, the group and the timeout, instead of blocking this rank.

The group is megatron-core's tensor-and-context-parallel group when megatron's
``parallel_state`` is initialized in this process, otherwise one built with
``torch.distributed.new_group``; with pipeline stages (``pp > 1``) it is the whole
TP x CP x PP block of the rank (``cpmem.admission.groups``), since every stage prices
the same step. torch (and megatron) are imported only when a
communicator is built, so ``import cpmem`` never needs them.
"""

from __future__ import annotations

import copy
import importlib
import sys
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from cpmem.admission.groups import block_of, model_parallel_blocks
from cpmem.errors import (
    CollectiveTimeoutError,
    InputError,
    require_positive_int,
    require_positive_seconds,
)

__all__ = [
    "TorchCommunicator",
    "model_parallel_group",
    "tensor_and_context_group",
    "torch_communicator",
]


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


def model_parallel_group(tp: int, cp: int, pp: int) -> Any:
    """This process's TP x CP x PP block (one model replica: every stage of it).

    - megatron initialized: its own groups decide the block (whatever its rank order):
      the ranks ``a + b - me`` for ``a`` in this rank's pipeline group and ``b`` in its
      tensor-and-context group (both vary independent dimensions of the layout); the
      sizes must match ``tp``, ``cp`` and ``pp``; every process shares its block
      (one all-gather over the world) so that all of them create every block's group;
    - otherwise: megatron's default order (``groups.model_parallel_blocks``).

    Every process of the world must call this with the same sizes (torch's
    ``new_group`` requires it).
    """
    dist = _dist()
    ps = _megatron_parallel_state()
    world, me = dist.get_world_size(), dist.get_rank()
    if ps is None:
        blocks = model_parallel_blocks(world, tp, cp, pp)
    else:
        sizes = (
            ps.get_tensor_model_parallel_world_size(),
            ps.get_context_parallel_world_size(),
            ps.get_pipeline_model_parallel_world_size(),
        )
        if sizes != (tp, cp, pp):
            raise InputError(
                "tp x cp x pp",
                f"{tp}x{cp}x{pp}",
                "megatron's groups are {}x{}x{}".format(*sizes),
            )
        stage_ranks = dist.get_process_group_ranks(ps.get_pipeline_model_parallel_group())
        inner = tensor_and_context_group(tp, cp)
        inner_ranks = dist.get_process_group_ranks(inner) if inner is not None else [me]
        mine = tuple(sorted(a + b - me for a in stage_ranks for b in inner_ranks))
        every: list[Any] = [None] * world
        dist.all_gather_object(every, mine)
        blocks = tuple(sorted(set(every)))
    if len(blocks) == 1:
        return dist.group.WORLD
    own: Any = None
    for members in blocks:  # every process creates every group, in the same order
        group = dist.new_group(list(members))
        if members == block_of(me, blocks):
            own = group
    return own


class TorchCommunicator:
    """The three collectives of :class:`cpmem.admission.comm.Communicator` on one process group.

    ``rank`` and ``size`` are within the group, so errors name the group rank.
    ``timeout`` (seconds; None: the process group's own) bounds every collective.
    """

    def __init__(self, group: Any = None, *, timeout: float | None = None) -> None:
        dist = _dist()
        self._dist = dist
        self._group = group if group is not None else dist.group.WORLD
        self._rank = int(dist.get_rank(self._group))
        self._size = int(dist.get_world_size(self._group))
        if self._rank < 0:
            raise InputError("group", group, "this process is not a member of the group")
        self._timeout = None if timeout is None else require_positive_seconds("timeout", timeout)
        self._members = [int(r) for r in dist.get_process_group_ranks(self._group)]
        self._global_rank = int(dist.get_rank())
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

    @property
    def timeout(self) -> float | None:
        return self._timeout

    def with_timeout(self, seconds: float | None) -> TorchCommunicator:
        """The same group, every collective bounded by ``seconds`` (None: the group's own)."""
        bounded = copy.copy(self)
        bounded._timeout = None if seconds is None else require_positive_seconds("timeout", seconds)
        return bounded

    def _run(self, collective: str, issue: Callable[[], Any]) -> None:
        """Issue one async collective and wait for it within the timeout."""
        try:
            work = issue()
            if self._timeout is None:
                done = work.wait()
            else:
                done = work.wait(timeout=timedelta(seconds=self._timeout))
        except RuntimeError as exc:  # torch's DistBackendError is a RuntimeError
            raise CollectiveTimeoutError(
                collective, self._members, self._global_rank, self._timeout, _cause(exc)
            ) from exc
        if done is False:  # a backend that reports a timed-out wait instead of raising
            raise CollectiveTimeoutError(
                collective, self._members, self._global_rank, self._timeout, "wait timed out"
            )

    def _all_reduce(self, value: int, op: Any, name: str) -> int:
        tensor = self._torch.tensor([int(value)], dtype=self._torch.int64, device=self._device)
        self._run(
            f"all_reduce({name})",
            lambda: self._dist.all_reduce(tensor, op=op, group=self._group, async_op=True),
        )
        return int(tensor.item())

    def _all_gather(self, collective: str, tensor: Any) -> list[Any]:
        out = [self._torch.empty_like(tensor) for _ in range(self._size)]
        self._run(
            collective,
            lambda: self._dist.all_gather(out, tensor, group=self._group, async_op=True),
        )
        return out

    def max_int(self, value: int) -> int:
        return self._all_reduce(value, self._dist.ReduceOp.MAX, "MAX")

    def min_int(self, value: int) -> int:
        return self._all_reduce(value, self._dist.ReduceOp.MIN, "MIN")

    def gather_errors(self, error: str | None) -> list[str | None]:
        """Every rank's error (None: it succeeded): lengths first (-1 for None), then,
        only if some rank failed, the messages' UTF-8 bytes padded to the longest."""
        torch = self._torch
        payload = None if error is None else str(error).encode("utf-8")
        length = torch.tensor(
            [-1 if payload is None else len(payload)], dtype=torch.int64, device=self._device
        )
        sizes = [int(t.item()) for t in self._all_gather("all_gather(error lengths)", length)]
        longest = max(sizes)
        if longest <= 0:  # every rank agrees: nobody has bytes to send
            return [None if n < 0 else "" for n in sizes]
        padded = torch.zeros(longest, dtype=torch.uint8)
        if payload:
            padded[: len(payload)] = torch.tensor(list(payload), dtype=torch.uint8)
        chunks = self._all_gather("all_gather(errors)", padded.to(self._device))
        return [
            None if n < 0 else bytes(c[:n].cpu().tolist()).decode("utf-8", "replace")
            for n, c in zip(sizes, chunks, strict=True)
        ]


def _cause(exc: BaseException) -> str:
    """torch's reason in a few words: its first sentence, without gloo's source location."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if text.startswith("[") and "] " in text:  # "[.../gloo/transport/tcp/pair.cc:553] ..."
        text = text.split("] ", 1)[1]
    return text.split(". ", 1)[0][:200]


def torch_communicator(
    tp: int | None = None,
    cp: int | None = None,
    *,
    pp: int = 1,
    ranks: Sequence[int] | None = None,
    timeout: float | None = None,
) -> TorchCommunicator:
    """A communicator over this process's TP x CP group (see tensor_and_context_group),
    or with ``pp > 1`` over its TP x CP x PP block (``model_parallel_group``), every
    collective bounded by ``timeout`` seconds (None: the process group's own)."""
    if require_positive_int("pp", pp) > 1:
        if ranks is not None:
            raise InputError("ranks", list(ranks), "give either ranks or pp, not both")
        group = model_parallel_group(tp or 1, cp or 1, pp)
    else:
        group = tensor_and_context_group(tp, cp, ranks=ranks)
    return TorchCommunicator(group, timeout=timeout)
