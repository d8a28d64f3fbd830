"""Megatron FSDP's buffers (``--use-megatron-fsdp``): how a rank's trained parameters are
grouped, laid out, padded and sharded over the data-parallel group, what it keeps between
steps, and what it gathers and reduces while a step runs.

Read from Megatron-LM at the snapshot (d98e8a64), ``megatron/core/distributed/fsdp/``:
``src/megatron_fsdp/param_and_grad_buffer.py`` (``pgb``), ``src/megatron_fsdp/megatron_fsdp.py``
(``mfsdp``) and ``mcore_fsdp_adapter.py``:

- every ``TransformerLayer`` is an FSDP unit (mcore_fsdp_adapter.py:163-173, any strategy but
  ``no_shard``, which has none); a unit's parameters are one bucket, and the parameters
  outside every unit (the embedding, a learned position table, the final norm, an untied
  output layer) one more, in ``named_parameters`` order (``_get_parameter_groups``,
  pgb:1731-1860; Megatron-LM splits that bucket at 40M elements only under
  ``--overlap-grad-reduce``, training.py:2179-2194, which cpmem does not read: the split
  would only add a bucket's end padding);
- a bucket's ``chunk_size_factor`` is its widest row (``shape[1:]``), widened to the lcm of
  any row that does not divide it (pgb:1876-1912); each tensor whose size is not a
  multiple of it is rounded up to one, its remnant sharing a chunk with another's, and
  tensors smaller than a chunk fill the gaps or follow at the end
  (``build_data_parallel_buffer_index``, pgb:258-383); the bucket ends on a multiple of
  DP x chunk unless the strategy is ``no_shard`` (pgb:285-288, 366-371), and a rank's
  shard is the bucket's size / DP (pgb:410);
- the strategy decides which buffers are sharded (pgb:2330-2349): ``optim`` the fp32 main
  weights (and so the optimizer's states), ``optim_grads`` also the gradient buffer,
  ``optim_grads_params`` also the model's weights; ``no_shard`` keeps the module's own
  weights (no weight buffer, pgb:2652) and shards nothing;
- the main weights are fp32 (``--megatron-fsdp-main-params-dtype fp32``, pgb:2688-2706),
  the gradient buffer in ``--megatron-fsdp-main-grads-dtype`` (the parameters' dtype under
  ``auto``, pgb:2313-2322); the optimizer steps a view of each tensor's part of the main
  weights' shard (``_init_optimizer_named_parameters``, pgb:3295-3349: real elements, no
  padding), its gradient a copy in the main weights' dtype where the buffer's is narrower
  (``update_main_grads``, pgb:3381).

While a step runs, under ``optim_grads_params`` a bucket is gathered whole into a buffer
of its own before its unit's forward, with the buckets after it up to half the
communication unit (``suggested_AG_prefetch_size``: at least 500M elements,
mfsdp:417-444; ``all_gather_params``, pgb:4487-4515), released after the unit's forward
(mfsdp:977-1001) and gathered again for its backward; the outside-unit bucket is never
released by a unit hook. Under ``optim_grads`` and ``optim_grads_params`` a bucket's
gradients are accumulated in a whole bucket of their own until it is reduce-scattered,
and the reduce-scatter queue frees the oldest only past the unit size (at least 1B
elements, ``wait_for_previous_grad_reduce``, pgb:3924-3955).

Between steps the units' gathered and gradient buckets are freed
(``AllGatherPipeline.reset``, ``GradReducePipeline.reset``); the outside-unit buckets stay
gathered (``reset(preserve_non_fsdp_units=True)``, pgb:4339-4371, since Megatron-LM
378d81fbd3 of 2026-05-30; the recordings made before it hold them gathered only while a
step runs: a declared miss of the tier, ``cpmem.gate.megatron_misses``).

Routed experts (``.experts.`` in a parameter's name) and FP8 weights are parameter groups
of their own within a unit, so buckets of their own (``cpmem.pricing.fsdp_units``); an
expert bucket is padded to and sharded over the expert data-parallel group
(``get_fsdp_group(is_expert_parallel=True)``, pgb:2580-2600); an FP8 bucket's weights are
``uint8`` (pgb:2634-2635), its gradients bf16 under ``auto`` (pgb:2313-2322).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cpmem.model.geometry import ModelGeometry
from cpmem.pricing.components import OUTSIDE_FIGURE
from cpmem.pricing.fp8_static import TRANSPOSE_BEFORE_CC
from cpmem.pricing.fsdp_units import Tensor, outside_tensors, unit_count, unit_tensors
from cpmem.pricing.optimizer_state import MASTER_BYTES, master_gradient_bytes
from cpmem.pricing.torch_fsdp2 import fsdp2_in_flight, fsdp2_units, gradient_excess
from cpmem.pricing.workspaces import compute_capability
from cpmem.step.step import StepSettings
from cpmem.step.trainer import Optimizer

STRATEGIES = ("no_shard", "optim", "optim_grads", "optim_grads_params")
"""``--data-parallel-sharding-strategy``'s values (arguments.py)."""

PREFETCH_ELEMENTS = 500_000_000
"""The all-gather prefetch window: half the communication unit, which is at least 1B
elements (``max(1_000_000_000, ...)``, megatron_fsdp.py:438-444)."""
BF16_BYTES = 2
"""An FP8 bucket's gradient element under ``auto`` (``torch.bfloat16``, pgb:2316)."""
REDUCE_QUEUE_ELEMENTS = 1_000_000_000
"""The reduce-scatter queue's capacity: the communication unit (megatron_fsdp.py:443)."""


@dataclass(frozen=True)
class Bucket:
    """One bucket as laid out: ``size`` elements (padding included), each tensor's
    ``(start, end)``, whether it is an FSDP unit's (and which layer's: ``layer``), whether
    it holds routed experts (sharded over the expert data-parallel group) and whether its
    weights are FP8 (a ``uint8`` weight buffer)."""

    size: int
    spans: tuple[tuple[int, int], ...]
    unit: bool
    layer: int = -1
    expert: bool = False
    fp8: bool = False

    def shard_real(self, shards: int, index: int) -> int:
        """The real (not padding) elements of shard ``index`` of ``shards``."""
        size = self.size // shards
        lo, hi = index * size, (index + 1) * size
        return sum(max(0, min(b, hi) - max(a, lo)) for a, b in self.spans)

    @property
    def real(self) -> int:
        return sum(b - a for a, b in self.spans)


def chunk_factor(tensors: Sequence[Tensor]) -> int:
    """The bucket's chunk: its widest row, widened to the lcm with each row that neither
    equals it, nor divides it with the tensor a whole number of chunks, nor belongs to a
    tensor smaller than a chunk (pgb:1876-1912, tensors taken widest row first)."""
    ordered = sorted(tensors, key=lambda t: -t.width)
    chunk = ordered[0].width
    for t in ordered:
        fits = t.width == chunk or (chunk % t.width == 0 and t.numel % chunk == 0)
        if not fits and t.numel >= chunk:
            chunk = math.lcm(chunk, t.width)
    return chunk


def lay_out(
    tensors: Sequence[Tensor], shards: int, padded: bool, unit: bool, layer: int = -1
) -> Bucket:
    """The bucket of ``tensors`` (in ``named_parameters`` order, one group's: all experts'
    or none, all FP8 or none) laid out as ``build_data_parallel_buffer_index`` does
    (pgb:258-383), its end on a multiple of ``shards`` x chunk where ``padded`` (every
    strategy but ``no_shard``)."""
    chunk = chunk_factor(tensors)
    ordered = sorted(tensors, key=lambda t: -t.width)  # stable: the source's sort
    fragments = [t for t in ordered if t.numel < chunk]
    regular = [t for t in ordered if t.numel >= chunk]
    spans: list[tuple[int, int]] = []
    at = 0
    while regular:
        t = regular.pop(0)
        spans.append((at, at + t.numel))
        if t.numel % chunk == 0:
            at += t.numel
            continue
        gap = at + t.numel
        at += (t.numel // chunk + 1) * chunk
        remain = t.numel % chunk
        space = chunk - remain
        pair = next(
            (r for r in regular if r.numel % chunk and remain + r.numel % chunk <= chunk), None
        )
        if pair is not None:
            regular.remove(pair)
            rhs = pair.numel % chunk
            spans.append((at - rhs, at - rhs + pair.numel))
            space -= rhs
            at += pair.numel // chunk * chunk
        for f in list(fragments):
            if f.numel <= space:
                spans.append((gap, gap + f.numel))
                space -= f.numel
                gap += f.numel
                fragments.remove(f)
    for f in fragments:
        spans.append((at, at + f.numel))
        at += f.numel
    size = -(-at // (shards * chunk)) * shards * chunk if padded else at
    first = tensors[0]
    return Bucket(size, tuple(spans), unit, layer, first.expert, first.fp8)


def _groups(tensors: Sequence[Tensor]) -> list[list[Tensor]]:
    """``tensors`` split into megatron_fsdp's parameter groups, each in the order of its
    first tensor (a new group per expert / FP8 kind, pgb:1791-1830)."""
    groups: dict[tuple[bool, bool], list[Tensor]] = {}
    for t in tensors:
        groups.setdefault((t.expert, t.fp8), []).append(t)
    return list(groups.values())


@dataclass(frozen=True)
class Sharding:
    """The rank's groups: ``dp`` ranks (DP x CP) shard a dense bucket, ``expert_dp`` (the
    expert data-parallel group, world / (ETP x EP x PP)) an expert one; TP, EP and ETP
    divide the tensors; ``fp8``: the linears' weights are FP8."""

    tp: int
    dp: int
    ep: int = 1
    etp: int = 1
    expert_dp: int = 1
    fp8: bool = False

    def shards(self, bucket: Bucket) -> int:
        return self.expert_dp if bucket.expert else self.dp


def fsdp_buckets(g: ModelGeometry, sharding: Sharding, strategy: str) -> list[Bucket]:
    """The rank's buckets: the outside-unit one first (the embedding is the first
    parameter), then each layer's groups, each padded to its own group's ranks x chunk;
    under ``no_shard`` no units, so one bucket per group of every tensor."""
    s = sharding
    padded = strategy != "no_shard"
    layers = [unit_tensors(g, i, s.tp, s.ep, s.etp, s.fp8) for i in range(unit_count(g))]
    if not padded:
        everything = outside_tensors(g, s.tp) + [t for layer in layers for t in layer]
        return [lay_out(group, 1, False, False) for group in _groups(everything)]
    out = [lay_out(outside_tensors(g, s.tp), s.dp, True, False)]
    laid: dict[tuple[Tensor, ...], list[Bucket]] = {}
    for i, tensors in enumerate(layers):
        key = tuple(tensors)
        if key not in laid:  # alike layers lay out alike (the layout is slow at scale)
            laid[key] = [
                lay_out(grp, s.expert_dp if grp[0].expert else s.dp, True, True)
                for grp in _groups(tensors)
            ]
        out += [Bucket(b.size, b.spans, True, i, b.expert, b.fp8) for b in laid[key]]
    return out


@dataclass(frozen=True)
class FsdpStatic:
    """What one rank keeps between steps, in elements: the model weights' buffer
    (``weights``: the module's own tensors under ``no_shard``; ``fp8_weights`` those of
    the FP8 buckets, ``uint8``), the gradient buffer, the fp32 main weights, and the
    elements the optimizer steps (its states' and any fp32 gradient copy's)."""

    weights: int
    gradients: int
    main_weights: int
    stepped: int
    fp8_weights: int = 0
    kept_gathered: int = 0
    """The outside-unit buckets, whole: under ``optim_grads_params`` kept gathered between
    steps (``AllGatherPipeline.reset(preserve_non_fsdp_units=True)``, pgb:4339-4371: marked
    ``PRESERVED``, their storage kept and gathered into again in place)."""
    fp8_gradients: int = 0
    """Of ``gradients``: the FP8 buckets' elements (their own gradient dtype,
    ``fsdp_gradient_bytes``)."""
    fp8_stepped: int = 0
    """Of ``stepped``: the FP8 buckets' elements."""

    """The outside-unit buckets, whole: under ``optim_grads_params`` kept gathered between
    steps (``AllGatherPipeline.reset(preserve_non_fsdp_units=True)``, pgb:4339-4371: marked
    ``PRESERVED``, their storage kept and gathered into again in place)."""


def fsdp_static(
    buckets: Sequence[Bucket], sharding: Sharding, strategy: str, index: int, expert_index: int = 0
) -> FsdpStatic:
    """The buffers of the rank at ``index`` of its DP x CP group (``expert_index`` of its
    expert data-parallel group): a sharded buffer holds its shard of each bucket (size /
    the bucket's group), an unsharded one the whole bucket; the optimizer steps its
    shard's real elements (all of them under ``no_shard``)."""
    weights_sharded = strategy == "optim_grads_params"
    grads_sharded = strategy in ("optim_grads", "optim_grads_params")
    main_sharded = strategy != "no_shard"

    def held(b: Bucket, sharded: bool) -> int:
        return b.size // sharding.shards(b) if sharded else b.size

    def weights(fp8: bool) -> int:
        mine = [b for b in buckets if b.fp8 == fp8]
        if strategy == "no_shard":
            return sum(b.real for b in mine)
        return sum(held(b, weights_sharded) for b in mine)

    def stepped(b: Bucket) -> int:
        if not main_sharded:
            return b.real
        return b.shard_real(sharding.shards(b), expert_index if b.expert else index)

    return FsdpStatic(
        weights(False),
        sum(held(b, grads_sharded) for b in buckets),
        sum(held(b, main_sharded) for b in buckets),
        sum(stepped(b) for b in buckets),
        weights(True),
        sum(b.size for b in buckets if not b.unit) if weights_sharded else 0,
        sum(held(b, grads_sharded) for b in buckets if b.fp8),
        sum(stepped(b) for b in buckets if b.fp8),
    )


def fsdp_gradient_bytes(held: FsdpStatic, opt: Optimizer, param_bytes: int) -> tuple[int, int]:
    """The rank's gradient buffer and the optimizer's fp32 copies of its narrower
    gradients, in bytes, for parameters of ``param_bytes`` (the buffer's element
    ``opt.grad_bytes``: ``--megatron-fsdp-main-grads-dtype``, the parameters' dtype under
    ``auto``). Under ``auto`` an FP8 bucket's gradients are bf16 whatever the parameters'
    dtype (``_resolve_group_grad_dtype``, param_and_grad_buffer.py:2306-2316 at
    4828d651), so beside fp32 parameters (``grad_bytes`` 4 as well, read as ``auto``)
    they take 2 B an element; the optimizer steps each shard's gradient converted to
    its fp32 main weight's dtype (``optimizer_grad.to(param.dtype)``, :3369-3373, kept
    in ``dist_main_grad``): a copy of 4 B an element where the gradient is narrower
    (``master_gradient_bytes``), every stepped element under 2-byte gradients and the
    FP8 ones beside fp32 gradients."""
    grad = opt.grad_bytes
    fp8_grad = BF16_BYTES if param_bytes == grad == MASTER_BYTES else grad
    buffer = grad * (held.gradients - held.fp8_gradients) + fp8_grad * held.fp8_gradients
    copies = master_gradient_bytes(opt) * held.stepped
    if opt.kind != "none" and fp8_grad < MASTER_BYTES <= grad:
        copies += MASTER_BYTES * held.fp8_stepped
    return buffer, copies


def _window(
    groups: Sequence[Sequence[Bucket]], first: int, limit: int, nbytes: Callable[[Bucket], int]
) -> int:
    """Bytes of the first ``first`` groups and the groups after them taken while the
    elements taken beyond those are fewer than ``limit`` (the prefetch and queue loops,
    pgb:4495-4515, 3938-3948: a group at a time, counted in elements)."""
    taken = [b for grp in groups[:first] for b in grp]
    beyond = 0
    for grp in groups[first:]:
        if beyond >= limit:
            break
        beyond += sum(b.size for b in grp)
        taken += grp
    return sum(nbytes(b) for b in taken)


def _unit_groups(buckets: Sequence[Bucket]) -> list[list[Bucket]]:
    """The units' buckets in megatron_fsdp's bucket groups (a unit's expert buckets, its
    others: ``bucket_to_bucket_group``, pgb:1938-1955), in order."""
    groups: dict[tuple[int, bool], list[Bucket]] = {}
    for b in buckets:
        if b.unit:
            groups.setdefault((b.layer, b.expert), []).append(b)
    return list(groups.values())


@dataclass(frozen=True)
class FsdpInFlight:
    """What is in flight while a step runs (in the units ``fsdp_in_flight`` was given:
    elements at 1 B each): whole buckets of parameters gathered (``gathered``, in each
    bucket's weight dtype) and of gradients not yet reduce-scattered (``gradients``, in
    the gradient buffer's dtype), at the forward's and the backward's worst moment."""

    forward_gathered: int
    gathered: int
    gradients: int


def pooled_layers(buckets: Sequence[Bucket]) -> set[int]:
    """The units the double buffer serves (``FixedPoolAllocator``, pgb:647-745): the largest
    set of units alike, each with the same buckets in order, of the same dtype and real
    elements (``_is_two_bucket_group_equal``, pgb:735-747), the first such set where
    several are as large (pgb:680-688)."""
    units: dict[int, list[Bucket]] = {}
    for b in buckets:
        if b.unit:
            units.setdefault(b.layer, []).append(b)
    alike = {layer: tuple((b.real, b.fp8) for b in bs) for layer, bs in units.items()}
    best: list[int] = []
    for layer in units:
        same = [other for other in units if alike[other] == alike[layer]]
        if len(same) > len(best):
            best = same
    return set(best)


def double_buffer_bytes(
    buckets: Sequence[Bucket], strategy: str, param_bytes: int, grad_bytes: int
) -> int:
    """What the double buffer keeps (``--fsdp-double-buffer``): two buffers per bucket of a
    served unit (``UB_BUFFER_NUM = 2``, pgb:2526), taken from megatron's global memory
    buffer and kept for the process (``get_global_memory_buffer().get_tensor``,
    pgb:857-859): the gathered weights' under ``optim_grads_params``, the gradients' under
    ``optim_grads`` and ``optim_grads_params``, each bucket whole."""
    pooled = pooled_layers(buckets)
    if not pooled:
        return 0
    unit = [b for b in buckets if b.unit and b.layer == min(pooled)]
    weights = sum(b.size * (1 if b.fp8 else param_bytes) for b in unit)
    grads = sum(b.size * grad_bytes for b in unit)
    held = (weights if strategy == "optim_grads_params" else 0) + (
        grads if strategy in ("optim_grads", "optim_grads_params") else 0
    )
    return 2 * held


def fsdp_in_flight(
    buckets: Sequence[Bucket],
    strategy: str,
    param_bytes: int = 1,
    grad_bytes: int = 1,
    transposes: bool = False,
    pooled: frozenset[int] = frozenset(),
) -> FsdpInFlight:
    """A bound on what is in flight, added to the activations' peak: under
    ``optim_grads_params`` the units one gather brings (the first unit's bucket groups and
    the prefetch window after them; the outside-unit buckets stay gathered between steps,
    ``FsdpStatic.kept_gathered``); under ``optim_grads`` and ``optim_grads_params`` the outside-unit
    bucket's gradients (from the final norm's, right after the head's backward, to the
    embedding's, the last) and the units' the reduce-scatter queue holds (the first
    unit's and up to the queue's capacity after them). Each term is at most every bucket;
    they are not all live at once (the units' gradients grow as their activations are
    freed), so the sum is a bound. A gathered FP8 bucket is 1 B an element; where
    ``transposes`` (compute capability below 10) the backward's gather makes each FP8
    weight's transpose beside it, 1 B an element (``fp8_create_transpose_cache`` after
    ``wait_bucket_ready(bwd=True)``, mfsdp:493-498; freed with the unit's weights after its
    backward, ``release_params_fp8_transpose_cache``, mfsdp:627-634). The ``pooled`` units'
    buckets are the double buffer's, static (``double_buffer_bytes``): not in flight."""
    groups = _unit_groups([b for b in buckets if b.layer not in pooled])
    first = sum(1 for grp in groups if grp[0].layer == groups[0][0].layer) if groups else 0

    def weight(b: Bucket) -> int:
        return b.size * (1 if b.fp8 else param_bytes)

    def grad(b: Bucket) -> int:
        return b.size * grad_bytes

    outside = [b for b in buckets if not b.unit]

    def weight_and_transpose(b: Bucket) -> int:
        return weight(b) + (b.size if b.fp8 and transposes else 0)

    forward = backward = 0
    if strategy == "optim_grads_params":  # the outside-unit buckets: static (kept_gathered)
        forward = _window(groups, first, PREFETCH_ELEMENTS, weight)
        backward = _window(groups, first, PREFETCH_ELEMENTS, weight_and_transpose)
    gradients = 0
    if strategy in ("optim_grads", "optim_grads_params"):
        gradients = sum(map(grad, outside)) + _window(groups, first, REDUCE_QUEUE_ELEMENTS, grad)
    return FsdpInFlight(forward, backward, gradients)


def fsdp_sharding(settings: StepSettings) -> Sharding:
    """The settings' rank's ``Sharding``."""
    layout = settings.layout
    expert_dp = max(1, settings.world_size // (layout.etp * layout.ep * settings.pipeline.pp))
    fp8 = settings.fp8 is not None and settings.fp8.param_gather
    return Sharding(layout.tp, layout.dp * layout.cp, layout.ep, layout.etp, expert_dp, fp8)


def in_flight_bytes(settings: StepSettings) -> FsdpInFlight:
    """What FSDP holds in flight on the settings' rank beyond the activations, in bytes
    (all 0 without it): under Megatron FSDP (``fsdp_in_flight``) gathered buckets in their
    weights' dtype and gradient buckets in the gradient buffer's; under Torch FSDP2 its
    gathered units, gradients and reduce-scatter inputs, all in the parameters' dtype
    (``cpmem.pricing.torch_fsdp2.fsdp2_in_flight``), charged as gathered at the whole
    backward."""
    opt = settings.optimizer
    if opt.fsdp == "none":
        return FsdpInFlight(0, 0, 0)
    if opt.fsdp == "torch_fsdp2":
        layout, te = settings.layout, settings.runtime.transformer_impl == "transformer_engine"
        units = fsdp2_units(settings.geometry, layout.tp, layout.etp, output_unit=te)
        ranks = layout.dp * layout.cp
        flight2 = fsdp2_in_flight(units, ranks)
        excess = gradient_excess(units, ranks, opt.grad_bytes, master_gradient_bytes(opt))
        p = settings.dtype_bytes
        return FsdpInFlight(p * flight2.forward + excess, p * flight2.backward + excess, 0)
    sharding = fsdp_sharding(settings)
    buckets = fsdp_buckets(settings.geometry, sharding, opt.fsdp)
    transposes = sharding.fp8 and compute_capability(settings) < TRANSPOSE_BEFORE_CC
    pooled = frozenset(pooled_layers(buckets)) if opt.fsdp_buffers != "dynamic" else frozenset()
    return fsdp_in_flight(
        buckets, opt.fsdp, settings.dtype_bytes, opt.grad_bytes, transposes, pooled
    )


def backward_in_flight(flight: FsdpInFlight, backward: int, layers: int | None) -> int:
    """What ``flight`` adds to a forward+backward figure of ``backward`` bytes whose
    layers' backward alone holds ``layers`` (None: not priced apart): the backward's
    gathered buckets at its every moment, and the gradient buckets only from the layers'
    backward on (they are made in the parameters' post-accumulate-grad hooks, the first
    once the output layer's backward has run: ``registry.with_fsdp``), so they raise the
    figure only by what the layers' moment with them holds above it. Where the layers'
    moment is not priced apart they are charged at the whole backward."""
    if layers is None:
        return flight.gathered + flight.gradients
    return flight.gathered + max(0, layers + flight.gradients - backward)


def startup_notes(settings: StepSettings) -> tuple[str, ...]:
    """Under Torch FSDP2, the answer's line on its start-up: Megatron-LM builds the whole
    model on each GPU before ``fully_shard`` shards it, unless ``--use-cpu-initialization``
    or ``--init-model-with-meta-device`` (training.py:1796-1802 at 4828d651), a moment
    before any step's memory that the
    figure does not hold."""
    if settings.optimizer.fsdp != "torch_fsdp2":
        return ()
    layout, te = settings.layout, settings.runtime.transformer_impl == "transformer_engine"
    units = fsdp2_units(settings.geometry, layout.tp, layout.etp, output_unit=te)
    whole = settings.dtype_bytes * sum(t.numel for t in units.tensors())
    return (
        f"fsdp=torch_fsdp2: Megatron-LM builds the whole model on each GPU before "
        f"fully_shard shards it ({whole:,} B of weights at start-up, before the step's "
        "static memory; none under --use-cpu-initialization or "
        "--init-model-with-meta-device, training.py:1796-1802): " + OUTSIDE_FIGURE,
    )


def fp8_weight_count(g: ModelGeometry, sharding: Sharding) -> int:
    """The FP8 weights on the rank, each a ``Float8Tensor`` with its own fp32
    ``_scale_inv`` whatever buffer holds its data (``cpmem.pricing.fp8_static``)."""
    if not sharding.fp8:
        return 0
    s = sharding
    return sum(
        1
        for i in range(unit_count(g))
        for t in unit_tensors(g, i, s.tp, s.ep, s.etp, True)
        if t.fp8
    )
