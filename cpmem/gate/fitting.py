"""Fitting a policy's margin on measured samples, and the leave-out studies that show
what the fitted constants are worth on cells they were not fitted on."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cpmem.gate.samples import Sample
from cpmem.gate.targets import TargetCell, target_of
from cpmem.pricing.tight import (
    MARGIN,
    Margin,
    TightTerms,
    cold_backward_terms,
    price_tight,
    structural_terms,
)
from cpmem.units import MIB

FACTOR_STEP = 0.005
ALLOWANCE_STEP = MIB
ALLOWANCE_GRID = tuple(range(0, 129 * MIB, 2 * MIB))


def _round_factor(value: float) -> float:
    return round(math.ceil(value / FACTOR_STEP - 1e-9) * FACTOR_STEP, 6)


def _round_allowance(value: float) -> int:
    return max(0, math.ceil(value / ALLOWANCE_STEP)) * ALLOWANCE_STEP


def fit_margin(samples: Sequence[Sample], terms: TightTerms | None = None) -> Margin:
    """The margin fitted on ``samples`` (for ``terms``, the policy's own by default).

    Forward: for each allowance on a 2 MiB grid (0-128 MiB) the smallest factor (a
    multiple of 0.005) that covers every forward peak; keep the pair whose worst
    estimate / (target x peak) is smallest (ties: the smaller allowance). Backward: the
    same factor; the smallest whole-MiB allowance that covers every warm cell's
    forward+backward peak, then the smallest cold-backward allowance that, added for
    the cold cells, covers theirs."""
    terms = terms or TightTerms()
    bases = [(s, *structural_terms(s.inputs, terms)) for s in samples]
    best: tuple[float, int, float] | None = None
    for allowance in ALLOWANCE_GRID:
        factor = 1.0
        for s, forward, _ in bases:
            factor = max(factor, (s.forward_peak - allowance) / sum(forward.values()))
        factor = _round_factor(factor)
        worst = 0.0
        for s, forward, _ in bases:
            est = math.ceil(sum(forward.values()) * factor) + allowance
            worst = max(worst, est / (target_of(s.inputs) * s.forward_peak))
        if best is None or worst < best[0] - 1e-12:
            best = (worst, allowance, factor)
    assert best is not None
    _, fwd_allowance, factor = best

    def shortfall(s: Sample, fb: dict[str, int]) -> int:
        return s.forward_backward_peak - math.ceil(sum(fb.values()) * factor)

    warm = _round_allowance(
        max([shortfall(s, fb) for s, _, fb in bases if not s.inputs.cold], default=0)
    )
    probe = Margin(factor, fwd_allowance, warm, 0)
    cold = _round_allowance(
        max(
            [
                shortfall(s, fb) - warm - sum(cold_backward_terms(s.inputs, probe, terms).values())
                for s, _, fb in bases
                if s.inputs.cold
            ],
            default=0,
        )
    )
    return Margin(factor, fwd_allowance, warm, cold)


@dataclass(frozen=True)
class Row:
    cell_id: str
    model: str
    estimate: int
    forward_peak: int
    fb_estimate: int
    fb_peak: int

    @property
    def headroom(self) -> float:
        return self.estimate / self.forward_peak - 1

    @property
    def fb_headroom(self) -> float:
        return self.fb_estimate / self.fb_peak - 1


def evaluate(
    samples: Sequence[Sample], margin: Margin = MARGIN, terms: TightTerms | None = None
) -> list[Row]:
    rows = []
    for s in samples:
        est = price_tight(s.inputs, margin, terms)
        assert est.forward_backward_bytes is not None
        rows.append(
            Row(
                s.cell_id,
                s.model,
                est.estimate_bytes,
                s.forward_peak,
                est.forward_backward_bytes,
                s.forward_backward_peak,
            )
        )
    return rows


def target_cells(
    samples: Sequence[Sample], margin: Margin = MARGIN, terms: TightTerms | None = None
) -> list[TargetCell]:
    return [
        TargetCell(
            s.cell_id,
            s.inputs,
            price_tight(s.inputs, margin, terms),
            s.forward_peak,
            s.forward_backward_peak,
        )
        for s in samples
    ]


# --- leave-out evidence (cross-validation) ---------------------------------------------


@dataclass(frozen=True)
class LeaveOut:
    """The margin refitted without ``held`` samples, evaluated on them."""

    label: str
    margin: Margin
    held: tuple[Sample, ...]
    rows: tuple[Row, ...]

    @property
    def forward_covered(self) -> int:
        return sum(1 for r in self.rows if r.estimate >= r.forward_peak)

    @property
    def fb_covered(self) -> int:
        return sum(1 for r in self.rows if r.fb_estimate >= r.fb_peak)

    @property
    def over_target(self) -> int:
        return sum(
            1
            for s, r in zip(self.held, self.rows, strict=True)
            if r.estimate > target_of(s.inputs) * r.forward_peak
        )

    def misses(self) -> list[str]:
        """Held-out cells the refitted margin fails to cover, with the figure."""
        out = []
        for r in self.rows:
            if r.estimate < r.forward_peak:
                out.append(f"{r.cell_id} forward {r.headroom:+.1%}")
            if r.fb_estimate < r.fb_peak:
                out.append(f"{r.cell_id} forward+backward {r.fb_headroom:+.1%}")
        return out


def leave_out(
    label: str,
    samples: Sequence[Sample],
    held: Callable[[Sample], bool],
    terms: TightTerms | None = None,
) -> LeaveOut:
    fit = fit_margin([s for s in samples if not held(s)], terms)
    chosen = tuple(s for s in samples if held(s))
    return LeaveOut(label, fit, chosen, tuple(evaluate(chosen, fit, terms)))


def _by_key(
    samples: Sequence[Sample],
    key: Callable[[Sample], str],
    terms: TightTerms | None,
    label: Callable[[str], str] = str,
) -> list[LeaveOut]:
    out = []
    for value in sorted({key(s) for s in samples}):

        def held(s: Sample, v: str = value) -> bool:
            return key(s) == v

        out.append(leave_out(label(value), samples, held, terms))
    return out


def leave_one_model_out(
    samples: Sequence[Sample], terms: TightTerms | None = None
) -> list[LeaveOut]:
    """For each model: every tunable constant chosen without that model's cells."""
    return _by_key(samples, lambda s: s.model, terms)


def leave_one_mode_out(
    samples: Sequence[Sample], terms: TightTerms | None = None
) -> list[LeaveOut]:
    """For each recompute mode (mode and modules): the constants chosen without it."""
    return _by_key(samples, lambda s: s.inputs.recompute.label, terms)


def leave_longest_shape_out(
    samples: Sequence[Sample], terms: TightTerms | None = None
) -> list[LeaveOut]:
    """For each model: every tunable constant chosen without the cells of that model's
    longest shape (its largest logical token count), in every phase and layout."""
    out = []
    for model in sorted({s.model for s in samples}):
        longest = max(s.logical_tokens for s in samples if s.model == model)

        def held(s: Sample, m: str = model, n: int = longest) -> bool:
            return s.model == m and s.logical_tokens == n

        out.append(leave_out(f"{model} {longest:,} tokens", samples, held, terms))
    return out


FOLDS: dict[str, Callable[[Sequence[Sample], TightTerms | None], list[LeaveOut]]] = {
    "leave one model out": leave_one_model_out,
    "leave each model's longest shape out": leave_longest_shape_out,
    "leave one recompute mode out": leave_one_mode_out,
}
"""The cross-validation folds the gate requires every held-out cell covered in."""


def cross_validate(
    samples: Sequence[Sample], terms: TightTerms | None = None
) -> dict[str, list[LeaveOut]]:
    return {name: fold(samples, terms) for name, fold in FOLDS.items()}
