"""What one rank holds under Muon's layer-wise distributed optimizer with its
precomputed layout: the whole buffers, and the share it steps.

megatron-core's DDP builds one ``full_param_layout`` per model chunk
(``training/models/dist_utils.py:360-386``), over the chunk's trainable parameters in the
order they are registered, grouped into buffers (``group_params_for_buffers``): the dense
matrices Muon steps and the routed experts' (``cpmem.pricing.layer_wise_layout``, over
DP x CP and the expert data-parallel group), and the rest in the distributed optimizer's
byte-level buffer (``cpmem.pricing.param_buffers``, one bucket; the tied output copy in
one of its own). Every rank keeps each buffer whole (the weights and the gradients), and
steps the matrices of its shard in every bucket and the real elements of its slice of
the rest. The buckets: ``max(40M, 1M x DP x CP)`` elements under
``--overlap-grad-reduce`` (dist_utils.py:315-319), on the first stage's first model chunk
only (the others one bucket, dist_utils.py:360-373).

Megatron-LM refuses Adam-stepped expert-parallel parameters on this path
(optimizer/__init__.py:918-926: "Non-emerging expert-parallel param groups are not yet
supported"), so routed experts' biases are refused here too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cpmem.errors import InputError
from cpmem.pricing.layer_wise_layout import LayerWiseLayout, layer_wise_layout
from cpmem.pricing.param_buffers import buffer_shard
from cpmem.pricing.weights import StageTensors

DEFAULT_BUCKET = 40_000_000
"""DDP's bucket: at least 40M elements (dist_utils.py:316)."""
BUCKET_PER_RANK = 1_000_000
"""... and 1M per rank of DP x CP (dist_utils.py:316)."""


def grad_bucket_size(dp_cp: int) -> int:
    """DDP's bucket size under ``--overlap-grad-reduce`` without ``--ddp-bucket-size``:
    ``max(40M, 1M x DP x CP)`` elements."""
    return max(DEFAULT_BUCKET, BUCKET_PER_RANK * dp_cp)


@dataclass(frozen=True)
class LayoutChunk:
    """One model chunk's tensors and its bucket size (None: one bucket)."""

    tensors: StageTensors
    bucket_size: int | None


@dataclass(frozen=True)
class LayerWiseHeld:
    """One rank: ``numel`` buffer elements (padding included, each kept whole), and the
    elements it steps with Muon (``muon_elements``) and with Adam (``adam_elements``)."""

    numel: int
    muon_elements: int
    adam_elements: int


@dataclass(frozen=True)
class _ChunkLayout:
    matrices: LayerWiseLayout
    experts: LayerWiseLayout
    adam: tuple[tuple[int, ...], ...]  # the distributed optimizer's buffers


def _chunk_layout(chunk: LayoutChunk, dense_shards: int, expert_shards: int) -> _ChunkLayout:
    t = chunk.tensors
    if t.dense_shapes is None:
        raise InputError(
            "optimizer",
            "muon",
            "the layer-wise distributed optimizer's precomputed layout packs Muon's "
            "matrices by shape, and a layer kind of this model lists none (--muon-layout "
            "legacy prices its legacy path)",
        )
    if not all(t.expert_matrices):
        raise InputError(
            "optimizer",
            "muon",
            "Megatron-LM asserts: non-emerging expert-parallel param groups (the routed "
            "experts' biases) are not yet supported on the layer-wise + "
            "DistributedOptimizer path (optimizer/__init__.py:918-926; --muon-layout "
            "legacy prices its legacy path)",
        )
    adam = tuple(n for n, m in zip(t.dense, t.dense_matrices, strict=True) if not m)
    return _ChunkLayout(
        layer_wise_layout(t.dense_shapes, dense_shards, chunk.bucket_size),
        layer_wise_layout(t.expert_shapes, expert_shards, chunk.bucket_size),
        tuple(g for g in (adam, t.tied_copy) if g),
    )


def layer_wise_held(
    chunks: Sequence[LayoutChunk],
    dense_shards: int,
    expert_shards: int,
    own: tuple[int, int] | None,
    *,
    muon_bytes: int,
    adam_bytes: int,
) -> LayerWiseHeld:
    """What a rank holds over the stage's ``chunks``: the rank of index ``own`` (its DP x
    CP index, its expert data-parallel index), or (None) the costliest of each group at
    ``muon_bytes`` / ``adam_bytes`` per element stepped."""
    layouts = [_chunk_layout(c, dense_shards, expert_shards) for c in chunks]
    numel = sum(
        c.matrices.numel
        + c.experts.numel
        + sum(buffer_shard(g, dense_shards, 0).numel for g in c.adam)
        for c in layouts
    )

    def dense(r: int) -> tuple[int, int]:
        muon = sum(c.matrices.shard_elements[r] for c in layouts)
        adam = sum(buffer_shard(g, dense_shards, r).real for c in layouts for g in c.adam)
        return muon, adam

    def expert(r: int) -> int:
        return sum(c.experts.shard_elements[r] for c in layouts)

    if own is None:
        muon, adam = max(
            (dense(r) for r in range(dense_shards)),
            key=lambda s: s[0] * muon_bytes + s[1] * adam_bytes,
        )
        experts = max(expert(r) for r in range(expert_shards))
    else:
        (muon, adam), experts = dense(own[0]), expert(own[1])
    return LayerWiseHeld(numel, muon + experts, adam)
