"""The gate's checks, each a JSON-ready dict with ``passed`` and ``failing``."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cpmem.admission.admission import admit_step
from cpmem.gate.claims import Claim
from cpmem.gate.controls import CONTROL_POLICIES, compute_controls
from cpmem.gate.controls_diff import compare_controls
from cpmem.gate.controls_file import (
    CONTROLS_FILE,
    ControlsError,
    controls_bytes,
    controls_dir,
    load_controls,
    load_meta,
    policy_rows,
)
from cpmem.gate.estimator import Estimator
from cpmem.golden.cells import MeasuredCell
from cpmem.golden.manifest import verify
from cpmem.samples.cells import is_measured
from cpmem.samples.targets import Target, TargetCell, measure_target
from cpmem.step.step import Step


def forward_backward_row(c: MeasuredCell, fb: int | None) -> dict[str, Any] | None:
    """A cell's forward+backward coverage row, where both the estimate and the measured
    peak exist."""
    fb_peak = c.forward_backward_peak_bytes
    if fb is None or fb_peak is None:
        return None
    return {
        "cell_id": c.cell_id,
        "forward_backward_bytes": fb,
        "forward_backward_peak_bytes": fb_peak,
        "headroom": fb / fb_peak - 1,
        "covered": fb >= fb_peak,
    }


def coverage(
    cells: Sequence[MeasuredCell], steps: Mapping[str, Step], est: Estimator
) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    fb_rows: list[dict[str, Any]] = []
    for c in cells:
        if not is_measured(c):
            continue
        assert c.forward_peak_bytes is not None
        priced = est.price(steps[c.cell_id])
        e = priced.estimate_bytes
        rows.append(
            {
                "cell_id": c.cell_id,
                "phase": c.phase,
                "estimate_bytes": e,
                "forward_peak_bytes": c.forward_peak_bytes,
                "headroom": e / c.forward_peak_bytes - 1,
                "rank_samples": c.measured_rank_samples,
                "covered": e >= c.forward_peak_bytes,
            }
        )
        row = forward_backward_row(c, priced.forward_backward_bytes)
        if row is not None:  # the policy prices backward
            fb_rows.append(row)
    failing = [r["cell_id"] for r in rows if not r["covered"]]
    failing += [f"{r['cell_id']} (forward+backward)" for r in fb_rows if not r["covered"]]
    return {"passed": not failing, **coverage_summary(rows, fb_rows, failing)}


def coverage_summary(
    rows: Sequence[Mapping[str, Any]], fb_rows: Sequence[Mapping[str, Any]], failing: list[str]
) -> dict[str, Any]:
    """Headroom statistics of coverage rows (a row without an estimate has headroom
    None and counts as a cell, not as priced), and of forward+backward rows if any."""
    priced = [r for r in rows if r["headroom"] is not None]
    heads = [r["headroom"] for r in priced]
    tight = min(priced, key=lambda r: r["headroom"]) if priced else None
    out: dict[str, Any] = {
        "cells": len(rows),
        "rank_samples": sum(r["rank_samples"] for r in rows),
        "min_headroom": min(heads) if heads else None,
        "min_headroom_cell": tight["cell_id"] if tight else None,
        "median_headroom": statistics.median(heads) if heads else None,
        "max_headroom": max(heads) if heads else None,
        "failing": failing,
        "rows": rows,
    }
    if fb_rows:
        fb_heads = [r["headroom"] for r in fb_rows]
        out["forward_backward"] = {
            "cells": len(fb_rows),
            "covered": sum(1 for r in fb_rows if r["covered"]),
            "min_headroom": min(fb_heads),
            "median_headroom": statistics.median(fb_heads),
            "max_headroom": max(fb_heads),
            "rows": fb_rows,
        }
    return out


def targets_check(
    cells: Sequence[MeasuredCell],
    steps: Mapping[str, Step],
    est: Estimator,
    targets: Sequence[Target],
) -> dict[str, Any]:
    """Each declared target on the measured cells it selects (``measure_target``)."""
    measured = [
        TargetCell(
            c.cell_id,
            steps[c.cell_id],
            est.price(steps[c.cell_id]),
            c.forward_peak_bytes,
            c.forward_backward_peak_bytes,
        )
        for c in cells
        if is_measured(c) and c.forward_peak_bytes is not None
    ]
    results = [measure_target(t, measured).to_dict() for t in targets]
    failing = [
        f"{r['target']}: {r['problem'] or ', '.join(r['failing'])}" for r in results if not r["met"]
    ]
    return {
        "passed": not failing,
        "declared": len(results),
        "met": sum(1 for r in results if r["met"]),
        "targets": results,
        "failing": failing,
    }


def conformance(
    cells: Sequence[MeasuredCell],
    steps: Mapping[str, Step],
    est: Estimator,
    claims: Sequence[Claim],
) -> dict[str, Any]:
    per_claim = []
    failing: list[str] = []
    mismatches = []
    for claim in claims:
        checked = matched = 0
        for c in cells:
            recorded = getattr(c, claim.column)
            if recorded is None or not claim.selects(c):
                continue
            checked += 1
            got = est.price(steps[c.cell_id], claim.variant).estimate_bytes
            if got == recorded:
                matched += 1
            else:
                failing.append(c.cell_id)
                mismatches.append(
                    {
                        "claim": claim.name,
                        "cell_id": c.cell_id,
                        "recorded_bytes": recorded,
                        "estimate_bytes": got,
                        "difference_bytes": got - recorded,
                    }
                )
        per_claim.append(
            {
                "claim": claim.name,
                "description": claim.description,
                "column": claim.column,
                "checked": checked,
                "matched": matched,
            }
        )
    return {
        "passed": not failing,
        "claims_none": not claims,
        "checked": sum(p["checked"] for p in per_claim),
        "matched": sum(p["matched"] for p in per_claim),
        "claims": per_claim,
        "failing": failing,
        "mismatches": mismatches,
    }


def controls_check(golden_dir: Path, policy: str) -> dict[str, Any]:
    """A recorded policy must reproduce its own controls to the byte; another policy
    is held against the reference's, for information."""
    required = policy in CONTROL_POLICIES
    path = controls_dir(golden_dir) / CONTROLS_FILE
    base: dict[str, Any] = {"required": required, "file": str(path)}
    try:
        recorded = load_controls(golden_dir)
    except ControlsError as exc:
        return {**base, "passed": not required, "error": str(exc), "failing": [], "total": 0}
    fresh = compute_controls(golden_dir, [policy])
    held = policy_rows(recorded, policy if required else "reference")
    diff = compare_controls(held, fresh, ignore=() if required else ("policy",))
    identical = required and controls_bytes(held) == controls_bytes(fresh)
    moved = [c.control_id for c in diff.changed] + list(diff.added) + list(diff.removed)
    return {
        **base,
        "passed": identical or (not required),
        "byte_identical": identical,
        "total": len(fresh),
        "matching": len(fresh) - len(diff.changed) - len(diff.added),
        "diff": diff.to_dict(),
        "failing": moved if required else [],
        "differing": moved,
        "meta": load_meta(golden_dir),
    }


def refusals(
    cells: Sequence[MeasuredCell], steps: Mapping[str, Step], policy: str
) -> dict[str, Any]:
    rows = []
    for c in cells:
        if c.available_bytes is None:
            continue
        decision = admit_step(steps[c.cell_id], c.available_bytes, policy=policy)
        expected = "refuse" if c.refused else "fit"
        rows.append(
            {
                "cell_id": c.cell_id,
                "recorded": "refused" if c.refused else "ran",
                "decision": decision.action,
                "required_bytes": decision.required_bytes,
                "available_bytes": decision.available_bytes,
                "ok": decision.action == expected,
            }
        )
    return {
        "passed": all(r["ok"] for r in rows),
        "cells": len(rows),
        "refused": sum(1 for r in rows if r["recorded"] == "refused"),
        "admitted": sum(1 for r in rows if r["recorded"] == "ran"),
        "failing": [r["cell_id"] for r in rows if not r["ok"]],
        "rows": rows,
    }


def golden_check(golden_dir: Path, cells: Sequence[MeasuredCell]) -> dict[str, Any]:
    problems = verify(golden_dir)
    return {"passed": not problems, "cells": len(cells), "problems": problems, "failing": problems}
