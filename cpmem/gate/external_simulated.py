"""An estimator that is not a cpmem policy, on the gate's simulated tier
(``cpmem gate --tier simulated --estimator package.module:function`` or
``--estimates FILE.csv``; docs/external-estimators.md).

Every grid row of ``golden/simulated/`` is described as a measured cell is
(``describe_row``, the same keys; ``cell_id`` is the row's ``config_id``), from the plan
the simulator was given (``row_step``). The estimator's answer is checked as the
simulated tier checks a policy's (``cpmem.gate.simulated``):

- **coverage**: the estimate >= ``required(sim, figure, family)``: the simulated
  busiest-rank peak with the cold set-up the simulator leaves out and the simulator's
  validated worst under-estimate for the model's family (``cpmem.samples.rows``);
  forward+backward likewise where the estimator gives it;
- **headroom** ``estimate / central(sim) - 1``, against the simulator's central figure
  (not the allowance), per model, family, CP and recompute mode; informational.

It passes when the grid is intact (its manifest) and every row is covered, as the
measured tier's external gate does. The busiest-rank check and the declared targets
judge a cpmem policy and are reported as not applicable.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cpmem.errors import InputError
from cpmem.gate.external import ExternalEstimate, describe_row
from cpmem.model.geometry import ModelGeometry
from cpmem.pricing.cold import COLD_SETUP
from cpmem.reports.tables import pct
from cpmem.samples.rows import (
    SIM_WORST_UNDER,
    Family,
    Figure,
    SimRow,
    central,
    family,
    load_rows,
    required,
    row_step,
    simulated_dir,
    verify_simulated,
)

__all__ = [
    "SIM_NA_REASON",
    "SIM_NOT_APPLICABLE",
    "DescribedRow",
    "described_rows",
    "gate_external_simulated",
    "row_descriptions",
]

SIM_NOT_APPLICABLE = ("busiest_rank", "targets")
SIM_NA_REASON = (
    "checks a cpmem pricing policy (the rank it prices as busiest, its declared targets); "
    "not applicable to an external estimator"
)
FIGURES: tuple[Figure, ...] = ("forward", "forward_backward")


@dataclass(frozen=True)
class DescribedRow:
    """A grid row, its model's validation family and its description."""

    row: SimRow
    family: Family
    description: dict[str, Any]


def described_rows(
    golden_dir: Path | None = None, ids: Iterable[str] | None = None
) -> list[DescribedRow]:
    """Every grid row (or those ``ids`` names), in ``rows.csv`` order."""
    sim_dir = simulated_dir(golden_dir)
    cache: dict[str, ModelGeometry] = {}
    out = []
    for row in load_rows(sim_dir, ids):
        step = row_step(row, sim_dir, cache)
        out.append(DescribedRow(row, family(step.geometry, step.compiled), describe_row(row, step)))
    return out


def row_descriptions(
    golden_dir: Path | None = None, ids: Iterable[str] | None = None
) -> list[dict[str, Any]]:
    """Every grid row's description (what ``--estimator`` passes on this tier)."""
    return [d.description for d in described_rows(golden_dir, ids)]


def _mode(row: SimRow) -> str:
    return f"{row.mode}({row.modules})" if row.modules else row.mode


def _row(d: DescribedRow, figure: Figure, got: int | None, problem: str | None) -> dict[str, Any]:
    r = d.row
    sim = r.forward_peak if figure == "forward" else r.forward_backward_peak
    need = required(sim, figure, d.family)
    return {
        "config_id": r.config_id,
        "model": r.model,
        "family": d.family,
        "tp": r.tp,
        "cp": r.cp,
        "mode": _mode(r),
        "logical_tokens": r.logical_tokens,
        "estimate_bytes": got,
        "simulated_peak_bytes": sim,
        "central_bytes": central(sim),
        "required_bytes": need,
        "headroom": None if got is None else got / central(sim) - 1,
        "covered": got is not None and got >= need,
        "problem": problem,
    }


def _stats(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    priced = [r for r in rows if r["headroom"] is not None]
    heads = [r["headroom"] for r in priced]
    tight = min(priced, key=lambda r: r["headroom"]) if priced else None
    return {
        "rows": len(rows),
        "priced": len(priced),
        "covered": sum(1 for r in rows if r["covered"]),
        "min_headroom": min(heads) if heads else None,
        "min_headroom_row": tight["config_id"] if tight else None,
        "median_headroom": statistics.median(heads) if heads else None,
        "max_headroom": max(heads) if heads else None,
    }


def _groups(
    rows: Sequence[Mapping[str, Any]], key: Callable[[Mapping[str, Any]], object]
) -> list[dict[str, Any]]:
    grouped: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        grouped.setdefault(str(key(r)), []).append(r)
    out = []
    for name in sorted(grouped, key=lambda v: (int(v), "") if v.isdigit() else (0, v)):
        s = _stats(grouped[name])
        if s["priced"]:
            out.append({"group": name, **{k: v for k, v in s.items() if k != "priced"}})
    return out


GROUPS: dict[str, Callable[[Mapping[str, Any]], object]] = {
    "by_model": lambda r: r["model"],
    "by_family": lambda r: r["family"],
    "by_cp": lambda r: r["cp"],
    "by_mode": lambda r: r["mode"],
}


def gate_external_simulated(
    name: str,
    estimates: Mapping[str, ExternalEstimate],
    golden_dir: Path | None = None,
    raised: Mapping[str, str] | None = None,
    rows: Sequence[DescribedRow] | None = None,
) -> dict[str, Any]:
    """The simulated tier's report for an external estimator (JSON-ready); ``rows``
    (default: every grid row) are the rows it is judged on."""
    sim_dir = simulated_dir(golden_dir)
    problems = verify_simulated(sim_dir)
    described = list(rows) if rows is not None else described_rows(golden_dir)
    known = {d.row.config_id for d in described}
    unknown = sorted(set(estimates) - known)
    if unknown:
        raise InputError("cell_id", unknown[:5], f"not grid rows ({len(unknown)} unknown)")
    raised = dict(raised or {})
    by_figure: dict[Figure, list[dict[str, Any]]] = {"forward": [], "forward_backward": []}
    failing: list[str] = []
    for d in described:
        cid = d.row.config_id
        got = estimates.get(cid)
        problem = raised.get(cid) or ("no estimate" if got is None else None)
        fwd = _row(d, "forward", None if got is None else got[0], problem)
        by_figure["forward"].append(fwd)
        if not fwd["covered"]:
            failing.append(cid + (f" ({problem})" if problem else ""))
        if got is not None and got[1] is not None:
            fb = _row(d, "forward_backward", got[1], None)
            by_figure["forward_backward"].append(fb)
            if not fb["covered"]:
                failing.append(f"{cid} (forward+backward)")
    coverage: dict[str, Any] = {
        "passed": not failing and bool(described),
        **_stats(by_figure["forward"]),
        "failing": failing,
        "by_row": by_figure["forward"],
    }
    if by_figure["forward_backward"]:
        coverage["forward_backward"] = {
            **_stats(by_figure["forward_backward"]),
            "by_row": by_figure["forward_backward"],
        }
    checks: dict[str, Any] = {
        "data": {"passed": not problems, "problems": problems, "failing": problems},
        "coverage": coverage,
        "headroom": {
            "passed": True,
            "informational": True,
            **{k: _groups(by_figure["forward"], key) for k, key in GROUPS.items()},
            "failing": [],
        },
    }
    for check in SIM_NOT_APPLICABLE:
        checks[check] = {
            "passed": True,
            "applicable": False,
            "reason": SIM_NA_REASON,
            "failing": [],
        }
    passed = all(ch["passed"] for ch in checks.values())
    fbc = coverage.get("forward_backward")
    return {
        "estimator": name,
        "tier": "simulated",
        "simulated_dir": str(sim_dir),
        "rows": len(described),
        "allowance": {
            "cold_setup_bytes": COLD_SETUP,
            "simulator_worst_under": {k: dict(v) for k, v in SIM_WORST_UNDER.items()},
        },
        "passed": passed,
        "checks": checks,
        "summary": (
            f"gate {'PASSED' if passed else 'FAILED'} (external estimator {name}, simulated "
            f"tier): {coverage['covered']}/{coverage['rows']} rows covered"
            + (f", forward+backward {fbc['covered']}/{fbc['rows']}" if fbc else "")
            + (
                f"; min headroom {pct(coverage['min_headroom'])} (against the simulator's "
                "central figure)"
                if coverage["min_headroom"] is not None
                else ""
            )
            + ("" if not problems else "; simulated data damaged")
        ),
    }
