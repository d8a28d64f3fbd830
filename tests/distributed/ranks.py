"""One forked process per rank for the gloo tests.

The parent (the test) imports torch, cpmem's admission and, where a test uses it,
megatron-core once; every rank is forked from it and starts there, instead of a fresh
interpreter importing them again (torch takes over a second to import, megatron-core
three more, and a test starts up to eight ranks). A rank runs ``target(*args)`` with the
environment the ranks always had (gloo on the loopback, warnings off, one intra-op
thread), sends back its result or its traceback, and leaves without the interpreter's
teardown: gloo's C++ destructors can abort or block at exit (a dead peer, or torch
2.13's gloo threads), after the result is sent.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any

FORK = multiprocessing.get_context("fork")
RANK_ENV = {"GLOO_SOCKET_IFNAME": "lo", "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}


def preload(megatron: bool = False) -> None:
    """Import what every rank uses into the parent, so that the forked ranks have it."""
    import torch.distributed  # noqa: F401

    import cpmem.admission.admission
    import cpmem.admission.torch_comm  # noqa: F401

    if megatron:
        import megatron.core.parallel_state


def _rank(conn: Connection, target: Callable[..., Any], args: tuple[Any, ...]) -> None:
    os.environ.update(RANK_ENV)
    import warnings

    import torch

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    try:
        outcome: tuple[str, Any] = ("result", target(*args))
    except BaseException:  # the parent reports it with the rank
        outcome = ("error", traceback.format_exc())
    try:
        conn.send(outcome)
        conn.close()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


class Ranks:
    """``target(*args)`` forked once per entry of ``args``; ``results`` waits for them."""

    def __init__(self, target: Callable[..., Any], args: Sequence[tuple[Any, ...]]) -> None:
        self.procs: list[Any] = []
        self.conns: list[Connection] = []
        for rank_args in args:
            receive, send = FORK.Pipe(duplex=False)
            proc = FORK.Process(target=_rank, args=(send, target, rank_args), daemon=True)
            proc.start()
            send.close()
            self.procs.append(proc)
            self.conns.append(receive)
        self.start = time.perf_counter()

    def outcome(self, rank: int, deadline_s: float) -> tuple[str, Any]:
        """``("result", value)``, ``("error", traceback)``, ``("exited", code)`` (it left
        without a result) or ``("hung", None)`` (nothing by ``deadline_s`` after the
        start)."""
        left = max(1.0, deadline_s - (time.perf_counter() - self.start))
        conn = self.conns[rank]
        if not conn.poll(left):
            return ("hung", None)
        try:
            received: tuple[str, Any] = conn.recv()
        except EOFError:
            self.procs[rank].join(5)
            return ("exited", self.procs[rank].exitcode)
        return received

    def exit_code(self, rank: int, deadline_s: float) -> int | None:
        """The rank's exit status once it has exited (None: still running by then)."""
        left = max(1.0, deadline_s - (time.perf_counter() - self.start))
        self.procs[rank].join(left)
        code: int | None = self.procs[rank].exitcode
        return code

    def stop(self) -> None:
        """Kill every rank still running (only the processes this test started)."""
        for proc in self.procs:
            if proc.is_alive():
                proc.kill()
            proc.join()
        for conn in self.conns:
            conn.close()
