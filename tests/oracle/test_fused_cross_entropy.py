"""Megatron-core's fused cross entropy as ``jit_fuser`` (``torch.compile``) runs it, on the
installed PyTorch's CPU inductor: the buffers behind ``cpmem.step.torch_build`` and
``cpmem.pricing.head.fused_loss_bytes``.

The rank simulator's tracker is a dispatch mode, under which TorchDynamo does not compile
(oracles/rank_sim/head.py), so these runs count bytes with the profiler's allocator
events instead: every storage the CPU allocator hands out and takes back, the compiled
graphs' own buffers included. Megatron's ``fused_vocab_parallel_cross_entropy`` runs as
the output layer calls it, in a world-size-1 gloo group (TP 1), on bf16 logits
``[tokens, 1, V]``; each figure is read per logit at a size where the per-token tensors
add under 0.05 B per logit. The first call compiles; the second is measured.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from cpmem.pricing.head import (  # noqa: E402
    FUSED_BACKWARD_COPY_BYTES,
    LOGIT_BACKWARD_BYTES,
    LOGIT_FORWARD_BYTES,
    LOGIT_KEPT_BYTES,
)
from cpmem.step.torch_build import TorchBuild  # noqa: E402
from oracles.megatron_layer import init_single_process_megatron  # noqa: E402

warnings.filterwarnings("ignore")
TOKENS, VOCAB = 512, 4096
LOGITS = TOKENS * VOCAB
PER_TOKEN_SLACK = 0.05  # bytes per logit the per-token tensors may add
INSTALLED = TorchBuild(
    (int(torch.__version__.split(".")[0]), int(torch.__version__.split(".")[1])), "installed"
)


def _live_peaks(run: Callable[[], None]) -> dict[str, int]:
    """Peak live CPU bytes above the start of ``run`` inside each ``record_function``
    block it opens, from the profiler's allocator events."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    events = sorted(prof.profiler.kineto_results.events(), key=lambda e: e.start_ns())
    spans = {
        e.name(): (e.start_ns(), e.start_ns() + e.duration_ns())
        for e in events
        if e.name() in ("forward", "backward")
    }
    live, peaks = 0, dict.fromkeys(spans, 0)
    for e in events:
        if e.name() != "[memory]":
            continue
        live += e.nbytes()
        for name, (start, end) in spans.items():
            if start <= e.start_ns() <= end:
                peaks[name] = max(peaks[name], live)
    return peaks


def _loss(kind: str) -> dict[str, float]:
    """Bytes per logit at the loss's forward and backward peaks, the bf16 logits (made
    before the profile starts, 2 B) counted in."""
    init_single_process_megatron()
    # a fresh dynamo, compiling in this process: an earlier test of the same process may
    # have compiled these helpers up to dynamo's recompile limit, and inductor's worker
    # pool may fail under load, either leaving the helpers to run eager (the measured
    # figure is then the unfused loss's); the warm-up must have compiled a graph
    torch._dynamo.reset()
    torch._inductor.config.compile_threads = 1
    from torch._dynamo.utils import counters

    counters.clear()
    from megatron.core import parallel_state
    from megatron.core.fusions.fused_cross_entropy import fused_vocab_parallel_cross_entropy
    from megatron.core.tensor_parallel.cross_entropy import vocab_parallel_cross_entropy

    group = parallel_state.get_tensor_model_parallel_group()
    torch.manual_seed(0)
    logits = torch.randn(TOKENS, 1, VOCAB, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, VOCAB, (TOKENS, 1), dtype=torch.long)

    def loss() -> Any:
        if kind == "fused":
            return fused_vocab_parallel_cross_entropy(logits, labels, group)
        return vocab_parallel_cross_entropy(logits, labels)

    loss().sum().backward()  # compiles (fused); the measured call runs the compiled code
    logits.grad = None
    if kind == "fused":
        assert counters["stats"]["unique_graphs"] > 0, "the fused loss ran eager, uncompiled"

    def step() -> None:
        with torch.profiler.record_function("forward"):
            losses = loss()
        with torch.profiler.record_function("backward"):
            losses.sum().backward()

    peaks = _live_peaks(step)
    bf16 = logits.element_size()
    return {k: v / LOGITS + bf16 for k, v in peaks.items()}


def _within(measured: float, expected: float) -> bool:
    return expected <= measured <= expected + PER_TOKEN_SLACK


def test_the_unfused_loss_peaks_at_its_6_bytes_both_ways() -> None:
    """The method's check: the eager loss reads as head.py's LOGIT_* figures say (the bf16
    logits live through this backward, as the caller's leaf, 2 B above a real step's)."""
    got = _loss("unfused")
    assert _within(got["forward"], LOGIT_KEPT_BYTES + LOGIT_FORWARD_BYTES)
    assert _within(got["backward"], LOGIT_BACKWARD_BYTES + 2)


def test_the_compiled_backward_holds_one_more_fp32_copy() -> None:
    """Inductor scatters the backward's in-place update into a new fp32 buffer beside the
    saved softmax: 4 B per logit above the eager loss (10 B, the logits' 2 B apart); the
    forward holds the eager figure from PyTorch 2.5 on (2.2 computes its ``exp`` into a
    second fp32 buffer)."""
    got = _loss("fused")
    assert INSTALLED.compiled_backward_copy
    assert _within(got["backward"], LOGIT_BACKWARD_BYTES + FUSED_BACKWARD_COPY_BYTES + 2)
    if INSTALLED.compiled_forward_in_place:
        assert _within(got["forward"], LOGIT_KEPT_BYTES + LOGIT_FORWARD_BYTES)
