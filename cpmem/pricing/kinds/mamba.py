"""The Mamba-2 mixer (megatron-core 0.16's ``MambaMixer`` in a ``MambaLayer``; HF
``NemotronHMamba2Mixer``): its parameters, trained tensors and adapters (``MAMBA``, its
spec).

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
"""

from __future__ import annotations

from cpmem.model.geometry import ModelGeometry
from cpmem.plan.layout import ParallelLayout
from cpmem.pricing.kinds.spec import MixerSpec, TrainedTensors
from cpmem.pricing.layer_parameters import LayerParameters, norm_parameters, norm_tensors
from cpmem.step.trainer import Adapter


def in_proj_width(g: ModelGeometry) -> int:
    """``in_proj``'s output: z and x (``2d``), B and C (``2GN``), dt (one per head)."""
    return 2 * g.mamba_inner + 2 * g.mamba_groups * g.mamba_state_dim + g.mamba_heads


def conv_channels(g: ModelGeometry) -> int:
    """The causal convolution's channels: x, B and C (``d + 2GN``)."""
    return g.mamba_inner + 2 * g.mamba_groups * g.mamba_state_dim


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
        )

    def adapter_parameters(self, g: ModelGeometry, adapter: Adapter, layout: ParallelLayout) -> int:
        """LoRA on ``in_proj`` (``mamba_in``: ``A`` whole, ``B``'s output sharded) and on
        ``out_proj`` (``mamba_out``: ``A``'s input sharded, ``B`` whole)."""
        h, tp = g.hidden, layout.tp
        widths = {"mamba_in": h + in_proj_width(g) // tp, "mamba_out": g.mamba_inner // tp + h}
        return sum(adapter.rank * w for t, w in widths.items() if adapter.adapts(t))


MAMBA = MambaSpec()
