"""The ``tight`` policy: the composed structure (``compose``) with its fitted margin
(``calibrated.MARGIN``), the forward figure per CP rank, and the Estimate."""

from __future__ import annotations

import math

from cpmem.model.geometry import ModelGeometry
from cpmem.pricing.components import Component
from cpmem.pricing.estimate import Estimate, step_fields
from cpmem.pricing.registry import Ignore, register_policy
from cpmem.pricing.tight.calibrated import Margin
from cpmem.pricing.tight.calibrated import runtime_margin as margin_for
from cpmem.pricing.tight.compose import (
    POLICY,
    Structure,
    layers_backward_terms,
    priced_tokens,
    structural_terms,
    tight_widths,
)
from cpmem.pricing.tight.widths import TightWidths
from cpmem.pricing.workspaces import outside_allocator_notes
from cpmem.step.step import Step


def with_margin(base: dict[str, int], factor: float, allowance: int) -> dict[str, int]:
    """``base`` with the margin's factor (rounded up to the byte) and allowance added."""
    subtotal = sum(base.values())
    out = dict(base)
    out[Component.MARGIN_FACTOR] = math.ceil(subtotal * factor) - subtotal
    out[Component.MARGIN_ALLOWANCE] = allowance
    return out


def runtime_margin(step: Step) -> Margin:
    """The margin the step's runtime is priced with (``calibrated.runtime_margin``)."""
    return margin_for(step.settings.runtime.fitted_margin)


def rank_forward_bytes(
    step: Step, margin: Margin | None = None, structure: Structure = POLICY
) -> tuple[int, ...]:
    """Each CP rank's forward estimate at its own model tokens (``Plan.rank_tokens``):
    what it keeps and its one-layer transient follow its own count, what every rank
    pads to the largest count does not. The busiest rank's is the estimate."""
    margin = runtime_margin(step) if margin is None else margin
    cp = step.plan.layout.cp
    if cp == 1:
        return (_margined_forward(step, margin, structure, None),)
    return tuple(_margined_forward(step, margin, structure, n) for n in step.plan.rank_tokens)


def _margined_forward(step: Step, margin: Margin, structure: Structure, tokens: int | None) -> int:
    forward, _ = structural_terms(step, structure, tokens)
    return sum(with_margin(forward, margin.forward_factor, margin.forward_allowance).values())


def price_tight(
    step: Step, margin: Margin | None = None, structure: Structure = POLICY
) -> Estimate:
    """The forward (admission) and forward+backward estimates of ``step``, with ``margin``
    (by default its runtime's)."""
    margin = runtime_margin(step) if margin is None else margin
    forward, forward_backward = structural_terms(step, structure)
    components = with_margin(forward, margin.forward_factor, margin.forward_allowance)
    layers = None
    if step.recompute.keeps_gradients:
        fb_components = with_margin(
            forward_backward, margin.forward_factor, margin.backward_allowance
        )
        fb_components.update(structure.cold_backward(step, margin))
        if not step.geometry.mtp_depths:  # an MTP depth's backward may run before the head's
            terms = layers_backward_terms(step, forward_backward, structure)
            at_layers = with_margin(terms, margin.forward_factor, margin.backward_allowance)
            layers = sum(at_layers.values()) + sum(structure.cold_backward(step, margin).values())
    else:  # a no-grad forward has no backward: its whole step is its forward
        fb_components = dict(components)
    plan, layout = step.plan, step.plan.layout
    estimate = sum(components.values())
    fb = sum(fb_components.values())
    if fb < estimate:  # the forward peak is part of the forward+backward peak
        fb_components[Component.FORWARD_PEAK_EXCESS] = estimate - fb
        fb = estimate
    return Estimate(
        policy="tight",
        estimate_bytes=estimate,
        busiest_rank=plan.busiest_rank if layout.cp > 1 else 0,
        busiest_tokens=priced_tokens(step),
        per_rank_bytes=rank_forward_bytes(step, margin, structure),
        components=components,
        grad_segments=plan.grad_segments if step.recompute.keeps_gradients else 0,
        head_bytes=forward.get(Component.HEAD_KEPT, 0) + forward.get(Component.HEAD, 0),
        **step_fields(step),
        forward_backward_bytes=fb,
        forward_backward_components=fb_components,
        layers_backward_bytes=None if layers is None else min(layers, fb),
        notes=(
            *((f"moe_routing={step.moe_routing}",) if step.geometry.is_moe else ()),
            *outside_allocator_notes(step.settings),
        ),
    )


def fusion_unpriced(step: Step) -> bool:
    """Whether a fused SwiGLU moves nothing ``tight`` prices on ``step``: under
    torch.compile every SwiGLU is priced fused (``mlp.swiglu_saved``, the experts'
    ``MOE_ROW_COMPILED_F``); eager, a routed expert's row is megatron-core's unfused GLU
    (``moe.MOE_ROW_EAGER_F``, the rank simulator's), so only a dense MLP's or a shared
    expert's SwiGLU reads the fusion."""
    g = step.geometry
    return step.compiled or ("dense" not in g.mlps and not g.shared_expert_ffn)


def compile_unpriced(step: Step) -> bool:
    """Whether torch.compile moves nothing ``tight`` prices on ``step``: tight reads it in
    gated attention's eager saved set without recompute (``eager_none``:
    ``kinds.attention.EAGER_NONE_GATED``), in an unfused SwiGLU's (a dense MLP's or a
    shared expert's: ``kinds.mlp.swiglu_saved``) and in a routed expert's row
    (``kinds.moe.saved_width``); a step with none of them prices the same compiled."""
    g = step.geometry
    gated_eager = g.attention_output_gate and step.recompute.keeps_everything
    unfused = not g.fused_swiglu and ("dense" in g.mlps or bool(g.shared_expert_ffn))
    return not (g.is_moe or gated_eager or unfused)


def backend_unpriced(step: Step) -> bool:
    """Whether flash moves nothing ``tight`` prices on ``step``: every attention layer is
    gated, whose saved set is priced as measured under the fused kernel
    (``attention.core_width``: ``7Q + 3KV``); flash-attn's ``bshd`` copies are priced on
    ungated attention only (``attention.ungated_multiples``)."""
    g = step.geometry
    return step.settings.runtime.attention_backend == "flash" and g.attention_output_gate


TIGHT_IGNORES: dict[str, str | Ignore] = {
    "profiles": "tight prices no learned floors (the reference does)",
    "compiled": Ignore(
        "tight reads torch.compile in gated attention's eager saved set, an unfused SwiGLU "
        "and a routed expert's row; this step has none (its SwiGLU fused, no routed experts)",
        where=compile_unpriced,
    ),
    "fused_swiglu": Ignore(
        "tight prices a routed expert's GLU eager as megatron-core's unfused one (its fused "
        "weighted_bias_swiglu, experts.py:689-692, is not priced) and every SwiGLU fused "
        "under torch.compile: the fusion moves a dense MLP's or shared expert's eager set only",
        where=fusion_unpriced,
    ),
    "attention_backend": Ignore(
        "tight prices gated attention's saved set as measured under the fused kernel; "
        "flash-attn's copies are priced on ungated attention",
        where=backend_unpriced,
    ),
}


def _structure_widths(geometry: ModelGeometry, step: Step) -> TightWidths:
    return tight_widths(geometry, step, runtime_q=0)


STRUCTURE_ONLY = Structure(widths=_structure_widths)
"""``tight`` on the rank simulator's structure alone: the measured runtime's query-wide
tensor per ungated attention layer beyond it (``UNGATED_RUNTIME_Q``, which the
simulator does not keep: its validated attention-only miss) left out."""


def price_structure_only(step: Step) -> Estimate:
    """``step`` priced on the simulator's structure alone (``STRUCTURE_ONLY``): the figure
    a headroom over the simulator is read on where the policy adds what a measured runtime
    keeps beyond it (the simulated tier's MoE target, ``cpmem.samples.targets``)."""
    return price_tight(step, structure=STRUCTURE_ONLY)


@register_policy("tight", ignores=TIGHT_IGNORES)
def tight_policy(step: Step) -> Estimate:
    """Structural forward (admission) and forward+backward peaks with a small margin."""
    return price_tight(step)
