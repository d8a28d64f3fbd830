"""How admission prices a step: the policy, the figure it admits on, and the routing
bound an MoE step is decided on (``Pricer``), shared by admission, its suggestions, the
width search and ``capacity``."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from cpmem.errors import InputError
from cpmem.pricing.estimate import Estimate
from cpmem.pricing.registry import price
from cpmem.step.routing import WORST
from cpmem.step.step import STEP_KINDS, Step, StepKind

Figure = Literal["forward", "forward_backward"]
FIGURES: tuple[Figure, ...] = ("forward", "forward_backward")
Kinds = tuple[tuple[StepKind, int], ...]
"""A step's required bytes as the first and as a steady step of its process."""


BALANCED_NOTE = (
    "admitted on the worst-case MoE routing: balanced is an expectation, not a bound "
    "(a router without capacity can reach the worst); state one with --moe-routing "
    "capacity:F or rows:N to admit on it"
)


def on_a_bound(step: Step) -> tuple[Step, str | None]:
    """The step admission decides on: an MoE step under the balanced expectation is
    priced at the worst case, the bound a router without capacity reaches (a stated
    capacity or row count is a bound already), with the note saying so."""
    if not step.geometry.is_moe or step.moe_routing != "balanced":
        return step, None
    return replace(step, settings=step.settings.replace(moe_routing=WORST)), BALANCED_NOTE


@dataclass(frozen=True)
class Pricer:
    """How a decision prices a step: the policy and the figure it admits on.

    Every step is priced as the first and as a steady step of its process and required
    at the larger: a run must survive both, and which holds more depends on the step (the
    first pays its kernel set-up in the activations, a steady one holds the optimizer's
    moments and the kernel workspaces in its static memory). Against the runtime's figures
    (what a running process has left once its static memory is allocated) the requirement
    is the activation figure; with ``whole_device`` (the decision is against a device or
    a given budget, ``cpmem.admission.budget``) it is the whole-device figure (static
    memory plus activations, where a pipeline step holds most of both:
    ``Estimate.whole_device_bytes``)."""

    policy: str | None = None
    """None: each step's runtime's policy (``Runtime.default_policy``)."""
    figure: Figure = "forward"
    whole_device: bool = False

    def __post_init__(self) -> None:
        if self.figure not in FIGURES:
            raise InputError("figure", self.figure, f"must be one of {list(FIGURES)}")

    def estimate(self, step: Step) -> Estimate:
        """The step's estimate at whichever step kind requires more (``priced``)."""
        return self.priced(step)[0]

    def priced(self, step: Step) -> tuple[Estimate, Kinds]:
        """The estimate of whichever step kind requires more (the first on a tie), and
        the required bytes of each kind."""
        kinds = self.kinds(step)
        required = tuple((kind, self.required(est)) for kind, est in kinds.items())
        kind = max(required, key=lambda pair: pair[1])[0]
        return kinds[kind], required

    def kinds(self, step: Step) -> dict[StepKind, Estimate]:
        """The step priced as the first and as a steady step of its process, on a
        routing bound (``on_a_bound``)."""
        bounded, note = on_a_bound(step)
        out = {}
        for kind in STEP_KINDS:
            est = price(
                replace(bounded, settings=bounded.settings.replace(cold=kind == "first")),
                self.policy,
            )
            out[kind] = replace(est, notes=(*est.notes, note)) if note else est
        return out

    def activations(self, est: Estimate) -> int:
        """The activation figure: forward peak, or forward+backward where asked and priced."""
        if self.figure == "forward_backward":
            if est.forward_backward_bytes is None:
                raise InputError(
                    "figure", self.figure, f"policy {est.policy!r} does not price backward"
                )
            return est.forward_backward_bytes
        return est.estimate_bytes

    def required(self, est: Estimate) -> int:
        """The admission figure: the activation figure against the runtime's figures,
        the whole-device figure against a device or a given budget."""
        if self.whole_device:
            self.activations(est)  # refuses a figure the policy does not price
            return est.whole_device_bytes(self.figure)
        return self.activations(est)
