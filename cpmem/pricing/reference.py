"""The reference policy: the published pricing model (docs/pricing.md), to the byte.

``reference`` charges the busiest CP rank its real layout; ``global`` is the same
formula charging every rank the packed count (the estimator before busiest-rank
pricing). Beyond the published dense terms, cpmem adds first-principles terms for
full recompute, no-grad and MoE (docs/pricing.md, "Beyond the published terms").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from cpmem.model.geometry import ModelGeometry
from cpmem.pricing.estimate import Estimate
from cpmem.pricing.gathered import gathered_kv_bytes
from cpmem.pricing.inputs import PricingInput
from cpmem.pricing.recompute import Recompute
from cpmem.pricing.registry import register_policy
from cpmem.pricing.widths import LayerWidths, layer_widths
from cpmem.units import MIB

COLD_ALLOWANCE = 64 * MIB  # observed cold kernel set-up is about 58 MiB
SAFETY = 1.10
CALIBRATED_CP = 2
"""The largest CP the recorded estimates were calibrated on (golden cells: CP <= 2).
Its widths hold one remote rank's gathered K/V within their envelope (the measured
Qwen3.5-4B CP 2 cells without recompute, and every simulated CP 2 row, are covered);
each CP rank beyond it adds its gathered K/V (``cpmem.pricing.gathered``)."""


def segment_state_bytes(geometry: ModelGeometry, tp: int, dtype_bytes: int = 2) -> int:
    """Per gradient-enabled segment and GDN layer: initial and final fp32 recurrent
    state plus the convolution history, sharded by TP."""
    k, v = geometry.gdn_key_width, geometry.gdn_value_width
    state = 4 * geometry.gdn_value_heads * geometry.gdn_key_dim * geometry.gdn_value_dim
    conv = dtype_bytes * (2 * k + v) * (geometry.gdn_conv_kernel - 1)
    return int((2 / tp) * (state + conv))


def static_floor_layers(geometry: ModelGeometry) -> int:
    """The legacy floor's multiplier: clamp(L / 4 + 4, 4, 16) (integer division)."""
    return min(max(geometry.layers // 4 + 4, 4), 16)


def feature_width(geometry: ModelGeometry, widths: LayerWidths, recompute: Recompute) -> int:
    """Elements retained per token over all layers, for one recompute setting."""
    layers = list(zip(geometry.mixers, geometry.mlps, strict=True))
    per_layer = [widths.mixer(mix) + widths.ffn(ffn) for mix, ffn in layers]
    if recompute.mode == "full":
        # each layer keeps its input; backward recomputes one layer at a time
        return geometry.layers * widths.layer_input + max(per_layer)
    if recompute.mode == "no-grad":
        # nothing is kept; one layer's forward transients are live at a time
        return max(per_layer)
    features = sum(per_layer)
    if recompute.mode == "selective":
        dense = sum(1 for k in geometry.mlps if k == "dense")
        moe = geometry.moe_layers
        if "mlp" in recompute.modules and dense:
            features -= (dense - 1) * (widths.mlp - widths.layer_input)
        if "moe" in recompute.modules and moe:
            # the router/dispatch input stays (common width); one layer recomputes
            features -= (moe - 1) * (widths.moe - widths.common)
    return features


def cp_discounted(inputs: PricingInput) -> bool:
    """Busiest-rank pricing applies to dense CP with gradients and partial recompute."""
    return (
        inputs.plan.layout.cp > 1
        and inputs.recompute.mode in ("selective", "none")
        and not inputs.geometry.is_moe
    )


@dataclass(frozen=True)
class ReferenceTerms:
    """Switches of the reference formula. The defaults are the published model; the
    other settings are the recorded earlier estimators and the gate's mutants."""

    cp_tokens: Literal["busiest", "packed", "average"] = "busiest"
    segment_states: bool = True
    cold_allowance: bool = True
    tp_padding: bool = True
    fused_swiglu: bool | None = None  # None: the model's own setting


def _priced_tokens(inputs: PricingInput, terms: ReferenceTerms) -> tuple[int, list[int]]:
    """R for the admission figure, and each rank's own R."""
    plan = inputs.plan
    cp = plan.layout.cp
    pad = plan.layout.tp if terms.tp_padding else 1
    packed = plan.packed_tokens if terms.tp_padding else sum(g.real_tokens for g in plan.groups)
    if not cp_discounted(inputs) or terms.cp_tokens == "packed":
        return packed, [packed] * cp
    if terms.cp_tokens == "average":
        avg = -(-packed // cp)
        return avg, [avg] * cp
    per_group = [g.model_tokens(pad) for g in plan.groups]
    ranks = [sum(col) for col in zip(*per_group, strict=True)]
    return sum(max(row) for row in per_group), ranks


def _price(inputs: PricingInput, policy: str, terms: ReferenceTerms) -> Estimate:
    geometry, plan, rc = inputs.geometry, inputs.plan, inputs.recompute
    if terms.fused_swiglu is not None:
        geometry = geometry.with_fused_swiglu(terms.fused_swiglu)
    layout = plan.layout
    b = inputs.dtype_bytes
    widths = layer_widths(geometry, layout.tp, layout.sp, layout.ep, "concentrated")
    features = feature_width(geometry, widths, rc)
    segments = plan.grad_segments if rc.keeps_gradients else 0
    seg_bytes = segments * geometry.gdn_layers * segment_state_bytes(geometry, layout.tp, b)
    if not terms.segment_states:
        seg_bytes = 0
    cold = COLD_ALLOWANCE if terms.cold_allowance else 0
    static = plan.packed_tokens * geometry.hidden * b * static_floor_layers(geometry)
    outputs = inputs.outputs
    gathered = outputs if layout.cp > 1 else 0
    priced, rank_priced = _priced_tokens(inputs, terms)
    # gathered K/V are padded to the largest rank's count: the same on every rank
    gathered_kv = gathered_kv_bytes(inputs, priced, layout.cp - CALIBRATED_CP)

    def components_for(tokens: int) -> dict[str, int]:
        retained = tokens * b * features
        floor = cold + seg_bytes + retained
        profile = inputs.profiles.floor(inputs.signature, tokens) if inputs.profiles else 0
        static_excess = max(0, static - floor)
        profile_excess = max(0, profile - max(floor, static))
        before_safety = outputs + floor + static_excess + profile_excess + gathered
        before_safety += gathered_kv
        total = int(before_safety * SAFETY)
        extra = {"cp_gathered_kv": gathered_kv} if gathered_kv else {}
        return {
            "retained_tokens": retained,
            "segment_states": seg_bytes,
            "cold_allowance": cold,
            "outputs": outputs,
            "gathered_outputs": gathered,
            "static_floor": static_excess,
            "profile_floor": profile_excess,
            **extra,
            "safety_factor": total - before_safety,
        }

    components = components_for(priced)
    per_rank = tuple(sum(components_for(n).values()) for n in rank_priced)
    busiest_rank = max(range(len(per_rank)), key=lambda r: (per_rank[r], -r))
    return Estimate(
        policy=policy,
        estimate_bytes=sum(components.values()),
        busiest_rank=busiest_rank,
        busiest_tokens=priced,
        per_rank_bytes=per_rank,
        components=components,
        packed_tokens=plan.packed_tokens,
        logical_tokens=plan.logical_tokens,
        grad_segments=segments,
        model=geometry.name,
        recompute=rc.label,
        planner=plan.planner,
        tp=layout.tp,
        cp=layout.cp,
        sp=layout.sp,
        retained_bytes=components["retained_tokens"]
        + components["segment_states"]
        + components.get("cp_gathered_kv", 0),
    )


@register_policy("reference")
def reference_policy(inputs: PricingInput) -> Estimate:
    """The published model: busiest-rank tokens for dense CP selective/none."""
    return _price(inputs, "reference", ReferenceTerms())


@register_policy("global")
def global_policy(inputs: PricingInput) -> Estimate:
    """The pre-CP-aware estimator: every rank charged the packed token count."""
    return _price(inputs, "global", ReferenceTerms(cp_tokens="packed"))


def price_reference(inputs: PricingInput, terms: ReferenceTerms, name: str) -> Estimate:
    """The reference formula with some terms switched (earlier estimators, mutants)."""
    return _price(inputs, name, terms)
