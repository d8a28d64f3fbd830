"""Cross-validation of a fitted margin: the margin refitted without a fold of the
measured samples (one model, each model's longest shape, one recompute mode) and
evaluated on the held-out ones, which shows what the fitted constants are worth on cells
they were not fitted on."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cpmem.calibration.fitting import Row, evaluate, fit_margin
from cpmem.calibration.variant import TIGHT, TightVariant
from cpmem.pricing.tight.calibrated import Margin
from cpmem.samples.cells import Sample
from cpmem.samples.targets import target_of


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
            if r.estimate > target_of(s.step) * r.forward_peak
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
    variant: TightVariant = TIGHT,
) -> LeaveOut:
    fit = fit_margin([s for s in samples if not held(s)], variant)
    chosen = tuple(s for s in samples if held(s))
    return LeaveOut(label, fit, chosen, tuple(evaluate(chosen, fit, variant)))


def _by_key(
    samples: Sequence[Sample],
    key: Callable[[Sample], str],
    variant: TightVariant,
    label: Callable[[str], str] = str,
) -> list[LeaveOut]:
    out = []
    for value in sorted({key(s) for s in samples}):

        def held(s: Sample, v: str = value) -> bool:
            return key(s) == v

        out.append(leave_out(label(value), samples, held, variant))
    return out


def leave_one_model_out(samples: Sequence[Sample], variant: TightVariant = TIGHT) -> list[LeaveOut]:
    """For each model: every tunable constant chosen without that model's cells."""
    return _by_key(samples, lambda s: s.model, variant)


def leave_one_mode_out(samples: Sequence[Sample], variant: TightVariant = TIGHT) -> list[LeaveOut]:
    """For each recompute mode (mode and modules): the constants chosen without it."""
    return _by_key(samples, lambda s: s.step.recompute.label, variant)


def leave_longest_shape_out(
    samples: Sequence[Sample], variant: TightVariant = TIGHT
) -> list[LeaveOut]:
    """For each model: every tunable constant chosen without the cells of that model's
    longest shape (its largest logical token count), in every phase and layout."""
    out = []
    for model in sorted({s.model for s in samples}):
        longest = max(s.logical_tokens for s in samples if s.model == model)

        def held(s: Sample, m: str = model, n: int = longest) -> bool:
            return s.model == m and s.logical_tokens == n

        out.append(leave_out(f"{model} {longest:,} tokens", samples, held, variant))
    return out


FOLDS: dict[str, Callable[[Sequence[Sample], TightVariant], list[LeaveOut]]] = {
    "leave one model out": leave_one_model_out,
    "leave each model's longest shape out": leave_longest_shape_out,
    "leave one recompute mode out": leave_one_mode_out,
}
"""The cross-validation folds the gate requires every held-out cell covered in."""


def cross_validate(
    samples: Sequence[Sample], variant: TightVariant = TIGHT
) -> dict[str, list[LeaveOut]]:
    return {name: fold(samples, variant) for name, fold in FOLDS.items()}
