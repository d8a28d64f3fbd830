"""Torch FSDP2 in Megatron-LM (``--use-torch-fsdp2``): PyTorch's ``fully_shard`` sharding
each parameter of a rank over its data-parallel group, what a rank keeps between steps
and what it gathers and reduces while a step runs. The ``fsdp`` setting ``torch_fsdp2``
of the step, beside Megatron FSDP's strategies (``cpmem.pricing.fsdp``).

Read from Megatron-LM at 4828d651: ``TorchFullyShardedDataParallel``
(``megatron/core/distributed/torch_fully_sharded_data_parallel.py``) calls ``fully_shard``
on every ``TransformerLayer``, ``LanguageModelEmbedding``, ``RotaryEmbedding`` (no
parameter) and megatron-core's own ``ColumnParallelLinear`` (the output layer; not under
``--transformer-impl local``), in ``modules()`` order, then on the whole model: the
parameters of no such module (the final norm) are the root's. Each is a unit here. The
mesh is the data-parallel group with context parallelism (DP x CP ranks). The model is
cast by ``Float16Module`` before it is wrapped (training.py:1805-1807, 1820-1875), no
mixed-precision policy is given, so every gathered weight and gradient is in the
parameters' dtype. The optimizer is megatron's non-distributed one
(``--use-distributed-optimizer`` is refused beside it, arguments.py:980-981):
``Float16OptimizerWithFloat16Params`` copies each (sharded) parameter to fp32
(``param.detach().clone().float()``, optimizer.py:827) and each sharded gradient
(``model_param.grad.float()``, optimizer.py:914), kept until the next ``zero_grad``
(training.py:2307), dropping the 2-byte gradient as it copies it (optimizer.py:919).

Read from PyTorch's ``torch/distributed/fsdp/_fully_shard`` (2.13, installed):

- a parameter is split along dim 0 into DP x CP chunks of ``ceil(dim0 / ranks)`` rows
  (``_chunk_with_empty``); each rank keeps a zero-padded chunk of that size
  (``padded_sharded_param_size``, ``_fsdp_param.py:298-307``) and its parameter is the
  view of its real rows (the last ranks fewer, or none);
- a unit's gradients are reduce-scattered into one flat buffer of its padded chunks
  (``foreach_reduce``, ``_fsdp_collectives.py:592-613``), each parameter's sharded
  gradient a view into it, accumulated in place over micro-batches;
- a unit is gathered into one flat buffer of ``ranks`` x its padded chunks, then copied
  out into one padded tensor per parameter (``foreach_all_gather``,
  ``foreach_all_gather_copy_out``); in the forward the flat buffer is freed at the next
  unit's copy-out (``all_gather_state``, ``_fsdp_param_group.py:417-489``) and the
  unit's own tensors after its forward (``reshard_after_forward``, Megatron's default;
  the root's, the final norm, are held gathered here throughout: torch keeps them so
  where ``reshard_after_forward`` is left to its default, ``_fsdp_state.py:203-207``,
  which Megatron does not, a bound); in the backward the next unit is
  gathered ahead (``_backward_prefetch``), the unit's gradients are copied into a
  reduce-scatter input of its padded size, and one such input is kept until the next
  unit's reduce-scatter (``reduce_scatter_states``, capacity 1,
  ``_fsdp_param_group.py:588-720``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cpmem.model.geometry import ModelGeometry
from cpmem.pricing.fsdp_units import Tensor, unit_count, unit_tensors
from cpmem.pricing.weights import padded_vocab


def rows(t: Tensor) -> int:
    """The tensor's dim 0: its elements over its row (``shape[1:]``)."""
    return t.numel // t.width


def chunk_rows(t: Tensor, ranks: int) -> int:
    """Rows of each rank's padded chunk: ``ceil(dim0 / ranks)`` (``torch.chunk``)."""
    return -(-rows(t) // ranks)


def padded_shard(t: Tensor, ranks: int) -> int:
    """Elements of a rank's padded chunk of ``t``, the same on every rank."""
    return chunk_rows(t, ranks) * t.width


def real_shard(t: Tensor, ranks: int, index: int) -> int:
    """Real elements of rank ``index``'s chunk (its rows of dim 0, fewer or none on the
    last ranks)."""
    c = chunk_rows(t, ranks)
    return max(0, min(c, rows(t) - index * c)) * t.width


@dataclass(frozen=True)
class Units:
    """The rank's parameters grouped as ``fully_shard`` groups them: the units in forward
    order (the embedding, each layer, the output layer) and the root's."""

    units: tuple[tuple[Tensor, ...], ...]
    root: tuple[Tensor, ...]

    def tensors(self) -> list[Tensor]:
        return [t for u in self.units for t in u] + list(self.root)


def fsdp2_units(g: ModelGeometry, tp: int, etp: int = 1, output_unit: bool = True) -> Units:
    """The units of a GPT model on one stage with an untied output layer: the embedding
    (word table, rows of ``hidden``, and a learned position table), each
    ``TransformerLayer`` (``cpmem.pricing.fsdp_units.unit_tensors``: every routed expert
    on the rank, EP being 1, split by ``etp``), the output layer
    (``[vocab / TP, hidden]``, its own unit where ``output_unit``, else the root's); the
    root holds the final norm (two tensors for LayerNorm)."""
    h = g.hidden
    vocab = Tensor(padded_vocab(g, tp) // tp * h, h)
    embedding = [vocab]
    if g.learned_position_rows:
        embedding.append(Tensor(g.learned_position_rows * h, h))
    layers = [tuple(unit_tensors(g, i, tp, 1, etp)) for i in range(unit_count(g))]
    root = [Tensor(h)] * (2 if g.norm == "layernorm" else 1)
    units = [tuple(embedding), *layers]
    if output_unit:
        units.append((vocab,))
    else:
        root.append(vocab)
    return Units(tuple(units), tuple(root))


@dataclass(frozen=True)
class Fsdp2Static:
    """What one rank keeps, in elements: its padded chunks (``padded``: the weights, and
    the gradients' flat reduce-scatter outputs) and its real elements (``real``: the
    optimizer's fp32 copies, moments and fp32 gradients)."""

    padded: int
    real: int


def fsdp2_static(units: Units, ranks: int, index: int) -> Fsdp2Static:
    """The padded and real elements of the rank at ``index`` of its DP x CP group."""
    tensors = units.tensors()
    return Fsdp2Static(
        sum(padded_shard(t, ranks) for t in tensors),
        sum(real_shard(t, ranks, index) for t in tensors),
    )


def gradient_excess(units: Units, ranks: int, grad_bytes: int, copy_bytes: int) -> int:
    """Bytes by which a step's gradients (``grad_bytes`` on every padded chunk) can
    outgrow the fp32 copies (``copy_bytes`` on the real elements) the static memory holds
    in their place (``cpmem.pricing.static``): ``zero_grad`` frees the copies as the step
    starts and the gradients fill in over its backward. Taken at the rank with the fewest
    real elements, the last, so that it bounds every rank's; none where no copy is made
    (fp32 gradients are static themselves)."""
    if not copy_bytes:
        return 0
    held = fsdp2_static(units, ranks, ranks - 1)
    return max(0, grad_bytes * held.padded - copy_bytes * held.real)


def gathered(tensors: Sequence[Tensor], ranks: int) -> int:
    """Elements of a unit gathered: ``ranks`` x its padded chunks (the flat all-gather
    buffer, and again the per-parameter outputs it is copied into)."""
    return ranks * sum(padded_shard(t, ranks) for t in tensors)


@dataclass(frozen=True)
class Fsdp2InFlight:
    """Elements in flight beyond the activations at the forward's worst moment and the
    backward's."""

    forward: int
    backward: int


def fsdp2_in_flight(units: Units, ranks: int) -> Fsdp2InFlight:
    """A bound on what ``fully_shard`` holds while a step runs, every unit resharded
    after its forward. The root is held gathered from its forward to its backward (``R``);
    ``P[i]`` is unit ``i`` gathered, the root's counted as a unit before the first:

    - forward: unit ``i``'s gather is issued while the previous unit's flat buffer is
      still held (``P[i-1] + P[i]``); that buffer is freed as unit ``i`` is copied out
      (``wait_for_unshard``), its flat buffer kept beside its copy (``2 P[i]``) until the
      next unit's copy-out: ``R + max(P[i-1], P[i]) + P[i]``;
    - backward, while unit ``i`` runs its backward: its weights and its gradients (at most
      its padded size), the unit before it gathered ahead (its flat buffer), the
      reduce-scatter input kept of the unit after it; at its reduce-scatter its weights
      are freed first, the input taken beside its gradients; at its copy-out its flat
      buffer and its copy beside the kept input; the root's weights, gradients and
      reduce-scatter input: ``3 R + 2 P[i] + P[i-1] + P[i+1]``, which bounds each.

    Held against ``fully_shard`` run on the CPU (tests/oracle/test_torch_fsdp2_sharding.py:
    PyTorch's ``FSDPMemTracker`` at every unit's hooks)."""
    root = gathered(units.root, ranks)
    sizes = [gathered(u, ranks) for u in units.units]
    before = [root, *sizes[:-1]]
    after = [*sizes[1:], 0]
    forward = root + max((max(b, p) + p for b, p in zip(before, sizes, strict=True)), default=0)
    backward = 3 * root + max(
        (2 * p + b + a for b, p, a in zip(before, sizes, after, strict=True)), default=0
    )
    return Fsdp2InFlight(forward, backward)
