"""The estimate object: per-rank bytes, the busiest rank, and where the bytes go."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cpmem.pricing.components import check_names, retained_bytes
from cpmem.pricing.device_budget import DeviceBudget
from cpmem.pricing.provenance import Facts, Source, assumptions, facts_of, provenance
from cpmem.pricing.static import StaticMemory
from cpmem.step.routing import routing_kind
from cpmem.step.step import Step
from cpmem.step.trainer import Adapter, Head
from cpmem.units import gib


@dataclass(frozen=True)
class Estimate:
    """A policy's prediction for one plan.

    ``estimate_bytes`` is the admission figure (the busiest rank's forward peak);
    ``components`` add up to it exactly. ``forward_backward_bytes`` is set by
    policies that also price backward.
    """

    policy: str
    estimate_bytes: int
    busiest_rank: int
    busiest_tokens: int
    per_rank_bytes: tuple[int, ...]
    components: dict[str, int]
    packed_tokens: int
    logical_tokens: int
    grad_segments: int
    model: str
    recompute: str
    planner: str
    tp: int
    cp: int
    sp: bool
    forward_backward_bytes: int | None = None
    forward_backward_components: dict[str, int] | None = None
    layers_backward_bytes: int | None = None
    """The forward+backward figure at the layers' backward alone, once the loss's or the
    head's backward has run (the head's kept tensors freed): the moments at which the
    parameters' gradients exist. A term made only from then on (Megatron FSDP's gradient
    buckets, ``registry``) is charged beside it. None where the policy does not price
    that moment apart: such a term is then charged at the whole backward."""
    notes: tuple[str, ...] = field(default=())
    head: Head = Head()
    adapter: Adapter = Adapter()
    cp_comm: str = "all_gather"
    step_kind: str = "steady"
    """Which of the process's steps was priced: ``first`` or ``steady``."""
    runtime: str = "art"
    """The process the step runs in (``Runtime.name``: ``art`` or ``megatron-lm``)."""
    training: str = "lora"
    """What is trained: ``lora`` (the adapters, ``adapter``) or ``full`` (every parameter;
    ``adapter`` is then unused)."""
    attention_backend: str = "fused"
    """The core attention's kernel priced (``Runtime.attention_backend``)."""
    ep: int = 1
    etp: int = 1
    """Expert parallelism and the experts' own tensor parallelism (1: experts unsplit by
    TP; Megatron-LM's default is ETP = TP)."""
    backend_asked: str = "fused"
    """What was asked for it (``auto``: Transformer Engine's pick)."""
    head_bytes: int = 0
    """What the head holds at its forward peak on the busiest rank (0 without a head):
    its share of the estimate is the ``head`` component, what it holds beyond the layer
    transient the forward's other moment holds."""
    static: StaticMemory | None = None
    """The rank's static memory under the activations (``cpmem.pricing.static``): the
    same for every policy, attached by ``cpmem.pricing.registry.price``."""
    device_budget: DeviceBudget | None = None
    """What the step's device leaves the activations once the static memory is
    allocated (None: the step names no device)."""
    busiest_stage: int = 0
    """Under pipeline parallelism: the stage whose busiest rank holds ``estimate_bytes``
    (``cpmem.pricing.pipeline``); 0 without stages."""
    stage_bytes: tuple[int, ...] = ()
    """Every stage's forward figure (its busiest rank's); empty without stages."""
    stage_forward_backward_bytes: tuple[int, ...] | None = None
    pipeline_op: str = ""
    """The op at the busiest stage's peak and how many model chunks it held in flight."""
    stage_statics: tuple[StaticMemory, ...] = ()
    """Every pipeline stage's static memory (its layers, the embedding on the first, the
    output layer on the last); ``static`` is the one of ``device_stage()``. Empty without
    stages."""
    answered_stage: int | None = None
    """The pipeline stage of the step's rank where it names one (``last`` or a global
    rank, ``StepSettings.rank``); None: the busiest (``device_stage``)."""
    ignored_options: tuple[str, ...] = ()
    """The options set on the step that this policy does not price (each a one-line
    reason: ``option: why``), attached by ``cpmem.pricing.registry.price``."""
    unpriced: frozenset[str] = field(default=frozenset(), compare=False)
    """The options this policy does not price on the step, set on it or not, and those set
    that no policy prices there (``registry.unpriced_options``, ``inapplicable_options``):
    what the assumptions must not state as priced. Attached by ``registry.price``."""
    facts: Facts = Facts()
    """What about the step decides which measured tier holds each term and what the
    estimate assumes (``cpmem.pricing.provenance``)."""
    routing_figures: dict[str, int] = field(default_factory=dict)
    """Of an MoE step: the step's figure (``figure_bytes``) under each routing the step
    can be priced with (``worst``, ``balanced``, ``capacity`` at ``capacity_factor``:
    the step's own or 1, and its own ``rows``; ``cpmem.step.routing``), attached by
    ``cpmem.pricing.registry.price`` where the policy prices the routing."""
    capacity_factor: float | None = None
    """The factor ``routing_figures["capacity"]`` was priced at."""

    @property
    def figure_bytes(self) -> int:
        """The figure a caller reads (``Runtime.answers_peak``): ``peak_bytes`` (static
        memory and activations) for a Megatron-LM run, ``estimate_bytes`` (the
        activations) for ART's trainer."""
        return self.peak_bytes if self.facts.answers_peak else self.estimate_bytes

    @property
    def routing_bound(self) -> str:
        """What the MoE routing that priced the step is: a bound or the expectation."""
        kind = routing_kind(self.facts.moe_routing)
        if kind == "balanced":
            return "expectation"
        if kind == "concentrated":
            return "bound (worst: a router without capacity can reach it)"
        return f"bound ({kind}: stated)"

    def __post_init__(self) -> None:
        # plain names (``Component`` values) for JSON, CSV and comparisons alike
        object.__setattr__(self, "components", {str(k): v for k, v in self.components.items()})
        if self.forward_backward_components is not None:
            fb = {str(k): v for k, v in self.forward_backward_components.items()}
            object.__setattr__(self, "forward_backward_components", fb)
        total = sum(self.components.values())
        if total != self.estimate_bytes:
            raise AssertionError(
                f"components add up to {total}, not estimate_bytes {self.estimate_bytes}"
            )
        check_names(self.components, self.policy)
        check_names(self.forward_backward_components or {}, self.policy)

    def stage_figure(self, stage: int, figure: str = "forward") -> int:
        """``stage``'s activation figure (forward, or forward+backward where priced) on
        its busiest rank; without stages, the step's."""
        if not self.stage_bytes:
            return self._figure(figure)
        if figure == "forward_backward":
            assert self.stage_forward_backward_bytes is not None
            return self.stage_forward_backward_bytes[stage]
        return self.stage_bytes[stage]

    def device_stage(self, figure: str = "forward") -> int:
        """The stage whose static memory plus activation figure is largest: where a device
        runs out first (0 without stages). The busiest activation stage need not be it:
        the first stage holds the embedding, the last the output layer."""
        if not self.stage_statics:
            return 0
        if self.answered_stage is not None:
            return self.answered_stage
        return max(
            range(len(self.stage_statics)),
            key=lambda s: self.stage_statics[s].total + self.stage_figure(s, figure),
        )

    def whole_device_bytes(self, figure: str = "forward") -> int:
        """Static memory plus activations where the device holds most of them together
        (``device_required``): what the device must hold beyond its reserve and the
        memory outside PyTorch."""
        activations, static = self.device_required(figure)
        return activations + (0 if static is None else static.total)

    @property
    def peak_bytes(self) -> int:
        """The allocator's peak over the step on the answered stage: static memory plus the
        forward+backward activations where the policy prices backward (else the forward's):
        what Megatron-LM logs as ``mem-max-allocated-bytes`` from its second step on."""
        figure = "forward" if self.forward_backward_bytes is None else "forward_backward"
        return self.whole_device_bytes(figure)

    def device_required(self, figure: str = "forward") -> tuple[int, StaticMemory | None]:
        """The activation figure and the static memory of ``device_stage(figure)``: the
        pair a device must hold together."""
        stage = self.device_stage(figure)
        if self.stage_statics:
            return self.stage_figure(stage, figure), self.stage_statics[stage]
        return self._figure(figure), self.static

    def _figure(self, figure: str) -> int:
        if figure == "forward_backward":
            assert self.forward_backward_bytes is not None
            return self.forward_backward_bytes
        return self.estimate_bytes

    @property
    def estimate_gib(self) -> float:
        return gib(self.estimate_bytes)

    @property
    def retained_bytes(self) -> int:
        """What the forward keeps until backward (``components.RETAINED``): the part of
        a sub-forward that stays live while the next runs when admission splits a request."""
        return retained_bytes(self)

    @property
    def provenance(self) -> dict[str, Source]:
        """Where each non-zero component's bytes were checked, the activations' (forward
        and forward+backward) and the static memory's (``cpmem.pricing.provenance``)."""
        named = [
            *self.components.items(),
            *(self.forward_backward_components or {}).items(),
            *(self.static.components.items() if self.static is not None else ()),
        ]
        return provenance((n for n, b in named if b), self.facts, self.policy)

    @property
    def assumptions(self) -> dict[str, str]:
        """What the estimate takes for granted, one line each: the CP layout, the experts'
        split (MoE), where the kernel set-up is charged (``cpmem.pricing.provenance``)."""
        static = self.static.components if self.static is not None else {}
        workspaces = sum(b for n, b in static.items() if "workspace" in n)
        return assumptions(
            self.facts,
            planner=self.planner,
            cp=self.cp,
            ep=self.ep,
            etp=self.etp,
            workspace_bytes=workspaces,
            unpriced=self.unpriced,
        )

    @property
    def trained(self) -> str:
        """What the step trains, as a label: its adapters, or ``full training``."""
        return self.adapter.label if self.training == "lora" else "full training"

    def to_dict(self) -> dict[str, Any]:
        """The stable JSON shape other tools read (names documented in docs/cli.md)."""
        out: dict[str, Any] = {
            "policy": self.policy,
            "model": self.model,
            "recompute": self.recompute,
            "planner": self.planner,
            "tp": self.tp,
            "cp": self.cp,
            "sp": self.sp,
            "estimate_bytes": self.estimate_bytes,
            "estimate_gib": round(self.estimate_gib, 6),
            "busiest_rank": self.busiest_rank,
            "busiest_tokens": self.busiest_tokens,
            "packed_tokens": self.packed_tokens,
            "logical_tokens": self.logical_tokens,
            "grad_segments": self.grad_segments,
            "per_rank_bytes": list(self.per_rank_bytes),
            "components": dict(self.components),
            "head": self.head.label,
            "head_bytes": self.head_bytes,
            "adapter": {
                "rank": self.adapter.rank,
                "dropout": self.adapter.dropout,
                "targets": list(self.adapter.targets),
            },
            "cp_comm": self.cp_comm,
            "step": self.step_kind,
            "runtime": self.runtime,
            "training": self.training,
            "ep": self.ep,
            "etp": self.etp,
            "attention_backend": self.attention_backend,
            "attention_backend_asked": self.backend_asked,
        }
        if self.forward_backward_bytes is not None:
            out["forward_backward_bytes"] = self.forward_backward_bytes
            out["forward_backward_gib"] = round(gib(self.forward_backward_bytes), 6)
            out["forward_backward_components"] = dict(self.forward_backward_components or {})
        if self.stage_bytes:
            out["busiest_stage"] = self.busiest_stage
            out["stage_bytes"] = list(self.stage_bytes)
            if self.stage_forward_backward_bytes is not None:
                out["stage_forward_backward_bytes"] = list(self.stage_forward_backward_bytes)
            out["pipeline_op"] = self.pipeline_op
        if self.stage_statics:
            out["device_stage"] = self.device_stage()
            out["stage_static_bytes"] = [s.total for s in self.stage_statics]
        if self.static is not None:
            out.update(self.static.to_dict())
            out["peak_bytes"] = self.peak_bytes
        if self.device_budget is not None:
            out["device_budget"] = self.device_budget.to_dict()
        out["provenance"] = {name: src.to_dict() for name, src in self.provenance.items()}
        out["assumptions"] = self.assumptions
        if self.routing_figures:
            out["moe_routing"] = self.facts.moe_routing
            out["routing_bound"] = self.routing_bound
            out["routing_figures"] = dict(self.routing_figures)
            out["capacity_factor"] = self.capacity_factor
        out["ignored_options"] = [o.partition(":")[0] for o in self.ignored_options]
        if self.notes:
            out["notes"] = list(self.notes)
        return out


def step_fields(step: Step) -> dict[str, Any]:
    """The Estimate fields every policy copies from the step it priced."""
    plan, layout = step.plan, step.plan.layout
    return {
        "packed_tokens": plan.packed_tokens,
        "logical_tokens": plan.logical_tokens,
        "model": step.geometry.name,
        "recompute": step.recompute.label,
        "planner": plan.planner,
        "tp": layout.tp,
        "cp": layout.cp,
        "sp": layout.sp,
        "head": step.head,
        "adapter": step.adapter,
        "cp_comm": step.cp_comm,
        "step_kind": step.settings.step_kind,
        "runtime": step.settings.runtime.name,
        "training": step.settings.training,
        "ep": layout.ep,
        "etp": layout.etp,
        "attention_backend": step.settings.runtime.attention_backend,
        "backend_asked": step.settings.runtime.backend_asked,
        "facts": facts_of(step),
    }
