"""Policies with fitted constants, and the three checks that keep a fit honest.

A constant fitted on the cells the gate then checks cannot fail coverage there, so
for a fitted policy the gate also requires:

- constants: refitting on every measured cell reproduces the constants in the code;
- cross-validation: refitted without each fold (one model, each model's longest
  shape, one recompute mode), the held-out cells are covered. Held-out misses the
  policy is known to have are declared, with the reason, in ``KNOWN_HELDOUT_MISSES``:
  a new miss fails the gate, and so does a declared one that does not happen (the
  list only shrinks);
- mutants: each structural mutant of the policy (one modelled term removed or
  broken), refitted, misses a declared target or adds held-out misses.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cpmem.calibration.crossval import LeaveOut, cross_validate
from cpmem.calibration.fitting import fit_margin, target_cells
from cpmem.calibration.misses import KNOWN_HELDOUT_MISSES
from cpmem.calibration.variant import TIGHT, TIGHT_MUTANTS, TightVariant
from cpmem.pricing.tight.calibrated import MARGIN, Margin
from cpmem.samples.cells import Sample
from cpmem.samples.targets import TargetCell, measure_target, targets_for


@dataclass(frozen=True)
class FittedPolicy:
    """How to refit a policy and price with refitted constants and a mutant structure."""

    name: str
    constants: Margin
    fit: Callable[[Sequence[Sample], TightVariant], Margin]
    cells: Callable[[Sequence[Sample], Margin, TightVariant], list[TargetCell]]
    folds: Callable[[Sequence[Sample], TightVariant], dict[str, list[LeaveOut]]]
    policy: TightVariant
    mutants: Mapping[str, TightVariant]


FITTED: dict[str, FittedPolicy] = {
    "tight": FittedPolicy(
        "tight", MARGIN, fit_margin, target_cells, cross_validate, TIGHT, TIGHT_MUTANTS
    ),
}


def fitted_policy(policy: str) -> FittedPolicy | None:
    return FITTED.get(policy)


def _misses(folds: Mapping[str, Sequence[LeaveOut]]) -> list[tuple[str, str, str, str]]:
    out = []
    for fold, results in folds.items():
        for lo in results:
            for r in lo.rows:
                if r.estimate < r.forward_peak:
                    out.append((fold, lo.label, r.cell_id, "forward"))
                if r.fb_estimate < r.fb_peak:
                    out.append((fold, lo.label, r.cell_id, "forward_backward"))
    return out


def _miss_text(miss: tuple[str, str, str, str]) -> str:
    fold, label, cell, figure = miss
    return f"{fold} ({label}): {cell} {figure}"


def constants_check(samples: Sequence[Sample], fitted: FittedPolicy) -> dict[str, Any]:
    refit = fitted.fit(samples, fitted.policy)
    same = refit == fitted.constants
    return {
        "passed": same,
        "constants": repr(fitted.constants),
        "refit": repr(refit),
        "failing": [] if same else [f"code has {fitted.constants!r}, the fit gives {refit!r}"],
    }


def cross_validation_check(samples: Sequence[Sample], fitted: FittedPolicy) -> dict[str, Any]:
    folds = fitted.folds(samples, fitted.policy)
    misses = _misses(folds)
    known = KNOWN_HELDOUT_MISSES.get(fitted.name, {})
    new = [m for m in misses if m not in known]
    gone = [m for m in known if m not in misses]
    rows = [
        {
            "fold": fold,
            "held_out": lo.label,
            "cells": len(lo.rows),
            "forward_covered": lo.forward_covered,
            "forward_backward_covered": lo.fb_covered,
            "refit": repr(lo.margin),
        }
        for fold, results in folds.items()
        for lo in results
    ]
    return {
        "passed": not new and not gone,
        "folds": rows,
        "held_out_cells": sum(r["cells"] for r in rows),
        "misses": [_miss_text(m) for m in misses],
        "known_misses": [f"{_miss_text(m)}: {why}" for m, why in known.items()],
        "failing": [f"new held-out miss: {_miss_text(m)}" for m in new]
        + [f"declared miss did not happen (remove it): {_miss_text(m)}" for m in gone],
    }


def mutants_check(samples: Sequence[Sample], fitted: FittedPolicy) -> list[dict[str, Any]]:
    """Each mutant refitted; caught when it misses a declared target or has held-out
    misses the policy does not have."""
    baseline = set(_misses(fitted.folds(samples, fitted.policy)))
    out = []
    for name, mutant in fitted.mutants.items():
        margin = fitted.fit(samples, mutant)
        cells = fitted.cells(samples, margin, mutant)
        missed = [
            f"{r.target.name} ({r.target.figure}): {r.measured}"
            for r in (measure_target(t, cells) for t in targets_for(fitted.name))
            if not r.met
        ]
        extra = [m for m in _misses(fitted.folds(samples, mutant)) if m not in baseline]
        out.append(
            {
                "mutant": name,
                "terms": repr(mutant),
                "refit": repr(margin),
                "caught": bool(missed or extra),
                "caught_by": "targets" if missed else "cross-validation" if extra else None,
                "targets_missed": missed,
                "new_held_out_misses": [_miss_text(m) for m in extra],
            }
        )
    return out
