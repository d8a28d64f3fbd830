"""The LM head and its loss, on one CP rank for its own tokens: what every policy adds
where a trainer's step ends with a head instead of returning the hidden states.

The head runs after the last layer, on the rank's own tokens (under SP the sequence is
gathered first, so each TP rank holds the logits of all its CP tokens, ``V/t`` columns of
the vocabulary); the loss is reduced, so nothing is gathered over CP. Three moments:

- ``kept``: what it holds from its forward until its backward (beside the layers' kept
  activations);
- ``forward``: what it holds beyond ``kept`` at its forward peak (the last layer's
  transient is gone by then);
- ``backward``: what its backward holds at once, the first moment of the step's backward.

Sources (restated): megatron-core 0.16 ``tensor_parallel/layers.py`` (a frozen output
layer runs ``LinearWithFrozenWeight``, which saves only the weight),
``tensor_parallel/cross_entropy.py`` (``vocab_parallel_logits.float()`` is a new fp32
copy; ``exp`` and the division run in place; ``save_for_backward(exp_logits,
target_mask, masked_target_1d)`` keeps the fp32 softmax; the backward builds the
gradient in that buffer and autograd casts it back to bf16), ``fusions/
fused_cross_entropy.py`` (the same upcast and the same softmax kept; its helpers
compiled by ``jit_fuser``, which adds fp32 buffers by the container's PyTorch:
``fused_loss_bytes``, ``cpmem.step.torch_build``); chunked
log-probs recomputed per chunk in backward (verl's ``FusedLinearForPPO``); a fused linear
cross entropy (Wijmans et al. 2024, Cut Cross Entropy: saves the hidden states and an
fp32 log-sum-exp per token, never the logits). The rank simulator runs or restates each
(oracles/rank_sim/README.md); tests/oracle holds these terms to it.
"""

from __future__ import annotations

from dataclasses import dataclass

from cpmem.pricing.widths import sp_divisor
from cpmem.step.step import Step
from cpmem.step.torch_build import torch_build

FP32 = 4
INT64 = 8
LOGIT_FORWARD_BYTES = 2
"""Bytes per logit at the head's forward peak beyond what it keeps: the bf16 logits the
output layer returns, live beside the fp32 copy ``.float()`` makes (the softmax is built
in place in that copy, which is what is kept). None of fp32 logits: ``.float()`` returns
the tensor itself (``tensor_parallel/cross_entropy.py:25`` at 4828d651), whose softmax is
built in it in place (:42, :62)."""
LOGIT_KEPT_BYTES = FP32
"""Bytes per logit kept until backward: the fp32 softmax."""
LOGIT_BACKWARD_BYTES = FP32 + 2
"""Bytes per logit in the head's backward: the fp32 gradient built in the kept softmax's
buffer and its bf16 cast, which the output layer's backward reads; of fp32 logits the
gradient alone (``FP32``: no cast, the ``.float()`` of the forward being the identity)."""
FUSED_BACKWARD_COPY_BYTES = FP32
"""Bytes per logit the compiled fused loss's backward holds beyond the unfused one's:
inductor scatters ``calculate_gradients``' in-place update of the saved softmax into a new
fp32 copy and writes it back, so the softmax, the copy and the bf16 gradient are live
together (10 B per logit; ``TorchBuild.compiled_backward_copy``)."""
FUSED_FORWARD_COPY_BYTES = FP32
"""Bytes per logit PyTorch 2.2's compiled forward adds: the in-place ``exp`` of
``calculate_predicted_logits`` computed into a new fp32 buffer beside the fp32 copy it is
written back into (``TorchBuild.compiled_forward_in_place`` false)."""
AUTOTUNE_CLONE_BYTES = FP32
"""Bytes per logit a PyTorch before 2.6 adds at the first launch of the fused loss's
mutating pointwise kernels (the forward's in-place division, the backward's write-back into
the softmax): the device clone of the fp32 buffer each mutates while its configs are
benchmarked (``TorchBuild.autotune_clones_on_device``). A first-micro-batch transient,
priced on every step: the first step lacks only the optimizer's moments (made lazily at
its end), so the figure covers it by at most those."""
SOFTCAP_KEPT_BYTES = 2
"""Bytes per logit a final logit soft-capping ``cap * tanh(logits / cap)`` (Gemma 2's
``final_logit_softcapping``, applied to the bf16 logits before the loss upcasts them)
keeps until backward: ``tanh``'s bf16 output, which its backward reads
(``1 - tanh²``); the two scalings save nothing. At the forward peak the capped logits
take the plain logits' place (``LOGIT_FORWARD_BYTES``); in backward each of the three
steps replaces the gradient it reads, never above the loss's own
``LOGIT_BACKWARD_BYTES``."""
TOKEN_KEPT_BYTES = INT64 + 1 + INT64 + FP32
"""Bytes per token the loss keeps beside the logits: the int64 labels, the bool target
mask, the int64 masked target and the fp32 per-token loss."""
CHUNK_FORWARD_BYTES = 4 * FP32
"""Bytes per logit of one chunk at the chunked head's forward peak (verl's
``_fused_linear_for_ppo_fwd`` op order): the fp32 logits (the bf16 matmul output freed
once upcast), the softmax, the log-softmax and, for the entropy, ``probs * logits``."""
CHUNK_BACKWARD_BYTES = 5 * FP32
"""Bytes per logit of one recomputed chunk in the chunked head's backward (verl's
``_fused_linear_for_ppo_bwd``): the fp32 logits and softmax recomputed, the one-hot
targets, ``one_hot - probs`` and the fp32 gradient it scales into."""
VOCAB_DIVISOR = 128
"""Megatron pads the vocabulary to a multiple of 128 x TP (``make_vocab_size_divisible_by``'s
default, ``ModelGeometry.vocab_multiple``) so that every TP rank holds an equal shard."""


@dataclass(frozen=True)
class HeadBytes:
    """The head's three moments on one rank, in bytes (all 0 without a head)."""

    kept: int = 0
    forward: int = 0
    backward: int = 0


def vocab_shard(step: Step) -> int:
    """Vocabulary columns of the output layer on one TP rank: ``V/t`` of the vocabulary
    padded to a multiple of ``vocab_multiple x TP``."""
    tp = step.plan.layout.tp
    multiple = step.geometry.vocab_multiple * tp
    return -(-step.geometry.vocab // multiple) * multiple // tp


def fused_loss_bytes(step: Step) -> tuple[int, int]:
    """Bytes per logit megatron's fused cross entropy holds beyond the unfused one at the
    head's forward and backward moments, in the step's container (its PyTorch compiles the
    loss's helpers: ``cpmem.step.torch_build``): (0, 4) from PyTorch 2.6 (every NGC image
    from 25.01), (4, 8) on 2.5 (NGC 24.10), (8, 8) on 2.2 (NGC 24.01)."""
    build = torch_build(step.settings.runtime.container)
    clone = AUTOTUNE_CLONE_BYTES if build.autotune_clones_on_device else 0
    forward = clone + (0 if build.compiled_forward_in_place else FUSED_FORWARD_COPY_BYTES)
    backward = clone + (FUSED_BACKWARD_COPY_BYTES if build.compiled_backward_copy else 0)
    return forward, backward


def head_input_bytes(step: Step, tokens: int) -> int:
    """The final norm's output the head reads: the rank's tokens, and under SP also the
    local shard it was gathered from."""
    layout = step.plan.layout
    s = sp_divisor(layout.tp, layout.sp)
    h, b = step.geometry.hidden, step.dtype_bytes
    return tokens * h * b + (tokens // s * h * b if s > 1 else 0)


def keeps_norm_input(step: Step) -> bool:
    """Whether the head's kept bytes hold the final norm's saved input (a trained output
    layer's, ``trained_head_bytes``): the last layer's output, or in a pipeline chunk of
    the loss alone the activation the chunk received."""
    return not step.head.returns_hidden and step.settings.training == "full"


def trained_head_bytes(step: Step, tokens: int) -> HeadBytes:
    """What a trained output layer adds to a frozen one's moments (full-parameter
    training; 0 for LoRA, whose output layer is megatron's ``LinearWithFrozenWeight`` and
    saves only its weight): it keeps its input, the final norm's output on the rank's
    sequence shard, beside the norm's own saved input (``2H/s`` per token: megatron's
    ``LinearWithGradAccumulationAndAsyncCommunication`` saves the local shard and gathers
    it again in backward)."""
    settings = step.settings
    if settings.training != "full":
        return HeadBytes()
    layout = step.plan.layout
    h, b = step.geometry.hidden, step.dtype_bytes
    norm = 2 * tokens // sp_divisor(layout.tp, layout.sp) * h * b
    return HeadBytes(kept=norm, backward=norm)  # backward: a moment, the kept included


def head_bytes(step: Step, tokens: int) -> HeadBytes:
    """The head's moments for a rank holding ``tokens`` model tokens."""
    head = step.head
    if head.returns_hidden:
        return HeadBytes()
    trained = trained_head_bytes(step, tokens)
    frozen = _frozen_head_bytes(step, tokens)
    return HeadBytes(
        kept=frozen.kept + trained.kept,
        forward=frozen.forward + trained.forward,
        backward=frozen.backward + trained.backward,
    )


def _frozen_head_bytes(step: Step, tokens: int) -> HeadBytes:
    """The head's moments with a frozen output layer."""
    head = step.head
    vt = vocab_shard(step)
    h, b = step.geometry.hidden, step.dtype_bytes
    read = head_input_bytes(step, tokens)
    grad_in = tokens * h * b  # the gradient the head hands the last layer
    per_token = tokens * TOKEN_KEPT_BYTES
    if head.kind in ("logits", "fused"):
        logits = tokens * vt
        softcap = logits * SOFTCAP_KEPT_BYTES if step.geometry.final_logit_softcap else 0
        forward, backward = fused_loss_bytes(step) if head.kind == "fused" else (0, 0)
        upcast = b < FP32  # bf16 / fp16 logits copied to fp32; fp32 ones used as they are
        return HeadBytes(
            kept=logits * LOGIT_KEPT_BYTES + per_token + softcap,
            forward=read + logits * ((LOGIT_FORWARD_BYTES if upcast else 0) + forward),
            backward=logits * ((LOGIT_BACKWARD_BYTES if upcast else FP32) + backward) + grad_in,
        )
    hidden_kept = tokens * h * b  # the head's input, saved to recompute the logits
    if head.kind == "chunked":
        assert head.chunk is not None
        chunk = min(head.chunk, tokens) * vt
        capped = SOFTCAP_KEPT_BYTES if step.geometry.final_logit_softcap else 0
        return HeadBytes(  # one chunk's logits at a time, recomputed in backward
            kept=hidden_kept + per_token,
            forward=read + chunk * (CHUNK_FORWARD_BYTES + capped),
            backward=hidden_kept + chunk * (CHUNK_BACKWARD_BYTES + capped) + grad_in,
        )
    # linear-ce: the hidden states and an fp32 log-sum-exp per token; blockwise logits only
    return HeadBytes(kept=hidden_kept + per_token, forward=read, backward=grad_in)
