"""Policies with fitted constants, and the three checks that keep a fit honest.

A constant fitted on the cells the gate then checks cannot fail coverage there, so
for a fitted policy the gate also requires:

- constants: refitting on every measured cell reproduces the constants in the code;
- cross-validation: refitted without each fold (one model, each model's longest
  shape, one recompute mode), the held-out cells are covered. Held-out misses the
  policy is known to have are declared, with the reason, in ``KNOWN_HELDOUT_MISSES``:
  a new miss fails the gate, and so does a declared one that no longer happens (the
  list only shrinks);
- mutants: each structural mutant of the policy (one modelled term removed or
  broken), refitted, misses a declared target or adds held-out misses.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cpmem.gate.fitting import LeaveOut, cross_validate, fit_margin, target_cells
from cpmem.gate.samples import Sample
from cpmem.gate.targets import TargetCell, measure_target, targets_for
from cpmem.pricing.tight import MARGIN, Margin, TightTerms


@dataclass(frozen=True)
class FittedPolicy:
    """How to refit a policy and price with refitted constants and a mutant structure."""

    name: str
    constants: Margin
    fit: Callable[[Sequence[Sample], TightTerms | None], Margin]
    cells: Callable[[Sequence[Sample], Margin, TightTerms | None], list[TargetCell]]
    folds: Callable[[Sequence[Sample], TightTerms | None], dict[str, list[LeaveOut]]]
    mutants: Mapping[str, TightTerms]


TIGHT_MUTANTS: dict[str, TightTerms] = {
    "no-backward-term": TightTerms(backward=False),
    "no-cold-setup": TightTerms(cold_setup=False),
    "no-segment-states": TightTerms(segment_states=False),
    "fused-swiglu-on-unfused": TightTerms(fused_swiglu_on_unfused=True),
    "tp1-widths-at-tp": TightTerms(tp1_widths=True),
}

FITTED: dict[str, FittedPolicy] = {
    "tight": FittedPolicy("tight", MARGIN, fit_margin, target_cells, cross_validate, TIGHT_MUTANTS),
}

# (fold, held-out label, cell id, figure) -> why. Each is a cell whose fixed cost is
# still unexplained: its constant is pinned by that cell alone (docs/tight.md,
# "Held-out misses").
_SHORT_27B = (
    "the 27B's short cells keep a fixed cost no other model's cells show (forward about "
    "33 MiB at TP8 64+64 compiled; a first backward about 90 MiB under torch.compile, "
    "about 45 MiB eager; the TP4 256+256 cells about 130 MiB above their structure): the "
    "allowances are pinned by them alone"
)
KNOWN_HELDOUT_MISSES: dict[str, dict[tuple[str, str, str, str], str]] = {
    "tight": {
        (
            "leave one model out",
            "qwen3.5-27b",
            "tp:final:Qwen3.8-27B:tp4:selective:core_attn:compiled:256+256",
            "forward_backward",
        ): _SHORT_27B,
        (
            "leave one recompute mode out",
            "selective(core_attn)",
            "tp:final:Qwen3.8-27B:tp4:selective:core_attn:compiled:256+256",
            "forward_backward",
        ): _SHORT_27B,
        (
            "leave one model out",
            "qwen3.5-27b",
            "tp:final:Qwen3.8-27B:tp4:selective:core_attn:compiled:64+64",
            "forward_backward",
        ): _SHORT_27B,
        (
            "leave one model out",
            "qwen3.5-27b",
            "tp:final:Qwen3.8-27B:tp8:selective:core_attn:compiled:64+64",
            "forward_backward",
        ): _SHORT_27B,
        (
            "leave one model out",
            "qwen3.5-27b",
            "tp:segment_state_negative_control:Qwen3.8-27B:tp4:selective:core_attn:eager:64+64",
            "forward_backward",
        ): _SHORT_27B,
        (
            "leave one recompute mode out",
            "selective(core_attn)",
            "tp:final:Qwen3.8-27B:tp4:selective:core_attn:compiled:64+64",
            "forward_backward",
        ): _SHORT_27B,
        (
            "leave one recompute mode out",
            "selective(core_attn)",
            "tp:final:Qwen3.8-27B:tp8:selective:core_attn:compiled:64+64",
            "forward_backward",
        ): _SHORT_27B,
        (
            "leave one recompute mode out",
            "selective(core_attn)",
            "tp:segment_state_negative_control:Qwen3.8-27B:tp4:selective:core_attn:eager:64+64",
            "forward_backward",
        ): _SHORT_27B,
    }
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
    refit = fitted.fit(samples, None)
    same = refit == fitted.constants
    return {
        "passed": same,
        "constants": repr(fitted.constants),
        "refit": repr(refit),
        "failing": [] if same else [f"code has {fitted.constants!r}, the fit gives {refit!r}"],
    }


def cross_validation_check(samples: Sequence[Sample], fitted: FittedPolicy) -> dict[str, Any]:
    folds = fitted.folds(samples, None)
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
        + [f"declared miss no longer happens (remove it): {_miss_text(m)}" for m in gone],
    }


def mutants_check(samples: Sequence[Sample], fitted: FittedPolicy) -> list[dict[str, Any]]:
    """Each mutant refitted; caught when it misses a declared target or has held-out
    misses the policy does not have."""
    baseline = set(_misses(fitted.folds(samples, None)))
    out = []
    for name, terms in fitted.mutants.items():
        margin = fitted.fit(samples, terms)
        cells = fitted.cells(samples, margin, terms)
        missed = [
            f"{r.target.name} ({r.target.figure}): {r.measured}"
            for r in (measure_target(t, cells) for t in targets_for(fitted.name))
            if not r.met
        ]
        extra = [m for m in _misses(fitted.folds(samples, terms)) if m not in baseline]
        out.append(
            {
                "mutant": name,
                "terms": repr(terms),
                "refit": repr(margin),
                "caught": bool(missed or extra),
                "caught_by": "targets" if missed else "cross-validation" if extra else None,
                "targets_missed": missed,
                "new_held_out_misses": [_miss_text(m) for m in extra],
            }
        )
    return out
