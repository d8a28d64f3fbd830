"""The reference policy: the published pricing model (docs/pricing.md), to the byte.

``reference`` charges the busiest CP rank its real layout; ``global`` is the same
formula charging every rank the packed count (the estimator before busiest-rank
pricing). Beyond the published dense terms, cpmem adds first-principles terms for
full recompute, no-grad and MoE (docs/pricing.md, "Beyond the published terms").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from cpmem.errors import InputError
from cpmem.model.geometry import ModelGeometry
from cpmem.plan.layout import ParallelLayout
from cpmem.pricing.cold import COLD_SETUP
from cpmem.pricing.components import Component
from cpmem.pricing.cp_comm import kept_remote_ranks
from cpmem.pricing.estimate import Estimate, step_fields
from cpmem.pricing.gathered import gathered_kv_bytes
from cpmem.pricing.head import head_bytes
from cpmem.pricing.kinds import mixer_spec, mlp_spec
from cpmem.pricing.kinds.gdn import segment_state_bytes
from cpmem.pricing.registry import Ignore, register_policy, runtime_cp_comm, unpriced_options
from cpmem.pricing.widths import LayerWidths, common_width, sp_divisor
from cpmem.step.recompute import Mode, Module, Recompute
from cpmem.step.step import Step
from cpmem.step.trainer import Adapter

SAFETY = 1.10
CALIBRATED_CP = 2
"""The largest CP the recorded estimates were calibrated on (golden cells: CP <= 2).
Its widths hold one remote rank's gathered K/V within their envelope (the measured
Qwen3.5-4B CP 2 cells without recompute, and every simulated CP 2 row, are covered);
each CP rank beyond it adds its gathered K/V (``cpmem.pricing.gathered``)."""


def static_floor_layers(geometry: ModelGeometry) -> int:
    """The legacy floor's multiplier: clamp(L / 4 + 4, 4, 16) (integer division)."""
    return min(max(geometry.layers // 4 + 4, 4), 16)


def layer_widths(
    geometry: ModelGeometry,
    layout: ParallelLayout,
    adapter: Adapter | None = None,
    core_kept: bool = False,
) -> LayerWidths:
    """The reference widths of every kind the model has at one TP/SP/EP layout, with
    what ``adapter`` keeps beyond the harness's (each kind's spec: ``reference_width``;
    ``core_kept``: no ``core_attn`` checkpoint drops the attention's core)."""
    tp, sp = layout.tp, layout.sp
    adapter = Adapter() if adapter is None else adapter
    saved = {
        k: mixer_spec(k).reference_width(geometry, layout, adapter, core_kept)
        for k in geometry.mixer_kinds
    }
    saved.update(
        {
            k: mlp_spec(k).reference_width(geometry, layout, adapter, core_kept)
            for k in geometry.mlp_kinds
        }
    )
    return LayerWidths(
        common=common_width(geometry, tp, sp),
        layer_input=geometry.hidden // sp_divisor(tp, sp),
        saved=saved,
    )


def feature_width(geometry: ModelGeometry, widths: LayerWidths, recompute: Recompute) -> int:
    """Elements retained per token over all layers, for one recompute setting."""
    kinds = [(widths.of(mix) + widths.of(ffn), n) for mix, ffn, n in geometry.layer_kinds]
    widest = max((width for width, _ in kinds), default=0)  # a pipeline chunk: none
    if recompute.full:
        # each layer keeps its input; backward recomputes one layer at a time
        return geometry.layers * widths.layer_input + widest
    if not recompute.keeps_gradients:
        # nothing is kept; one layer's forward transients are live at a time
        return widest
    features = sum(width * n for width, n in kinds)
    for k in geometry.mlp_kinds:
        features -= mlp_spec(k).reference_dropped(widths, recompute, geometry.mlp_count(k))
    return features


def cp_discounted(step: Step) -> bool:
    """Busiest-rank pricing applies to dense CP with gradients and partial recompute."""
    return step.plan.layout.cp > 1 and step.recompute.keeps_saved_sets and not step.geometry.is_moe


def busiest_tokens(step: Step) -> tuple[int, list[int]]:
    """R for the admission figure and each rank's own R: the busiest CP rank's model
    tokens (TP padding included) where ``cp_discounted``, else the packed count."""
    plan = step.plan
    if not cp_discounted(step):
        return plan.packed_tokens, [plan.packed_tokens] * plan.layout.cp
    return plan.busiest_tokens, list(plan.rank_tokens)


def packed_tokens(step: Step) -> tuple[int, list[int]]:
    """Every rank charged the packed count (the estimator before busiest-rank pricing)."""
    plan = step.plan
    return plan.packed_tokens, [plan.packed_tokens] * plan.layout.cp


def all_segment_states(step: Step) -> int:
    """Bytes of every gradient-enabled segment's states in every GDN layer."""
    segments = step.plan.grad_segments if step.recompute.keeps_gradients else 0
    per = segment_state_bytes(step.geometry, step.plan.layout.tp, step.dtype_bytes)
    return segments * step.geometry.gdn_layers * per


@dataclass(frozen=True)
class ReferenceStructure:
    """The pieces of the reference formula that differ between the published model
    (the defaults), ``global`` (``packed_tokens``) and the estimators the golden layer
    recorded before it, which the gate reproduces (``cpmem.gate``): the tokens each rank
    is charged, its segment states, its cold allowance and the steps that pay it."""

    tokens: Callable[[Step], tuple[int, list[int]]] = busiest_tokens
    segment_states: Callable[[Step], int] = all_segment_states
    cold_allowance: int = COLD_SETUP
    every_step_cold: bool = False
    """False: the allowance is charged on the first step of a process only; a steady step
    has paid its kernel set-up, and holds what the set-up left (the cuBLAS and Transformer
    Engine workspaces) in its static memory (``cpmem.pricing.workspaces``), so its
    activations charge none. True: on every step, as ART's estimator charged it when it
    recorded the golden layer's estimates (it did not know a process's step:
    ``cpmem.calibration.variant.as_recorded``)."""


REFERENCE = ReferenceStructure()
GLOBAL = ReferenceStructure(tokens=packed_tokens)


PUBLISHED_MODULES = (Module.CORE_ATTN, Module.MLP, Module.MOE)
"""The selective checkpoints the reference formula prices (its widths' ``core`` and
``reference_dropped`` parts)."""


def price_reference(step: Step, structure: ReferenceStructure, name: str) -> Estimate:
    """The reference formula with ``structure``'s pieces, named ``name``: ART's published
    formula for its LoRA trainer, refused for another runtime or full training (its
    widths are a frozen base's with LoRA: ``tight`` prices both)."""
    settings = step.settings
    if not settings.runtime.published_formula:
        raise InputError(
            "policy",
            name,
            f"is ART's published LoRA formula; the {settings.runtime.name} runtime is priced "
            "by --policy tight",
        )
    if settings.training != "lora":
        raise InputError(
            "policy",
            name,
            f"is ART's published LoRA formula; --training {settings.training} is priced by "
            "--policy tight",
        )
    unpublished = [m for m in step.recompute.modules if m not in PUBLISHED_MODULES]
    if unpublished:
        raise InputError(
            "modules",
            "+".join(unpublished),
            f"ART's published formula checkpoints only {'/'.join(PUBLISHED_MODULES)}; "
            "--policy tight prices the others",
        )
    geometry, plan, rc = step.geometry, step.plan, step.recompute
    layout = plan.layout
    b = step.dtype_bytes
    core_kept = rc.keeps_saved_sets and not rc.checkpoints(Module.CORE_ATTN)
    widths = layer_widths(geometry, layout, step.adapter, core_kept)
    features = feature_width(geometry, widths, rc)
    segments = plan.grad_segments if rc.keeps_gradients else 0
    seg_bytes = structure.segment_states(step)
    cold = structure.cold_allowance if step.cold or structure.every_step_cold else 0
    static = plan.packed_tokens * geometry.hidden * b * static_floor_layers(geometry)
    outputs = step.outputs
    gathered = outputs if layout.cp > 1 else 0
    priced, rank_priced = structure.tokens(step)
    # gathered K/V are padded to the largest rank's count: the same on every rank
    beyond = kept_remote_ranks(step) - (CALIBRATED_CP - 1)  # the widths hold one remote rank
    gathered_kv = gathered_kv_bytes(step, priced, beyond)
    unpriced = unpriced_options(step, name)  # they cannot change which profile applies

    def components_for(tokens: int) -> dict[str, int]:
        retained = tokens * b * features
        floor = cold + seg_bytes + retained
        profile = step.profiles.floor(step.signature, tokens, unpriced) if step.profiles else 0
        static_excess = max(0, static - floor)
        profile_excess = max(0, profile - max(floor, static))
        head = head_bytes(step, tokens)
        before_safety = outputs + floor + static_excess + profile_excess + gathered
        before_safety += gathered_kv + head.kept + head.forward
        total = int(before_safety * SAFETY)
        extra: dict[str, int] = {Component.CP_GATHERED_KV: gathered_kv} if gathered_kv else {}
        if not step.head.returns_hidden:
            extra[Component.HEAD_KEPT] = head.kept
            extra[Component.HEAD] = head.forward
        return {
            Component.RETAINED_ACTIVATIONS: retained,
            Component.SEGMENT_STATES: seg_bytes,
            Component.COLD_SETUP: cold,
            Component.OUTPUTS: outputs,
            Component.GATHERED_OUTPUTS: gathered,
            Component.STATIC_FLOOR: static_excess,
            Component.PROFILE_FLOOR: profile_excess,
            **extra,
            Component.MARGIN_FACTOR: total - before_safety,
        }

    components = components_for(priced)
    per_rank = tuple(sum(components_for(n).values()) for n in rank_priced)
    busiest_rank = max(range(len(per_rank)), key=lambda r: (per_rank[r], -r))
    return Estimate(
        policy=name,
        estimate_bytes=sum(components.values()),
        busiest_rank=busiest_rank,
        busiest_tokens=priced,
        per_rank_bytes=per_rank,
        components=components,
        grad_segments=segments,
        head_bytes=components.get(Component.HEAD_KEPT, 0) + components.get(Component.HEAD, 0),
        **step_fields(step),
    )


def alike_at_cp2(step: Step) -> bool:
    """Whether the reference prices the step's CP comm type as its runtime's default at
    CP <= 2: all_gather, p2p and a2a keep one other rank's K/V for attention (the widths'
    envelope); a2a's head-split exchange differs on a Gated DeltaNet layer and a2a+p2p
    is another schedule."""
    comms = {step.cp_comm, runtime_cp_comm(step)}
    if "a2a+p2p" in comms:
        return False
    return "a2a" not in comms or step.geometry.gdn_layers == 0


REFERENCE_IGNORES: dict[str, str | Ignore] = {
    "compiled": "the reference's widths are eager's (tight prices torch.compile)",
    "moe_routing": "the reference charges every expert row concentrated (tight prices balanced)",
    "attention_backend": "the reference's widths are the measured kernels'; tight prices "
    "flash-attn's copies and the unfused backends' probabilities",
    "recompute": Ignore(
        "at CP <= 2 the reference prices no recompute as selective core attention (its "
        "widths' envelope, calibrated at CP 2, holds both); tight prices the core's "
        "saved set",
        where=lambda step: (
            step.plan.layout.cp <= CALIBRATED_CP and step.recompute.mode == Mode.NONE
        ),
    ),
    "cp_comm": Ignore(
        "at CP <= 2 the reference's widths hold one other rank's K/V, what all_gather, p2p "
        "and a2a keep alike there (tight prices each type's in-flight buffers)",
        where=lambda step: step.plan.layout.cp <= CALIBRATED_CP and alike_at_cp2(step),
    ),
    "offload": "the reference's widths name no saved tensor: every one is priced on the "
    "device (tight prices what fine-grained offloading sends to the host)",
    "planner": Ignore(
        "the reference charges every CP rank the packed count on this step (busiest-rank "
        "pricing is for dense CP with gradients and partial recompute: cp_discounted)",
        where=lambda step: not cp_discounted(step),
    ),
}
GLOBAL_IGNORES: dict[str, str | Ignore] = {
    **REFERENCE_IGNORES,
    "planner": "global charges every CP rank the packed count, whatever the layout",
}


@register_policy("reference", ignores=REFERENCE_IGNORES)
def reference_policy(step: Step) -> Estimate:
    """The published model: busiest-rank tokens for dense CP selective/none."""
    return price_reference(step, REFERENCE, "reference")


@register_policy("global", ignores=GLOBAL_IGNORES)
def global_policy(step: Step) -> Estimate:
    """The pre-CP-aware estimator: every rank charged the packed token count."""
    return price_reference(step, GLOBAL, "global")
