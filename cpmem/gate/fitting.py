"""Fitting a policy's margin on measured samples, and the leave-out studies that show
what the fitted constants are worth on cells they were not fitted on."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cpmem.gate.samples import Sample
from cpmem.gate.targets import TargetCell, target_of
from cpmem.pricing.tight import MARGIN, Margin, price_tight, structural_terms
from cpmem.units import MIB

FACTOR_STEP = 0.005
ALLOWANCE_STEP = MIB


ALLOWANCE_GRID = tuple(range(0, 129 * MIB, 4 * MIB))


def _round_factor(value: float) -> float:
    return round(math.ceil(value / FACTOR_STEP - 1e-9) * FACTOR_STEP, 6)


def fit_margin(samples: Sequence[Sample]) -> Margin:
    """The margin fitted on ``samples``: for each forward allowance on a 4 MiB grid
    (0-128 MiB) the smallest factor (a multiple of 0.005) that covers every forward
    peak; keep the pair whose worst estimate / (target x peak) is smallest (ties: the
    smaller allowance). Backward uses the same factor plus the smallest whole-MiB
    allowance that covers every forward+backward peak."""
    bases = [(s, structural_terms(s.inputs)) for s in samples]
    best: tuple[float, int, float] | None = None
    for allowance in ALLOWANCE_GRID:
        factor = 1.0
        for s, (forward, _) in bases:
            factor = max(factor, (s.forward_peak - allowance) / sum(forward.values()))
        factor = _round_factor(factor)
        worst = 0.0
        for s, (forward, _) in bases:
            base = sum(forward.values())
            est = math.ceil(base * factor) + allowance
            worst = max(worst, est / (target_of(s.inputs) * s.forward_peak))
        if best is None or worst < best[0] - 1e-12:
            best = (worst, allowance, factor)
    assert best is not None
    _, fwd_allowance, factor = best
    fb_allowance = 0
    for s, (forward, backward) in bases:
        base = sum(forward.values()) + sum(backward.values())
        fb_allowance = max(fb_allowance, s.forward_backward_peak - math.ceil(base * factor))
    fb_allowance = -(-fb_allowance // ALLOWANCE_STEP) * ALLOWANCE_STEP
    return Margin(factor, fwd_allowance, factor, fb_allowance)


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


def evaluate(samples: Sequence[Sample], margin: Margin = MARGIN) -> list[Row]:
    rows = []
    for s in samples:
        est = price_tight(s.inputs, margin)
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


def target_cells(samples: Sequence[Sample], margin: Margin = MARGIN) -> list[TargetCell]:
    return [
        TargetCell(
            s.cell_id,
            s.inputs,
            price_tight(s.inputs, margin),
            s.forward_peak,
            s.forward_backward_peak,
        )
        for s in samples
    ]


# --- leave-out evidence --------------------------------------------------------------


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


def leave_out(label: str, samples: Sequence[Sample], held: Callable[[Sample], bool]) -> LeaveOut:
    fit = fit_margin([s for s in samples if not held(s)])
    chosen = tuple(s for s in samples if held(s))
    return LeaveOut(label, fit, chosen, tuple(evaluate(chosen, fit)))


def leave_one_model_out(samples: Sequence[Sample]) -> list[LeaveOut]:
    """For each model: every tunable constant chosen without that model's cells."""
    out = []
    for model in sorted({s.model for s in samples}):

        def held(s: Sample, m: str = model) -> bool:
            return s.model == m

        out.append(leave_out(model, samples, held))
    return out


def leave_longest_shape_out(samples: Sequence[Sample]) -> list[LeaveOut]:
    """For each model: every tunable constant chosen without the cells of that model's
    longest shape (its largest logical token count), in every phase and layout."""
    out = []
    for model in sorted({s.model for s in samples}):
        longest = max(s.logical_tokens for s in samples if s.model == model)

        def held(s: Sample, m: str = model, n: int = longest) -> bool:
            return s.model == m and s.logical_tokens == n

        out.append(leave_out(f"{model} {longest:,} tokens", samples, held))
    return out
