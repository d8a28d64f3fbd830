"""The layer-wise distributed optimizer's precomputed buffer for Muon's matrices: how
megatron-core bin-packs whole matrices into shard-aligned buckets, and what each rank
of the group steps.

Under ``--optimizer muon --use-distributed-optimizer`` (the default
``--use-layer-wise-param-layout``) megatron-core's DDP keeps distributed-optimizer
buffers (``training/models/dist_utils.py:326-335`` turns ``use_distributed_optimizer``
back on) and splits the trainable parameters in two (``tag_params_for_buffer_routing``,
``is_managed_by_layer_wise_optimizer``): the matrices Muon orthogonalises (exactly 2-D,
not ``use_muon=False``, not the embedding or output layer) go to a buffer of their own
laid out by ``LayerWiseDistributedOptimizer._compute_per_buffer_param_layout``; the rest
(norms, biases, the embedding and output layer) to the distributed optimizer's
byte-sharded buffer (``cpmem.pricing.param_buffers``), stepped by Adam under a separate
``DistributedOptimizer`` (``optimizer/__init__.py:837-943``). Each rank keeps both whole
buffers (the parameters and the gradients) and steps the matrices of its own shard of
every bucket (``_shard_params_from_layout``).

The layout (``layer_wise_optimizer.py:196-445`` at NVIDIA/Megatron-LM d98e8a64):

- the matrices are walked in reverse model order (the order their gradients arrive);
  with a ``bucket_size`` (``--overlap-grad-reduce`` on the first stage's first model
  chunk, ``dist_utils.py:315-319, 366-373``) a bucket closes once it holds at least
  ``max(bucket_size, int(shards x its largest x 0.9))`` elements and the next matrix
  would not fit the padding of its least-loaded shard (shards filled in that walk's
  order, each start rounded up to 64); without one, one bucket holds them all;
- a bucket is packed by longest-processing-time: its matrices sorted by Newton-Schulz
  cost ``max(m, n) x min(m, n)^2`` descending (a stable sort), each given to the shard of
  least accumulated cost (the costs carry over from bucket to bucket; ties to the lowest
  shard) among those where it still fits under ``1.3 x`` the bucket's elements / shards
  (its start rounded up to 64), else to the shard with the fewest elements;
- every shard of the bucket is padded to its fullest shard's elements rounded up to
  ``lcm(64, lcm(shards, 128) / shards)`` (``_shard_divisor``; the NCCL bus-bandwidth
  padding is refused by cpmem), so the bucket is ``shards`` x that.

Rank ``r`` of the group steps the matrices in shard ``r`` of each bucket: their fp32
master copy (under ``--bf16``) and Muon's fp32 momentum.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from cpmem.pricing.param_buffers import BUCKET_ALIGN, PARAM_ALIGN

CAP_SLACK = 0.3
"""A shard takes a matrix while its elements stay under (1 + 0.3) x the bucket's elements
/ shards (``_NUMEL_EPSILON``, layer_wise_optimizer.py:313)."""
PADDING_FLOOR = 0.9
"""A bucket's soft minimum is at least ``int(shards x largest x 0.9)`` elements
(``PADDING_FLOOR``, layer_wise_optimizer.py:365)."""

Shape = tuple[int, int]


def ns_cost(shape: Shape) -> int:
    """Newton-Schulz's estimated cost of one matrix: ``max(m, n) x min(m, n)^2``
    (``_ns_compute_cost``)."""
    big, small = max(shape), min(shape)
    return big * small * small


def _align(value: int, divisor: int) -> int:
    return -(-value // divisor) * divisor


def shard_divisor(shards: int) -> int:
    """What every shard of a bucket is rounded up to: ``lcm(64, lcm(shards, 128) /
    shards)`` (``_shard_divisor`` without the NCCL bus-bandwidth padding)."""
    return math.lcm(PARAM_ALIGN, math.lcm(shards, BUCKET_ALIGN) // shards)


@dataclass(frozen=True)
class LayerWiseLayout:
    """The laid-out buffer: ``numel`` elements in all (padding included, every rank
    keeps the whole), and ``shard_elements[r]``: the real elements of the matrices rank
    ``r`` steps, over every bucket."""

    numel: int
    shard_elements: tuple[int, ...]


def _pack(
    chunk: Sequence[Shape], shards: int, loads: list[int], divisor: int
) -> tuple[int, list[int]]:
    """One bucket (``_emit_bucket``): its elements padded, and the real elements of each
    shard; ``loads`` (each shard's accumulated cost) is carried over."""
    total = sum(m * n for m, n in chunk)
    cap = total / shards * (1 + CAP_SLACK)
    cursors = [0] * shards
    real = [0] * shards
    for shape in sorted(chunk, key=lambda s: -ns_cost(s)):
        numel = shape[0] * shape[1]
        fits = [s for s in range(shards) if _align(cursors[s], PARAM_ALIGN) + numel <= cap]
        if fits:
            target = min(fits, key=lambda s: loads[s])
        else:
            target = min(range(shards), key=lambda s: cursors[s])
        cursors[target] = _align(cursors[target], PARAM_ALIGN) + numel
        loads[target] += ns_cost(shape)
        real[target] += numel
    return shards * _align(max(cursors), divisor), real


def layer_wise_layout(
    shapes: Sequence[Shape], shards: int, bucket_size: int | None = None
) -> LayerWiseLayout:
    """The buffer of the matrices ``shapes`` (each ``(rows, cols)`` on the rank, in model
    order) over ``shards`` ranks, one bucket per ``bucket_size`` elements (None: one)."""
    if shards < 1:
        raise ValueError(f"shards must be positive, got {shards}")
    divisor = shard_divisor(shards)
    loads = [0] * shards
    numel = 0
    elements = [0] * shards

    def emit(chunk: list[Shape]) -> None:
        nonlocal numel
        if not chunk:
            return
        size, real = _pack(chunk, shards, loads, divisor)
        numel += size
        for s in range(shards):
            elements[s] += real[s]

    chunk: list[Shape] = []
    chunk_numel = largest = 0
    placed = [0] * shards  # the walk's own estimate of each shard's elements
    for shape in reversed(shapes):
        n = shape[0] * shape[1]
        if bucket_size is not None and chunk:
            threshold = max(bucket_size, int(shards * largest * PADDING_FLOOR))
            target = _align(max(placed), divisor)
            absorbs = _align(min(placed), PARAM_ALIGN) + n <= target
            if chunk_numel >= threshold and not absorbs:
                emit(chunk)
                chunk, chunk_numel, largest = [], 0, 0
                placed = [0] * shards
        s = min(range(shards), key=lambda i: placed[i])
        placed[s] = _align(placed[s], PARAM_ALIGN) + n
        chunk.append(shape)
        chunk_numel += n
        largest = max(largest, n)
    emit(chunk)
    return LayerWiseLayout(numel, tuple(elements))
