"""A dense (SwiGLU) MLP in ``tight``: its saved set, its peak without gradients and its
backward, as the saved-tensor oracle and the rank simulator show them."""

from __future__ import annotations

from cpmem.model.geometry import ModelGeometry
from cpmem.pricing.tight.widths import LORA_SUM_COPIES, TightWidths
from cpmem.step.recompute import Module
from cpmem.step.step import Step

MLP_BACKWARD_COPIES = 3
"""F-multiples the MLP's backward holds on top of its saved set: the down projection's
input gradient formed as the frozen base's gradient plus the LoRA's, summed
(``3 x F/t``, as ``LORA_SUM_COPIES``). The rank simulator under full recompute
(Qwen3.5-4B TP1, 8,192 tokens): the forward+backward peak minus the layer inputs and
the recomputed layer's saved sets is 27,657 elements per token = ``3F`` + 9."""


PLAIN_MLP_SAVED_F = 2
"""F-multiples a plain (ungated) MLP keeps: fc1's output, which the GeLU (fused with the
bias or not: megatron's ``bias_gelu``) or squared ReLU saves, and the activation's output,
fc2's input (Megatron-LM's GPT recordings: ``2F``)."""


def swiglu_saved(geometry: ModelGeometry, compiled: bool) -> int:
    """F-multiples a SwiGLU keeps: 3 fused (input gate‖up and the activation output),
    3 when torch.compile fuses an unfused SwiGLU, 5 for megatron's eager GLU; +2 with
    an activation clamp (its mask and the clamped copy); a plain MLP
    ``PLAIN_MLP_SAVED_F``."""
    if not geometry.gated_mlp:
        return PLAIN_MLP_SAVED_F
    c = 3 if geometry.fused_swiglu or compiled else 5
    if geometry.activation_clamp is not None:
        c += 2
    return c


def core_width(geometry: ModelGeometry, tp: int, compiled: bool) -> int:
    """Elements per token the SwiGLU keeps beyond the common norm/LoRA input."""
    return swiglu_saved(geometry, compiled) * geometry.ffn // tp


def nograd_width(geometry: ModelGeometry, w: TightWidths) -> int:
    """One dense MLP's peak in a pass without gradients (a selective ``mlp``
    checkpoint's forward, full recompute, no-grad) beside its residual input (which a
    selective checkpoint keeps; under full recompute it is mid-layer, live beside the
    kept layer inputs): its norm output and SP-gathered LoRA input (``common`` less the
    layer input) and the gate‖up projection formed as base + LoRA delta + sum
    (``LORA_SUM_COPIES x 2F/t``), or the SwiGLU's own set where wider. Rank simulator,
    Qwen3.5-4B ``core_attn+mlp``, 8,192 tokens, the ``mlp`` component's rise at the
    forward peak: 57,856 elements per token at TP1 (``H + 6F``), 31,488 at TP2
    (``H + H/2 + 6F/2``)."""
    c = max(LORA_SUM_COPIES * 2, swiglu_saved(geometry, compiled=False))
    return w.common - w.layer_input + c * geometry.ffn // w.tp


def backward_buffers(geometry: ModelGeometry, w: TightWidths) -> int:
    """The MLP's backward buffers on top of its saved set (``MLP_BACKWARD_COPIES x F/t``)."""
    return MLP_BACKWARD_COPIES * geometry.ffn // w.tp


def backward_phase(geometry: ModelGeometry, w: TightWidths, step: Step) -> int:
    """Elements per token the MLP's backward holds on top of the retained set and the
    incoming gradient: its backward buffers, with, under an ``mlp`` checkpoint, its
    recomputed set beyond the kept input."""
    phase = backward_buffers(geometry, w)
    if step.recompute.checkpoints(Module.MLP):
        phase += w.mlp - w.layer_input
    return phase
