"""The dense MLP (SwiGLU, GeLU or squared ReLU): its parameters and adapters, the
reference's width, and in ``tight`` its saved set, its peak without gradients and its
backward, as the saved-tensor oracle and the rank simulator show them (``DENSE``, its
spec)."""

from __future__ import annotations

from cpmem.model.geometry import ModelGeometry
from cpmem.plan.layout import ParallelLayout
from cpmem.pricing import adapters
from cpmem.pricing.kinds.discarded import layernorm_dropped
from cpmem.pricing.kinds.fp8 import dense_fp8_width
from cpmem.pricing.kinds.linears import mlp_linears
from cpmem.pricing.kinds.spec import MlpSpec, TightContext, TrainedTensors
from cpmem.pricing.layer_parameters import (
    LayerParameters,
    Linear,
    fc1_width,
    sublayer_norm_parameters,
    sublayer_norm_tensors,
)
from cpmem.pricing.tight.widths import LORA_SUM_COPIES, TightWidths
from cpmem.pricing.widths import LayerWidths, mlp_width
from cpmem.step.recompute import Module, Recompute
from cpmem.step.step import Step
from cpmem.step.trainer import Adapter

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
        phase += w.of("dense") - w.layer_input
    return phase


def mlp_norms(g: ModelGeometry) -> int:
    """The feed-forward sub-layer's own norms: its pre-MLP norm, any post-MLP norm
    (``sublayer_norm_parameters``)."""
    return sublayer_norm_parameters(g)


class DenseSpec(MlpSpec):
    """The dense MLP (``cpmem.pricing.kinds.spec``)."""

    name = "dense"

    def parameters(self, g: ModelGeometry) -> LayerParameters:
        """fc1 (gate and up where gated) and fc2 sharded over TP, with their biases where
        the model has them (fc2's whole), the norms replicated."""
        h, fc1 = g.hidden, fc1_width(g, g.ffn)
        bias = fc1 if g.mlp_bias else 0
        return LayerParameters((fc1 + g.ffn) * h + bias, 0, mlp_norms(g) + (h if g.mlp_bias else 0))

    def linears(self, g: ModelGeometry) -> tuple[Linear, ...]:
        return mlp_linears(g, g.ffn, "mlp")

    def trained_tensors(self, g: ModelGeometry, tp: int) -> TrainedTensors:
        h, fc1 = g.hidden, fc1_width(g, g.ffn)
        return TrainedTensors(
            weights=(fc1 * h // tp, h * g.ffn // tp),
            norms=sublayer_norm_tensors(g),
            biases=(fc1 // tp, h) if g.mlp_bias else (),
            shapes=((fc1 // tp, h), (h, g.ffn // tp)),
        )

    def adapter_parameters(self, g: ModelGeometry, adapter: Adapter, layout: ParallelLayout) -> int:
        h, tp = g.hidden, layout.tp
        widths = {"fc1": h + 2 * g.ffn // tp, "fc2": g.ffn // tp + h}
        return sum(adapter.rank * w for t, w in widths.items() if adapter.adapts(t))

    def reference_width(
        self, g: ModelGeometry, layout: ParallelLayout, adapter: Adapter, core_kept: bool
    ) -> int:
        tp, sp = layout.tp, layout.sp
        return mlp_width(g, tp, sp) + adapters.extra_width(g, adapter, tp, "mlp", sp=sp)

    def reference_dropped(self, widths: LayerWidths, recompute: Recompute, layers: int) -> int:
        if not recompute.checkpoints(Module.MLP):
            return 0
        return (layers - 1) * (widths.of(self.name) - widths.layer_input)

    def tight_widths(self, ctx: TightContext) -> dict[str, int]:
        g, step, tp = ctx.geometry, ctx.step, ctx.tp
        mlp_core = core_width(g, tp, step.compiled)
        mlp_core += adapters.extra_width(g, step.adapter, tp, "mlp", sp=ctx.sp)
        kept = ctx.common + ctx.sandwich + ctx.masks + mlp_core + dense_fp8_width(ctx)
        return {self.name: kept, "mlp_core": mlp_core}

    def checkpoint_dropped(self, w: TightWidths, step: Step) -> int:
        if not step.recompute.checkpoints(Module.MLP):
            # a pre-MLP norm of its own (the local spec) under ``layernorm``
            return layernorm_dropped(step.geometry, step, w.tp, "dense")
        return w.of(self.name) - w.layer_input

    def nograd_width(self, g: ModelGeometry, w: TightWidths, step: Step) -> int:
        # the MLP's residual input is mid-layer: no checkpoint keeps it
        return nograd_width(g, w) + w.layer_input

    def forward_transient(self, g: ModelGeometry, w: TightWidths, step: Step) -> int:
        # the checkpointed MLP's forward runs without gradients, beside the residual
        # input the checkpoint keeps
        return nograd_width(g, w) if step.recompute.checkpoints(Module.MLP) else 0

    def full_backward_buffers(self, g: ModelGeometry, w: TightWidths, step: Step) -> int:
        return backward_buffers(g, w)

    def backward_phase(self, g: ModelGeometry, w: TightWidths, step: Step) -> int:
        rebuilt = 0 if step.recompute.checkpoints(Module.MLP) else self.checkpoint_dropped(w, step)
        return backward_phase(g, w, step) + rebuilt


DENSE = DenseSpec()
