"""What a policy may read: one input bundle (geometry, plan, recompute, execution mode)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from cpmem.errors import InputError
from cpmem.model.geometry import ModelGeometry
from cpmem.plan.plan import Plan
from cpmem.pricing.profiles import ProfileSignature, ProfileStore
from cpmem.pricing.recompute import Recompute

MoeRouting = Literal["concentrated", "balanced"]
BF16_BYTES = 2


@dataclass(frozen=True)
class PricingInput:
    """Everything a policy may read. ``output_bytes`` defaults to the hidden states
    the calibration driver returns (logical tokens x hidden x dtype bytes). ``cold``:
    the step is the first of its process (kernel set-up not yet paid); the safe default
    for admission, since a planner rarely knows."""

    geometry: ModelGeometry
    plan: Plan
    recompute: Recompute = Recompute()
    compiled: bool = False
    moe_routing: MoeRouting = "concentrated"
    output_bytes: int | None = None
    profiles: ProfileStore | None = None
    dtype_bytes: int = BF16_BYTES
    cold: bool = True

    def __post_init__(self) -> None:
        self.geometry.check_tp(self.plan.layout.tp)
        if self.moe_routing not in ("concentrated", "balanced"):
            raise InputError(
                "moe_routing", self.moe_routing, "must be 'concentrated' or 'balanced'"
            )
        if self.output_bytes is not None and self.output_bytes < 0:
            raise InputError("output_bytes", self.output_bytes, "must be >= 0")

    @property
    def outputs(self) -> int:
        if self.output_bytes is not None:
            return self.output_bytes
        return self.plan.logical_tokens * self.geometry.hidden * self.dtype_bytes

    @property
    def signature(self) -> ProfileSignature:
        layout = self.plan.layout
        return ProfileSignature(
            model=self.geometry.name,
            tp=layout.tp,
            cp=layout.cp,
            mode=self.recompute.mode,
            modules="+".join(self.recompute.modules),
            compiled=self.compiled,
        )
