"""The LM head's byte constants (cpmem/pricing/head.py), measured by running the code they
stand for on CPU tensors.

``vocab_parallel_cross_entropy`` is megatron-core 0.16's own
(``tensor_parallel/cross_entropy.py``, in a world-size-1 gloo group: TP 1); the chunked
head is verl's ``FusedLinearForPPOFunction`` as the rank simulator restates it
(oracles/rank_sim/head.py ``ChunkedLogProbs``). Bytes are the live storages the rank
simulator's tracker counts (oracles/rank_sim/tracker.py: every storage an op creates,
until its last reference dies). Each figure is a slope: the same run at two vocabulary
(or chunk) sizes, so the per-token tensors and the rest cancel, and the per-token bytes
are the intercept at a token count whose tensors fill whole 512-byte blocks.
"""

from __future__ import annotations

import gc
import warnings
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from cpmem.pricing.head import (  # noqa: E402
    CHUNK_BACKWARD_BYTES,
    CHUNK_FORWARD_BYTES,
    LOGIT_BACKWARD_BYTES,
    LOGIT_KEPT_BYTES,
    TOKEN_KEPT_BYTES,
)
from oracles.megatron_layer import init_single_process_megatron  # noqa: E402
from oracles.rank_sim.head import ChunkedLogProbs  # noqa: E402
from oracles.rank_sim.tracker import LiveBytesTracker  # noqa: E402

warnings.filterwarnings("ignore")
TOKENS = 8192  # a multiple of 512: every per-token tensor fills whole blocks


def _cross_entropy(tokens: int, vocab: int) -> dict[str, Any]:
    """megatron's loss on bf16 logits ``[tokens, 1, vocab]``: what its forward leaves
    while the caller holds the per-token loss, and its backward's peak (the kept set
    carried into it), with the labels megatron's ``GPTDataset`` makes (``.long()``)."""
    init_single_process_megatron()
    from megatron.core.tensor_parallel.cross_entropy import vocab_parallel_cross_entropy

    logits = torch.randn(tokens, 1, vocab, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, vocab, (tokens, 1), dtype=torch.long)
    # the loss's own storages: cyclic garbage (from earlier in the process, or made
    # here) is collected before the live bytes are read, not left to the collector's
    # schedule, which depends on what the process ran before (under xdist, any module)
    gc.collect()
    with LiveBytesTracker() as tracker:
        losses = vocab_parallel_cross_entropy(logits, labels)
        gc.collect()
        kept = tracker.live
        tracker.set_phase("backward")
        losses.sum().backward()
    assert logits.grad is not None and logits.grad.dtype == torch.bfloat16
    return {
        "kept": kept,
        "backward": tracker.peaks["backward"].bytes,
        "loss_bytes": losses.element_size(),
        "label_bytes": labels.element_size(),
    }


@pytest.fixture(scope="module")
def cross_entropy() -> tuple[dict[str, Any], dict[str, Any]]:
    return _cross_entropy(TOKENS, 256), _cross_entropy(TOKENS, 512)


def test_logit_kept_bytes_is_the_fp32_softmax_megatron_saves(
    cross_entropy: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    """``LOGIT_KEPT_BYTES``: ``.float()`` copies the logits, ``exp`` and the division run
    in place in that copy, ``save_for_backward`` keeps it: 4 bytes per logit."""
    small, large = cross_entropy
    per_logit = (large["kept"] - small["kept"]) / (TOKENS * 256)
    assert per_logit == LOGIT_KEPT_BYTES


def test_token_kept_bytes_is_the_labels_and_what_the_loss_keeps_per_token(
    cross_entropy: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    """``TOKEN_KEPT_BYTES``: per token, the int64 labels (``GPTDataset``'s ``.long()``)
    and what megatron's loss leaves beside the softmax: the saved bool target mask and
    int64 masked target (1 + 8) and the fp32 per-token loss it returns (4)."""
    small, large = cross_entropy
    per_logit = (large["kept"] - small["kept"]) / (TOKENS * 256)
    per_token = (small["kept"] - per_logit * TOKENS * 256) / TOKENS
    assert per_token == 1 + 8 + small["loss_bytes"] and small["loss_bytes"] == 4
    assert small["label_bytes"] + per_token == TOKEN_KEPT_BYTES


def test_logit_backward_bytes_is_the_gradient_in_the_softmax_and_its_bf16_cast(
    cross_entropy: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    """``LOGIT_BACKWARD_BYTES``: the backward builds the fp32 gradient in the saved
    softmax's buffer (no new fp32 tensor) and autograd casts it to the bf16 logits'
    gradient: 4 + 2 bytes per logit at the backward's peak."""
    small, large = cross_entropy
    per_logit = (large["backward"] - small["backward"]) / (TOKENS * 256)
    assert per_logit == LOGIT_BACKWARD_BYTES


def _chunked(chunk: int, tokens: int = 1024, vocab: int = 4096, hidden: int = 8) -> list[int]:
    """The chunked head's forward and backward peaks (a frozen classifier, created before
    the tracker, as a step's weights are)."""
    h = torch.randn(tokens, hidden, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(vocab, hidden, dtype=torch.bfloat16)
    ids = torch.randint(0, vocab, (tokens,), dtype=torch.long)
    with LiveBytesTracker() as tracker:
        log_probs, _ = ChunkedLogProbs.apply(h, w, ids, chunk, None)
        tracker.set_phase("backward")
        (-log_probs.float().mean()).backward()
    return [tracker.peaks[p].bytes for p in ("forward", "backward")]


@pytest.fixture(scope="module")
def chunked() -> tuple[list[int], list[int], int]:
    """Peaks at two chunk sizes over the same 1,024 tokens and 4,096-entry vocabulary:
    the difference is 512 more tokens' logits per chunk (the per-token tensors, a few
    bytes each against 4,096 logits a token, move the slope by under 0.01)."""
    return _chunked(512), _chunked(1024), 512 * 4096


def test_chunk_forward_bytes_is_one_chunks_fp32_tensors_at_its_peak(
    chunked: tuple[list[int], list[int], int],
) -> None:
    """``CHUNK_FORWARD_BYTES``: at the chunk's forward peak the fp32 logits, the softmax,
    the log-softmax and ``probs * logits`` are live: 4 x 4 bytes per logit."""
    small, large, logits = chunked
    per_logit = (large[0] - small[0]) / logits
    assert per_logit == pytest.approx(CHUNK_FORWARD_BYTES, abs=0.05)


def test_chunk_backward_bytes_is_one_recomputed_chunks_fp32_tensors(
    chunked: tuple[list[int], list[int], int],
) -> None:
    """``CHUNK_BACKWARD_BYTES``: the recomputed fp32 logits and softmax, the one-hot
    targets, ``one_hot - probs`` and the gradient it scales into: 5 x 4 bytes per
    logit."""
    small, large, logits = chunked
    per_logit = (large[1] - small[1]) / logits
    assert per_logit == pytest.approx(CHUNK_BACKWARD_BYTES, abs=0.05)
