# mypy: disable-error-code="no-untyped-call,no-any-return"
"""The word embedding's lookup, as megatron-core 0.16 runs it: ``VocabParallelEmbedding
.forward`` inside ``LanguageModelEmbedding.forward`` (tensor_parallel/layers.py,
models/common/embeddings/language_model_embedding.py, installed). Used where a step
looks tokens up and the lookup matters: the MTP depths' shifted tokens (mtp.py) and,
under full training, the decoder's own input (the trained table keeps the ids and makes
a gradient). A LoRA step's decoder input stays runner.py's stand-in.

Restated, not run, because one line needs data: ``masked_input[input_mask] = 0`` and
``output_parallel[input_mask, :] = 0.0`` index with a bool mask (a ``nonzero`` whose
size fake tensors cannot know); ``masked_fill_`` with the same mask writes the same
values in place and its backward keeps the same bool mask. Per token of the rank's ids:

- TP > 1: the bool mask (``input_ < start | input_ >= end``: two bool temporaries and
  their union), ``input_.clone() - start`` (an int64 copy, then the int64 shifted ids),
  the ids' in-place masking;
- the lookup (``F.embedding``: one bf16 row of H per id); where the table trains,
  autograd keeps the ids it read (the shifted copy at TP > 1, the caller's ids at TP 1)
  and, at TP > 1, the bool mask of the output's in-place masking;
- SP: ``reduce_scatter_to_sequence_parallel_region`` (megatron's mapping: tokens / TP
  rows), then ``embeddings.clone()`` (``clone_scatter_output_in_embedding``, on by
  default); else at TP > 1 the in-place all-reduce (nothing allocated).

Backward of a trained table: ``embedding_dense_backward`` makes the dense bf16 gradient
of the rank's V/TP x H table (freed by DDP's hook, training.py); the CUDA kernel's sort
buffers and per-segment partial sums are not modelled. Not modelled either: the learned
position embedding (Megatron-LM's ``learned_absolute`` default; this simulator's
attention layers use rope or none) and the embedding dropout (the residual stream here
is dropout-free).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

BF16 = torch.bfloat16


class _Lookup(torch.autograd.Function):
    """``F.embedding(ids, weight)``: a new (tokens, H) output; where the weight trains the
    node keeps the ids; backward the dense table gradient."""

    @staticmethod
    def forward(ctx: Any, ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(ids)
        ctx.table = weight.shape
        return weight.new_empty((ids.shape[0], weight.shape[1]))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return None, grad.new_empty(ctx.table)


class Embedding(nn.Module):
    """The rank's vocabulary-parallel word embedding table (V/TP x H, V padded) and its
    lookup (module docstring)."""

    def __init__(self, vocab_local: int, hidden: int, tp: int, sp: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_local, hidden, dtype=BF16))
        self.tp, self.sp = tp, sp
        self.start = 0  # the rank's first vocabulary id (values never matter here)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp > 1:
            mask = (ids < self.start) | (ids >= self.start + self.weight.shape[0])
            masked = ids.clone() - self.start
            masked.masked_fill_(mask, 0)
        else:
            mask, masked = None, ids
        out = _Lookup.apply(masked, self.weight)
        del masked
        if mask is not None:
            out.masked_fill_(mask[:, None], 0.0)
        del mask
        if self.sp:
            from megatron.core.tensor_parallel import mappings

            out = mappings.reduce_scatter_to_sequence_parallel_region(out)
            out = out.clone()
        elif self.tp > 1:
            from megatron.core.tensor_parallel import mappings

            out = mappings.reduce_from_tensor_model_parallel_region(out)
        return out
