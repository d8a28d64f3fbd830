"""Muon's optimizer state, and the layer-wise distributed optimizer's share of it.

Megatron-LM's ``--optimizer muon`` (``megatron/core/optimizer/emerging_optimizers.py`` at
the snapshot) steps every 2-D weight with ``TensorParallelMuon`` and routes the rest to
Adam (``_is_muon_excluded``: a parameter marked ``use_muon=False``, the word embedding and
the output layer, ``is_embedding_or_output_parameter``, and every tensor that is not
2-D: norms, biases, a convolution's kernel). Both are wrapped by
``Float16OptimizerWithFloat16Params`` under ``--bf16``, which keeps an fp32 master copy of
each parameter it steps (as for Adam, ``static.master_bytes``). Their states, made at the
first optimizer step:

- a Muon matrix: one fp32 ``momentum_buffer`` (``OrthogonalizedOptimizer.step``,
  Emerging-Optimizers: ``torch.zeros_like(grad)`` of the fp32 master's gradient):
  ``MUON_STATE_BYTES``;
- everything else: Adam's ``exp_avg`` and ``exp_avg_sq``: ``ADAM_STATE_BYTES``.

The orthogonalisation (Newton-Schulz on one matrix at a time) is transient and made
inside the optimizer step, after the backward has freed the activations: priced in
``cpmem.pricing.muon_step``.

Sources, at the recordings' snapshot (NVIDIA/Megatron-LM d98e8a64): which tensors Muon
steps, ``emerging_optimizers.py:140-147``; fp16 refused, ``optimizer/__init__.py:774-775``;
``--use-distributed-optimizer`` turned into the layer-wise one, ``arguments.py:1724-1737``;
the legacy path keeps DDP's own (not the distributed optimizer's) buffers,
``training/models/dist_utils.py:326-332``; its assignment,
``layer_wise_optimizer.py:713-754``. The momentum: Emerging-Optimizers'
``OrthogonalizedOptimizer.step`` (``state["momentum_buffer"] = torch.zeros_like(grad)``).
megatron-core 0.16.1 (the installed package) differs: its ``muon.py:252-258`` steps every
2-D non-embedding weight with Muon (no ``use_muon`` tag) and has no legacy/precomputed
layout switch; cpmem follows the snapshot, which ran the recordings.

``--use-distributed-optimizer`` with Muon is the layer-wise distributed optimizer
(``validate_args`` turns it into ``use_layer_wise_distributed_optimizer`` and turns the
byte-sharded one off, arguments.py). By default its buffers follow the precomputed
layout, priced in ``cpmem.pricing.layer_wise_layout`` (the matrices bin-packed whole by
their shapes: the fused QKV weight as one matrix, ``--muon-no-split-qkv`` only changes how
Newton-Schulz splits it). With ``--no-use-layer-wise-param-layout`` it runs the legacy
path (``LayerWiseDistributedOptimizer._shard_params_ping_pong``,
layer_wise_optimizer.py): the gradients are all-reduced into the whole buffer every rank
keeps (no distributed-optimizer padding), and each parameter is given whole to one rank
of its data-parallel group, the dense ones over DP x CP and the routed experts' over the
expert data-parallel group: sorted by element count (a stable sort), the i-th goes to
rank ``loop[i mod 2n]`` with ``loop = 0, 1, ..., n-1, n-1, ..., 0``. A rank keeps the
master copy and the states of its own parameters only.

The stable sort keeps tensors of equal size in the order of the optimizers' parameter
groups, which this module does not restate: where tensors of one size are stepped by both
optimizers, a rank is priced with the costlier ones among those it receives (at most the
difference between Adam's and Muon's states on those tensors, an upper bound).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import groupby

MUON_STATE_BYTES = 4
"""Muon's fp32 momentum per element of a matrix it steps."""
ADAM_STATE_BYTES = 8
"""Adam's two fp32 moments per element of a tensor Muon leaves to it."""


def state_bytes(matrix: bool) -> int:
    """The state bytes per element of a tensor: Muon's momentum for a matrix, Adam's two
    moments otherwise."""
    return MUON_STATE_BYTES if matrix else ADAM_STATE_BYTES


@dataclass(frozen=True)
class MuonShare:
    """What one rank steps: ``elements`` (each with a master copy where the parameters
    are 2-byte) and the ``state_bytes`` of their momentum or moments."""

    elements: int
    state_bytes: int

    def __add__(self, other: MuonShare) -> MuonShare:
        return MuonShare(self.elements + other.elements, self.state_bytes + other.state_bytes)

    def total(self, master_bytes: int) -> int:
        return self.elements * master_bytes + self.state_bytes


NO_SHARE = MuonShare(0, 0)


def whole(tensors: Sequence[int], matrices: Sequence[bool]) -> MuonShare:
    """Every tensor stepped on the rank (no distributed optimizer)."""
    return MuonShare(
        sum(tensors), sum(n * state_bytes(m) for n, m in zip(tensors, matrices, strict=True))
    )


def ping_pong_rank(position: int, ranks: int) -> int:
    """The rank the ``position``-th tensor of the sorted list goes to: ``0..n-1`` then
    ``n-1..0``, repeated."""
    step = position % (2 * ranks)
    return step if step < ranks else 2 * ranks - 1 - step


def layer_wise_share(
    tensors: Sequence[int],
    matrices: Sequence[bool],
    ranks: int,
    rank: int,
) -> MuonShare:
    """Rank ``rank``'s share of ``tensors`` (elements each, ``matrices`` saying which Muon
    steps) under the legacy layer-wise assignment over ``ranks`` ranks; where tensors of
    one size are stepped by both optimizers, the costlier ones of those the rank receives
    (an upper bound)."""
    if ranks == 1:
        return whole(tensors, matrices)
    items = sorted(zip(tensors, matrices, strict=True), key=lambda t: t[0])
    share = NO_SHARE
    position = 0
    for numel, group in groupby(items, key=lambda t: t[0]):
        kinds = [m for _, m in group]
        received = sum(
            1 for i in range(position, position + len(kinds)) if ping_pong_rank(i, ranks) == rank
        )
        position += len(kinds)
        # the costlier tensors first: Adam's (not a matrix) before Muon's
        costly = sorted(kinds, key=lambda m: state_bytes(m), reverse=True)[:received]
        share += MuonShare(numel * len(costly), sum(numel * state_bytes(m) for m in costly))
    return share


def busiest_share(
    tensors: Sequence[int], matrices: Sequence[bool], ranks: int, master_bytes: int
) -> MuonShare:
    """The largest share any of the ``ranks`` ranks steps (``layer_wise_share``)."""
    shares = [layer_wise_share(tensors, matrices, ranks, r) for r in range(ranks)]
    return max(shares, key=lambda s: s.total(master_bytes))
