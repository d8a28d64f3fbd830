"""The Mamba-2 mixer (megatron-core's ``MambaMixer`` in a ``MambaLayer``; HF
``NemotronHMamba2Mixer``): its parameters, trained tensors and adapters, and in ``tight``
its saved set, its forward's working set, its backward and its peak without gradients
(``MAMBA``, its spec).

With ``d = mamba_heads x mamba_head_dim`` the inner width, ``G`` groups, ``N`` the state
size and ``h`` heads, megatron-core builds (``ssm/mamba_mixer.py``):

- ``in_proj`` (a column-parallel linear fused with the layer's input norm): ``H`` to
  ``2d + 2GN + h`` (z, x, B, C and dt), sharded over TP;
- ``conv1d``: a depthwise causal convolution over the ``d + 2GN`` channels x, B and C, its
  kernel and bias, sharded;
- ``dt_bias``, ``A_log`` and ``D`` (one per head), and the gated RMSNorm's ``d`` weight,
  sharded;
- ``out_proj`` (row-parallel, no bias): ``d`` to ``H``.

TP must divide the heads and the groups (``MambaMixer``'s asserts,
``ModelGeometry.check_tp``).

What a layer holds is read off the training path megatron runs (``use_mem_eff_path``, its
default; the recordings' snapshot d98e8a64 ``MambaMixer.forward`` and ``_ssm_training``)
and mamba_ssm's ``MambaSplitConv1dScanCombinedFn`` (state-spaces/mamba e9594ce,
``ops/triton/ssd_combined.py``), which megatron calls without the norm's weight: the scan
gates its output by ``silu(z)`` itself and megatron's gated-group RMSNorm runs after it.
Per token, ``P = 2d + 2GN + h`` the in_proj output, every inner width over TP:

- kept: the in_proj output's contiguous ``[b, l, P]`` copy the function saves
  (``zxbcdt``), the ungated scan output ``out_x`` (``d``), the norm's input (the scan's
  gated output made contiguous again, ``d``) with its fp32 ``rstd`` per group, and the
  norm's output, which out_proj's adapter (or a trained out_proj) saves; the in_proj's
  fused norm saves the layer's norm input and output as every sub-layer's does;
- the forward's working set beyond it: the in_proj output itself (``forward`` still
  holds it while the function runs), the causal conv's output over x, B and C, the
  chunked scan's fp32 ``dt`` and ``dA_cumsum`` (one per head), its chunk states (fp32
  from ``_chunk_state_fwd``, then the passed bf16 ones: ``d x N`` per chunk), the fp32
  ``C·Bᵀ`` per chunk and group, and the gated output;
- the backward's working set beside the saved set: the conv output recomputed, the
  gradient of the in_proj output (``dzxbcdt``) and of the conv's input and output, the
  gradient out of the gate, the recomputed fp32 states and their gradients, ``C·Bᵀ`` and
  its gradient, and the per-head fp32 terms.
"""

from __future__ import annotations

from cpmem.model.geometry import ModelGeometry
from cpmem.plan.layout import ParallelLayout
from cpmem.pricing import adapters
from cpmem.pricing.kinds.spec import MixerSpec, TightContext, TrainedTensors
from cpmem.pricing.layer_parameters import LayerParameters, norm_parameters, norm_tensors
from cpmem.pricing.tight.widths import LORA_SUM_COPIES, TightWidths
from cpmem.step.step import Step
from cpmem.step.trainer import Adapter

KEPT_INNER_D = 3
"""``d``-wide tensors a Mamba-2 layer keeps beside the saved in_proj output: the ungated
scan output ``out_x``, the gated output the group RMSNorm saves as its input, and that
norm's output, out_proj's input (saved by its adapter's ``A``, or by a trained
out_proj)."""

FP32 = 2
"""bf16-equivalent elements of one fp32 value."""

LORA_ACTIVATIONS = 2
"""The harness's rank-1 ``A·x`` on in_proj and on out_proj."""

STATE_TENSORS_FORWARD = 1
"""Chunk-state tensors live at the scan forward's last allocation, in bf16-equivalents of
one ``d x N`` state per chunk: the passed states ``_state_passing_fwd`` returns in the
input's dtype (the fp32 ones of ``_chunk_state_fwd`` are freed by then). The rank
simulator's stand-in (oracles/rank_sim/mamba_kernels.py, its README's "Mamba-2")
allocates and frees each buffer where mamba_ssm's host code names it."""

STATE_TENSORS_BACKWARD = 4
"""Chunk-state tensors the scan's backward holds at once, in bf16-equivalents of one
``d x N`` state per chunk: the recomputed fp32 states (2), the passed states and their
gradient ``dstates`` in the input's dtype (1 each)."""

PER_HEAD_FORWARD = 2 * FP32
"""bf16-equivalent elements per head and token the scan's forward holds: the fp32
``dt`` after softplus and ``dA_cumsum``."""

PER_HEAD_BACKWARD = 5 * FP32
"""bf16-equivalent elements per head and token the scan's backward holds: the cloned and
recomputed fp32 ``dt`` and ``dA_cumsum``, ``ddt`` and the ``ddA`` terms."""

CONV_TENSORS_BACKWARD = 3
"""``d + 2GN``-wide tensors the backward holds beside the saved set: the conv's output
recomputed, the gradient of its output (``dxBC``) and the conv backward's gradient of
its input."""

CB_TENSORS_FORWARD = 1
CB_TENSORS_BACKWARD = 2
"""fp32 ``C·Bᵀ`` blocks (``chunk x chunk`` per chunk and group) the forward holds
(``_bmm_chunk_fwd``) and the backward (recomputed, and its gradient ``dCB``)."""


def in_proj_width(g: ModelGeometry) -> int:
    """``in_proj``'s output: z and x (``2d``), B and C (``2GN``), dt (one per head)."""
    return 2 * g.mamba_inner + 2 * g.mamba_groups * g.mamba_state_dim + g.mamba_heads


def conv_channels(g: ModelGeometry) -> int:
    """The causal convolution's channels: x, B and C (``d + 2GN``)."""
    return g.mamba_inner + 2 * g.mamba_groups * g.mamba_state_dim


def inner(g: ModelGeometry) -> int:
    """``d``: the inner width."""
    return g.mamba_inner


def saved_core(g: ModelGeometry, tp: int) -> int:
    """Elements per token the mixer keeps beyond its input norm's set: the in_proj
    output, ``KEPT_INNER_D`` inner-wide tensors, the gated norm's fp32 ``rstd`` per group
    and the input norm's per token, and the two rank-1 adapters' activations."""
    rstd = FP32 * (g.mamba_groups + 1)
    return (in_proj_width(g) + KEPT_INNER_D * inner(g) + rstd) // tp + LORA_ACTIVATIONS


def states_per_token(g: ModelGeometry) -> int:
    """One ``d x N`` chunk state per chunk, spread over the chunk's tokens."""
    return inner(g) * g.mamba_state_dim // g.mamba_chunk


def cb_per_token(g: ModelGeometry) -> int:
    """One fp32 ``chunk x chunk`` block per chunk and group, per token."""
    return FP32 * g.mamba_groups * g.mamba_chunk


def scan_moment(g: ModelGeometry, tp: int) -> int:
    """Elements per token at the scan forward's last allocation beside the layer's input
    norm: the in_proj output ``forward`` still holds, the conv output, the per-head fp32
    terms, the passed chunk states, ``C·Bᵀ``, ``out_x`` and the gated output (the rank
    simulator: ``W + (d + 2GN) + 4h + dN/Q + 2GQ + 2d``, over TP)."""
    width = in_proj_width(g) + conv_channels(g) + 2 * inner(g)
    width += PER_HEAD_FORWARD * g.mamba_heads + STATE_TENSORS_FORWARD * states_per_token(g)
    return (width + CB_TENSORS_FORWARD * cb_per_token(g)) // tp


def forward_working_set(g: ModelGeometry, tp: int) -> int:
    """Elements per token the scan's forward holds beside what the layer keeps: its
    moment less ``out_x``, which the layer keeps."""
    return scan_moment(g, tp) - inner(g) // tp


def backward_working_set(g: ModelGeometry, tp: int) -> int:
    """Elements per token the mixer's backward holds beside its saved set and the incoming
    gradient: the in_proj output's gradient, ``CONV_TENSORS_BACKWARD`` conv-wide tensors,
    the gate's gradient out, the chunk states and their gradients, ``C·Bᵀ`` and its
    gradient, the per-head fp32 terms."""
    width = in_proj_width(g) + CONV_TENSORS_BACKWARD * conv_channels(g) + inner(g)
    width += PER_HEAD_BACKWARD * g.mamba_heads + STATE_TENSORS_BACKWARD * states_per_token(g)
    return (width + CB_TENSORS_BACKWARD * cb_per_token(g)) // tp


class MambaSpec(MixerSpec):
    """The Mamba-2 mixer (``cpmem.pricing.kinds.spec``)."""

    name = "mamba"

    def parameters(self, g: ModelGeometry) -> LayerParameters:
        h, d = g.hidden, g.mamba_inner
        conv = conv_channels(g) * (g.mamba_conv_kernel + 1)  # kernel and bias
        per_head = 3 * g.mamba_heads  # dt_bias, A_log, D
        sharded = h * in_proj_width(g) + conv + per_head + d + d * h
        return LayerParameters(sharded, 0, norm_parameters(g, h))

    def trained_tensors(self, g: ModelGeometry, tp: int) -> TrainedTensors:
        h, d = g.hidden, g.mamba_inner
        channels = conv_channels(g) // tp
        heads = g.mamba_heads // tp
        return TrainedTensors(
            weights=(h * in_proj_width(g) // tp, channels * g.mamba_conv_kernel, d // tp * h),
            norms=tuple(norm_tensors(g, h)),
            extra=(channels, heads, heads, heads, d // tp),
            # in_proj marked use_muon=False (mamba_mixer.py:309), the [C, 1, K] conv kernel
            not_matrices=(0, 1),
            shapes=((h, d // tp),),
        )

    def adapter_parameters(self, g: ModelGeometry, adapter: Adapter, layout: ParallelLayout) -> int:
        """LoRA on ``in_proj`` (``mamba_in``: ``A`` whole, ``B``'s output sharded) and on
        ``out_proj`` (``mamba_out``: ``A``'s input sharded, ``B`` whole)."""
        h, tp = g.hidden, layout.tp
        widths = {"mamba_in": h + in_proj_width(g) // tp, "mamba_out": g.mamba_inner // tp + h}
        return sum(adapter.rank * w for t, w in widths.items() if adapter.adapts(t))

    def tight_widths(self, ctx: TightContext) -> dict[str, int]:
        g, tp = ctx.geometry, ctx.tp
        width = ctx.common + ctx.masks + saved_core(g, tp)
        width += adapters.extra_width(g, ctx.step.adapter, tp, "mamba", sp=ctx.sp)
        return {self.name: width}

    def nograd_width(self, g: ModelGeometry, w: TightWidths, step: Step) -> int:
        """Without gradients, beside the kept layer inputs: the in_proj output formed as
        base + LoRA delta + sum (``LORA_SUM_COPIES``) beside the norm's local and gathered
        output, or the scan's moment beside the norm's output, whichever is larger (the
        rank simulator's two no-grad moments: ``H/t + H + 3W/t`` and
        ``H/t + scan_moment``)."""
        tp = w.tp
        norm = g.hidden // tp
        forming = norm + g.hidden + LORA_SUM_COPIES * in_proj_width(g) // tp
        return max(forming, norm + scan_moment(g, tp))

    def forward_transient(self, g: ModelGeometry, w: TightWidths, step: Step) -> int:
        return forward_working_set(g, w.tp) if step.recompute.keeps_saved_sets else 0

    def full_backward_peak(self, g: ModelGeometry, w: TightWidths, step: Step, mixer: int) -> int:
        return mixer + backward_working_set(g, w.tp)

    def backward_phase(self, g: ModelGeometry, w: TightWidths, step: Step) -> int:
        return backward_working_set(g, w.tp)


MAMBA = MambaSpec()
