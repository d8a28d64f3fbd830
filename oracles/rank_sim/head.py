# mypy: disable-error-code="no-untyped-call,no-any-return"
"""The LM head and its loss (``head``): what the last pipeline stage runs after the
decoder, for the rank's own CP tokens.

- ``hidden`` (the calibration harness, the default; not in this module): the final
  hidden states gathered over SP and CP, unpacked, mean-square loss (runner.py).
- ``logits``: the final RMSNorm (fused kernel, frozen weight), then megatron-core
  0.16's own ``tensor_parallel.ColumnParallelLinear`` as ``GPTModel.output_layer`` builds
  it (vocabulary-parallel, ``gather_output=False``, no bias, frozen weight; with tied
  embeddings ``skip_weight_param_allocation`` and the embedding's weight passed at call
  time, as ``GPTModel`` does). Under SP its ``linear_with_frozen_weight`` gathers the
  sequence first, so every TP rank holds bf16 logits ``[tokens, V/TP]`` for all its CP
  tokens; ``LinearWithFrozenWeight`` saves no input. Then megatron's own
  ``tensor_parallel.cross_entropy.vocab_parallel_cross_entropy`` on them: its
  ``.float()`` copy (4 B per logit, alongside the 2 B bf16 logits: ~6 B per logit at the
  head's forward peak), ``exp`` and the division in place, ``save_for_backward`` of
  that fp32 softmax (4 B per logit kept until backward), whose backward builds the
  gradient in the same buffer; autograd's cast back to bf16 adds a bf16 gradient.
- ``fused``: megatron's own ``fusions/fused_cross_entropy.py``
  (``fused_vocab_parallel_cross_entropy``, one all-reduce for the predicted logit and
  the sum of exps). Its helpers are wrapped in ``jit_fuser`` (``torch.compile`` in
  megatron-core 0.16); TorchDynamo does not compile under an active dispatch mode (the
  fake-tensor mode and this simulator's tracker; ``convert_frame``'s
  ``should_skip_for_dispatch_mode``), so the helpers run as megatron's Python, eagerly.
  Their outputs (the fp32 copy, the softmax buffer, the bf16 gradient made inside the
  function's backward) are tensors a compiled run materialises too; a compiled run holds
  more, which this eager run does not: inductor scatters the backward's update into a new
  fp32 copy of the softmax (every PyTorch from 2.2, read on CPU inductor;
  tests/oracle/test_fused_cross_entropy.py), and older PyTorch builds add buffers of their
  own (cpmem's ``cpmem/step/torch_build.py``).
- ``chunked:N``: log-probabilities N tokens at a time, each chunk's logits recomputed in
  backward, restated from verl's ``FusedLinearForPPOFunction`` (verl/utils/experimental/
  torch_functional.py, volcengine/verl): forward saves the hidden states, the classifier
  and the token ids and keeps only the per-token log-probs and entropy (bf16); per
  chunk, eager torch ops in verl's order (logits, ``/ temperature``, fp32 copy, softmax,
  log-softmax, gather, logsumexp, ``probs * logits``), all transient; backward per chunk
  recomputes the logits, fp32 copy and softmax, builds the one-hot, ``one_hot - probs``,
  the scaled fp32 gradient, its bf16 cast and ``/ temperature``, and the hidden-state
  gradient. Under TP each chunk's logits are the rank's V/TP columns. One deviation:
  verl's function allocates the classifier gradient (``zeros_like(vocab_weights)`` and a
  per-chunk ``dlogits.T @ hidden``) whether or not the weight trains; with the frozen
  head of a LoRA step it is skipped here (it would add 2 x V/TP x H x 2 bytes).
- ``linear-ce``: a fused linear cross entropy that never materialises the logits,
  restated from Cut Cross Entropy (Wijmans et al. 2024, "Cut Your Losses in
  Large-Vocabulary Language Models"; apple/ml-cross-entropy ``cce.py``,
  ``cce_lse_forward.py``, ``cce_backward.py``): forward computes the fp32 log-sum-exp per
  token blockwise (logits only in on-chip blocks), the fp32 average logit per vocabulary
  entry (gradient filtering, ``filter_eps="auto"``) and the target logit by an indexed
  dot; it saves the hidden states, the classifier, the lse and the targets. Backward
  sorts the vocabulary by average logit (int32), recomputes logits blockwise and
  accumulates the hidden-state gradient into one ``zeros_like(e)`` (bf16; no classifier
  gradient for a frozen weight). Under TP, CCE's vocab-parallel mode: lse reduced over
  the TP group.

Final logit soft-capping (``SimModel.final_softcap``, Gemma 2's
``final_logit_softcapping``) under ``logits`` and ``fused``: ``tanh(logits / cap) * cap``
on the bf16 logits before the loss, HF ``Gemma2ForCausalLM.forward``'s three eager ops.
The division and the multiplication by a number save nothing; ``tanh`` saves its bf16
output (2 B per logit, until backward); at the head's forward peak the capped logits,
the kept tanh output and the loss's fp32 copy are live (8 B per logit, 6 B uncapped).
``chunked:N`` (verl's function has no soft-cap) and ``linear-ce`` (Cut Cross Entropy
caps inside its kernel, keeping no logits) are unchanged.

Labels are one int64 per token, allocated with the batch at the start of the step. The
loss is reduced on the rank (no gather of the hidden states); backward starts from it.
Megatron pads the vocabulary to a multiple of 128 x TP (``make_vocab_size_divisible_by``
= 128), so V/TP is the padded vocabulary over TP.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from oracles.rank_sim.geometry import SimInputError

BF16, F32 = torch.bfloat16, torch.float32
HEADS = ("hidden", "logits", "fused", "chunked:N", "linear-ce")
VOCAB_MULTIPLE = 128  # megatron's default make_vocab_size_divisible_by


@dataclass(frozen=True)
class HeadSpec:
    kind: str = "hidden"
    chunk: int = 0  # tokens per chunk (chunked only)

    @classmethod
    def parse(cls, text: str | HeadSpec) -> HeadSpec:
        if isinstance(text, HeadSpec):
            return text
        name, _, arg = str(text).partition(":")
        if name == "chunked":
            try:
                n = int(arg)
            except ValueError:
                n = 0
            if n < 1:
                raise SimInputError("head", text, "chunked:N needs a chunk size N >= 1")
            return cls("chunked", n)
        if arg or name not in ("hidden", "logits", "fused", "linear-ce"):
            raise SimInputError("head", text, f"one of {', '.join(HEADS)}")
        return cls(name)

    @property
    def label(self) -> str:
        return f"chunked:{self.chunk}" if self.kind == "chunked" else self.kind

    @property
    def harness(self) -> bool:
        return self.kind == "hidden"


def padded_vocab(vocab: int, tp: int) -> int:
    multiple = VOCAB_MULTIPLE * tp
    return -(-vocab // multiple) * multiple


def _tp_group() -> Any:
    from megatron.core import parallel_state

    return parallel_state.get_tensor_model_parallel_group()


class Head(nn.Module):
    """Final norm, output layer and loss of one rank (every head but ``hidden``)."""

    def __init__(self, ctx: Any, cfg: Any, spec: HeadSpec) -> None:
        super().__init__()
        from megatron.core.tensor_parallel.layers import ColumnParallelLinear

        m, t = ctx.model, ctx.layout.tp
        if m.vocab < 1:
            raise SimInputError("head", spec.label, f"{m.name} has no vocabulary size")
        self.ctx, self.spec = ctx, spec
        self.vocab = padded_vocab(m.vocab, t)
        self.norm_w = nn.Parameter(torch.empty(m.hidden, dtype=BF16), requires_grad=False)
        self.tied = m.tie_embeddings
        self.output_layer = ColumnParallelLinear(
            m.hidden, self.vocab, config=cfg, init_method=nn.init.zeros_, bias=False,
            skip_bias_add=False, gather_output=False, skip_weight_param_allocation=self.tied,
        )  # fmt: skip
        if self.tied:  # the (vocab-parallel) embedding's weight, shared with the output layer
            self.embedding_weight = nn.Parameter(
                torch.empty(self.vocab // t, m.hidden, dtype=BF16), requires_grad=False
            )
        full = ctx.adapters.full  # full training: the final norm and output layer train
        if full and spec.kind not in ("hidden", "logits", "fused"):
            raise SimInputError(
                "head", spec.label, "full training runs megatron's output layer: logits or fused"
            )
        for p in self.parameters():
            p.requires_grad_(full)
        self.output_layer.gradient_accumulation_fusion = full and ctx.adapters.wgrad_fusion

    def weight(self) -> torch.Tensor:
        return self.embedding_weight if self.tied else self.output_layer.weight

    def norm(self, x: torch.Tensor) -> torch.Tensor:
        """The decoder's final layernorm (fused kernel)."""
        from oracles.rank_sim.layers import rmsnorm

        with self.ctx.label("head"):
            return rmsnorm(x, self.norm_w)

    def output(self, h: torch.Tensor) -> torch.Tensor:
        """megatron's vocabulary-parallel output layer on the normed hidden states ``h``:
        bf16 ``[tokens, V/TP]`` (every TP rank: all its CP tokens under SP)."""
        return self.output_layer(h, weight=self.weight() if self.tied else None)[0]

    def capped(self, logits: torch.Tensor) -> torch.Tensor:
        """Gemma 2's ``tanh(logits / cap) * cap`` on the bf16 logits (no cap: as given)."""
        cap = self.ctx.model.final_softcap
        return torch.tanh(logits / cap) * cap if cap else logits

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.capped(self.output(h))

    def cross_entropy(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """``compute_language_model_loss``: megatron's vocabulary-parallel cross entropy
        (``logits``) or its fused one (``fused``); per-token fp32 losses."""
        if self.spec.kind == "logits":
            from megatron.core.tensor_parallel.cross_entropy import vocab_parallel_cross_entropy

            return vocab_parallel_cross_entropy(logits, labels)
        from megatron.core.fusions.fused_cross_entropy import fused_vocab_parallel_cross_entropy

        return fused_vocab_parallel_cross_entropy(logits, labels, _tp_group())

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.loss(self.norm(x), labels)

    def loss(self, h: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The head after the final norm: output layer and loss on the normed ``h``."""
        from oracles.rank_sim.layers import gather_sp

        ctx, kind = self.ctx, self.spec.kind
        with ctx.label("head"):
            if kind in ("logits", "fused"):
                logits = self.output(h)
                del h
                logits = self.capped(logits)
                losses = self.cross_entropy(logits, labels)
                del logits  # GPTModel's frame drops the logits once the loss is made
                return losses.mean()
            layout = ctx.layout
            full = gather_sp(h, layout)  # megatron's mapping: reduce-scatter in backward
            if layout.tp > 1 and not layout.sp:
                from megatron.core.tensor_parallel import mappings

                full = mappings.copy_to_tensor_model_parallel_region(full)
            del h
            group = _tp_group() if layout.tp > 1 else None
            if kind == "chunked":
                log_probs, _entropy = ChunkedLogProbs.apply(
                    full, self.weight(), labels, self.spec.chunk, group
                )
                return -log_probs.float().mean()
            return LinearCrossEntropy.apply(full, self.weight(), labels, group)


def _chunk_logits(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    logits = (h @ w.t()) / 1.0  # verl divides by the temperature (1.0 here)
    return logits.to(F32)


def _chunk_forward(
    h: torch.Tensor, w: torch.Tensor, ids: torch.Tensor, group: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's ``_fused_linear_for_ppo_fwd`` op sequence on one chunk (vocab shard)."""
    logits = _chunk_logits(h, w)
    probs = logits.softmax(dim=-1)
    log_probs = logits.log_softmax(dim=-1)
    token_log_probs = log_probs.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    entropy = torch.logsumexp(logits, dim=-1) - torch.sum(probs * logits, dim=-1)
    if group is not None:  # vocab-parallel: the per-token statistics are reduced
        dist.all_reduce(token_log_probs, group=group)
    return token_log_probs.to(h.dtype), entropy.to(h.dtype)


def _chunk_backward(
    dlog_probs: torch.Tensor, h: torch.Tensor, w: torch.Tensor, ids: torch.Tensor
) -> torch.Tensor:
    """verl's ``_fused_linear_for_ppo_bwd`` (log-prob gradient only) on one chunk."""
    logits = _chunk_logits(h, w)
    probs = logits.softmax(dim=-1)
    dlogits: Any = 0
    one_hot = torch.zeros_like(logits).scatter_(-1, ids.unsqueeze(-1), 1)
    dlogits += dlog_probs.to(F32).unsqueeze(-1) * (one_hot - probs)
    del one_hot, probs, logits
    dlogits = dlogits.to(h.dtype) / 1.0
    return dlogits @ w  # the classifier gradient is skipped: the head is frozen


class ChunkedLogProbs(torch.autograd.Function):
    """verl's ``FusedLinearForPPOFunction``: chunked linear + log-softmax, per-chunk
    recompute in backward (see the module docstring)."""

    @staticmethod
    def forward(
        ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, ids: torch.Tensor,
        chunk: int, group: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        ctx.set_materialize_grads(False)
        tokens = hidden.shape[0]
        log_probs = hidden.new_empty((tokens,))
        entropy = hidden.new_empty((tokens,))
        for start in range(0, tokens, chunk):
            stop = min(start + chunk, tokens)
            lp, ent = _chunk_forward(hidden[start:stop], weight, ids[start:stop], group)
            log_probs[start:stop] = lp
            entropy[start:stop] = ent
            del lp, ent
        ctx.save_for_backward(hidden, weight, ids)
        ctx.chunk = chunk
        return log_probs, entropy

    @staticmethod
    def backward(ctx: Any, dlog_probs: torch.Tensor | None, _dentropy: Any) -> tuple[Any, ...]:
        hidden, weight, ids = ctx.saved_tensors
        dhidden = torch.zeros_like(hidden)
        assert dlog_probs is not None
        for start in range(0, hidden.shape[0], ctx.chunk):
            stop = min(start + ctx.chunk, hidden.shape[0])
            dh = _chunk_backward(
                dlog_probs[start:stop], hidden[start:stop], weight, ids[start:stop]
            )
            dhidden[start:stop] += dh
            del dh
        return dhidden, None, None, None, None


class LinearCrossEntropy(torch.autograd.Function):
    """Cut Cross Entropy's ``LinearCrossEntropyFunction`` (mean reduction), buffer level:
    no ``[tokens, V]`` tensor is ever allocated."""

    @staticmethod
    def forward(
        ctx: Any, e: torch.Tensor, c: torch.Tensor, targets: torch.Tensor, group: Any
    ) -> torch.Tensor:
        tokens, vocab = e.shape[0], c.shape[0]
        lse = e.new_empty((tokens,), dtype=F32)  # cce_lse_forward_kernel's output
        locks = e.new_empty((-(-tokens // 128),), dtype=torch.int32)
        logit_avg = e.new_empty((vocab,), dtype=F32)  # filter_eps="auto" and a gradient
        del locks
        if group is not None:  # vp_reduce_lse
            dist.all_reduce(lse, group=group)
        neg_dot = e.new_empty((tokens,), dtype=F32)  # indexed_neg_dot_forward_kernel
        if group is not None:  # vp_reduce_correct_logit
            dist.all_reduce(neg_dot, group=group)
        loss = neg_dot.add_(lse).mean()
        ctx.save_for_backward(e, c, lse, targets, logit_avg)
        return loss

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        e, _c, _lse, _targets, logit_avg = ctx.saved_tensors
        order = torch.argsort(logit_avg).to(torch.int32)  # sort_logit_avg
        de = torch.zeros_like(e)  # accum_e_fp32=False: de in e's dtype
        de_locks = e.new_zeros((-(-e.shape[0] // 128), -(-e.shape[1] // 64)), dtype=torch.int32)
        del order, de_locks
        return de, None, None, None
