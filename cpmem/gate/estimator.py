"""What the gate prices with: a registered policy, or a mutant of the reference formula."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from cpmem.errors import CpmemError
from cpmem.pricing.estimate import Estimate
from cpmem.pricing.inputs import PricingInput
from cpmem.pricing.reference import ReferenceTerms, price_reference
from cpmem.pricing.registry import price

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
