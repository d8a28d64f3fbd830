"""What ``tight`` takes from the measured cells rather than from a saved-tensor count.

Every other constant of the policy counts tensors the oracles and the rank simulator
show (``attention``, ``gdn``, ``mlp``, ``moe``). These were chosen from measured golden
cells, each with the cells that chose it; the fitted margin is the last of them. A test
states each one's evidence and fails when the constant moves
(tests/unit/pricing/test_tight_calibrated.py, tests/unit/pricing/test_constant_facts.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from cpmem.pricing.cold import COLD_SETUP
from cpmem.units import MIB

__all__ = [
    "COLD_SETUP",
    "CP_HYBRID_BACKWARD_AUTOTUNE",
    "EAGER_NONE_GATED",
    "LOSS_BACKWARD_OUTPUTS",
    "MARGIN",
    "MOE_COMPILED_ROW_FP32_F",
    "NO_MARGIN",
    "SEGMENT_STATES_SPARED",
    "UNGATED_RUNTIME_Q",
    "Margin",
    "runtime_margin",
]

LOSS_BACKWARD_OUTPUTS = 6
"""The mean-square loss's backward, in multiples of the returned bf16 outputs: the
forward+backward peak minus the bytes retained after forward is 6.00 x outputs on every
golden cell of >= 2,048 tokens that records both and whose backward transient is smaller
(12 bytes per output element: the fp32 upcast, its fp32 gradient and the bf16 gradient
handed to the last layer). Under CP the loss runs over the returned outputs, gathered and
unpacked to the logical tokens, on every rank: the rank simulator's CP rows back it
through all of them (``qwen3-1.7b:tp4:cp4:pair-16k:none``, rank 0: four bf16 copies of the
32,768 logical outputs); the measured CP 2 cells peak in forward and cannot tell."""

CP_HYBRID_BACKWARD_AUTOTUNE = 256 * MIB
"""Triton's benchmark buffer (``get_empty_cache_for_benchmark``: 256 MiB, allocated while
an autotuned kernel is timed) during the first backward of a CP run of a hybrid model,
whose GDN kernels autotune there: the 4B CP2 64+64 cell's backward rises 279.5 MiB above
its forward peak where its retained set and loss explain about 24 MiB. Inferred from that
one cell and the buffer's size, not read off a trace; priced when cold."""

EAGER_NONE_GATED = 2
"""Q-multiples eager gated attention keeps without a ``core_attn`` checkpoint (the query
before the qk-norm and before the rope, which a compiled run fuses away). Measured: the 4B
CP2 cells without recompute exceed the ``core_attn`` cells of the same shape, at the
forward peak, by 8,256 elements per rank token per attention layer beyond the other rank's
gathered K/V on both shapes (4,096+4,096 and 2,048+2,048), ``2Q`` = 8,192. The 27B compiled cells without recompute match
``core_attn``. Not priced on ungated attention: no ungated cell without recompute was
measured, and the rank simulator's ungated attention keeps the same set with and without
the checkpoint (Qwen3-1.7B TP1: 15,444 elements per token per layer either way, less the
softmax statistics)."""

UNGATED_RUNTIME_Q = 1
"""Q-multiples the measured runtime keeps per ungated attention layer beyond the rank
simulator's structure (oracles/rank_sim/README.md "The miss": Qwen3-1.7B TP2 cells, eager
and compiled, 1,160 elements per token per layer above the simulator where ``Q/t`` =
1,024; the CP2 cell 2.8% under without it). Which tensor it is was not found; priced on
ungated attention only (the gated 27B/4B match the simulator within 1%)."""

MOE_COMPILED_ROW_FP32_F = 2
"""F_e-multiples (bf16 elements) the measured compiled MoE runs keep per expert row
beyond the fused set: one fp32 ``F_e`` tensor. oracles/rank_sim/README.md "MoE",
"Balanced (compiled) cells": against the measured ``core_attn+moe`` cells of the same
routing the simulator's compiled ``core_attn`` cells are short by about 2 KB per expert row
(0.5-0.7 GiB at every size), i.e. ``2·F_e`` bf16 elements at F_e = 512. Which tensor it
is (an inductor fp32 intermediate, or uneven natural routing) was not resolved; priced on
compiled runs only, where it was measured."""

SEGMENT_STATES_SPARED = 1
"""Segment states a GDN layer does not keep out of the ``2n`` (initial and final per
segment, ``gdn.SEGMENT_STATES_PER_SEGMENT``) for ``n`` segments: ``2n - 1``, the rank's
first segment starting from no state (fla's ``initial_state=None`` saves none). Measured
(warm forward peak minus the structure without states, in one-state units): the
two-segment ``core_attn+mlp`` cells hold 2.9 (27B TP4 64+64) and 2.8 (4B TP2 128+128); the
eight-segment 27B TP2 cells 10.6 (8 x 64) and 13.1 (8 x 256), under the 15 priced. The
rank simulator keeps one per root piece and one per parent piece (2 for two roots), below
what the measured 27B cells hold (docs/tight.md "Segment states"). The count is the one
of ``2n``, ``2n - 1``, ``1.5n`` and ``n + 1`` that the measured cells and the
cross-validation support (8 held-out misses; 14 for ``1.5n``, 15 for ``n + 1``): an upper
envelope of what the cells hold, not a traced mechanism."""


@dataclass(frozen=True)
class Margin:
    """The policy's fitted constants: ``forward_factor`` on each structural sum plus a
    fixed allowance for the forward, one for every backward, and one for the cold set-up
    of the first backward of a process (``cpmem.calibration.fitting.fit_margin``)."""

    forward_factor: float
    forward_allowance: int
    backward_allowance: int
    cold_backward_allowance: int


MARGIN = Margin(
    forward_factor=1.04,
    forward_allowance=26 * MIB,
    backward_allowance=13 * MIB,
    cold_backward_allowance=97 * MIB,
)
"""Fitted on every measured rank-sample (docs/tight.md); the gate checks that refitting
reproduces it and cross-validates it by model, shape and recompute mode."""

NO_MARGIN = Margin(
    forward_factor=1.0, forward_allowance=0, backward_allowance=0, cold_backward_allowance=0
)
"""No margin: every term a tensor read from the runtime's source."""


def runtime_margin(fitted: bool) -> Margin:
    """The margin a runtime's steps are priced with (``Runtime.fitted_margin``): ART's,
    fitted on its measured cells; none for Megatron-LM's, whose recordings no constant of
    ``tight`` was fitted to (the gate's Megatron-LM tier holds the unmargined structure to
    them)."""
    return MARGIN if fitted else NO_MARGIN
