"""The LM head and its loss, for the trainer-step cells (``--head logits|chunked:N``).

Why: cpmem prices a trainer's step that ends with a head (cpmem/pricing/head.py); the
harness returns the hidden states instead. Both engines hand the head the last layer's
output on the rank's own tokens, flattened to ``[T, H]``. The head, all frozen bf16:

- the decoder's final RMSNorm (as the rank simulator's head and cpmem's pricing read it);
- the output layer: a plain frozen linear ``[H -> V]``, ``V`` the model's vocabulary
  padded to a multiple of 128 as megatron pads it (``make_vocab_size_divisible_by``; the
  labels stay in the real vocabulary). At TP 1 that is megatron's vocabulary-parallel
  output layer: ``LinearWithFrozenWeight`` saves only the weight, as a frozen
  ``F.linear`` does;
- ``logits``: the output layer, then the cross entropy named by
  ``CellSpec.head_ce``: megatron-core's ``vocab_parallel_cross_entropy`` (its ``.float()``
  copy, the softmax built in place and kept for backward), or torch's
  ``cross_entropy`` over an fp32 upcast of the logits (``log_softmax`` of the copy, its
  output kept) where megatron is not importable. The per-token losses are averaged.
- ``chunked:N``: log-probabilities ``N`` tokens at a time; each chunk runs under
  ``torch.utils.checkpoint`` (non-reentrant), so only the head's input (a view of the
  norm output, the whole of which stays referenced) and the labels are kept, and each
  chunk is recomputed in backward. Inside a chunk the ops are verl's
  ``_fused_linear_for_ppo_fwd`` order, the chunked head cpmem prices
  (``FusedLinearForPPO``, restated in oracles/rank_sim/head.py): the output layer, the
  fp32 upcast (the bf16 product freed), softmax, log-softmax, the labels' log-probs
  gathered, and the entropy (``logsumexp - sum(probs * logits)``, returned as verl does
  but not in the loss). The loss is minus the mean log-prob (the same value as the
  cross entropy). The backward is autograd's over the recomputed chunk (verl writes its
  own; both hold the recomputed fp32 logits and softmax and an fp32 gradient or two).

Labels are random int64 token ids, made before the measured window as the input ids are.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from cpmem.model.geometry import ModelGeometry

from .spec import CellSpec
from .torchlib import load_torch

VOCAB_DIVISOR = 128  # megatron's default make_vocab_size_divisible_by (TP 1)


def padded_vocab(vocab: int) -> int:
    """The output layer's rows: ``vocab`` rounded up to a multiple of VOCAB_DIVISOR."""
    return -(-vocab // VOCAB_DIVISOR) * VOCAB_DIVISOR


def have_megatron_cross_entropy() -> bool:
    """Whether megatron-core's ``vocab_parallel_cross_entropy`` can be imported."""
    try:
        if importlib.util.find_spec("megatron.core") is None:
            return False
        import megatron.core.tensor_parallel.cross_entropy  # noqa: F401
    except Exception:  # a broken install counts as absent
        return False
    return True


def init_megatron_parallel_state() -> None:
    """megatron's model-parallel groups (TP = PP = 1) over the initialised process group:
    ``vocab_parallel_cross_entropy`` reduces over the TP group."""
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)


def head_description(spec: CellSpec) -> str:
    """What the head ran, for the summary's notes."""
    if spec.head == "logits":
        ce = (
            "megatron-core's vocab_parallel_cross_entropy"
            if spec.head_ce == "megatron"
            else "torch's cross_entropy over an fp32 upcast (not megatron's, which cpmem prices)"
        )
        return (
            "head logits: final RMSNorm, frozen linear [H -> V] (V padded to a multiple of "
            f"{VOCAB_DIVISOR}), {ce}; loss = mean"
        )
    if spec.head.startswith("chunked"):
        return (
            f"head {spec.head}: final RMSNorm, then per chunk of {spec.head_chunk} tokens "
            "under torch.utils.checkpoint (recomputed in backward) verl's op order: frozen "
            "linear, fp32 upcast, softmax, log_softmax, gather, entropy (not in the loss); "
            "loss = -mean log-prob"
        )
    return "head hidden (the harness): hidden states returned, loss = their mean square"


def build_head(spec: CellSpec, geometry: ModelGeometry, device: Any) -> Any:
    """The head module for ``spec.head`` (None for the harness's ``hidden``).

    Its ``forward(hidden, labels)`` returns the scalar loss."""
    if spec.head == "hidden":
        return None
    torch = load_torch()
    nn = torch.nn
    f = nn.functional
    bf16 = torch.bfloat16
    h, vocab = geometry.hidden, padded_vocab(geometry.vocab)
    chunk = spec.head_chunk
    ce = spec.head_ce

    def chunk_log_probs(x: Any, ids: Any, weight: Any) -> tuple[Any, Any]:
        """verl's ``_fused_linear_for_ppo_fwd`` on one chunk (temperature 1)."""
        logits = f.linear(x, weight).float()  # the bf16 product is freed once upcast
        probs = logits.softmax(dim=-1)
        log_probs = logits.log_softmax(dim=-1)
        token_log_probs = log_probs.gather(-1, ids[:, None]).squeeze(-1)
        entropy = torch.logsumexp(logits, dim=-1) - torch.sum(probs * logits, dim=-1)
        return token_log_probs, entropy

    class LmHead(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.Parameter(torch.ones(h, device=device, dtype=bf16), requires_grad=False)
            w = torch.randn(vocab, h, device=device, dtype=bf16) * h**-0.5
            self.weight = nn.Parameter(w, requires_grad=False)

        def forward(self, hidden: Any, labels: Any) -> Any:
            x = f.rms_norm(hidden.reshape(-1, h), (h,), self.norm)
            if chunk is None:  # logits
                logits = f.linear(x, self.weight)
                del x
                if ce == "megatron":
                    from megatron.core.tensor_parallel.cross_entropy import (
                        vocab_parallel_cross_entropy,
                    )

                    losses = vocab_parallel_cross_entropy(logits, labels)
                else:
                    losses = f.cross_entropy(logits.float(), labels, reduction="none")
                del logits  # as GPTModel's frame drops them once the loss is made
                return losses.mean()
            parts = []
            for start in range(0, x.shape[0], chunk):
                stop = min(start + chunk, x.shape[0])
                log_probs, _entropy = torch.utils.checkpoint.checkpoint(
                    chunk_log_probs,
                    x[start:stop],
                    labels[start:stop],
                    self.weight,
                    use_reentrant=False,
                )
                parts.append(log_probs)
            return -torch.cat(parts).mean()

    return LmHead()
