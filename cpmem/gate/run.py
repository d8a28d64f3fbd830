"""The estimator gate: checks a pricing policy against the golden measurements.

``cpmem gate [--policy reference] [--json] [--record-controls] [--golden DIR]``

Checks, each PASS or FAIL (the exit status is non-zero when any fails):

0. golden: the golden layer is intact (schema, manifest, agreement with sources);
   a measured byte that changed would otherwise change every verdict below.
1. coverage: the estimate is at least the measured forward peak of every measured
   cell, in every phase. A measurement is valid whichever estimator ran beside
   it, so negative-control cells' peaks count too. For a policy that prices
   backward (``forward_backward_bytes``), its forward+backward figure must also
   cover every measured forward+backward peak.
2. conformance: recorded estimates of the paths the policy claims to reproduce
   match to the byte (``CONFORMANCE_CLAIMS``; a policy absent from it claims none).
3. controls: the reference policy reproduces ``golden/controls`` to the byte;
   other policies' differences are reported, not required.
4. refusals: cells recorded as refused are refused by admission against their
   recorded available bytes; cells that ran are admitted.
5. power: the recorded negative-control estimates fail to cover their peaks, and
   every mutant of the policy under test is caught (the reference formula's by
   coverage or conformance; a fitted policy's, refitted, by a target or a new
   held-out miss). A gate that passes broken estimators proves nothing.
6. targets: the headroom and coverage targets the policy declares (``TARGETS``;
   a policy absent from it declares none) are each met on the cells they select;
   each is printed with its measured worst value, a miss names its cells.
7. constants and cross_validation (policies with fitted constants,
   ``cpmem.calibration.fitted``): refitting on every cell reproduces the constants in the
   code, and refitted without each fold the held-out cells are covered (declared
   known misses aside, which may only shrink).
8. request_path: every measured cell planned from its request (lengths, shared
   prefix, TP, CP) with the default planner and priced by the policy covers its
   measured forward peak; the planned and recorded busiest counts are reported.

Cells are priced from what was recorded, never from a planner's guess: the
layout, packed tokens, segments and (under CP) the busiest rank's tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cpmem.calibration.fitted import constants_check, cross_validation_check, fitted_policy
from cpmem.gate.checks import (
    conformance,
    controls_check,
    coverage,
    golden_check,
    refusals,
    targets_check,
)
from cpmem.gate.claims import claims_for
from cpmem.gate.estimator import Estimator
from cpmem.gate.megatron_tier import megatron_check
from cpmem.gate.power import power
from cpmem.gate.request_path import request_path
from cpmem.gate.static_check import budget_check, static_check
from cpmem.golden.cells import MeasuredCell, load_cells
from cpmem.golden.files import CELLS_FILE, default_golden_dir
from cpmem.reports.tables import pct
from cpmem.samples.cells import cell_step, measured_samples
from cpmem.samples.targets import targets_for


def coverage_check(policy: str = "reference", golden_dir: Path | None = None) -> dict[str, Any]:
    """The gate's coverage check alone (``run_gate``'s ``checks["coverage"]``): every
    measured cell's rank-samples priced by ``policy``, without the other checks' work."""
    golden_dir = golden_dir if golden_dir is not None else default_golden_dir()
    cells = load_cells(golden_dir / CELLS_FILE)
    steps = {c.cell_id: cell_step(c) for c in cells}
    return coverage(cells, steps, Estimator.for_policy(policy))


def run_gate(policy: str = "reference", golden_dir: Path | None = None) -> dict[str, Any]:
    """Every check for ``policy``; the full report as a JSON-ready dict."""
    golden_dir = golden_dir if golden_dir is not None else default_golden_dir()
    cells = load_cells(golden_dir / CELLS_FILE)
    steps = {c.cell_id: cell_step(c) for c in cells}
    est = Estimator.for_policy(policy)
    checks = {
        "golden": golden_check(golden_dir, cells),
        "coverage": coverage(cells, steps, est),
        "request_path": request_path(cells, est),
        "conformance": conformance(cells, steps, est, claims_for(policy)),
        "controls": controls_check(golden_dir, policy),
        "refusals": refusals(cells, steps, policy),
        "power": power(cells, steps, policy),
        **fitting_checks(cells, policy),
        "targets": targets_check(cells, steps, est, targets_for(policy)),
        "static": static_check(cells),
        "budget": budget_check(cells),
        "megatron": megatron_check(golden_dir),
    }
    passed = all(ch["passed"] for ch in checks.values())
    report: dict[str, Any] = {
        "policy": policy,
        "golden_dir": str(golden_dir),
        "passed": passed,
        "checks": checks,
    }
    report["summary"] = summary_line(report)
    return report


def fitting_checks(cells: Sequence[MeasuredCell], policy: str) -> dict[str, dict[str, Any]]:
    """Constants and cross-validation, for a policy with fitted constants."""
    fitted = fitted_policy(policy)
    if fitted is None:
        return {}
    samples = measured_samples(cells)
    return {
        "constants": constants_check(samples, fitted),
        "cross_validation": cross_validation_check(samples, fitted),
    }


def summary_line(report: Mapping[str, Any]) -> str:
    ch = report["checks"]
    cov, conf, ctl, ref, pw = (
        ch["coverage"],
        ch["conformance"],
        ch["controls"],
        ch["refusals"],
        ch["power"],
    )
    verdict = "PASSED" if report["passed"] else "FAILED"
    failed = [name for name, c in ch.items() if not c["passed"]]
    fbc = cov.get("forward_backward")
    parts = [
        f"gate {verdict} (policy {report['policy']}): {cov['cells']} cells, "
        f"{cov['rank_samples']} rank-samples "
        + ("covered" if cov["passed"] else f"checked, {len(cov['failing'])} NOT covered")
        + (f" (forward+backward {fbc['covered']}/{fbc['cells']})" if fbc else "")
    ]
    if cov["min_headroom"] is not None:
        parts.append(
            f"min headroom {pct(cov['min_headroom'])}, median {pct(cov['median_headroom'])}, "
            f"max {pct(cov['max_headroom'])}"
        )
    rp = ch.get("request_path")
    if rp:
        parts.append(
            f"request path: {rp['cells'] - len(rp['failing'])}/{rp['cells']} covered, "
            f"busiest {rp['busiest_matching']}/{rp['cp_cells']} CP cells as recorded"
        )
    if conf["claims_none"]:
        parts.append("conformance: claims none")
    else:
        parts.append(f"{conf['matched']}/{conf['checked']} recorded estimates reproduced")
    if ctl.get("error"):
        parts.append("controls missing")
    else:
        word = "reproduced" if ctl["required"] else "match (informational)"
        parts.append(f"{ctl['matching']}/{ctl['total']} controls {word}")
    parts.append(f"{ref['cells'] - len(ref['failing'])}/{ref['cells']} admission decisions")
    muts = pw["mutants"]
    negs = pw["negative_controls"]
    parts.append(
        f"{sum(n['caught'] for n in negs)}/{len(negs)} negative controls and "
        f"{sum(m['caught'] for m in muts)}/{len(muts)} mutants caught"
    )
    if "cross_validation" in ch:
        cv = ch["cross_validation"]
        parts.append(
            f"constants {'reproduced' if ch['constants']['passed'] else 'NOT reproduced'} "
            f"by the fit; cross-validation {len(cv['folds'])} folds, {cv['held_out_cells']} "
            f"held-out cells, {len(cv['misses'])} held-out misses "
            f"({len(cv['known_misses'])} declared)"
        )
    tg = ch.get("targets")
    if tg and tg["declared"]:
        parts.append(
            f"targets {tg['met']}/{tg['declared']} met: "
            + "; ".join(
                f"{t['target']} ({t['figure']}) {t['measured']} [{t['bound']}]"
                + ("" if t["met"] else " MISSED")
                for t in tg["targets"]
            )
        )
    st, bu = ch.get("static"), ch.get("budget")
    if st and bu:
        parts.append(
            f"static memory within 3% of {st['within']}/{st['checked']} recorded baselines "
            f"({st['checked'] - st['within']} declared); budget rule on {bu['checked']} cells: "
            f"max error {pct(bu['max_abs_error_from_baseline'])} from the recorded baseline, "
            f"{pct(bu['max_abs_error_from_static'])} from the estimated static memory"
        )
    mg = ch.get("megatron")
    if mg:
        c = mg["checks"]
        parts.append(
            f"Megatron-LM recordings: {mg['recordings']} priced, static within 3% "
            f"{c['static']['passed']} ({c['static']['declared']} declared), peak covers "
            f"{c['covers']['passed']} ({c['covers']['declared']} declared), headroom "
            f"{c['headroom']['passed']} ({c['headroom']['declared']} declared), median "
            f"headroom {pct(mg['median_headroom'])} ({pct(mg['median_bound_headroom'])} "
            "with the MoE routing bounds)"
        )
    line = "; ".join(parts)
    if failed:
        line += f"; FAILED checks: {', '.join(failed)}"
    return line
