"""Test sessions. `nox` (no -s) runs what CI runs; `nox -s gpu` runs the GPU-marked checks.

Every session runs in ONE shared environment (`.nox/shared`), built the first time a
session needs it and reused while its inputs (pyproject.toml and the pins below) are
unchanged: torch and megatron-core are installed once, not once per session. Each
session still runs on its own (`nox -s golden` builds the environment if missing).
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import nox

# gpu runs early: without CUDA its tests skip (with the reason), and the suite then
# closes on the sessions that run tests here.
nox.options.sessions = [
    "lint",
    "typecheck",
    "gpu",
    "tests",
    "property",
    "golden",
    "oracle",
    "distributed",
]

ROOT = Path(__file__).resolve().parent
SHARED = ROOT / ".nox" / "shared"
# The CPU wheel of torch; an unpinned torch would pull a multi-GB CUDA build.
TORCH = "torch==2.13.0"
PINS = (
    TORCH,
    "megatron-core>=0.16,<0.17",
    "ruff>=0.6",
    "mypy>=1.10",
    "pandas-stubs",
    "types-PyYAML",
)
# grid: Ray, for the simulated grid's Ray engine, tested in the `oracle` session
# (tests/oracle/test_sim_grid_ray.py; about 10 s to install, docs/simulated-grid.md "Engines")
EXTRAS = "test,report,grid"


def _inputs_digest() -> str:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8") + "\n".join(PINS) + EXTRAS
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _shared(session: nox.Session) -> Path:
    """The shared environment's bin/ directory, built (or rebuilt) when its inputs
    changed since it was last built."""
    bindir = SHARED / "bin"
    marker = SHARED / ".inputs-sha256"
    digest = _inputs_digest()
    if not (marker.is_file() and marker.read_text() == digest and (bindir / "python").exists()):
        session.log(f"building the shared environment {SHARED}")
        session.run(sys.executable, "-m", "venv", "--clear", str(SHARED), external=True)
        pip = [str(bindir / "python"), "-m", "pip", "install", "--quiet", "--upgrade"]
        session.run(*pip, "--disable-pip-version-check", "pip", external=True)
        session.run(*pip, TORCH, *PINS[1:], "-e", f".[{EXTRAS}]", external=True)
        marker.write_text(digest)
    return bindir


BYTECODE = {"PYTHONDONTWRITEBYTECODE": ""}
"""Every session writes its modules' bytecode (``__pycache__/``, ignored by git) even where
the caller's environment says not to: the sessions start some hundred Python processes
(xdist workers, the CLI, the driver, gloo ranks, the grid's workers), and each one
compiled every module of cpmem, the tests and the oracles from source again."""


def _run(session: nox.Session, tool: str, *args: str) -> None:
    """Run ``tool`` (a console script or ``python``) from the shared environment."""
    session.run(str(_shared(session) / tool), *args, external=True, env=BYTECODE)


@nox.session(venv_backend="none")
def lint(session: nox.Session) -> None:
    """ruff over every Python file."""
    _run(session, "ruff", "check", ".")
    _run(session, "ruff", "format", "--check", ".")


@nox.session(venv_backend="none")
def typecheck(session: nox.Session) -> None:
    """mypy --strict on the estimator package."""
    _run(session, "mypy", "cpmem")


@nox.session(venv_backend="none")
def tests(session: nox.Session) -> None:
    """CPU unit tests, including byte-exact reproduction of the recorded estimates
    (torch + megatron-core let the measurement driver's CPU end-to-end tests run)."""
    _run(session, "python", "-m", "pytest", "tests/unit", "-n", "auto", *session.posargs)


@nox.session(venv_backend="none")
def property(session: nox.Session) -> None:
    """Hypothesis properties against the ownership oracle (profile `ci`)."""
    _run(
        session,
        "python",
        "-m",
        "pytest",
        "tests/property",
        "-n",
        "auto",
        "--hypothesis-profile=ci",
        "--hypothesis-show-statistics",
        *session.posargs,
    )


@nox.session(venv_backend="none")
def golden(session: nox.Session) -> None:
    """Golden-layer integrity tests, the estimator gate on the reference and tight policies,
    and every report kept in golden/reports/, all as tests under xdist: the gate passes on
    each recorded policy (tests/golden/test_gate.py, and `cpmem gate --policy reference`
    as the walkthrough runs it, tests/golden/test_examples.py) and each kept report is what
    its command prints now, what it reports met (`--check`: tight_policy.md in
    test_fitting.py, peers.md in test_peers.py, megatron.md in test_megatron_tier.py,
    static_memory.md in test_static_check.py, simulated_tier.md in test_simulated.py). Print a report with its command
    (`python -m cpmem.reports.tight_report`, `cpmem gate --policy tight`, ...)."""
    _run(session, "python", "-m", "pytest", "tests/golden", "-n", "auto", *session.posargs)


@nox.session(venv_backend="none")
def oracle(session: nox.Session) -> None:
    """Saved-tensor oracle and rank simulator (torch + megatron-core on CPU), on every CPU:
    a module's tests stay on one worker (``--dist loadscope``: the grid generator's runs
    share their module's reference run), and the tables the tests print are shown with
    their test (``-rP``)."""
    _run(
        session,
        "python",
        "-m",
        "pytest",
        "tests/oracle",
        "-n",
        "auto",
        "--dist",
        "loadscope",
        "-rP",
        *session.posargs,
    )


@nox.session(venv_backend="none")
def distributed(session: nox.Session) -> None:
    """Collective admission over torch.distributed (gloo, several CPU processes)."""
    _run(session, "python", "-m", "pytest", "tests/distributed", "-s", *session.posargs)


@nox.session(venv_backend="none")
def gpu(session: nox.Session) -> None:
    """GPU-marked native checks; they skip with a reason where no CUDA device exists."""
    _run(session, "python", "-m", "pytest", "gpu_tests", "-m", "gpu", "-rs", *session.posargs)


@nox.session(venv_backend="none")
def bench(session: nox.Session) -> None:
    """Speed figures of the CLI's first command (the whole process, against its 0.2 s),
    planning, pricing, width selection and the capacity table (not a pass/fail test)."""
    _run(session, "python", "benchmarks/bench_cli.py")
    _run(session, "python", "benchmarks/bench_planning.py", *session.posargs)
    _run(session, "python", "benchmarks/bench_capacity.py")
    _run(session, "python", "benchmarks/bench_megatron.py")


@nox.session(venv_backend="none")
def simulate(session: nox.Session) -> None:
    """Rank simulator over every expressible golden cell at full depth: prints the
    comparison and fails when golden/reports/rank_sim_validation.md is stale (regenerate
    with `python -m oracles.rank_sim.validate --write`). The default `oracle` session
    runs only a reduced-depth subset (tests/oracle/test_rank_sim.py)."""
    _run(session, "python", "-m", "oracles.rank_sim.validate", *session.posargs)
    _run(session, "python", "-m", "oracles.rank_sim.validate", "--check")


@nox.session(name="simulate-grid", venv_backend="none")
def simulate_grid(session: nox.Session) -> None:
    """The simulated grid: generate golden/simulated/ with the rank simulator on a local
    Ray instance (resumable: finished ranks are kept; `-- --workers N` to change the 2
    CPUs, `-- --engine local` for local processes, `-- --address ADDR` for a Ray cluster),
    then the gate's full simulated tier for every policy, each printed;
    fails when the data is missing or corrupted or a policy misses a declared target
    (docs/simulated-grid.md). Not in the default run, which checks a fixed subset of
    committed rows (tests/golden/test_simulated.py)."""
    _run(session, "python", "-m", "oracles.sim_grid", *session.posargs)
    cpmem = str(_shared(session) / "cpmem")
    failed = []
    for policy in ("tight", "reference", "global"):
        args = ("gate", "--tier", "simulated", "--policy", policy)
        out = session.run(cpmem, *args, external=True, success_codes=[0, 1], silent=True)
        print(out)
        if not str(out).startswith("simulated tier PASSED"):
            failed.append(policy)
    if failed:
        session.error(f"simulated tier failed for: {', '.join(failed)}")


# fla-core's own GDN autograd function in the rank simulator (oracles/rank_sim/fla_kernel.py):
# an environment of its own, never the shared one, so the default sessions and the
# committed validation report stay on the stand-in.
FLA_ENV = ROOT / ".nox" / "simulate-fla"
FLA_PINS = (TORCH, "megatron-core>=0.16,<0.17", "fla-core==0.6.0", "triton==3.9.0")


def _fla_env(session: nox.Session) -> Path:
    """The fla environment's bin/ directory, built like the shared one (torch first, the
    CPU wheel) with fla-core and triton pinned; rebuilt when its inputs change."""
    bindir = FLA_ENV / "bin"
    marker = FLA_ENV / ".inputs-sha256"
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8") + "\n".join(FLA_PINS)
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    if not (marker.is_file() and marker.read_text() == digest and (bindir / "python").exists()):
        session.log(f"building the fla environment {FLA_ENV}")
        session.run(sys.executable, "-m", "venv", "--clear", str(FLA_ENV), external=True)
        pip = [str(bindir / "python"), "-m", "pip", "install", "--quiet", "--upgrade"]
        session.run(*pip, "--disable-pip-version-check", "pip", external=True)
        session.run(*pip, TORCH, external=True)
        session.run(*pip, *FLA_PINS, "-e", ".[test]", external=True)
        marker.write_text(digest)
    return bindir


@nox.session(name="simulate_fla", venv_backend="none")
def simulate_fla(session: nox.Session) -> None:
    """The rank simulator with fla-core's own chunked gated delta rule (its triton launches
    made shape-only): the fla tests, then the validation over every golden cell with
    ``--gdn-kernel fla`` semantics (printed, never written: the committed report is the
    default environment's stand-in). Not in the default sessions."""
    python = str(_fla_env(session) / "python")
    env = {"RANK_SIM_GDN_KERNEL": "fla"}
    test = "tests/oracle/test_rank_sim_fla.py"
    session.run(python, "-m", "pytest", test, "-q", "-rs", *session.posargs, external=True)
    session.run(python, "-m", "oracles.rank_sim.validate", env=env, external=True)
