"""Where the grid's rank jobs run: a local process pool, or Ray.

An engine takes the pending rank jobs (plain-number dicts, ``worker.simulate_job``'s
input; no cpmem on the workers) and yields each job's result as it completes, keeping
twice as many jobs in flight as it has slots, not the whole grid queued. Both engines run
the same ``simulate_job``, so a rank's result does not depend on the engine and a run
stopped on one resumes on the other (``__main__`` appends the results to ranks.jsonl;
nothing here writes a file).

- ``local``: a ``ProcessPoolExecutor`` of ``--workers`` processes (the default where Ray
  is not installed).
- ``ray``: each job a Ray remote task (one CPU). Without ``--address`` the command starts
  a local Ray instance of ``--workers`` CPUs and shuts it down at the end; with
  ``--address`` it joins an existing cluster (``ray.init(address=...)``: ``auto``,
  ``HOST:6379`` or ``ray://HOST:10001``), ships this checkout's ``oracles/`` to it
  (``runtime_env`` ``py_modules``), uses every CPU the cluster has and leaves the cluster
  running. The cluster's Python environment must hold the simulator's torch and
  megatron-core: a worker's versions are checked against the driver's before any job.

Install Ray with ``pip install -e '.[grid]'``.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from importlib import metadata
from itertools import islice
from pathlib import Path
from typing import Any

from oracles.sim_grid.worker import simulate_job

Job = dict[str, Any]
Result = dict[str, Any]

ENGINES = ("local", "ray")
ORACLES = Path(__file__).resolve().parents[1]


def ray_installed() -> bool:
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


def default_engine(address: str | None = None) -> str:
    """``ray`` when Ray is installed (or an address is given), else ``local``."""
    return "ray" if address or ray_installed() else "local"


def worker_versions() -> dict[str, str | None]:
    """What a rank's result depends on besides the job: the simulator and its libraries."""
    from oracles.rank_sim import SIM_VERSION

    def version(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    return {
        "simulator": SIM_VERSION,
        "torch": version("torch"),
        "megatron-core": version("megatron-core"),
    }


class Engine:
    """Runs rank jobs; ``results`` yields each job's result as it completes (any order).
    A job that raises stops the run: the results already finished are yielded first, then
    the error is raised. Leaving the engine's ``with`` block on an exception (a failed job,
    Ctrl-C) ends the jobs still in flight; their results are not waited for.

    Ctrl-C reaches the driver only: the workers ignore SIGINT, so that a terminal's Ctrl-C
    (sent to the whole process group) stops the run in the driver's loop, where it is
    recorded, and not in a worker first (a broken pool, or an aborted Ray driver)."""

    name = ""
    slots = 1

    def results(self, jobs: Iterable[Job]) -> Iterator[Result]:
        queue = iter(jobs)
        running = [self._submit(j) for j in islice(queue, 2 * self.slots)]
        while running:
            ready, running = self._wait(running)
            error: BaseException | None = None
            for handle in ready:
                try:
                    res = self._result(handle)
                except Exception as e:  # keep the others' results; raise after them
                    error = error or e
                    continue
                if error is None:
                    running.extend(self._submit(j) for j in islice(queue, 1))
                yield res
            if error is not None:
                raise error

    def record(self) -> dict[str, Any]:
        """What the provenance records of this engine (the run record's fields)."""
        return {"engine": self.name, "address": None, "slots": self.slots}

    def close(self, abandon: bool = False) -> None:
        """Release the workers; ``abandon``: end the jobs still running, unread."""

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close(abandon=exc_type is not None)

    def _submit(self, job: Job) -> Any:
        raise NotImplementedError

    def _wait(self, running: list[Any]) -> tuple[list[Any], list[Any]]:
        raise NotImplementedError

    def _result(self, handle: Any) -> Result:
        raise NotImplementedError


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class LocalEngine(Engine):
    """``workers`` local processes."""

    name = "local"

    def __init__(self, workers: int) -> None:
        self.slots = workers
        self._pool = ProcessPoolExecutor(max_workers=workers, initializer=_ignore_sigint)

    def _submit(self, job: Job) -> Future[Result]:
        return self._pool.submit(simulate_job, job)

    def _wait(self, running: list[Any]) -> tuple[list[Any], list[Any]]:
        done, rest = wait(running, return_when=FIRST_COMPLETED)
        return list(done), list(rest)

    def _result(self, handle: Any) -> Result:
        res: Result = handle.result()
        return res

    def close(self, abandon: bool = False) -> None:
        if abandon:  # a rank can run for minutes: end it rather than wait for it
            procs = getattr(self._pool, "_processes", None) or {}  # pid -> Process
            for proc in list(procs.values()):
                proc.terminate()
        self._pool.shutdown(wait=True, cancel_futures=True)


class RayEngine(Engine):
    """Ray remote tasks: on a local instance of ``workers`` CPUs started here, or on the
    cluster at ``address``."""

    name = "ray"

    def __init__(self, workers: int, address: str | None = None) -> None:
        try:
            import ray
        except ImportError as e:
            raise SystemExit(
                "--engine ray needs Ray: pip install -e '.[grid]' (or use --engine local)"
            ) from e
        self._ray = ray
        self.address = address
        # no usage report from a generator run unless the user asked for one
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        # Ray's processes inherit SIG_IGN for SIGINT (class docstring): a Ray process killed
        # under a live driver can abort the driver, losing the run's record
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            self._init(ray, workers, address)
        finally:
            signal.signal(signal.SIGINT, previous)
        try:
            self.slots = max(1, int(ray.cluster_resources().get("CPU", workers)))
            self._remote = ray.remote(num_cpus=1)(simulate_job)
            here = worker_versions()
            there = ray.get(ray.remote(num_cpus=1)(worker_versions).remote())
            if there != here:
                raise SystemExit(
                    f"the Ray workers run {there}, this checkout {here}: their rows would "
                    "not be this simulator's (install the same versions on the cluster)"
                )
            self._nodes = len([n for n in ray.nodes() if n.get("Alive")])
        except BaseException:
            ray.shutdown()
            raise

    @staticmethod
    def _init(ray: Any, workers: int, address: str | None) -> None:
        quiet: dict[str, Any] = {"logging_level": logging.WARNING, "log_to_driver": False}
        if address:
            # the cluster runs this checkout's simulator, not whatever it has installed
            env = {"py_modules": [str(ORACLES)], "excludes": ["__pycache__"]}
            ray.init(address=address, runtime_env=env, **quiet)
        else:
            # workers on this machine see the driver's sys.path, so this checkout
            ray.init(
                address="local",
                num_cpus=workers,
                include_dashboard=False,
                object_store_memory=128 * 1024**2,  # results are small dicts
                **quiet,
            )

    def record(self) -> dict[str, Any]:
        return {
            "engine": self.name,
            "address": self.address or "local instance",
            "slots": self.slots,
            "ray": self._ray.__version__,
            "ray_nodes": self._nodes,
        }

    def _submit(self, job: Job) -> Any:
        return self._remote.remote(job)

    def _wait(self, running: list[Any]) -> tuple[list[Any], list[Any]]:
        ray = self._ray
        ready, rest = ray.wait(running, num_returns=1)
        if rest:  # every other one finished by now too
            more, rest = ray.wait(rest, num_returns=len(rest), timeout=0)
            ready += more
        return ready, rest

    def _result(self, handle: Any) -> Result:
        res: Result = self._ray.get(handle)
        return res

    def close(self, abandon: bool = False) -> None:
        # a local instance stops, with its workers; on a cluster, which stays up, a
        # driver's tasks end with it. Not ray.cancel first: it ends nothing more, and
        # cancelling tasks whose workers were dying aborted the driver in testing (Ray
        # 2.60, "Tried to complete task that was not pending").
        self._ray.shutdown()


def open_engine(name: str, workers: int, address: str | None = None) -> Engine:
    if name == "local":
        if address:
            raise SystemExit("--address joins a Ray cluster: use it with --engine ray")
        return LocalEngine(workers)
    if name == "ray":
        return RayEngine(workers, address)
    raise SystemExit(f"unknown engine {name!r} (one of {', '.join(ENGINES)})")
