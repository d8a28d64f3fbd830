"""What the gate prices with: a registered policy, or a variant of the reference formula
(``cpmem.calibration.variant``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from cpmem.calibration.variant import ReferenceVariant
from cpmem.errors import CpmemError
from cpmem.pricing.estimate import Estimate
from cpmem.pricing.reference import GLOBAL, REFERENCE, ReferenceStructure
from cpmem.pricing.registry import price
from cpmem.step.step import Step

# Registered policies that are the reference formula with some pieces set; only these
# (and their mutants) can price a claim's earlier-estimator variant (e.g. without
# segment states).
REFERENCE_FORMULA: dict[str, ReferenceStructure] = {"reference": REFERENCE, "global": GLOBAL}

StructureChange = Callable[[ReferenceStructure], ReferenceStructure]


@dataclass(frozen=True)
class Estimator:
    """A registered policy (``policy``), or a reference-formula variant (``variant``)."""

    name: str
    policy: str | None = None
    variant: ReferenceVariant | None = None

    @staticmethod
    def for_policy(policy: str) -> Estimator:
        structure = REFERENCE_FORMULA.get(policy)
        variant = ReferenceVariant(policy, structure) if structure is not None else None
        return Estimator(policy, policy, variant)

    def price(self, step: Step, change: StructureChange | None = None) -> Estimate:
        """The step's estimate; ``change`` changes the reference structure (an earlier
        estimator a claim reproduces)."""
        if change is not None:
            if self.variant is None:
                raise CpmemError(f"{self.name} is not the reference formula; it has no variants")
            changed = replace(self.variant, structure=change(self.variant.structure))
            return changed.price(step, self.name)
        if self.policy is not None:
            return price(step, self.policy)
        assert self.variant is not None
        return self.variant.price(step, self.name)
