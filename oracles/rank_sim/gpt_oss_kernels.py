# mypy: disable-error-code="no-untyped-call,no-any-return"
"""Shape-only functions for gpt-oss's two kernels beyond the shared set.

- ``QuickGeLU``: megatron's ``quick_gelu`` (activations.py, x * sigmoid(1.702 x)),
  decorated ``@jit_fuser``, i.e. ``torch.compile`` on torch >= 2.2. Its saved set is
  inductor's: AOTAutograd's min-cut partitioner with inductor's decompositions, traced on
  CPU (torch 2.13), keeps the input alone and recomputes the sigmoid in backward (without
  the decompositions it would also keep the sigmoid). The whole probs-weighted clamped
  GLU traced the same way keeps only the fc1 output and the fp32 probs, which is
  ``moe.WeightedSwiGLU``'s set (the ``--compiled`` path).
- ``AttentionSinks``: the learned per-head sink logit of gpt-oss's attention. HF's eager
  path (``eager_attention_forward`` in modeling_gpt_oss.py) concatenates the sink as one
  extra key column to the scores, softmaxes and drops it, so the output is still
  softmax-weighted values; a flash kernel with sinks (Transformer Engine's
  ``softmax_type="learnable"`` through cuDNN, FlashAttention-3's ``learnable_sink``)
  folds the sink into the row's logsumexp and saves what a plain call saves (q, k, v,
  out, the fp32 lse): the core's saved set is unchanged. What it adds is the sinks'
  gradient, one fp32 value per local query head, allocated in backward. This function
  stands for that: the identity on the core's output, whose backward passes the
  gradient through and allocates the (heads,) fp32 sink gradient.
"""

from __future__ import annotations

from typing import Any

import torch


class QuickGeLU(torch.autograd.Function):
    """x * sigmoid(1.702 x), compiled: saves its input; backward one input-sized buffer."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x.new_empty(x.shape)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return x.new_empty(x.shape)


class AttentionSinks(torch.autograd.Function):
    """The sink term of a flash kernel with learned sinks: ``out`` passes through (a
    view, no allocation); backward allocates the fp32 gradient of the (heads,) sinks."""

    @staticmethod
    def forward(ctx: Any, out: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
        ctx.heads = sinks.shape[0]
        return out.view_as(out)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return grad, grad.new_empty((ctx.heads,), dtype=torch.float32)
