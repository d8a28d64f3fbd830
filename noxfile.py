"""Test sessions. `nox` (no -s) runs what CI runs; `nox -s gpu` runs the GPU-marked checks."""

from __future__ import annotations

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
nox.options.reuse_existing_virtualenvs = True

PYTHON = "3.11"
# The CPU wheel of torch; an unpinned torch would pull a multi-GB CUDA build.
TORCH = "torch==2.13.0"


def _install(session: nox.Session, extras: str) -> None:
    session.install("-e", f".[{extras}]")


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff over every Python file."""
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python=PYTHON)
def typecheck(session: nox.Session) -> None:
    """mypy --strict on the estimator package (matplotlib installed for the report)."""
    _install(session, "test,report")
    session.install("mypy>=1.10", "pandas-stubs")
    session.run("mypy", "cpmem")


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """CPU unit tests, including byte-exact reproduction of the recorded estimates
    (torch + megatron-core let the measurement driver's CPU end-to-end tests run)."""
    _install(session, "test,report")
    session.install(TORCH, "megatron-core>=0.16,<0.17")
    session.run("pytest", "tests/unit", *session.posargs)


@nox.session(python=PYTHON)
def property(session: nox.Session) -> None:
    """Hypothesis properties against the ownership oracle (profile `ci`)."""
    _install(session, "test")
    session.run(
        "pytest",
        "tests/property",
        "--hypothesis-profile=ci",
        "--hypothesis-show-statistics",
        *session.posargs,
    )


@nox.session(python=PYTHON)
def golden(session: nox.Session) -> None:
    """Golden-layer integrity tests, the estimator gate on the reference and tight policies,
    and the tight policy's report."""
    _install(session, "test,report")
    session.run("pytest", "tests/golden", *session.posargs)
    session.run("cpmem", "gate", "--policy", "reference")
    session.run("cpmem", "gate", "--policy", "tight")
    # the tight policy's report: targets, per-cell, leave-one-model-out and
    # leave-longest-shape-out tables; printed, and failing when the copy kept in
    # golden/reports/ is stale (regenerate with --write, never here)
    session.run("python", "-m", "cpmem.gate.tight_report", "--check", "golden/reports/tight_policy.md")


@nox.session(python=PYTHON)
def oracle(session: nox.Session) -> None:
    """Saved-tensor oracle (torch + megatron-core on CPU) against the reference widths."""
    _install(session, "test")
    session.install(TORCH, "megatron-core>=0.16,<0.17")
    session.run("pytest", "tests/oracle", "-s", *session.posargs)


@nox.session(python=PYTHON)
def distributed(session: nox.Session) -> None:
    """Collective admission over torch.distributed (gloo, several CPU processes)."""
    _install(session, "test")
    session.install(TORCH, "megatron-core>=0.16,<0.17")
    session.run("pytest", "tests/distributed", "-s", *session.posargs)


@nox.session(python=PYTHON)
def gpu(session: nox.Session) -> None:
    """GPU-marked native checks; they skip with a reason where no CUDA device exists."""
    _install(session, "test")
    session.install(TORCH, "megatron-core>=0.16,<0.17")
    session.run("pytest", "gpu_tests", "-m", "gpu", "-rs", *session.posargs)


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Speed figures of planning, pricing and width selection (not a pass/fail test)."""
    _install(session, "test")
    session.run("python", "benchmarks/bench_planning.py", *session.posargs)


@nox.session(python=PYTHON)
def simulate(session: nox.Session) -> None:
    """Rank simulator over every expressible golden cell at full depth: prints the
    comparison and fails when golden/reports/rank_sim_validation.md is stale (regenerate
    with `python -m oracles.rank_sim.validate --write`). The default `oracle` session
    runs only a reduced-depth subset (tests/oracle/test_rank_sim.py)."""
    _install(session, "test")
    session.install(TORCH, "megatron-core>=0.16,<0.17")
    session.run("python", "-m", "oracles.rank_sim.validate", *session.posargs)
    session.run("python", "-m", "oracles.rank_sim.validate", "--check")
