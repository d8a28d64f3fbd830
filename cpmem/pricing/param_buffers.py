"""megatron-core's distributed-optimizer buffers: how a stage's trainable parameters are
laid out, padded and sliced over the ranks that shard them.

megatron-core's DDP (``distributed/param_and_grad_buffer.py``, ``optimizer/param_layout.py``)
puts the trainable parameters of a buffer into one contiguous parameter buffer and one
gradient buffer of the same layout: in reverse order (the order their gradients arrive),
each parameter starting on a multiple of 64 elements (``_pad_start_of_param_if_needed``),
the bucket ending on a multiple of ``lcm(shards, 128)`` (``_pad_end_of_bucket``). The
distributed optimizer cuts the buffer into ``shards`` equal slices, one per rank of its
group (data-parallel x context-parallel for the dense parameters, the expert data-parallel
group for the routed experts: ``distrib_optimizer.py``), and gives each rank an fp32 master
copy and moments for the real elements of its slice only (``_build_model_gbuf_param_range_map``:
padding gets none). The first slice is all real elements; the last holds the bucket's
trailing padding.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

PARAM_ALIGN = 64
"""Each parameter of a distributed-optimizer buffer starts on a multiple of 64 elements."""
BUCKET_ALIGN = 128
"""A bucket ends on a multiple of lcm(shards, 128) elements."""


@dataclass(frozen=True)
class BufferShard:
    """One buffer as laid out, and one rank's slice of it: ``numel`` padded elements in
    the whole buffer, ``real`` real elements in the rank's slice."""

    numel: int
    real: int


def buffer_spans(tensors: Sequence[int]) -> tuple[int, list[tuple[int, int]]]:
    """The buffer's elements before the bucket's end padding, and each parameter's span
    (reverse order, each start rounded up to ``PARAM_ALIGN``)."""
    spans = []
    numel = 0
    for n in reversed(tensors):
        numel = -(-numel // PARAM_ALIGN) * PARAM_ALIGN
        spans.append((numel, numel + n))
        numel += n
    return numel, spans


def buffer_shard(tensors: Sequence[int], shards: int, slice_index: int) -> BufferShard:
    """The buffer of ``tensors`` (elements each) cut into ``shards`` slices, and the real
    elements of slice ``slice_index``."""
    end, spans = buffer_spans(tensors)
    align = math.lcm(shards, BUCKET_ALIGN)
    numel = -(-end // align) * align
    size = numel // shards
    lo, hi = slice_index * size, (slice_index + 1) * size
    real = sum(max(0, min(b, hi) - max(a, lo)) for a, b in spans)
    return BufferShard(numel, real)
