"""Admission: does a request fit, must it be split, or is it refused?

Every rank computes its own required and available bytes; the group agrees on
(MAX required, MIN available) through a Communicator, so every rank takes the
same decision, and a planning failure anywhere raises everywhere. Every variant
admission considers (the cost-optimal layout, the executable memory-minimal ones,
the split parts, the suggestions) is derived from the one ``Step`` that ``estimate``
prices (``cpmem.step``): admission never prices a different request.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Literal, Unpack

from cpmem.admission.budget import Budget, step_budget
from cpmem.admission.comm import (
    Communicator,
    LocalCommunicator,
    agree_on_bytes,
    bounded,
    collective_plan,
)
from cpmem.admission.pricer import Figure, Kinds, Pricer
from cpmem.admission.suggest import CapacityAdvice, capacity_advice, suggest
from cpmem.errors import InputError
from cpmem.model.geometry import ModelGeometry
from cpmem.plan.planners import EXECUTABLE
from cpmem.plan.request import Request, Segment
from cpmem.pricing.components import retained_bytes
from cpmem.pricing.device_budget import DeviceBudget, runtime_budget
from cpmem.pricing.estimate import Estimate
from cpmem.step.describe import StepArguments, describe_step
from cpmem.step.step import STEP_KINDS, Step, StepKind

Action = Literal["fit", "split", "refuse"]
MAX_SPLIT = 64


usable_budget = runtime_budget
"""free + reusable reserved - 3% of the device's total (``cpmem.pricing.device_budget``)."""


@dataclass(frozen=True)
class Decision:
    """The agreed outcome. ``required_bytes`` / ``available_bytes`` are group-wide."""

    action: Action
    required_bytes: int
    available_bytes: int
    parts: int
    variant: str
    estimate: Estimate
    considered: tuple[tuple[str, int], ...]
    suggestion: str | None = None
    planners: tuple[tuple[str, str], ...] = ()  # variant -> the planner its layout assumes
    device_budget: DeviceBudget | None = None
    """The deciding device (or the given budget as one, ``budget.given_budget``) with the
    chosen estimate's static memory under it (None: the runtime's figures decided)."""
    step_kinds: Kinds = ()
    """The chosen variant's required bytes as the first and as a steady step of its
    process (``Pricer``): its activation figure against the runtime's figures, its
    whole-device bytes against a device or a budget; the decision was taken on the
    larger (``estimate.step_kind``)."""
    budget: Budget | None = None
    """What the decision was taken against and which budget decided
    (``cpmem.admission.budget``)."""
    capacity_advice: CapacityAdvice | None = None
    """Of a refused MoE step: the largest expert capacity factor under which it fits,
    with the balanced expectation beside it (``cpmem.admission.suggest``)."""

    @property
    def fits(self) -> bool:
        return self.action != "refuse"

    def planner_of(self, variant: str) -> str | None:
        """The planner whose layout ``variant`` was priced with (None: not recorded)."""
        return dict(self.planners).get(variant)

    def to_dict(self) -> dict[str, object]:
        return {
            "action": self.action,
            "required_bytes": self.required_bytes,
            "available_bytes": self.available_bytes,
            "parts": self.parts,
            "variant": self.variant,
            "planner": self.planner_of(self.variant),
            "considered": [
                {"variant": v, "required_bytes": b, "planner": self.planner_of(v)}
                for v, b in self.considered
            ],
            "suggestion": self.suggestion,
            "estimate": self.estimate.to_dict(),
            **(self.budget.to_dict() if self.budget is not None else {}),
            **({"whole_device": self.whole_device()} if self.device_budget else {}),
            **({self.step_kinds_key: dict(self.step_kinds)} if self.step_kinds else {}),
            **(
                {"capacity_advice": self.capacity_advice.to_dict()}
                if self.capacity_advice is not None
                else {}
            ),
        }

    @property
    def step_kinds_key(self) -> str:
        """The JSON key of ``step_kinds``: whole-device bytes against a device or a
        budget, the activation figure against the runtime's figures."""
        return "step_whole_device_bytes" if self.device_budget else "step_required_bytes"

    def whole_device(self) -> dict[str, object]:
        """The device's bytes on the busiest rank: static, the step's activations and its
        head (together the required figure), the runtime's reserve, the memory outside
        PyTorch, and what is left free; and every rank's static + activations."""
        whole = self.device_budget
        assert whole is not None
        est = self.estimate
        head = est.components.get("head", 0) + est.components.get("head_kept", 0)
        static = whole.static.total
        return {
            "device": whole.device.name,
            "device_total_bytes": whole.device.total_bytes,
            "busiest_rank": est.busiest_rank,
            "static_bytes": static,
            "static_components": dict(whole.static.components),
            "activations_bytes": max(0, self.required_bytes - head),
            "head_bytes": min(head, self.required_bytes),
            "reserve_bytes": whole.reserve_bytes,
            "non_torch_bytes": whole.non_torch_bytes,
            "free_bytes": self.available_bytes - self.required_bytes,
            "per_rank_bytes": [static + b for b in est.per_rank_bytes],
        }


def split_cost(pricer: Pricer, parts: Sequence[Estimate]) -> int:
    """Sub-forwards keep every part's retained bytes until backward
    (``cpmem.pricing.components.RETAINED``), but only one part's workspace (outputs,
    cold set-up, floors, margin) is live at a time."""
    retained = [retained_bytes(p) for p in parts]
    workspace = [pricer.required(p) - r for p, r in zip(parts, retained, strict=True)]
    return sum(retained) + max(workspace)


def split_kinds(pricer: Pricer, steps: Sequence[Step]) -> tuple[list[Estimate], Kinds]:
    """The sub-forwards of one step, all of one step kind (a split runs inside one step:
    the first of its process or a steady one): the parts' estimates at the kind whose
    ``split_cost`` is larger (the first on a tie), and each kind's cost."""
    by_kind: dict[StepKind, list[Estimate]] = {kind: [] for kind in STEP_KINDS}
    for s in steps:
        for kind, est in pricer.kinds(s).items():
            by_kind[kind].append(est)
    costs = tuple((kind, split_cost(pricer, ests)) for kind, ests in by_kind.items())
    kind = max(costs, key=lambda pair: pair[1])[0]
    return by_kind[kind], costs


def split_request(request: Request, parts: int) -> list[Request] | None:
    """Cut a request into ``parts`` sub-forwards balanced by tokens, or None if it
    has too few sequences. A shared prefix is repeated in every part that needs it."""
    # a unit is (origin tree, the subtrees of it that travel together)
    units: list[tuple[int, tuple[Segment, ...]]] = [(i, (t,)) for i, t in enumerate(request.trees)]
    expand = len(units) < parts
    if expand:
        units = [
            (i, (c,)) if t.children else (i, (t,))
            for i, t in enumerate(request.trees)
            for c in (t.children or (t,))
        ]
    if len(units) < parts:
        return None
    bins: list[dict[int, list[Segment]]] = [{} for _ in range(parts)]
    loads = [0] * parts
    for origin, segs in sorted(units, key=lambda u: -sum(s.subtree_tokens for s in u[1])):
        i = loads.index(min(loads))
        bins[i].setdefault(origin, []).extend(segs)
        loads[i] += sum(s.subtree_tokens for s in segs)
    out = []
    for b in bins:
        trees: list[Segment] = []
        for origin, group in sorted(b.items()):
            root = request.trees[origin]
            if expand and root.children:
                trees.append(replace(root, children=tuple(group)))
            else:
                trees.extend(group)
        out.append(Request(tuple(trees)))
    return out


def admit(
    model: str | ModelGeometry | None = None,
    lengths: Sequence[int] | None = None,
    *,
    budget_bytes: float | None = None,
    usable_bytes: float | None = None,
    policy: str | None = None,
    figure: Figure = "forward",
    comm: Communicator | None = None,
    timeout: float | None = None,
    **options: Unpack[StepArguments],
) -> Decision:
    """Admit the step ``cpmem.api.estimate`` prices for the same arguments (``options``
    are ``describe_step``'s) against this rank's budget (``cpmem.admission.budget``):
    ``usable_bytes`` the device can give the step (static memory and activations
    together), the step's ``device`` (its total less the reserve and the memory outside
    PyTorch; with ``usable_bytes`` too, the smaller decides), or ``budget_bytes``, the
    running process's own figure (free + reusable reserved - 3%), left after its static
    memory and compared with the activations alone.

    The step is described inside the first collective, so a bad input on one rank raises
    on every rank instead of leaving the others waiting. ``timeout`` (seconds; None: the
    communicator's own) bounds every collective: a peer that exited or is stuck raises
    ``CollectiveTimeoutError`` here (docs/admission.md, "When a rank dies").
    """
    comm, bad_timeout = _bounded(comm, timeout)

    def described() -> Step:
        if bad_timeout is not None:
            raise bad_timeout
        step = describe_step(model, lengths, **options)
        step_budget(step, budget_bytes, usable_bytes)
        return step

    step = collective_plan(comm, described)
    return admit_step(
        step, budget_bytes, usable_bytes=usable_bytes, policy=policy, figure=figure, comm=comm
    )


def admit_step(
    step: Step,
    budget_bytes: float | None = None,
    *,
    usable_bytes: float | None = None,
    use_device: bool = True,
    policy: str | None = None,
    figure: Figure = "forward",
    comm: Communicator | None = None,
    timeout: float | None = None,
) -> Decision:
    """Fit (cost-optimal plan, then memory-minimal plan), split (2, 4, 8, ...), or refuse.

    The cost-optimal plan is ``step``'s own (its settings' planner; default: the model's
    default planner). The memory-minimal alternatives are layouts a runtime executes
    (``EXECUTABLE``: the measured runtime's chunks, Megatron's zigzag), never a rule only
    cpmem applies; ``Decision.planners`` names the planner behind each variant. A step
    with an explicit plan (no request) is fit or refused as it stands. ``timeout`` as
    in ``admit``.

    Every variant is priced as the first and as a steady step of its process and
    required at the larger (``Pricer``), whatever ``step.settings.cold`` says: a run
    must survive both. The decision names the step kind it was decided on
    (``estimate.step_kind``) with the chosen variant's bytes at each (``step_kinds``).
    The budget (``cpmem.admission.budget.step_budget``: ``usable_bytes``, the step's
    device unless ``use_device`` is False, or the runtime's ``budget_bytes``) says what
    is compared: against a device or a given budget the step's static memory and
    activations together (``Pricer.whole_device``; a pipeline step at the stage where
    they are largest), the decision carrying the whole device's breakdown and stating
    its required and available bytes as the activations and what the budget leaves them
    beside the chosen estimate's static memory; against the runtime's figures the
    activations alone.
    """
    comm, bad_timeout = _bounded(comm, timeout)
    resolved: list[Budget] = []

    def checked() -> None:
        """The inputs every rank checks inside the first collective."""
        if bad_timeout is not None:
            raise bad_timeout
        resolved.append(step_budget(step, budget_bytes, usable_bytes, use_device=use_device))

    pricer = Pricer(policy, figure, whole_device=budget_bytes is None)
    if step.request is None:
        decision = _admit_fixed(step, lambda: resolved[0].available_bytes, pricer, comm, checked)
    else:
        decision = _admit_request(step, lambda: resolved[0].available_bytes, pricer, comm, checked)
    decision = replace(decision, budget=resolved[0])
    if not pricer.whole_device:
        return decision
    return _on_device(decision, pricer, resolved[0])


def _on_device(decision: Decision, pricer: Pricer, budget: Budget) -> Decision:
    """A decision taken in whole-device bytes, stated as activations against what the
    budget leaves them beside the chosen estimate's static memory (its ``step_kinds``
    stay whole-device bytes)."""
    est = decision.estimate
    _, static = est.device_required(pricer.figure)
    held = 0 if static is None else static.total
    under = est.static if est.static is not None else static
    return replace(
        decision,
        required_bytes=decision.required_bytes - held,
        available_bytes=decision.available_bytes - held,
        considered=tuple((v, b - held) for v, b in decision.considered),
        device_budget=None if under is None else budget.device_budget(under),
    )


def _admit_request(
    step: Step,
    budget: Callable[[], int],
    pricer: Pricer,
    comm: Communicator,
    checked: Callable[[], None],
) -> Decision:
    """Admission of a step planned from a request (``admit_step``)."""

    def candidates() -> list[Candidate]:
        checked()
        cost_optimal, kinds = pricer.priced(step)
        out = [Candidate("cost-optimal", pricer.required(cost_optimal), cost_optimal, kinds)]
        if step.plan.layout.cp > 1:
            for name in EXECUTABLE:
                if name == cost_optimal.planner:
                    continue  # already priced as the cost-optimal layout
                alternative = _variant(partial(step.replanned, name))
                if alternative is not None:
                    est, kinds = pricer.priced(alternative)
                    out.append(
                        Candidate(f"memory-minimal:{name}", pricer.required(est), est, kinds)
                    )
        return out

    found = collective_plan(comm, candidates)
    planners = tuple((c.variant, c.estimate.planner) for c in found)
    available = comm.min_int(budget())
    agreed = _agreed(comm, found)
    considered = [(c.variant, c.required) for c in agreed]
    best_fit = _first_fit(agreed, available)
    if best_fit is not None:
        return Decision(
            "fit",
            best_fit.required,
            available,
            1,
            best_fit.variant,
            best_fit.estimate,
            tuple(considered),
            planners=planners,
            step_kinds=best_fit.kinds,
        )

    request = step.request
    assert request is not None  # admit_step admits a step without one as it stands
    # a step of several micro-batches (over stages or one after another) is not split:
    # its micro-batches are the trainer's split already
    pipe = step.settings.pipeline
    parts = MAX_SPLIT + 1 if pipe.active or pipe.microbatches > 1 else 2
    while parts <= MAX_SPLIT:
        pieces = split_request(request, parts)
        if pieces is None:
            break

        def price_parts(ps: list[Request] = pieces) -> tuple[list[Estimate], Kinds] | None:
            steps = [_variant(partial(step.for_request, p)) for p in ps]
            if any(s is None for s in steps):
                return None  # a part estimate would refuse (a CP rank left empty)
            return split_kinds(pricer, [s for s in steps if s is not None])

        priced = collective_plan(comm, price_parts)
        if priced is None:
            break
        ests, kinds = priced
        cost = max(b for _, b in kinds)
        required, available = agree_on_bytes(comm, cost, available)
        considered.append((f"split-{parts}", required))
        planners += ((f"split-{parts}", ests[0].planner),)
        if required <= available:
            largest = max(ests, key=pricer.required)
            return Decision(
                "split",
                required,
                available,
                parts,
                f"split-{parts}",
                largest,
                tuple(considered),
                planners=planners,
                step_kinds=kinds,
            )
        parts *= 2

    # the group's agreed MAX, so every rank refuses with the same variant and bytes
    least = min(agreed, key=lambda c: c.required)
    advice = capacity_advice(step, available, pricer)
    return Decision(
        "refuse",
        least.required,
        available,
        0,
        least.variant,
        least.estimate,
        tuple(considered),
        suggestion=_with_advice(suggest(step, available, pricer), advice),
        planners=planners,
        step_kinds=least.kinds,
        capacity_advice=advice,
    )


def _bounded(
    comm: Communicator | None, timeout: float | None
) -> tuple[Communicator, InputError | None]:
    """The communicator bounded by ``timeout``, or, for a timeout it refuses, the
    communicator as given and the error to raise inside the first collective (so the
    peers of a rank with a bad timeout raise too instead of waiting for it)."""
    comm = comm or LocalCommunicator()
    try:
        return bounded(comm, timeout), None
    except InputError as exc:
        return comm, exc


def _variant(build: Callable[[], Step]) -> Step | None:
    """A variant of the step, or None where ``describe_step`` refuses it (e.g. a layout
    or a split part that leaves a CP rank empty): what estimate would not price,
    admission does not consider."""
    try:
        return build()
    except InputError:
        return None


@dataclass(frozen=True)
class Candidate:
    """A variant admission considers: its required bytes (this rank's, or the group's
    MAX once agreed), this rank's estimate at the deciding step kind, each kind's bytes."""

    variant: str
    required: int
    estimate: Estimate
    kinds: Kinds


def _agreed(comm: Communicator, found: list[Candidate]) -> list[Candidate]:
    """Each variant with the group's MAX of its required bytes (one collective per
    variant, in order) and this rank's estimate of it."""
    return [replace(c, required=comm.max_int(c.required)) for c in found]


def _first_fit(agreed: list[Candidate], available: int) -> Candidate | None:
    """Cost-optimal first; otherwise the least-demanding candidate (by the agreed bytes),
    if it fits."""
    if agreed[0].required <= available:
        return agreed[0]
    best = min(agreed, key=lambda c: c.required)
    return best if best.required <= available else None


def _admit_fixed(
    step: Step,
    budget: Callable[[], int],
    pricer: Pricer,
    comm: Communicator,
    checked: Callable[[], None],
) -> Decision:
    """Admit a plan the runtime already fixed (no alternatives, no split): fit or refuse."""

    def priced() -> tuple[Estimate, Kinds]:
        checked()
        return pricer.priced(step)

    est, kinds = collective_plan(comm, priced)
    required, available = agree_on_bytes(comm, pricer.required(est), budget())
    action: Action = "fit" if required <= available else "refuse"
    suggestion, advice = None, None
    if action == "refuse":
        advice = capacity_advice(step, available, pricer)
        suggestion = _with_advice("shorten the sequences, add CP ranks or recompute more", advice)
    return Decision(
        action,
        required,
        available,
        1 if action == "fit" else 0,
        "explicit",
        est,
        (("explicit", required),),
        suggestion,
        planners=(("explicit", "explicit"),),
        step_kinds=kinds,
        capacity_advice=advice,
    )


def _with_advice(suggestion: str, advice: CapacityAdvice | None) -> str:
    """A refusal's suggestion, an MoE step's capacity advice first where it has one."""
    return suggestion if advice is None else f"{advice.text()}; or {suggestion}"
