"""Policies with a piece replaced: what the gate's power study and the conformance claims
price with, built from the policies' own pieces (``ReferenceStructure``, tight's
``Structure``) and from changes to the step they are handed, never from a switch inside a
policy.

A step change states a fact about the input the policy then prices wrongly (an unfused
SwiGLU priced as fused, segments without their states); a structure replacement removes
or breaks one modelled term.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from cpmem.model.geometry import ModelGeometry
from cpmem.pricing.estimate import Estimate
from cpmem.pricing.reference import ReferenceStructure, cp_discounted, price_reference
from cpmem.pricing.tight.calibrated import MARGIN, Margin
from cpmem.pricing.tight.compose import (
    POLICY,
    Structure,
    backward_moment,
    layers_backward_moment,
    structural_terms,
    tight_widths,
)
from cpmem.pricing.tight.policy import price_tight
from cpmem.pricing.tight.widths import TightWidths
from cpmem.step.step import Step

StepChange = Callable[[Step], Step]


def unchanged(step: Step) -> Step:
    return step


def swiglu_fused(step: Step) -> Step:
    """The step with its model's SwiGLU taken as fused."""
    settings = replace(step.settings, geometry=step.geometry.with_fused_swiglu(True))
    return replace(step, settings=settings)


def warm(step: Step) -> Step:
    """The step taken as warm (its kernel set-up paid)."""
    return replace(step, settings=replace(step.settings, cold=False))


def no_segment_states_held(step: Step) -> Step:
    """The step with no rank holding any segment's recurrent state."""
    groups = tuple(
        replace(g, rank_segments=(0,) * len(g.attention_tokens)) for g in step.plan.groups
    )
    return replace(step, plan=replace(step.plan, groups=groups))


@dataclass(frozen=True)
class TightVariant:
    """``tight`` with ``structure`` and the step changed by ``change`` (the policy itself
    when both are the defaults); ``label`` says what was changed."""

    label: str = "tight"
    structure: Structure = POLICY
    change: StepChange = unchanged

    def terms(self, step: Step) -> tuple[dict[str, int], dict[str, int]]:
        return structural_terms(self.change(step), self.structure)

    def price(self, step: Step, margin: Margin = MARGIN) -> Estimate:
        return price_tight(self.change(step), margin, self.structure)

    def cold_backward(self, step: Step, margin: Margin) -> dict[str, int]:
        return self.structure.cold_backward(self.change(step), margin)

    def __repr__(self) -> str:
        return self.label


TIGHT = TightVariant()


def _no_backward(step: Step, w: TightWidths, tokens: int) -> int:
    return 0


def _no_cold_backward(step: Step, margin: Margin) -> dict[str, int]:
    return {}


def _warm_backward(step: Step, w: TightWidths, tokens: int) -> int:
    return backward_moment(warm(step), w, tokens)


def _warm_layers_backward(step: Step, w: TightWidths, tokens: int) -> int:
    return layers_backward_moment(warm(step), w, tokens)


def _no_cold(step: Step) -> int:
    return 0


def _tp1_widths(geometry: ModelGeometry, step: Step) -> TightWidths:
    return tight_widths(geometry, step, tp=1, sp=False)


TIGHT_MUTANTS: dict[str, TightVariant] = {
    "no-backward-term": TightVariant(
        "the backward's first moment and the cold backward set-up removed",
        replace(
            POLICY,
            backward=_no_backward,
            layers_backward=_no_backward,
            cold_backward=_no_cold_backward,
        ),
    ),
    "no-cold-setup": TightVariant(
        "no cold set-up: neither the first forward's, the GDN autotuning nor the first backward's",
        replace(
            POLICY,
            cold=_no_cold,
            backward=_warm_backward,
            layers_backward=_warm_layers_backward,
            cold_backward=_no_cold_backward,
        ),
    ),
    "no-segment-states": TightVariant("no segment states held", change=no_segment_states_held),
    "fused-swiglu-on-unfused": TightVariant("every SwiGLU priced as fused", change=swiglu_fused),
    "tp1-widths-at-tp": TightVariant(
        "the layer widths at TP 1 whatever the layout", replace(POLICY, widths=_tp1_widths)
    ),
}
"""tight's structural mutants: each, refitted, must miss a declared target or add
held-out misses (``cpmem.calibration.fitted.mutants_check``)."""


# --- the reference formula ------------------------------------------------------------


@dataclass(frozen=True)
class ReferenceVariant:
    """The reference formula with ``structure`` and the step changed by ``change``."""

    label: str
    structure: ReferenceStructure
    change: StepChange = unchanged

    def price(self, step: Step, name: str) -> Estimate:
        return price_reference(self.change(step), self.structure, name)

    def __repr__(self) -> str:
        return self.label


def _no_segment_states(step: Step) -> int:
    return 0


def average_tokens(step: Step) -> tuple[int, list[int]]:
    """Every rank charged ceil(packed / CP) where the reference discounts CP."""
    plan = step.plan
    if not cp_discounted(step):
        return plan.packed_tokens, [plan.packed_tokens] * plan.layout.cp
    avg = -(-plan.packed_tokens // plan.layout.cp)
    return avg, [avg] * plan.layout.cp


def unpadded_tokens(step: Step) -> tuple[int, list[int]]:
    """The busiest rank's tokens without TP padding (the real tokens where not
    discounted)."""
    plan = step.plan
    packed = sum(g.real_tokens for g in plan.groups)
    if not cp_discounted(step):
        return packed, [packed] * plan.layout.cp
    per_group = [g.model_tokens(1) for g in plan.groups]
    ranks = [sum(col) for col in zip(*per_group, strict=True)]
    return sum(max(row) for row in per_group), ranks


def without_segment_states(structure: ReferenceStructure) -> ReferenceStructure:
    """``structure`` priced without segment states (the estimator the golden layer's
    ``before_segment_states`` rows recorded)."""
    return replace(structure, segment_states=_no_segment_states)


def as_recorded(structure: ReferenceStructure) -> ReferenceStructure:
    """``structure`` charging its cold allowance on every step, the first of a process or
    not: the estimator that recorded the golden layer's estimates did (its warm cells'
    recorded estimates hold the 64 MiB allowance, e.g. every ``eager_control`` row whose
    first and repeat peaks agree)."""
    return replace(structure, every_step_cold=True)


def reference_mutants(base: ReferenceStructure) -> dict[str, ReferenceVariant]:
    """The reference formula with one term removed or broken; each must be caught."""
    return {
        "no-segment-states": ReferenceVariant("no segment states", without_segment_states(base)),
        "no-cold-allowance": ReferenceVariant("no cold allowance", replace(base, cold_allowance=0)),
        "cp-average-tokens": ReferenceVariant(
            "every CP rank charged the average", replace(base, tokens=average_tokens)
        ),
        "no-tp-padding": ReferenceVariant(
            "tokens without TP padding", replace(base, tokens=unpadded_tokens)
        ),
        "fused-mlp-on-unfused": ReferenceVariant(
            "every SwiGLU priced as fused", base, swiglu_fused
        ),
    }


__all__ = [
    "TIGHT",
    "TIGHT_MUTANTS",
    "ReferenceVariant",
    "TightVariant",
    "as_recorded",
    "reference_mutants",
    "without_segment_states",
]
