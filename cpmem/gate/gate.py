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
   every mutant of the reference formula (one term removed) is caught by
   coverage or, failing that, by conformance. A gate that passes broken
   estimators proves nothing.
6. targets: the headroom and coverage targets the policy declares (``TARGETS``;
   a policy absent from it declares none) are each met on the cells they select;
   each is printed with its measured worst value, a miss names its cells.

Cells are priced from what was recorded, never from a planner's guess: the
layout, packed tokens, segments and (under CP) the busiest rank's tokens.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from cpmem.admission.admission import admit_plan
from cpmem.api import load_model
from cpmem.errors import CpmemError
from cpmem.gate.controls import (
    CONTROL_POLICY,
    CONTROLS_FILE,
    ControlsError,
    compare_controls,
    compute_controls,
    controls_bytes,
    controls_dir,
    load_controls,
    load_meta,
    record_controls,
)
from cpmem.golden.cells import MeasuredCell, load_cells
from cpmem.golden.files import CELLS_FILE, default_golden_dir
from cpmem.golden.manifest import verify
from cpmem.plan.layout import ParallelLayout, round_up
from cpmem.plan.plan import Plan, explicit_plan
from cpmem.pricing.estimate import Estimate
from cpmem.pricing.inputs import MoeRouting, PricingInput
from cpmem.pricing.recompute import Recompute
from cpmem.pricing.reference import ReferenceTerms, price_reference
from cpmem.pricing.registry import policy_names, price
from cpmem.pricing.tight import TARGETS as TIGHT_TARGETS
from cpmem.pricing.tight import Target, TargetCell, measure_target

__all__ = [
    "CONFORMANCE_CLAIMS",
    "MUTANTS",
    "TARGETS",
    "Claim",
    "Estimator",
    "cell_inputs",
    "cell_plan",
    "claims_for",
    "main",
    "run_gate",
    "targets_for",
]

RecordedColumn = Literal["recorded_estimate_bytes", "recorded_old_estimate_bytes"]


# --------------------------------------------------------------------------------------
# Pricing a recorded cell
# --------------------------------------------------------------------------------------


def _unpadded_tokens(cell: MeasuredCell) -> int:
    """The real (shared) tokens behind ``packed_tokens`` when packed is them padded to TP.

    Recorded pairs do not always share their prefix in the packed row (the 2048
    pairs record a 614-token prefix and 4096 packed tokens), so the shared count
    is trusted only where padding it to TP gives exactly the recorded packed count.
    """
    lengths = cell.lengths_list
    shared = sum(lengths) - cell.shared_prefix * (len(lengths) - 1)
    if shared < cell.packed_tokens and round_up(shared, cell.tp) == cell.packed_tokens:
        return shared
    return cell.packed_tokens


def cell_plan(cell: MeasuredCell) -> Plan:
    """The recorded layout as an explicit plan (no planner involved)."""
    layout = ParallelLayout(tp=cell.tp, cp=cell.cp, sp=cell.sequence_parallel, ep=cell.ep)
    lengths = cell.lengths_list
    segments = cell.grad_segments
    if segments is None:  # only GDN models read it; the 1.7B rows without it have no GDN
        segments = 3 if cell.packed_tokens < sum(lengths) else len(lengths)
    if cell.cp > 1:
        return explicit_plan(
            layout,
            logical_tokens=sum(lengths),
            packed_tokens=cell.packed_tokens,
            grad_segments=segments,
            busiest_tokens=cell.retained_tokens,
        )
    return explicit_plan(
        layout,
        logical_tokens=sum(lengths),
        packed_tokens=cell.packed_tokens,
        grad_segments=segments,
        rank_tokens=[_unpadded_tokens(cell)],
    )


def cell_routing(cell: MeasuredCell) -> MoeRouting:
    return "balanced" if cell.concentrated_routing is False else "concentrated"


def cell_inputs(cell: MeasuredCell) -> PricingInput:
    return PricingInput(
        geometry=load_model(cell.model),
        plan=cell_plan(cell),
        recompute=Recompute.parse(cell.mode, cell.modules or None),
        compiled=cell.compiled,
        moe_routing=cell_routing(cell),
    )


# --------------------------------------------------------------------------------------
# Estimators, conformance claims and mutants
# --------------------------------------------------------------------------------------

# Registered policies that are the reference formula with some switches set; only
# these can price a claim's earlier-estimator variant (e.g. without segment states).
REFERENCE_FORMULA_TERMS: dict[str, ReferenceTerms] = {
    "reference": ReferenceTerms(),
    "global": ReferenceTerms(cp_tokens="packed"),
}


@dataclass(frozen=True)
class Estimator:
    """A registered policy, or a mutant of the reference formula (``policy`` None)."""

    name: str
    policy: str | None
    terms: ReferenceTerms | None

    @staticmethod
    def for_policy(policy: str) -> Estimator:
        return Estimator(policy, policy, REFERENCE_FORMULA_TERMS.get(policy))

    def price(self, inputs: PricingInput, variant: Mapping[str, Any] | None = None) -> Estimate:
        if variant:
            if self.terms is None:
                raise CpmemError(f"{self.name} is not the reference formula; it has no variants")
            return price_reference(inputs, replace(self.terms, **variant), self.name)
        if self.policy is not None:
            return price(inputs, self.policy)
        assert self.terms is not None
        return price_reference(inputs, self.terms, self.name)


def _is_moe(cell: MeasuredCell) -> bool:
    return load_model(cell.model).is_moe


@dataclass(frozen=True)
class Claim:
    """A set of recorded estimates a policy reproduces to the byte.

    ``variant`` switches reference terms for rows an earlier estimator recorded.
    """

    name: str
    description: str
    selects: Callable[[MeasuredCell], bool]
    column: RecordedColumn = "recorded_estimate_bytes"
    variant: Mapping[str, Any] = field(default_factory=dict)


_CP_FINAL = Claim(
    "cp-final",
    "CP file, recorded estimate (busiest-rank pricing)",
    lambda c: c.cp > 1 and c.phase == "final",
)
_TP_DENSE = Claim(
    "tp-dense",
    "TP file, dense final and eager_control rows",
    lambda c: c.cp == 1 and c.phase in ("final", "eager_control") and not _is_moe(c),
)
_BEFORE_SEGMENT_STATES = Claim(
    "before-segment-states",
    "TP file, before_segment_states rows, priced without segment states",
    lambda c: c.phase == "before_segment_states",
    variant={"segment_states": False},
)
_CP_OLD = Claim(
    "cp-old",
    "CP file, recorded old estimate (every rank charged the packed count)",
    lambda c: c.cp > 1 and c.recorded_old_estimate_bytes is not None,
    column="recorded_old_estimate_bytes",
)

# Which recorded estimates each policy claims to reproduce. A policy that is not
# listed claims none; a new policy (e.g. "tight") may say so explicitly with ().
CONFORMANCE_CLAIMS: dict[str, tuple[Claim, ...]] = {
    "reference": (_CP_FINAL, _TP_DENSE, _BEFORE_SEGMENT_STATES),
    "global": (_CP_OLD,),
    "tight": (),  # calibrated to the measurements: reproduces no recorded estimate
}


def claims_for(policy: str) -> tuple[Claim, ...]:
    return CONFORMANCE_CLAIMS.get(policy, ())


# The targets each policy declares (``cpmem.pricing.tight.Target``); the definitions live with
# the policy. A policy not listed declares none, and its targets row says so.
TARGETS: dict[str, tuple[Target, ...]] = {
    "tight": TIGHT_TARGETS,
}


def targets_for(policy: str) -> tuple[Target, ...]:
    return TARGETS.get(policy, ())


# The reference formula with one term removed; each must be caught.
MUTANTS: dict[str, ReferenceTerms] = {
    "no-segment-states": ReferenceTerms(segment_states=False),
    "no-cold-allowance": ReferenceTerms(cold_allowance=False),
    "cp-average-tokens": ReferenceTerms(cp_tokens="average"),
    "no-tp-padding": ReferenceTerms(tp_padding=False),
    "fused-mlp-on-unfused": ReferenceTerms(fused_swiglu=True),
}


# --------------------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------------------


def _measured(cell: MeasuredCell) -> bool:
    return not cell.refused and cell.forward_peak_bytes is not None


def _pct(x: float) -> str:
    return f"{x * 100:.1f}%"


def coverage(
    cells: Sequence[MeasuredCell], inputs: Mapping[str, PricingInput], est: Estimator
) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    fb_rows: list[dict[str, Any]] = []
    for c in cells:
        if not _measured(c):
            continue
        assert c.forward_peak_bytes is not None
        priced = est.price(inputs[c.cell_id])
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
        fb, fb_peak = priced.forward_backward_bytes, c.forward_backward_peak_bytes
        if fb is not None and fb_peak is not None:  # the policy prices backward
            fb_rows.append(
                {
                    "cell_id": c.cell_id,
                    "forward_backward_bytes": fb,
                    "forward_backward_peak_bytes": fb_peak,
                    "headroom": fb / fb_peak - 1,
                    "covered": fb >= fb_peak,
                }
            )
    heads = [r["headroom"] for r in rows]
    tight = min(rows, key=lambda r: r["headroom"]) if rows else None
    failing = [r["cell_id"] for r in rows if not r["covered"]]
    failing += [f"{r['cell_id']} (forward+backward)" for r in fb_rows if not r["covered"]]
    out: dict[str, Any] = {
        "passed": not failing,
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
    inputs: Mapping[str, PricingInput],
    est: Estimator,
    targets: Sequence[Target],
) -> dict[str, Any]:
    """Each declared target on the measured cells it selects (``measure_target``)."""
    measured = [
        TargetCell(
            c.cell_id,
            inputs[c.cell_id],
            est.price(inputs[c.cell_id]),
            c.forward_peak_bytes,
            c.forward_backward_peak_bytes,
        )
        for c in cells
        if _measured(c) and c.forward_peak_bytes is not None
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
    inputs: Mapping[str, PricingInput],
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
            got = est.price(inputs[c.cell_id], claim.variant).estimate_bytes
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
    required = policy == CONTROL_POLICY
    path = controls_dir(golden_dir) / CONTROLS_FILE
    base: dict[str, Any] = {"required": required, "file": str(path)}
    try:
        recorded = load_controls(golden_dir)
    except ControlsError as exc:
        return {**base, "passed": not required, "error": str(exc), "failing": [], "total": 0}
    fresh = compute_controls(policy)
    diff = compare_controls(recorded, fresh, ignore=() if required else ("policy",))
    identical = required and path.read_bytes() == controls_bytes(fresh)
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
    cells: Sequence[MeasuredCell], inputs: Mapping[str, PricingInput], policy: str
) -> dict[str, Any]:
    rows = []
    for c in cells:
        if c.available_bytes is None:
            continue
        inp = inputs[c.cell_id]
        decision = admit_plan(
            inp.geometry,
            inp.plan,
            c.available_bytes,
            recompute=inp.recompute,
            policy=policy,
            compiled=inp.compiled,
            moe_routing=inp.moe_routing,
        )
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


def power(cells: Sequence[MeasuredCell], inputs: Mapping[str, PricingInput]) -> dict[str, Any]:
    negatives = []
    for c in cells:
        if not c.is_negative_control:
            continue
        peak, rec = c.forward_peak_bytes, c.recorded_estimate_bytes
        caught = peak is not None and rec is not None and rec < peak
        negatives.append(
            {
                "cell_id": c.cell_id,
                "phase": c.phase,
                "recorded_estimate_bytes": rec,
                "forward_peak_bytes": peak,
                "ratio": rec / peak if rec is not None and peak else None,
                "caught": caught,
            }
        )
    mutants = []
    ref_claims = claims_for("reference")
    for name, terms in MUTANTS.items():
        mutant = Estimator(f"mutant:{name}", None, terms)
        cov = coverage(cells, inputs, mutant)
        conf = conformance(cells, inputs, mutant, ref_claims)
        caught_by = "coverage" if cov["failing"] else "conformance" if conf["failing"] else None
        reproduces = [
            c.cell_id
            for c in cells
            if c.is_negative_control
            and c.recorded_estimate_bytes == mutant.price(inputs[c.cell_id]).estimate_bytes
        ]
        mutants.append(
            {
                "mutant": name,
                "terms": repr(terms),
                "caught": caught_by is not None,
                "caught_by": caught_by,
                "coverage_failing": cov["failing"],
                "conformance_failing": conf["failing"],
                "reproduces_negative_controls": reproduces,
            }
        )
    failing = [n["cell_id"] for n in negatives if not n["caught"]]
    failing += [f"mutant:{m['mutant']}" for m in mutants if not m["caught"]]
    return {
        "passed": not failing,
        "negative_controls": negatives,
        "mutants": mutants,
        "failing": failing,
    }


def golden_check(golden_dir: Path, cells: Sequence[MeasuredCell]) -> dict[str, Any]:
    problems = verify(golden_dir)
    return {"passed": not problems, "cells": len(cells), "problems": problems, "failing": problems}


# --------------------------------------------------------------------------------------
# The whole gate
# --------------------------------------------------------------------------------------


def run_gate(policy: str = "reference", golden_dir: Path | None = None) -> dict[str, Any]:
    """Every check for ``policy``; the full report as a JSON-ready dict."""
    golden_dir = golden_dir if golden_dir is not None else default_golden_dir()
    cells = load_cells(golden_dir / CELLS_FILE)
    inputs = {c.cell_id: cell_inputs(c) for c in cells}
    est = Estimator.for_policy(policy)
    checks = {
        "golden": golden_check(golden_dir, cells),
        "coverage": coverage(cells, inputs, est),
        "conformance": conformance(cells, inputs, est, claims_for(policy)),
        "controls": controls_check(golden_dir, policy),
        "refusals": refusals(cells, inputs, policy),
        "power": power(cells, inputs),
        "targets": targets_check(cells, inputs, est, targets_for(policy)),
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
            f"min headroom {_pct(cov['min_headroom'])}, median {_pct(cov['median_headroom'])}, "
            f"max {_pct(cov['max_headroom'])}"
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
    line = "; ".join(parts)
    if failed:
        line += f"; FAILED checks: {', '.join(failed)}"
    return line


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [fmt.format(*headers).rstrip(), fmt.format(*("-" * w for w in widths))]
    out += [fmt.format(*r).rstrip() for r in rows]
    return out


def render(report: Mapping[str, Any]) -> str:
    """The human report: checks table, tightest cells, power detail, failures, summary."""
    ch = report["checks"]
    gold, cov, conf, ctl, ref, pw = (
        ch["golden"],
        ch["coverage"],
        ch["conformance"],
        ch["controls"],
        ch["refusals"],
        ch["power"],
    )
    tg = ch["targets"]

    def status(c: Mapping[str, Any]) -> str:
        return "PASS" if c["passed"] else "FAIL"

    conf_detail = (
        f"policy {report['policy']} claims no recorded estimates"
        if conf["claims_none"]
        else "; ".join(f"{p['claim']} {p['matched']}/{p['checked']}" for p in conf["claims"])
    )
    if ctl.get("error"):
        ctl_scope, ctl_detail = "0 controls", ctl["error"]
    elif ctl["required"]:
        ctl_scope = f"{ctl['total']} controls"
        ctl_detail = (
            "byte-identical to golden/controls"
            if ctl["byte_identical"]
            else f"{len(ctl['differing'])} differ from golden/controls"
        )
    else:
        ctl_scope = f"{ctl['total']} controls"
        ctl_detail = (
            f"{ctl['matching']}/{ctl['total']} match the reference's recorded values "
            f"(informational: only the reference policy is required to reproduce them)"
        )
    negs, muts = pw["negative_controls"], pw["mutants"]
    rows = [
        [
            "golden",
            status(gold),
            f"{gold['cells']} cells",
            "schema, manifest and sources agree" if gold["passed"] else "golden layer damaged",
        ],
        [
            "coverage",
            status(cov),
            f"{cov['cells']} cells, {cov['rank_samples']} rank-samples",
            (
                f"headroom min {_pct(cov['min_headroom'])} / median "
                f"{_pct(cov['median_headroom'])} / max {_pct(cov['max_headroom'])}"
            )
            if cov["cells"]
            else "no measured cells",
        ],
        *(
            [
                [
                    "",
                    "",
                    f"{cov['forward_backward']['cells']} forward+backward peaks",
                    f"{cov['forward_backward']['covered']}/{cov['forward_backward']['cells']} "
                    f"covered; headroom min {_pct(cov['forward_backward']['min_headroom'])} / "
                    f"median {_pct(cov['forward_backward']['median_headroom'])} / max "
                    f"{_pct(cov['forward_backward']['max_headroom'])}",
                ]
            ]
            if "forward_backward" in cov
            else []
        ),
        ["conformance", status(conf), f"{conf['checked']} recorded estimates", conf_detail],
        [
            "controls",
            status(ctl) if ctl["required"] else "INFO",
            ctl_scope,
            ctl_detail,
        ],
        [
            "refusals",
            status(ref),
            f"{ref['cells']} cells",
            f"{ref['refused']} recorded refused, {ref['admitted']} ran; "
            f"{len(ref['failing'])} decided otherwise",
        ],
        [
            "power",
            status(pw),
            f"{len(negs)} negative controls, {len(muts)} mutants",
            f"negative controls flagged {sum(n['caught'] for n in negs)}/{len(negs)}; "
            f"mutants caught {sum(m['caught'] for m in muts)}/{len(muts)}",
        ],
        [
            "targets",
            status(tg),
            f"{tg['declared']} targets",
            f"{tg['met']}/{tg['declared']} met"
            if tg["declared"]
            else f"policy {report['policy']} declares none",
        ],
    ]
    lines = [f"cpmem gate: policy {report['policy']}, golden {report['golden_dir']}", ""]
    lines += _table(["check", "result", "scope", "detail"], rows)

    tight = sorted(cov["rows"], key=lambda r: r["headroom"])[:5]
    if tight:
        lines += ["", "tightest cells (coverage):"]
        lines += _table(
            ["cell", "estimate GiB", "peak GiB", "headroom"],
            [
                [
                    r["cell_id"],
                    f"{r['estimate_bytes'] / 2**30:.3f}",
                    f"{r['forward_peak_bytes'] / 2**30:.3f}",
                    _pct(r["headroom"]),
                ]
                for r in tight
            ],
        )
    lines += ["", "power: recorded negative-control estimates (must NOT cover the peak):"]
    lines += _table(
        ["cell", "recorded GiB", "peak GiB", "ratio", "flagged"],
        [
            [
                n["cell_id"],
                f"{(n['recorded_estimate_bytes'] or 0) / 2**30:.3f}",
                f"{(n['forward_peak_bytes'] or 0) / 2**30:.3f}",
                f"{n['ratio']:.3f}" if n["ratio"] is not None else "-",
                "caught" if n["caught"] else "NOT CAUGHT",
            ]
            for n in negs
        ],
    )
    lines += ["", "power: mutants of the reference formula (each must be caught):"]
    mrows = []
    for m in muts:
        cells = m["coverage_failing"] if m["caught_by"] == "coverage" else m["conformance_failing"]
        shown = ", ".join(cells[:3]) + (f" (+{len(cells) - 3} more)" if len(cells) > 3 else "")
        mrows.append(
            [
                m["mutant"],
                m["caught_by"] or "NOT CAUGHT",
                f"{len(m['coverage_failing'])}",
                f"{len(m['conformance_failing'])}",
                shown or "-",
            ]
        )
    lines += _table(["mutant", "caught by", "uncovered", "mismatched", "catching cells"], mrows)

    if tg["declared"]:
        lines += ["", f"targets declared by policy {report['policy']}:"]
        lines += _table(
            ["target", "figure", "bound", "cells", "measured", "worst cell", "met"],
            [
                [
                    t["target"],
                    t["figure"],
                    t["bound"],
                    f"{t['cells']}",
                    t["measured"],
                    t["worst_cell"] or "-",
                    "met" if t["met"] else "MISSED",
                ]
                for t in tg["targets"]
            ],
        )

    failures = []
    for name, c in ch.items():
        if name == "controls" and not c["required"]:
            continue
        for item in c.get("failing", []):
            failures.append(f"  {name}: {item}")
    if ch["controls"].get("error") and ch["controls"]["required"]:
        failures.append(f"  controls: {ch['controls']['error']}")
    if failures:
        lines += ["", "failures:", *failures]
    if not conf["passed"]:
        lines += ["", "conformance mismatches:"]
        lines += [
            f"  {m['claim']}: {m['cell_id']}: recorded {m['recorded_bytes']:,}, "
            f"estimate {m['estimate_bytes']:,} ({m['difference_bytes']:+,})"
            for m in conf["mismatches"]
        ]
    lines += ["", report["summary"]]
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="cpmem gate", description="Check a pricing policy against the golden measurements."
    )
    p.add_argument("--policy", default="reference", help="pricing policy (default: reference)")
    p.add_argument("--json", action="store_true", help="print the full report as JSON")
    p.add_argument(
        "--record-controls",
        action="store_true",
        help="re-record golden/controls with the reference policy (prints and writes a diff "
        "report to golden/controls/last_diff.md), then run the gate",
    )
    p.add_argument(
        "--golden",
        type=Path,
        default=None,
        help="golden directory (default: $CPMEM_GOLDEN_DIR or the repo's golden/)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``cpmem gate``: 0 when every check passes, 1 when one fails, 2 on a usage error."""
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    golden_dir: Path = args.golden if args.golden is not None else default_golden_dir()
    if args.policy not in policy_names():
        print(
            f"cpmem gate: error: unknown policy {args.policy!r}; choose one of {policy_names()}",
            file=sys.stderr,
        )
        return 2
    recorded: dict[str, Any] | None = None
    try:
        if args.record_controls:
            diff = record_controls(golden_dir, overwrite=True)
            text = (controls_dir(golden_dir) / "last_diff.md").read_text(encoding="utf-8")
            recorded = {**diff.to_dict(), "markdown": text}
            if not args.json:
                print(text)
                print(
                    f"wrote {controls_dir(golden_dir)} (controls, metadata, last_diff.md) "
                    "and regenerated the golden manifest"
                )
                print()
        report = run_gate(args.policy, golden_dir)
    except CpmemError as exc:
        print(f"cpmem gate: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        if recorded is not None:
            report["recorded_controls"] = recorded
        print(json.dumps(report, indent=2))
    else:
        print(render(report))
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
