"""Admission that survives a dead rank: gloo, four CPU processes on 127.0.0.1.

Why: a rank that exits (or hangs) before or inside the admission collectives must not
leave its TP x CP peers blocked for the process group's timeout (or forever): they
raise a one-line ``CollectiveTimeoutError`` naming the collective, the group and the
timeout given to ``admit``. Each test forks one process per rank (``worker``; ranks.py,
as test_collective_admission.py does): one victim
rank exits with ``os._exit`` right before admission, exits at its first MAX
all-reduce, or sleeps instead of admitting; the parent checks every survivor's error
and time to error, and that nothing hung. The process group's own timeout
(``PG_TIMEOUT_S``) is far above ``TIMEOUT_S + SLACK_S``, so a survivor that finishes
in time was freed by admit's timeout, not by the group's.

Expected decisions (every rank alive, a timeout given) come from single-process
decisions (LocalCommunicator), never from the collective path under test.
"""

from __future__ import annotations

import math
import os
import sys
import time
from typing import Any

import pytest

pytest.importorskip("torch.distributed")

from tests.distributed.ranks import Ranks, preload

WORLD = 4
VICTIM = 2  # a middle rank: its ring neighbours and the ranks beyond them both wait on it
TIMEOUT_S = 4.0  # admit(..., timeout=)
SLACK_S = 20.0  # process start-up skew and a loaded 2-core CI machine
PG_TIMEOUT_S = 60  # init_process_group's timeout: the fallback admit's timeout must beat
JOIN_TIMEOUT_S = 120  # the whole worker group, per test
VICTIM_EXIT_CODE = 17
SCENARIOS = ("exit-before", "exit-mid", "stuck")
EXPECTED_COLLECTIVE = {
    "exit-before": "all_gather(error lengths)",  # the first collective of admit
    "exit-mid": "all_reduce(MAX)",  # the victim took part in the first ones
    "stuck": "all_gather(error lengths)",
}
BAD_TIMEOUT_RANK = 1


# --------------------------------------------------------------------------- worker


class _ExitAtMax:
    """A communicator that takes part in every collective until the first MAX
    all-reduce, where its process exits (a rank crashing mid-admission)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    @property
    def rank(self) -> int:
        return int(self.inner.rank)

    @property
    def size(self) -> int:
        return int(self.inner.size)

    def max_int(self, value: int) -> int:
        sys.stdout.flush()
        os._exit(VICTIM_EXIT_CODE)

    def min_int(self, value: int) -> int:
        return int(self.inner.min_int(value))

    def gather_errors(self, error: str | None) -> list[str | None]:
        return list(self.inner.gather_errors(error))

    def with_timeout(self, seconds: float) -> _ExitAtMax:
        return _ExitAtMax(self.inner.with_timeout(seconds))


def _attempt(fn: Any) -> dict[str, Any]:
    """A decision's agreed figures, or the error raised and every field it carries;
    ``elapsed`` is measured from the call."""
    from cpmem.errors import CollectiveTimeoutError, InputError, PlanningError

    start = time.perf_counter()
    try:
        d = fn()
    except Exception as exc:
        out: dict[str, Any] = {
            "error": type(exc).__name__,
            "message": str(exc),
            "elapsed": round(time.perf_counter() - start, 3),
            "is_runtime_error": isinstance(exc, RuntimeError),
            "is_planning_error": isinstance(exc, PlanningError),
        }
        if isinstance(exc, CollectiveTimeoutError):
            out.update(
                collective=exc.collective,
                ranks=exc.ranks,
                rank=exc.rank,
                timeout=exc.timeout,
                cause=exc.cause,
            )
        if isinstance(exc, InputError):
            out["field"] = exc.field
        if isinstance(exc, PlanningError):
            out["failed_rank"] = exc.failed_rank
        return out
    return {
        "action": d.action,
        "required": d.required_bytes,
        "available": d.available_bytes,
        "parts": d.parts,
        "variant": d.variant,
        "elapsed": round(time.perf_counter() - start, 3),
    }


def _decision(outcome: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in outcome.items() if k != "elapsed"}


def worker(rank: int, world: int, port: int, scenario: str) -> dict[str, Any]:
    """One rank: init gloo, build the communicator, then play ``scenario``."""
    from datetime import timedelta

    import torch.distributed as dist

    from cpmem.admission.admission import admit
    from cpmem.admission.comm import LocalCommunicator
    from cpmem.admission.torch_comm import TorchCommunicator, torch_communicator
    from cpmem.errors import InputError
    from cpmem.model.presets import get_preset
    from cpmem.plan.request import Request

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=PG_TIMEOUT_S),
    )
    comm = torch_communicator()  # the whole world: one group of WORLD ranks
    geometry = get_preset("qwen3.5-4b")
    at_layout: dict[str, Any] = {"tp": 1, "cp": world}
    request = Request.independent([4096] * 8)

    def admit_with(budget: int, **kwargs: Any) -> Any:
        return admit(geometry, request=request, budget_bytes=budget, **at_layout, **kwargs)

    out: dict[str, Any] = {"rank": rank, "scenario": scenario}
    dist.barrier()  # every rank starts admission at the same moment
    if scenario == "alive":
        # budgets differ per rank; the lowest is below every unsplit candidate
        local = LocalCommunicator()
        whole = admit_with(0, comm=local).considered
        low = min(v for k, v in whole if not k.startswith("split")) - 1
        budget = low + rank * 2**30
        out["expected"] = _decision(_attempt(lambda: admit_with(low, comm=local)))
        out["timed"] = _attempt(lambda: admit_with(budget, comm=comm, timeout=TIMEOUT_S))
        out["untimed"] = _attempt(lambda: admit_with(budget, comm=comm))
        bounded = comm.with_timeout(TIMEOUT_S)
        out["bounded_timeout"] = bounded.timeout
        out["original_timeout"] = comm.timeout
        out["bounded"] = _attempt(lambda: admit_with(budget, comm=bounded))
        # one rank passes a timeout it cannot use: it raises InputError, its peers
        # (inside the same first collective) a PlanningError naming it
        bad = BAD_TIMEOUT_RANK
        timeout = float("nan") if rank == bad else TIMEOUT_S
        out["bad_timeout"] = _attempt(lambda: admit_with(budget, comm=comm, timeout=timeout))
        out["after"] = _attempt(lambda: admit_with(budget, comm=comm, timeout=TIMEOUT_S))
        try:
            TorchCommunicator(timeout=0)
            out["constructor_zero"] = None
        except InputError as exc:
            out["constructor_zero"] = exc.field
        dist.barrier()  # nobody leaves while a peer may still need it
        return out

    if rank == VICTIM:
        if scenario == "exit-before":
            sys.stdout.flush()
            os._exit(VICTIM_EXIT_CODE)
        if scenario == "stuck":  # alive, but never reaches admission (killed by the parent)
            time.sleep(2 * PG_TIMEOUT_S)
            os._exit(VICTIM_EXIT_CODE)
        # exit-mid: admits, and exits at its first MAX all-reduce
        admit_with(2**62, comm=_ExitAtMax(comm), timeout=TIMEOUT_S)
        raise AssertionError("the victim outlived its exit")
    out["admit"] = _attempt(lambda: admit_with(2**62, comm=comm, timeout=TIMEOUT_S))
    return out


# --------------------------------------------------------------------------- parent


def _run_group(scenario: str) -> tuple[list[dict[str, Any]], dict[int, int | None]]:
    """Start WORLD worker processes; survivors must finish, the victim may be killed.
    Returns the survivors' results and every rank's exit code (None: killed here)."""
    from tests.distributed.test_collective_admission import _free_port

    port = _free_port()
    preload()
    ranks = Ranks(worker, [(r, WORLD, port, scenario) for r in range(WORLD)])
    victim = VICTIM if scenario != "alive" else None
    results: list[dict[str, Any]] = []
    codes: dict[int, int | None] = {}
    failures: list[str] = []
    try:
        for r in range(WORLD):
            if r == victim:
                continue
            kind, value = ranks.outcome(r, JOIN_TIMEOUT_S)
            codes[r] = ranks.exit_code(r, JOIN_TIMEOUT_S)
            if kind == "result":
                results.append(value)
            elif kind == "hung":
                failures.append(f"rank {r} hung (> {JOIN_TIMEOUT_S} s)")
            else:
                failures.append(f"rank {r} {kind}: {value}")
        if victim is not None:
            exits = scenario != "stuck"  # it exits on its own, at once
            if exits and ranks.exit_code(victim, JOIN_TIMEOUT_S) is None:
                failures.append(f"victim rank {victim} did not exit")
            codes[victim] = ranks.procs[victim].exitcode
    finally:
        ranks.stop()
    wall = time.perf_counter() - ranks.start
    print(f"\n[{scenario}] world={WORLD} timeout={TIMEOUT_S:g} s wall {wall:.2f} s")
    for res in sorted(results, key=lambda x: x["rank"]):
        shown = res.get("admit") or res.get("timed") or {}
        print(
            f"  rank {res['rank']}: {shown.get('error') or shown.get('action')} "
            f"after {shown.get('elapsed')} s in {shown.get('collective')} "
            f"(torch: {shown.get('cause')})"
        )
    assert not failures, "\n".join(failures)
    assert len(results) == WORLD - (victim is not None)
    return results, codes


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_survivors_raise_within_the_timeout(scenario: str) -> None:
    """A rank exits before / inside admission, or never reaches it: every other rank
    raises a one-line CollectiveTimeoutError naming the collective, the group and the
    timeout, within the timeout (plus slack), far before the group's own timeout."""
    results, codes = _run_group(scenario)
    if scenario != "stuck":
        assert codes[VICTIM] == VICTIM_EXIT_CODE, codes
    members = list(range(WORLD))
    for res in results:
        r, got = res["rank"], res["admit"]
        assert got["error"] == "CollectiveTimeoutError", got
        message = got["message"]
        assert "\n" not in message
        assert f"admission collective {EXPECTED_COLLECTIVE[scenario]}" in message, message
        assert f"group of {WORLD} ranks {members}" in message, message
        assert f"(this is rank {r})" in message, message
        assert f"timeout={TIMEOUT_S:g} s" in message, message
        assert "abort the step" in message, message
        assert got["ranks"] == members and got["rank"] == r and got["timeout"] == TIMEOUT_S
        assert got["collective"] == EXPECTED_COLLECTIVE[scenario]
        # not a planning failure (nothing was wrong with the request); a RuntimeError,
        # as torch's own collective errors are
        assert got["is_runtime_error"] and not got["is_planning_error"]
        assert got["elapsed"] <= TIMEOUT_S + SLACK_S, got
        assert TIMEOUT_S + SLACK_S < PG_TIMEOUT_S  # so the group's timeout cannot be why
        if scenario == "stuck":  # nobody hung up: the survivors waited for the timeout
            assert got["elapsed"] >= 0.9 * TIMEOUT_S, got


def test_a_timeout_changes_no_decision() -> None:
    """Every rank alive: the decision with a timeout (given to admit, or bound into the
    communicator) is the one without and the single-process one at the lowest budget;
    a rank with an unusable timeout raises InputError naming ``timeout`` and its peers
    a PlanningError naming that rank, and the group stays usable."""
    results, _ = _run_group("alive")
    for res in results:
        expected = res["expected"]
        assert expected["action"] == "split", expected  # the ladder's collectives ran
        for key in ("timed", "untimed", "bounded", "after"):
            assert _decision(res[key]) == expected, (key, res[key])
        assert res["bounded_timeout"] == TIMEOUT_S and res["original_timeout"] is None
        assert res["constructor_zero"] == "timeout"
        bad = res["bad_timeout"]
        if res["rank"] == BAD_TIMEOUT_RANK:
            assert bad["error"] == "InputError" and bad["field"] == "timeout", bad
        else:
            assert bad["error"] == "PlanningError", bad
            assert bad["failed_rank"] == BAD_TIMEOUT_RANK
            assert "timeout=nan" in bad["message"], bad


@pytest.mark.parametrize("timeout", [0, -1.0, math.nan, math.inf, True, "5"])
def test_an_invalid_timeout_is_refused(timeout: Any) -> None:
    """admit / admit_step refuse a timeout that is not a finite number of seconds > 0."""
    from cpmem.admission.admission import admit
    from cpmem.admission.comm import LocalCommunicator, bounded
    from cpmem.errors import InputError

    with pytest.raises(InputError) as exc:
        admit("qwen3.5-4b", [4096], budget_bytes=2**62, timeout=timeout)
    assert exc.value.field == "timeout"
    assert str(exc.value).startswith("timeout=")
    with pytest.raises(InputError) as exc:
        bounded(LocalCommunicator(), timeout)
    assert exc.value.field == "timeout"


def test_a_communicator_that_cannot_bound_refuses_a_timeout() -> None:
    """A timeout is never silently ignored: a communicator without with_timeout refuses it."""
    from cpmem.admission.admission import admit
    from cpmem.admission.comm import LocalCommunicator
    from cpmem.errors import InputError

    class Unbounded:
        rank, size = 0, 1
        max_int = min_int = staticmethod(lambda v: v)
        gather_errors = staticmethod(lambda e: [e])

    with pytest.raises(InputError, match="has no with_timeout") as exc:
        admit("qwen3.5-4b", [4096], budget_bytes=2**62, comm=Unbounded(), timeout=5)
    assert exc.value.field == "timeout"
    local = admit("qwen3.5-4b", [4096], budget_bytes=2**62, comm=LocalCommunicator())
    timed = admit("qwen3.5-4b", [4096], budget_bytes=2**62, timeout=5)
    assert timed == local


def test_without_a_timeout_the_error_names_the_groups_own() -> None:
    """timeout=None (the process group's own timeout applied): still one line, naming it."""
    from cpmem.errors import CollectiveTimeoutError

    exc = CollectiveTimeoutError("all_reduce(MIN)", [4, 5], 5, None, "Operation timed out!")
    message = str(exc)
    assert "\n" not in message
    assert "all_reduce(MIN) on group of 2 ranks [4, 5] (this is rank 5)" in message
    assert "within the process group's timeout" in message
    assert message.endswith("(torch: Operation timed out!)")
