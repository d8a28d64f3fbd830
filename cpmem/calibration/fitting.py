"""Fitting a policy's margin on measured samples, and the leave-out studies that show
what the fitted constants are worth on cells they were not fitted on."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from cpmem.calibration.variant import TIGHT, TightVariant
from cpmem.pricing.tight.calibrated import MARGIN, Margin
from cpmem.samples.cells import Sample
from cpmem.samples.targets import TargetCell, target_of
from cpmem.units import MIB

FACTOR_STEP = 0.005
ALLOWANCE_STEP = MIB
ALLOWANCE_GRID = tuple(range(0, 129 * MIB, 2 * MIB))


def _round_factor(value: float) -> float:
    return round(math.ceil(value / FACTOR_STEP - 1e-9) * FACTOR_STEP, 6)


def _round_allowance(value: float) -> int:
    return max(0, math.ceil(value / ALLOWANCE_STEP)) * ALLOWANCE_STEP


def fit_margin(samples: Sequence[Sample], variant: TightVariant = TIGHT) -> Margin:
    """The margin fitted on ``samples`` (for ``variant``, the policy itself by default).

    Forward: for each allowance on a 2 MiB grid (0-128 MiB) the smallest factor (a
    multiple of 0.005) that covers every forward peak; keep the pair whose worst
    estimate / (target x peak) is smallest (ties: the smaller allowance). Backward: the
    same factor; the smallest whole-MiB allowance that covers every warm cell's
    forward+backward peak, then the smallest cold-backward allowance that, added for
    the cold cells, covers theirs."""
    bases = [(s, *variant.terms(s.step)) for s in samples]
    best: tuple[float, int, float] | None = None
    for allowance in ALLOWANCE_GRID:
        factor = 1.0
        for s, forward, _ in bases:
            factor = max(factor, (s.forward_peak - allowance) / sum(forward.values()))
        factor = _round_factor(factor)
        worst = 0.0
        for s, forward, _ in bases:
            est = math.ceil(sum(forward.values()) * factor) + allowance
            worst = max(worst, est / (target_of(s.step) * s.forward_peak))
        if best is None or worst < best[0] - 1e-12:
            best = (worst, allowance, factor)
    assert best is not None
    _, fwd_allowance, factor = best

    def shortfall(s: Sample, fb: dict[str, int]) -> int:
        return s.forward_backward_peak - math.ceil(sum(fb.values()) * factor)

    warm = _round_allowance(
        max([shortfall(s, fb) for s, _, fb in bases if not s.step.cold], default=0)
    )
    probe = Margin(factor, fwd_allowance, warm, 0)
    cold = _round_allowance(
        max(
            [
                shortfall(s, fb) - warm - sum(variant.cold_backward(s.step, probe).values())
                for s, _, fb in bases
                if s.step.cold
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
    samples: Sequence[Sample], margin: Margin = MARGIN, variant: TightVariant = TIGHT
) -> list[Row]:
    rows = []
    for s in samples:
        est = variant.price(s.step, margin)
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
    samples: Sequence[Sample], margin: Margin = MARGIN, variant: TightVariant = TIGHT
) -> list[TargetCell]:
    return [
        TargetCell(
            s.cell_id,
            s.step,
            variant.price(s.step, margin),
            s.forward_peak,
            s.forward_backward_peak,
        )
        for s in samples
    ]
