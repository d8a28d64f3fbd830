"""Power: a gate that passes broken estimators proves nothing. The recorded negative
controls must fail coverage, and every mutant of the policy under test must be caught:
for the reference formula (``reference``, ``global``) a term removed, caught by coverage
or conformance; for a fitted policy its own structural mutants, each refitted
(``cpmem.calibration.fitted``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cpmem.calibration.fitted import fitted_policy, mutants_check
from cpmem.calibration.variant import reference_mutants as mutants_of
from cpmem.gate.checks import conformance, coverage
from cpmem.gate.claims import claims_for
from cpmem.gate.estimator import REFERENCE_FORMULA, Estimator
from cpmem.golden.cells import MeasuredCell
from cpmem.pricing.reference import REFERENCE
from cpmem.samples.cells import measured_samples
from cpmem.step.step import Step

# The reference formula with one term removed or broken; each must be caught.
MUTANTS = mutants_of(REFERENCE)


def power(
    cells: Sequence[MeasuredCell], steps: Mapping[str, Step], policy: str = "reference"
) -> dict[str, Any]:
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
    fitted = fitted_policy(policy)
    if fitted is not None:
        mutants = mutants_check(measured_samples(cells), fitted)
        of = f"{policy} (each refitted)"
    elif policy in REFERENCE_FORMULA:
        mutants = reference_mutants(cells, steps)
        of = "the reference formula"
    else:
        mutants, of = [], f"{policy}: none declared"
    failing = [n["cell_id"] for n in negatives if not n["caught"]]
    failing += [f"mutant:{m['mutant']}" for m in mutants if not m["caught"]]
    return {
        "passed": not failing,
        "negative_controls": negatives,
        "mutants_of": of,
        "mutants": mutants,
        "failing": failing,
    }


def reference_mutants(
    cells: Sequence[MeasuredCell], steps: Mapping[str, Step]
) -> list[dict[str, Any]]:
    """Each reference-formula mutant, caught by coverage or, failing that, conformance."""
    mutants = []
    ref_claims = claims_for("reference")
    for name, variant in MUTANTS.items():
        mutant = Estimator(f"mutant:{name}", variant=variant)
        cov = coverage(cells, steps, mutant)
        conf = conformance(cells, steps, mutant, ref_claims)
        caught_by = "coverage" if cov["failing"] else "conformance" if conf["failing"] else None
        reproduces = [
            c.cell_id
            for c in cells
            if c.is_negative_control
            and c.recorded_estimate_bytes == mutant.price(steps[c.cell_id]).estimate_bytes
        ]
        mutants.append(
            {
                "mutant": name,
                "terms": repr(variant),
                "caught": caught_by is not None,
                "caught_by": caught_by,
                "coverage_failing": cov["failing"],
                "conformance_failing": conf["failing"],
                "reproduces_negative_controls": reproduces,
            }
        )
    return mutants
