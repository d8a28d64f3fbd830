"""The Gated DeltaNet mixer: its parameters and adapters, the reference's width and
segment states, and in ``tight`` its saved set, its peak without gradients, its backward
workspace, and the recurrent segment states it keeps per gradient segment (``GDN``, its
spec).

The chunked gated delta rule of fla-core 0.6.0 as the rank simulator lays it out
(oracles/rank_sim/kernels.py), the saved-tensor oracle's widths (oracles/README.md)."""

from __future__ import annotations

from cpmem.model.geometry import ModelGeometry
from cpmem.plan.layout import ParallelLayout
from cpmem.pricing import adapters
from cpmem.pricing.components import Component
from cpmem.pricing.kinds.spec import MixerSpec, TightContext, TrainedTensors
from cpmem.pricing.layer_parameters import LayerParameters, norm_tensors
from cpmem.pricing.tight.calibrated import CP_HYBRID_BACKWARD_AUTOTUNE, SEGMENT_STATES_SPARED
from cpmem.pricing.tight.widths import TightWidths
from cpmem.pricing.widths import gdn_width
from cpmem.step.step import Step
from cpmem.step.trainer import Adapter

GDN_SMALL_PER_HEAD = 66
"""GDN per value-head small terms (fp32 gate cumsum, beta, WY matrix A): 66·Vh."""

GDN_CHUNK = 64
"""Tokens per chunk of the chunked gated delta rule (fla-core; the oracle's A is per
chunk): one ``dk x dv`` state per chunk and value head."""

GDN_FORWARD_WORKSPACE_V = 3
"""Value-width tensors the chunked gated delta rule's forward allocates beside its
chunk states and frees before returning (``w``, ``u``, ``v_new``; fla-core 0.6.0
``chunk_gated_delta_rule_fwd`` as the rank simulator lays it out). Live in a no-grad
pass too."""

GDN_BACKWARD_WORKSPACE_V = 9
"""Value-width tensors the chunked gated delta rule's backward holds at once besides its
saved set, with two chunk-state tensors (recomputed states and their gradient): ``w``,
``u``, ``v_new``, ``dv_local``, ``dv``, ``dq``, ``dk``, ``dw`` and the incoming ``do``
(fla-core 0.6.0 ``chunk_gated_delta_rule_bwd`` as the rank simulator lays it out).
Qwen3-Next-style (dense FFN) under full recompute at TP1: the simulator's
forward+backward peak is the GDN layer's backward, 61,800 elements per token of
backward buffers on top of what remains of its saved set."""

SEGMENT_STATES_PER_SEGMENT = 2
"""fp32 recurrent states (with their convolution histories) a GDN layer keeps per
gradient segment on the rank: the final state each segment's kernel call returns and
the initial state it starts from, less ``calibrated.SEGMENT_STATES_SPARED``."""


def segment_state_bytes(geometry: ModelGeometry, tp: int, dtype_bytes: int = 2) -> int:
    """The reference's per gradient-enabled segment and GDN layer: initial and final fp32
    recurrent state plus the convolution history, sharded by TP."""
    k, v = geometry.gdn_key_width, geometry.gdn_value_width
    state = 4 * geometry.gdn_value_heads * geometry.gdn_key_dim * geometry.gdn_value_dim
    conv = dtype_bytes * (2 * k + v) * (geometry.gdn_conv_kernel - 1)
    return int((2 / tp) * (state + conv))


def saved_width(geometry: ModelGeometry, common: int, tp: int) -> int:
    """Elements per token one GDN layer keeps: the common norm/LoRA input, the
    projections (``4K + 7V``, K the key and V the value width) and the small per-head
    terms (``GDN_SMALL_PER_HEAD``), sharded by TP. 0 for a model without GDN layers."""
    if not geometry.is_hybrid:
        return 0
    k, v = geometry.gdn_key_width, geometry.gdn_value_width
    return common + (4 * k + 7 * v + GDN_SMALL_PER_HEAD * geometry.gdn_value_heads) // tp


def _workspace(geometry: ModelGeometry, value_tensors: int, state_tensors: int) -> int:
    states = geometry.gdn_value_heads * geometry.gdn_key_dim * geometry.gdn_value_dim
    return value_tensors * geometry.gdn_value_width + state_tensors * states // GDN_CHUNK


def nograd_width(geometry: ModelGeometry, w: TightWidths) -> int:
    """One GDN mixer's peak without gradients, bounded by its saved set plus the chunked
    kernel's forward workspace (``GDN_FORWARD_WORKSPACE_V`` value-width tensors and one
    ``dk x dv`` state per chunk and value head). An envelope: the rank simulator's
    fla-shaped kernel peaks below it (Qwen3-Next-style full recompute, 8,192 tokens, TP1:
    57,824 elements per token where this is 63,552; TP2: 29,936 and 33,824), the
    saved-tensor oracle's CPU kernel, with its fp32 temporaries, above it
    (tests/oracle/test_tight_widths.py)."""
    return w.of("gdn") + _workspace(geometry, GDN_FORWARD_WORKSPACE_V, 1) // w.tp


def backward_width(geometry: ModelGeometry, w: TightWidths) -> int:
    """Under full recompute, the GDN mixer's backward once its layer's MLP is done: the
    mixer's saved set and its kernel's backward workspace (``GDN_BACKWARD_WORKSPACE_V``
    value-width tensors, two chunk-state tensors)."""
    return w.of("gdn") + _workspace(geometry, GDN_BACKWARD_WORKSPACE_V, 2) // w.tp


def rank_segments(step: Step) -> int:
    """Gradient-enabled segments whose recurrent states the busiest rank holds: the
    plan's bound (``Plan.rank_segments``: fewer where its layout places whole segments),
    none without gradients."""
    if not step.recompute.keeps_gradients:
        return 0
    return max(step.plan.rank_segments)


def segment_states_bytes(geometry: ModelGeometry, segments: int, tp: int, b: int) -> int:
    """One GDN layer's segment states on the rank: ``2n - 1`` fp32 states with their
    convolution histories for ``n`` segments (``SEGMENT_STATES_PER_SEGMENT``, less
    ``SEGMENT_STATES_SPARED``), each half the reference's per-segment pair
    (``segment_state_bytes``, which stays the reference's own). 0 without segments."""
    if segments <= 0:
        return 0
    states = SEGMENT_STATES_PER_SEGMENT * segments - SEGMENT_STATES_SPARED
    return states * segment_state_bytes(geometry, tp, b) // 2


def gdn_parameters(g: ModelGeometry) -> LayerParameters:
    """GDN's parameters with its input norm: one in projection to ``2K + 2V + 2 h_v``
    (q, k, v, the output gate z, beta and alpha), the causal convolution over ``2K + V``
    channels, ``dt_bias`` and ``A_log`` per value head and the out projection, sharded
    over TP; the input norm and the gated output norm replicated."""
    h = g.hidden
    k, v, heads = g.gdn_key_width, g.gdn_value_width, g.gdn_value_heads
    in_proj = h * (2 * k + 2 * v + 2 * heads)
    conv = (2 * k + v) * g.gdn_conv_kernel
    sharded = in_proj + conv + 2 * heads + v * h  # + dt_bias, A_log; out projection
    return LayerParameters(sharded, 0, h + g.gdn_value_dim)  # input norm, gated out norm


class GdnSpec(MixerSpec):
    """The Gated DeltaNet mixer (``cpmem.pricing.kinds.spec``)."""

    name = "gdn"

    def parameters(self, g: ModelGeometry) -> LayerParameters:
        return gdn_parameters(g)

    def trained_tensors(self, g: ModelGeometry, tp: int) -> TrainedTensors:
        """megatron-core's ``GatedDeltaNet``: the in projection (fused with the input
        norm), the causal convolution's kernel (no bias), ``dt_bias``, ``A_log``, the out
        projection sharded over TP; the input norm and the gated output norm (one value
        head wide) whole. Their sum on the rank is ``parameters``'."""
        h, k, v, heads = g.hidden, g.gdn_key_width, g.gdn_value_width, g.gdn_value_heads
        in_proj = h * (2 * k + 2 * v + 2 * heads) // tp
        conv = (2 * k + v) * g.gdn_conv_kernel // tp
        return TrainedTensors(
            weights=(in_proj, conv, v // tp * h),
            norms=tuple(norm_tensors(g, h)),
            extra=(heads // tp, heads // tp, g.gdn_value_dim),
            not_matrices=(1,),  # the causal convolution's [C, 1, K] kernel
            shapes=(((2 * k + 2 * v + 2 * heads) // tp, h), (h, v // tp)),
        )

    def adapter_parameters(self, g: ModelGeometry, adapter: Adapter, layout: ParallelLayout) -> int:
        h, tp = g.hidden, layout.tp
        out = 2 * g.gdn_key_width + 2 * g.gdn_value_width + 2 * g.gdn_value_heads
        widths = {"gdn_in": h + out // tp, "gdn_out": g.gdn_value_width // tp + h}
        return sum(adapter.rank * w for t, w in widths.items() if adapter.adapts(t))

    def reference_width(
        self, g: ModelGeometry, layout: ParallelLayout, adapter: Adapter, core_kept: bool
    ) -> int:
        tp, sp = layout.tp, layout.sp
        return gdn_width(g, tp, sp) + adapters.extra_width(g, adapter, tp, "gdn", sp=sp)

    def tight_widths(self, ctx: TightContext) -> dict[str, int]:
        g, tp = ctx.geometry, ctx.tp
        width = saved_width(g, ctx.common, tp)
        width += adapters.extra_width(g, ctx.step.adapter, tp, "gdn", sp=ctx.sp)
        return {self.name: width}

    def nograd_width(self, g: ModelGeometry, w: TightWidths, step: Step) -> int:
        return nograd_width(g, w)

    def full_backward_peak(self, g: ModelGeometry, w: TightWidths, step: Step, mixer: int) -> int:
        return backward_width(g, w)

    def step_terms(self, step: Step, w: TightWidths, tokens: int, busiest: int) -> dict[str, int]:
        g = step.geometry
        # under full recompute a layer's segment states live only while it (re)runs
        layers = min(1, g.gdn_layers) if step.recompute.one_layer_at_a_time else g.gdn_layers
        per_layer = segment_states_bytes(
            g, rank_segments(step), step.plan.layout.tp, step.dtype_bytes
        )
        return {Component.SEGMENT_STATES: layers * per_layer}

    def cold_backward_bytes(self, step: Step) -> int:
        """The GDN kernels' autotuning buffer in the first backward of a CP run
        (``calibrated.CP_HYBRID_BACKWARD_AUTOTUNE``)."""
        return CP_HYBRID_BACKWARD_AUTOTUNE if step.cold and step.plan.layout.cp > 1 else 0


GDN = GdnSpec()
