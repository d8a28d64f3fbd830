"""The one vocabulary of estimate components, shared by every policy.

A policy's ``Estimate.components`` (and ``forward_backward_components``) are named from
``Component``; a policy uses the names for the terms it prices and need not use all of
them. Admission reads the vocabulary, never a policy's own names: what a forward keeps
until backward (``RETAINED``) is what a request split into sub-forwards keeps once per
part, the rest being workspace live for one part at a time (``split_cost``).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Protocol

OUTSIDE_FIGURE = "not in this figure"
"""How an estimate's note ends when it names memory the figure does not hold (device memory
outside PyTorch's allocator, pinned host memory): the text answer lists those notes as
outside the figure (``outside_figure``)."""


def outside_figure(note: str) -> bool:
    """Whether ``note`` names memory outside the figure (it ends ``OUTSIDE_FIGURE``)."""
    return note.endswith(OUTSIDE_FIGURE)


class Component(StrEnum):
    """Where an estimate's bytes go."""

    RETAINED_ACTIVATIONS = "retained_activations"
    """Activations every layer keeps for backward (per token, over all layers)."""
    SEGMENT_STATES = "segment_states"
    """Recurrent GDN states kept per gradient-enabled segment: they do not shrink with CP."""
    CP_GATHERED_KV = "cp_gathered_kv"
    """Other CP ranks' K and V, all-gathered and saved by the attention kernel."""
    ROPE_TABLES = "rope_tables"
    """The rotary embedding's cos/sin tables, live through backward."""
    ATTENTION_SCORES = "attention_scores"
    """An unfused attention's ``s x s`` probabilities (and dropout mask and output) every
    attention layer keeps for backward where its core is kept."""
    EMBEDDING = "embedding"
    """What the embedding keeps until backward on the rank that embeds: the token ids
    (and learned positions' ids) its lookups save, the embedding dropout's mask."""
    DATALOADER_MASK = "dataloader_mask"
    """The data loader's ``[b, 1, s, s]`` bool attention mask, held while a micro-batch's
    forward runs on the first and last pipeline stages."""
    OUTPUTS = "outputs"
    """The returned outputs (by default the hidden states of the logical tokens)."""
    GATHERED_OUTPUTS = "gathered_outputs"
    """The outputs gathered over CP before they are unpacked."""
    LAYER_TRANSIENT = "layer_transient"
    """What one layer holds while it runs, on top of what is kept."""
    HEAD_KEPT = "head_kept"
    """What the LM head and its loss keep from their forward until backward (the fp32
    softmax, or the hidden states a chunked or fused-linear head recomputes from)."""
    HEAD = "head"
    """What the head holds beyond that at the forward peak, past the layer transient
    (``cpmem.pricing.head``)."""
    BACKWARD_TRANSIENT = "backward_transient"
    """The larger of the forward's transient and the backward's first moment."""
    COLD_SETUP = "cold_setup"
    """Kernel set-up of the first forward of a process."""
    COLD_BACKWARD_SETUP = "cold_backward_setup"
    """Kernel set-up of the first backward of a process."""
    STATIC_FLOOR = "static_floor"
    """The reference's legacy floor, where it exceeds the activations."""
    PROFILE_FLOOR = "profile_floor"
    """A learned profile's floor, where it exceeds everything else."""
    MARGIN_FACTOR = "margin_factor"
    """A policy's multiplicative margin on its sum."""
    MARGIN_ALLOWANCE = "margin_allowance"
    """A policy's fixed allowance."""
    PIPELINE_IN_FLIGHT = "pipeline_in_flight"
    """Under pipeline parallelism: the retained bytes of the other micro-batches' model
    chunks a stage holds in flight (``cpmem.pricing.pipeline``); under the combined 1F1B
    step without stages, what the other micro-batch of the step holds
    (``cpmem.pricing.accumulation``)."""
    PIPELINE_INPUTS = "pipeline_inputs"
    """Under pipeline parallelism: the activation each model chunk off the first virtual
    stage received, kept until that chunk's backward (megatron's ``input_tensors``): one
    layer input per chunk in flight, the current one's included."""
    PIPELINE_BUFFERS = "pipeline_buffers"
    """The activation a stage sends on, or the gradient it receives, while it moves."""
    DEFERRED_WGRAD = "deferred_wgrad"
    """Under megatron's deferred output-layer weight gradient: the output layer's input
    and the logits' gradient of each deferred micro-batch whose backward has run, kept on
    the last stage until the pipeline's drain (``cpmem.pricing.pipeline``)."""
    MTP = "mtp"
    """The multi-token prediction depths' layers, inputs and loss heads, kept from their
    forward (before the main head's) until their backward, on the stage holding the head."""
    FSDP_IN_FLIGHT = "fsdp_in_flight"
    """Under Megatron FSDP: the parameter buckets gathered whole and the gradient buckets
    not yet reduce-scattered while the step runs (``cpmem.pricing.fsdp``); under Torch
    FSDP2 the units gathered, their gradients and reduce-scatter inputs
    (``cpmem.pricing.torch_fsdp2``)."""
    FORWARD_PEAK_EXCESS = "forward_peak_excess"
    """Where the forward peak exceeds the backward's: the step's peak is the forward's."""
    OPTIMIZER_STEP_EXCESS = "optimizer_step_excess"
    """Where the optimizer step's own transient (Muon's Newton-Schulz on its largest
    matrix, ``cpmem.pricing.muon_step``), held after the backward has freed the
    activations, exceeds the forward+backward figure: the step's peak is the optimizer's."""


NAMES: frozenset[str] = frozenset(c.value for c in Component)

RETAINED: frozenset[Component] = frozenset(
    {
        Component.RETAINED_ACTIVATIONS,
        Component.SEGMENT_STATES,
        Component.CP_GATHERED_KV,
        Component.ROPE_TABLES,
        Component.EMBEDDING,
        Component.ATTENTION_SCORES,
        Component.HEAD_KEPT,
        Component.PIPELINE_IN_FLIGHT,
        Component.PIPELINE_INPUTS,
        Component.MTP,
    }
)
"""What a forward keeps until its backward: kept once per part of a split request."""


class HasComponents(Protocol):
    @property
    def components(self) -> Mapping[str, int]: ...


def retained_bytes(estimate: HasComponents) -> int:
    """The bytes of an estimate's forward that stay live until its backward."""
    return sum(b for name, b in estimate.components.items() if name in RETAINED)


def check_names(components: Mapping[str, int], policy: str) -> None:
    """Every component is named from the vocabulary (a policy's own name would be
    invisible to admission)."""
    unknown = sorted(set(components) - NAMES)
    if unknown:
        raise AssertionError(f"policy {policy!r} names components outside Component: {unknown}")
