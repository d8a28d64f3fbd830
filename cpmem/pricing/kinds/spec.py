"""A layer kind's spec: everything cpmem prices about one kind of sub-layer, the one
place the static memory and the policies that price by structure read it from.

A model is a stack of layers (``ModelGeometry.mixers`` and ``mlps``, one entry each per
layer): a token mixer (attention in its variants, Gated DeltaNet, Mamba-2, or none) and a
feed-forward block (a dense MLP, a mixture of experts, or none). Each kind is a
``MixerSpec`` or ``MlpSpec`` in its own module of ``cpmem.pricing.kinds``, registered by
its name (``cpmem.pricing.kinds.mixer_spec`` / ``mlp_spec``), and says:

- its parameters as megatron-core places them (``parameters``: sharded over TP, routed
  experts over EP, replicated), its trained tensors as megatron-core's DDP buffer lays
  them out (``trained_tensors``, ``expert_tensors``: full training), and its LoRA
  adapters' parameters (``adapter_parameters``);
- the reference formula's width (``reference_width``: ART's published one; a kind that
  formula never priced refuses);
- ``tight``'s widths in elements per token: what it keeps for backward
  (``tight_widths``), what a selective checkpoint drops of that and holds again while it
  runs, its peak without gradients, its backward's buffers, and the step-level terms only
  it holds (the rope tables and gathered K/V of attention, the recurrent states of GDN).

A method a kind does not override prices nothing for it (0), or refuses where 0 would be
a silent wrong number (the parameters, the reference's width, full training's tensors).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from cpmem.errors import InputError
from cpmem.model.geometry import ModelGeometry
from cpmem.plan.layout import ParallelLayout
from cpmem.pricing.layer_parameters import NO_PARAMETERS, LayerParameters, Linear
from cpmem.pricing.tight.widths import TightWidths
from cpmem.pricing.widths import LayerWidths
from cpmem.step.recompute import Recompute
from cpmem.step.step import Step
from cpmem.step.trainer import Adapter


@dataclass(frozen=True)
class TrainedTensors:
    """A sub-layer's trained tensors on one TP rank (elements each) but its routed
    experts', by role: a layer's tensors are laid out as its mixer's and its MLP's
    ``weights``, then their ``norms``, then their ``biases``, then their ``extra``
    (per-head norms), the order megatron's distributed-optimizer buffer pads them in
    (``cpmem.pricing.param_buffers``)."""

    weights: tuple[int, ...] = ()
    norms: tuple[int, ...] = ()
    biases: tuple[int, ...] = ()
    extra: tuple[int, ...] = ()
    not_matrices: tuple[int, ...] = ()
    """Positions in ``weights`` that Muon does not step (``cpmem.pricing.muon``): a
    convolution's 3-D kernel, or a projection megatron-core marks ``use_muon=False``. Every
    other weight is a 2-D matrix; norms, biases and ``extra`` are vectors."""
    shapes: tuple[tuple[int, int], ...] | None = None
    """The ``(rows, cols)`` on the rank of each matrix Muon steps (``weights`` but
    ``not_matrices``), as megatron-core's parameter holds it (a column-parallel linear's
    ``[out / TP, in]``, a row-parallel one's ``[out, in / TP]``), in the order the module
    registers them (``named_parameters``: attention's ``linear_proj`` before its
    ``linear_qkv``, ``Attention.__init__`` building it before ``SelfAttention``'s). The
    layer-wise distributed optimizer's layout walks and packs by them
    (``cpmem.pricing.layer_wise_layout``); None where the kind does not list them."""

    def matrix_flags(self) -> list[bool]:
        """Whether each tensor, in the layout's order (weights, norms, biases, extra), is a
        matrix Muon steps."""
        flags = [i not in self.not_matrices for i in range(len(self.weights))]
        return flags + [False] * (len(self.norms) + len(self.biases) + len(self.extra))


NO_TENSORS = TrainedTensors()


@dataclass(frozen=True)
class TightContext:
    """What every kind's ``tight`` saved width reads beside the model and the step: the
    TP degree and SP it is sharded by, whether the base is frozen with adapters
    (``lora``), the widths every sub-layer shares (the input norm's ``common``, Gemma's
    post-norm input ``sandwich``, the residual dropout's ``masks``), whether eager
    attention keeps everything (``eager_none``) and the query multiples the runtime keeps
    beyond the structure (``runtime_q``)."""

    geometry: ModelGeometry
    step: Step
    tp: int
    sp: bool
    lora: bool
    common: int
    sandwich: int
    masks: int
    eager_none: bool
    runtime_q: int


class LayerKindSpec:
    """What a mixer's and an MLP's spec share: the name, the static memory, the
    reference's width and ``tight``'s saved set."""

    name: ClassVar[str]

    def parameters(self, g: ModelGeometry) -> LayerParameters:
        """The sub-layer's parameters with its input norm."""
        raise NotImplementedError

    def trained_tensors(self, g: ModelGeometry, tp: int) -> TrainedTensors:
        """The sub-layer's trained tensors on one TP rank but the routed experts' (full
        training)."""
        raise InputError(
            "training", "full", f"full-parameter training does not price {self.name} layers"
        )

    def adapter_parameters(self, g: ModelGeometry, adapter: Adapter, layout: ParallelLayout) -> int:
        """The trainable parameters of the sub-layer's adapters on one rank."""
        return 0

    def linears(self, g: ModelGeometry) -> tuple[Linear, ...]:
        """The sub-layer's weight matrices as a checkpoint stores them, which a quantized
        checkpoint may hold quantized (``cpmem.pricing.quantized``)."""
        raise InputError(
            "quantized_weights",
            "stored",
            f"a quantized checkpoint's {self.name} layers are not priced as stored "
            "(--quantized-weights dequantized prices them)",
        )

    def reference_width(
        self, g: ModelGeometry, layout: ParallelLayout, adapter: Adapter, core_kept: bool
    ) -> int:
        """The reference formula's elements per token with the step's ``adapter``
        (``core_kept``: no ``core_attn`` checkpoint drops the attention's core)."""
        raise InputError(
            "policy",
            "reference",
            f"ART's published formula prices no {self.name} layer; --policy tight does",
        )

    def tight_widths(self, ctx: TightContext) -> dict[str, int]:
        """``tight``: elements per token the sub-layer keeps for backward, its input norm's
        included, under its own name, with the parts of it a selective checkpoint drops
        or keeps where it has one (``TightWidths``' named parts)."""
        return {self.name: 0}

    def nograd_width(self, g: ModelGeometry, w: TightWidths, step: Step) -> int:
        """``tight``: the sub-layer's peak in a pass without gradients (full recompute, a
        no-grad forward) beside the kept layer inputs."""
        return 0

    def checkpoint_dropped(self, w: TightWidths, step: Step) -> int:
        """``tight``: what the step's selective checkpoint drops of the saved set, per layer
        (0 where no checkpoint covers the sub-layer)."""
        return 0


class MixerSpec(LayerKindSpec):
    """A token mixer: attention in its variants, Gated DeltaNet, Mamba-2, or none."""

    attends: ClassVar[bool] = False
    """Whether the mixer exchanges keys and values over the sequence (CP comm types,
    rotary tables and ``s x s`` scores read it)."""

    def recompute_width(self, g: ModelGeometry, w: TightWidths, step: Step) -> int:
        """Under full recompute: the mixer recomputed with gradients (its saved set, with
        what it holds of other CP ranks while it runs)."""
        return w.of(self.name)

    def recompute_kept(self, g: ModelGeometry, w: TightWidths, step: Step) -> int:
        """Under full recompute: what the recomputed mixer still holds once its forward
        has run, while the layer's feed-forward block recomputes and runs its backward
        (its saved set; what it held only while running is freed)."""
        return self.recompute_width(g, w, step)

    def full_backward_peak(self, g: ModelGeometry, w: TightWidths, step: Step, mixer: int) -> int:
        """Under full recompute: the mixer's own backward moment, beside its recomputed
        width ``mixer`` where it still holds it (0: within the layer's other moment)."""
        return 0

    def backward_phase(self, g: ModelGeometry, w: TightWidths, step: Step) -> int:
        """The last layer's mixer backward on top of the retained set and the incoming
        gradient."""
        return 0

    def forward_transient(self, g: ModelGeometry, w: TightWidths, step: Step) -> int:
        """Elements per token the mixer holds beyond its kept set while its forward runs,
        where the step keeps saved sets (a CP exchange in flight, a kernel's working
        set)."""
        return 0

    def step_terms(self, step: Step, w: TightWidths, tokens: int, busiest: int) -> dict[str, int]:
        """Bytes the step holds for every layer of this kind, beside the per-token widths,
        by component (the rope tables, unfused scores, CP-gathered K/V, recurrent states),
        at the rank's ``tokens`` (``busiest``: the largest rank's, what padded buffers
        hold)."""
        return {}

    def transient_bytes(self, step: Step, tokens: int, busiest: int) -> int:
        """Bytes one layer of this kind holds while it runs beside the per-token transient
        (an unfused core's ``s x s`` working set, CP buffers padded to the largest rank)."""
        return 0

    def retained_padding_bytes(self, step: Step, w: TightWidths, tokens: int, busiest: int) -> int:
        """Bytes every layer of this kind keeps for backward because a CP exchange pads the
        rank's share to the largest (0 on the largest rank)."""
        return 0

    def cold_backward_bytes(self, step: Step) -> int:
        """What the first backward of a process holds inside a layer of this kind
        (kernel autotuning), beside the gradient the last layer receives."""
        return 0


class MlpSpec(LayerKindSpec):
    """A feed-forward block: a dense MLP, a mixture of experts, or none."""

    def expert_tensors(self, g: ModelGeometry, ep: int, etp: int) -> list[int]:
        """The routed experts' trained tensors on one rank (their own buffer)."""
        return []

    def expert_matrix_flags(self, g: ModelGeometry, ep: int, etp: int) -> list[bool]:
        """Whether each of ``expert_tensors`` is a matrix Muon steps (its weights), not a
        vector (its biases)."""
        return []

    def expert_shapes(self, g: ModelGeometry, ep: int, etp: int) -> list[tuple[int, int]]:
        """The ``(rows, cols)`` on the rank of each matrix of ``expert_tensors`` (those
        ``expert_matrix_flags`` marks), in order (``TrainedTensors.shapes``)."""
        return []

    def reference_dropped(self, widths: LayerWidths, recompute: Recompute, layers: int) -> int:
        """The reference's elements per token a selective checkpoint of the block drops
        over its ``layers`` (one recomputes at a time)."""
        return 0

    def forward_transient(self, g: ModelGeometry, w: TightWidths, step: Step) -> int:
        """``tight``: what one block holds at its forward peak beyond the kept set, where
        the step keeps saved sets (a dispatch's buffers, a checkpointed forward)."""
        return 0

    def after_forward(self, g: ModelGeometry, w: TightWidths, step: Step) -> int:
        """Elements per token a block keeps after its forward whatever the recompute
        (beside the saved set where gradients keep one), per layer."""
        return 0

    def full_backward_buffers(self, g: ModelGeometry, w: TightWidths, step: Step) -> int:
        """Under full recompute: the block's backward buffers beside its recomputed saved
        set (with what its recompute holds again)."""
        return 0

    def backward_phase(self, g: ModelGeometry, w: TightWidths, step: Step) -> int:
        """The last layer's block backward on top of the retained set and the incoming
        gradient."""
        return 0


class NoMixer(MixerSpec):
    """A layer without a token mixer (Megatron-LM's hybrid ``-`` and ``E`` layers: an MLP
    or MoE block alone, with its own input norm): nothing to hold or to train."""

    name = "none"

    def parameters(self, g: ModelGeometry) -> LayerParameters:
        return NO_PARAMETERS

    def trained_tensors(self, g: ModelGeometry, tp: int) -> TrainedTensors:
        return NO_TENSORS

    def linears(self, g: ModelGeometry) -> tuple[Linear, ...]:
        return ()

    def reference_width(
        self, g: ModelGeometry, layout: ParallelLayout, adapter: Adapter, core_kept: bool
    ) -> int:
        return 0


class NoMlp(MlpSpec):
    """A layer without a feed-forward block (Megatron-LM's hybrid ``M`` and ``*`` layers:
    a mixer alone): nothing to hold or to train."""

    name = "none"

    def parameters(self, g: ModelGeometry) -> LayerParameters:
        return NO_PARAMETERS

    def trained_tensors(self, g: ModelGeometry, tp: int) -> TrainedTensors:
        return NO_TENSORS

    def linears(self, g: ModelGeometry) -> tuple[Linear, ...]:
        return ()

    def reference_width(
        self, g: ModelGeometry, layout: ParallelLayout, adapter: Adapter, core_kept: bool
    ) -> int:
        return 0


NO_MIXER = NoMixer()
NO_MLP = NoMlp()
