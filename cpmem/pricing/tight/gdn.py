"""A Gated DeltaNet layer in ``tight``: its saved set, its peak without gradients, its
backward workspace, and the recurrent segment states it keeps per gradient segment.

The chunked gated delta rule of fla-core 0.6.0 as the rank simulator lays it out
(oracles/rank_sim/kernels.py), the saved-tensor oracle's widths (oracles/README.md)."""

from __future__ import annotations

from cpmem.model.geometry import ModelGeometry
from cpmem.pricing.reference import segment_state_bytes
from cpmem.pricing.tight.calibrated import SEGMENT_STATES_SPARED
from cpmem.pricing.tight.widths import TightWidths
from cpmem.step.step import Step

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
    return w.gdn + _workspace(geometry, GDN_FORWARD_WORKSPACE_V, 1) // w.tp


def backward_width(geometry: ModelGeometry, w: TightWidths) -> int:
    """Under full recompute, the GDN mixer's backward once its layer's MLP is done: the
    mixer's saved set and its kernel's backward workspace (``GDN_BACKWARD_WORKSPACE_V``
    value-width tensors, two chunk-state tensors)."""
    return w.gdn + _workspace(geometry, GDN_BACKWARD_WORKSPACE_V, 2) // w.tp


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
