"""The ``tight`` policy: structural forward and forward+backward peaks (docs/tight.md).

Unlike ``reference`` (calibrated envelopes times 1.10), ``tight`` prices each layer
kind with the saved sets the oracles measured (``oracles/README.md``), chosen by
recompute mode and execution mode (eager/compiled, fused/unfused SwiGLU), keeps every
fixed cost as its own component, prices the backward transient, and adds one small
documented margin (a factor and a fixed allowance) fitted so that every measured
rank-sample is covered. This module composes the policy: fixed terms, tokens priced,
components, margin. The per-layer widths are ``cpmem.pricing.tight_widths``; its
targets, the margin fit, the leave-out studies and its report live in ``cpmem.gate``
(``targets``, ``fitting``, ``tight_report``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cpmem.model.geometry import ModelGeometry
from cpmem.pricing.estimate import Estimate
from cpmem.pricing.gathered import gathered_kv_bytes
from cpmem.pricing.inputs import PricingInput
from cpmem.pricing.reference import segment_state_bytes
from cpmem.pricing.registry import register_policy
from cpmem.pricing.tight_widths import (
    forward_transient_width,
    kept_width,
    last_layer_backward_width,
    tight_widths,
)
from cpmem.units import MIB

# --- structural constants (observations, not fitted) -----------------------------
COLD_SETUP = 64 * MIB
"""Cold kernel set-up of the first forward of a process: the first forward peak minus
the repeat forward peak of the same cell is 64.0 MiB on 12 of the 16 first-in-process
golden cells (53.7-62.0 MiB on the others). Priced when ``inputs.cold``."""
LOSS_BACKWARD_OUTPUTS = 6
"""The mean-square loss's backward, in multiples of the returned bf16 outputs: the
forward+backward peak minus the bytes retained after forward is 6.00 x outputs on every
golden cell of >= 2,048 tokens that records both and whose backward transient is
smaller (12 bytes per output element: the fp32 upcast, its fp32 gradient and the bf16
gradient handed to the last layer). Under CP the loss runs over the returned outputs,
gathered and unpacked to the logical tokens (``outputs``), on every rank: the rank
simulator's CP rows back it through all of them (``qwen3-1.7b:tp4:cp4:pair-16k:none``,
rank 0: four bf16 copies of the 32,768 logical outputs); the measured CP 2 cells peak in
forward and cannot tell. tight priced the rank's share until issue 11's last round."""
CP_HYBRID_BACKWARD_AUTOTUNE = 256 * MIB
"""Triton's benchmark buffer (``get_empty_cache_for_benchmark``: 256 MiB, allocated
while an autotuned kernel is timed) during the first backward of a CP run of a hybrid
model, whose GDN kernels autotune there: the 4B CP2 64+64 cell's backward rises 279.5 MiB
above its forward peak where its retained set and loss explain about 24 MiB. Inferred
from that one cell and the buffer's size, not read off a trace; priced when cold."""


FINAL_HIDDEN_STATES = 1
"""Layer-input-wide tensors live beside the outputs under full recompute: the last
layer's output, which no checkpoint keeps but which the output gather reads (the
checkpoints keep the L layer inputs, the embedding output the first of them). Rank
simulator, ``qwen3-1.7b:tp2:cp8:single-32k:full`` busiest rank (7,680 tokens): forward
peak = embedding 15.7 MB + rope + 440.4 MB (28 layers' outputs, the last one included)
+ the gathered and unpacked outputs; L x layer input = 440.4 MB, so one layer input
(15.7 MB) more than tight priced. Priced in ``structural_terms`` as the floor of the
full-recompute transient."""


@dataclass(frozen=True)
class Margin:
    """The policy's fitted constants: ``forward_factor`` on each structural sum plus a
    fixed allowance for the forward, one for every backward, and one for the cold
    set-up of the first backward of a process (``cpmem.gate.fitting.fit_margin``)."""

    forward_factor: float
    forward_allowance: int
    backward_allowance: int
    cold_backward_allowance: int


# --- the fitted margin (docs/tight.md; the gate checks fit_margin reproduces it) ----
MARGIN = Margin(
    forward_factor=1.04,
    forward_allowance=26 * MIB,
    backward_allowance=13 * MIB,
    cold_backward_allowance=97 * MIB,
)


@dataclass(frozen=True)
class TightTerms:
    """Switches of the structure. The defaults are the policy; the gate's power study
    turns one off (or on) at a time, refits, and requires a target to fail."""

    backward: bool = True
    cold_setup: bool = True
    segment_states: bool = True
    fused_swiglu_on_unfused: bool = False
    tp1_widths: bool = False


def busiest_priced(inputs: PricingInput) -> bool:
    """Whether the busiest CP rank's tokens are priced: under CP, in every recompute mode
    and for every model family. Each rank keeps only its own tokens' activations; a
    full-recompute checkpoint keeps its own tokens' layer inputs and one layer's working
    set at its own count, and a no-grad forward likewise (the rank simulator's layout).
    MoE too: each CP rank dispatches only its own tokens, and the rank simulator takes
    every rank of the EP group to route as many tokens as the simulated (busiest) rank
    (oracles/rank_sim/moe.py ``expert_rows``; at EP = TP the EP group is the TP ranks of
    one CP rank), so the experts' rows follow the busiest rank's count. Until the
    simulated grid's MoE rows MoE kept the packed count (the reference's rule): +109% to
    +131% over the simulator at CP 2. No MoE cell under CP was measured."""
    return inputs.plan.layout.cp > 1


def priced_tokens(inputs: PricingInput) -> int:
    """R: the busiest CP rank's model tokens where ``busiest_priced``, else the packed
    count."""
    if busiest_priced(inputs):
        return inputs.plan.busiest_tokens
    return inputs.plan.packed_tokens


def rank_segments(inputs: PricingInput) -> int:
    """Gradient-enabled segments whose recurrent states the busiest rank holds.

    A layout that places whole prefix-tree segments (the ``gdn-segments`` planner, and
    explicit plans, taken to come from such a runtime as the measured one) leaves at
    least one segment on each other CP rank: the busiest holds at most
    segments - (CP - 1), and at least one. With fewer segments than CP ranks no layout
    can place them whole: segments are cut, and a rank's run can hold a piece of every
    one of them (the simulator's ``qwen3.5-27b:tp2:cp8:pack4-uneven`` puts pieces of two
    on its busiest rank and on its last; this bound gave one). Planners that cut every
    sequence across all ranks (``balanced``, ``attention-work``) leave every segment's
    state on every rank.
    """
    if not inputs.recompute.keeps_gradients:
        return 0
    segments = inputs.plan.grad_segments
    cp = inputs.plan.layout.cp
    whole_segments = inputs.plan.planner in ("gdn-segments", "explicit") and segments >= cp
    if busiest_priced(inputs) and segments and whole_segments:
        return max(1, segments - (cp - 1))
    return segments


SEGMENT_STATES_PER_SEGMENT = 2
"""fp32 recurrent states (with their convolution histories) a GDN layer keeps per
gradient segment on the rank: the final state each segment's kernel call returns and
the initial state it starts from ..."""
SEGMENT_STATES_SPARED = 1
"""... less one: the rank's first segment starts from no state (fla's
``initial_state=None`` saves none). So ``2n - 1`` states for ``n`` segments where the
reference prices ``2n`` (``segment_state_bytes``: initial and final per segment).
Measured (warm forward peak minus the structure without states, in one-state units):
the two-segment ``core_attn+mlp`` cells hold 3.0 (27B TP4 64+64) and 3.1 (4B TP2 128+128);
the eight-segment 27B TP2 cells 10.6 (8 x 64) and 13.1 (8 x 256), under the 15 priced.
The rank simulator keeps one per root piece and one per parent piece (2 for two roots),
below what the measured 27B cells hold (docs/tight.md "Segment states"). The count is
the one of ``2n``, ``2n - 1``, ``1.5n`` and ``n + 1`` that the measured cells and the
cross-validation support (8 held-out misses; 14 for ``1.5n``, 16 for ``n + 1``), an
upper envelope of what the cells hold, not a traced mechanism: a trace of one layer's
states in a many-segment cell would settle it."""


def tight_segment_state_bytes(geometry: ModelGeometry, segments: int, tp: int, b: int) -> int:
    """One GDN layer's segment states on the rank: ``2n - 1`` fp32 states with their
    convolution histories for ``n`` segments (``SEGMENT_STATES_PER_SEGMENT``,
    ``SEGMENT_STATES_SPARED``), each half the reference's per-segment pair
    (``segment_state_bytes``, which stays the reference's own). 0 without segments."""
    if segments <= 0:
        return 0
    states = SEGMENT_STATES_PER_SEGMENT * segments - SEGMENT_STATES_SPARED
    return states * segment_state_bytes(geometry, tp, b) // 2


def local_outputs(inputs: PricingInput) -> int:
    """The rank's share of the returned hidden states: the gradient the last layer's
    backward receives (the gather's backward hands each rank its own tokens')."""
    cp = inputs.plan.layout.cp
    return inputs.outputs // cp if cp > 1 else inputs.outputs


def cp_gathered_kv_bytes(inputs: PricingInput, tokens: int | None = None) -> int:
    """K and V of every other CP rank, all-gathered inside the core attention (padded to
    the largest rank's count, priced at the priced tokens) and saved by the flash kernel
    for backward, beyond the local K/V the widths already hold (``cpmem.pricing.gathered``:
    only where no ``core_attn`` checkpoint drops them; under full recompute one layer
    holds them at a time, priced in that layer's width). The simulated grid's dense CP 8
    rows without recompute miss by up to 7% without it (docs/simulated-grid.md). Measured
    only on the 4B CP 2 cells without recompute, where it is 0.6% of the peak. For a
    rank of ``tokens`` below the largest, its own slot of the padded buffer too (the
    widths hold only its ``tokens``): the simulator's small ranks of the skewed CP 4/8
    rows without recompute were 2-3% under without it."""
    busiest = priced_tokens(inputs)
    own_padding = 0 if tokens is None else max(0, busiest - tokens)
    remote = gathered_kv_bytes(inputs, busiest, inputs.plan.layout.cp - 1)
    return remote + gathered_kv_bytes(inputs, own_padding, 1)


def gathered_outputs_bytes(inputs: PricingInput, tokens: int) -> int:
    """The returned hidden states gathered over CP: every rank's rows padded to the
    largest rank's count in transit (one ``CP x R`` buffer, R the priced busiest count),
    live beside the unpacked logical copy (``outputs``). Rank simulator
    (oracles/rank_sim/runner.py, ``GatherTokens`` in kernels.py): the gather buffer is
    ``CP x max(counts)`` rows; ``qwen3-1.7b:tp2:cp8:pair-16k:full`` holds 8 x 5,632
    tokens (176 MiB) plus the 128 MiB unpacked copy at its forward peak. Until the
    simulated grid's full-recompute rows tight priced the logical count twice (up to
    3.4% under the simulator at CP 4/8). Scaled from ``outputs`` per logical token, so a
    caller's ``output_bytes`` carries over; never below the logical count (a request's
    shared prefix is repeated by the unpacking, not by the gather). 0 without CP."""
    cp = inputs.plan.layout.cp
    if cp <= 1:
        return 0
    outputs, logical = inputs.outputs, max(1, inputs.plan.logical_tokens)
    return max(outputs, -(-outputs * cp * tokens // logical))


ROPE_TABLES = 2
"""head_dim-wide bf16 tables the step's rotary embedding keeps per rank token: cos and
sin, allocated once per step and live through backward (recompute reads them). Rank
simulator (oracles/rank_sim/runner.py, label ``rope``: two ``(tokens, head_dim)`` bf16
tables; megatron's unfused ``_apply_rotary_pos_emb_bshd`` saves only the tables): 512
elements per token on Qwen3.5-35B-A3B (head_dim 256), whatever the TP degree."""


def rope_table_bytes(inputs: PricingInput, tokens: int) -> int:
    """The rope cos/sin tables (``ROPE_TABLES``) at the priced tokens, for a model with
    attention layers (GDN layers take no rope)."""
    g = inputs.geometry
    if "attention" not in g.mixers:
        return 0
    return ROPE_TABLES * g.head_dim * tokens * inputs.dtype_bytes


def structural_terms(
    inputs: PricingInput, terms: TightTerms | None = None, tokens: int | None = None
) -> tuple[dict[str, int], dict[str, int]]:
    """The unmargined forward components and forward+backward components of the rank
    holding ``tokens`` model tokens (default: the priced, busiest rank's).

    forward = retained set + one layer's transient; forward+backward = retained set +
    the larger of that transient and the backward's first moment (the loss's backward,
    or the last layer's backward on top of the incoming gradient). What every rank pads
    to the largest rank's count (the gathered outputs and K/V) is priced at the busiest
    rank's count whichever rank is asked for.
    """
    terms = terms or TightTerms()
    geometry = inputs.geometry
    if terms.fused_swiglu_on_unfused:  # a power-study mutant
        geometry = geometry.with_fused_swiglu(True)
    plan = inputs.plan
    b = inputs.dtype_bytes
    w = tight_widths(geometry, inputs, tp1=terms.tp1_widths)
    busiest = priced_tokens(inputs)
    tokens = busiest if tokens is None else tokens
    segments = rank_segments(inputs) if terms.segment_states else 0
    one_layer_passes = inputs.recompute.mode in ("full", "no-grad")
    # under full recompute a layer's segment states live only while it (re)runs
    state_layers = min(1, geometry.gdn_layers) if one_layer_passes else geometry.gdn_layers
    seg = state_layers * tight_segment_state_bytes(geometry, segments, plan.layout.tp, b)
    outputs = inputs.outputs
    gathered_outputs = gathered_outputs_bytes(inputs, busiest)
    transient = tokens * b * forward_transient_width(geometry, w, inputs)
    if one_layer_passes:
        # the outputs are formed after the last layer's pass: the forward peak is the
        # larger of the two on top of the layer inputs, not their sum; under full
        # recompute the last layer's output is live beside them (FINAL_HIDDEN_STATES)
        final = (
            FINAL_HIDDEN_STATES * tokens * b * w.layer_input
            if inputs.recompute.mode == "full"
            else 0
        )
        transient = max(final, transient - outputs - gathered_outputs)
    forward = {
        "cold_setup": COLD_SETUP if inputs.cold and terms.cold_setup else 0,
        "segment_states": seg,
        "outputs": outputs,
        "gathered_outputs": gathered_outputs,
        "retained_activations": tokens * b * kept_width(geometry, w, inputs),
        "layer_transient": transient,
    }
    rope = rope_table_bytes(inputs, tokens)
    if rope:  # a component only where the model has attention layers
        forward["rope_tables"] = rope
    gathered_kv = cp_gathered_kv_bytes(inputs, tokens)
    if gathered_kv:  # a component only where it applies (CP without core_attn recompute)
        forward["cp_gathered_kv"] = gathered_kv
    backward = 0
    if terms.backward and inputs.recompute.keeps_gradients:
        local = local_outputs(inputs)
        last_layer = tokens * b * last_layer_backward_width(geometry, w, inputs)
        backward = max(LOSS_BACKWARD_OUTPUTS * outputs, local + last_layer)
        if cold_autotune(inputs, terms):
            # timed inside a GDN layer's backward: the loss's buffers are gone by then
            backward = max(backward, local + CP_HYBRID_BACKWARD_AUTOTUNE)
    forward_backward = {k: v for k, v in forward.items() if k != "layer_transient"}
    forward_backward["backward_transient"] = max(transient, backward)
    return forward, forward_backward


def cold_autotune(inputs: PricingInput, terms: TightTerms) -> bool:
    """The first backward of a CP run of a hybrid model times its GDN kernels."""
    return (
        inputs.cold and terms.cold_setup and inputs.plan.layout.cp > 1 and inputs.geometry.is_hybrid
    )


def cold_backward_terms(inputs: PricingInput, margin: Margin, terms: TightTerms) -> dict[str, int]:
    """What the first backward of a process adds (nothing for a warm step)."""
    if not (inputs.cold and terms.cold_setup and terms.backward):
        return {}
    return {"cold_backward_setup": margin.cold_backward_allowance}


def _with_margin(base: dict[str, int], factor: float, allowance: int) -> dict[str, int]:
    subtotal = sum(base.values())
    out = dict(base)
    out["margin_factor"] = math.ceil(subtotal * factor) - subtotal
    out["margin_allowance"] = allowance
    return out


def rank_forward_bytes(
    inputs: PricingInput, margin: Margin = MARGIN, terms: TightTerms | None = None
) -> tuple[int, ...]:
    """Each CP rank's forward estimate at its own model tokens (``Plan.rank_tokens``):
    what it keeps and its one-layer transient follow its own count, what every rank
    pads to the largest count does not. Under CP the ranks own uneven shares, and a
    caller placing work across ranks wants each rank's figure, not the busiest's
    repeated. The busiest rank's is the estimate (the priced count)."""
    if not busiest_priced(inputs):
        return (_margined_forward(inputs, margin, terms, None),) * inputs.plan.layout.cp
    return tuple(_margined_forward(inputs, margin, terms, n) for n in inputs.plan.rank_tokens)


def _margined_forward(
    inputs: PricingInput, margin: Margin, terms: TightTerms | None, tokens: int | None
) -> int:
    forward, _ = structural_terms(inputs, terms, tokens)
    return sum(_with_margin(forward, margin.forward_factor, margin.forward_allowance).values())


def price_tight(
    inputs: PricingInput, margin: Margin = MARGIN, terms: TightTerms | None = None
) -> Estimate:
    terms = terms or TightTerms()
    forward, forward_backward = structural_terms(inputs, terms)
    components = _with_margin(forward, margin.forward_factor, margin.forward_allowance)
    if inputs.recompute.keeps_gradients:
        fb_components = _with_margin(
            forward_backward, margin.forward_factor, margin.backward_allowance
        )
        fb_components.update(cold_backward_terms(inputs, margin, terms))
    else:  # a no-grad forward has no backward: its whole step is its forward
        fb_components = dict(components)
    plan, layout = inputs.plan, inputs.plan.layout
    estimate = sum(components.values())
    fb = sum(fb_components.values())
    if fb < estimate:  # the forward peak is part of the forward+backward peak
        fb_components["forward_peak_excess"] = estimate - fb
        fb = estimate
    tokens = priced_tokens(inputs)
    return Estimate(
        policy="tight",
        estimate_bytes=estimate,
        busiest_rank=plan.busiest_rank if busiest_priced(inputs) else 0,
        busiest_tokens=tokens,
        per_rank_bytes=rank_forward_bytes(inputs, margin, terms),
        components=components,
        packed_tokens=plan.packed_tokens,
        logical_tokens=plan.logical_tokens,
        grad_segments=plan.grad_segments if inputs.recompute.keeps_gradients else 0,
        model=inputs.geometry.name,
        recompute=inputs.recompute.label,
        planner=plan.planner,
        tp=layout.tp,
        cp=layout.cp,
        sp=layout.sp,
        forward_backward_bytes=fb,
        forward_backward_components=fb_components,
        notes=(f"moe_routing={inputs.moe_routing}",) if inputs.geometry.is_moe else (),
        retained_bytes=forward["retained_activations"]
        + forward["segment_states"]
        + forward.get("cp_gathered_kv", 0)
        + forward.get("rope_tables", 0),
    )


@register_policy("tight")
def tight_policy(inputs: PricingInput) -> Estimate:
    """Structural forward (admission) and forward+backward peaks with a small margin."""
    return price_tight(inputs)
