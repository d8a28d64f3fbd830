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

Between steps the gathered and gradient buckets are freed (``AllGatherPipeline.reset``
and ``GradReducePipeline.reset`` as the recordings ran them, Megatron-LM 2aeaf56c). Since
378d81fbd3 (after every recording) Megatron-LM keeps the outside-unit buckets gathered
between steps; cpmem prices the recordings' behaviour.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from cpmem.model.geometry import ModelGeometry
from cpmem.pricing.layer_parameters import fc1_width, qk_norm_widths, sublayer_norm_tensors
from cpmem.pricing.weights import padded_vocab
from cpmem.step.step import StepSettings

STRATEGIES = ("no_shard", "optim", "optim_grads", "optim_grads_params")
"""``--data-parallel-sharding-strategy``'s values (arguments.py)."""

PREFETCH_ELEMENTS = 500_000_000
"""The all-gather prefetch window: half the communication unit, which is at least 1B
elements (``max(1_000_000_000, ...)``, megatron_fsdp.py:438-444)."""
REDUCE_QUEUE_ELEMENTS = 1_000_000_000
"""The reduce-scatter queue's capacity: the communication unit (megatron_fsdp.py:443)."""


@dataclass(frozen=True)
class Tensor:
    """One parameter on the rank: ``numel`` elements, rows of ``width`` (``shape[1:]``'s
    elements; 1 for a vector)."""

    numel: int
    width: int = 1


@dataclass(frozen=True)
class Bucket:
    """One bucket as laid out: ``size`` elements (padding included), each tensor's
    ``(start, end)``, and whether it is an FSDP unit's."""

    size: int
    spans: tuple[tuple[int, int], ...]
    unit: bool

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


def lay_out(tensors: Sequence[Tensor], shards: int, padded: bool, unit: bool) -> Bucket:
    """The bucket of ``tensors`` (in ``named_parameters`` order) laid out as
    ``build_data_parallel_buffer_index`` does (pgb:258-383), its end on a multiple of
    ``shards`` x chunk where ``padded`` (every strategy but ``no_shard``)."""
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
    return Bucket(size, tuple(spans), unit)


def layer_tensors(g: ModelGeometry, tp: int) -> list[Tensor]:
    """A dense GPT layer's parameters on one TP rank in megatron-core's Transformer Engine
    spec's ``named_parameters`` order: the attention's output projection (row-parallel:
    rows of the rank's ``q_width / TP`` inputs) and its bias, the QKV projection's fused
    input norm, weight (rows of ``hidden``) and bias, the q/k norms, then the MLP's fc1
    with its fused norm (rows of ``hidden``) and fc2 (rows of ``ffn / TP``), each with its
    bias. Their sum is the layer's ``weights.layer_tensors`` (a test holds it)."""
    h = g.hidden
    q_out = g.q_width * (2 if g.attention_output_gate else 1)
    qkv_out = q_out + 2 * g.kv_width
    fc1 = fc1_width(g, g.ffn)
    norms = [Tensor(n) for n in sublayer_norm_tensors(g)]
    out = [Tensor(h * g.q_width // tp, g.q_width // tp)]
    out += [Tensor(h)] if g.attention_bias else []
    out += [*norms, Tensor(qkv_out * h // tp, h)]
    out += [Tensor(qkv_out // tp)] if g.attention_bias else []
    out += [Tensor(n) for n in qk_norm_widths(g)]
    out += [*norms, Tensor(fc1 * h // tp, h)]
    out += [Tensor(fc1 // tp)] if g.mlp_bias else []
    out += [Tensor(h * g.ffn // tp, g.ffn // tp)]
    out += [Tensor(h)] if g.mlp_bias else []
    return out


def outside_tensors(g: ModelGeometry, tp: int) -> list[Tensor]:
    """The parameters outside every unit on a single stage: the word embedding (rows of
    ``hidden``), a learned position table, the final norm, an untied output layer."""
    h = g.hidden
    vocab = Tensor(padded_vocab(g, tp) // tp * h, h)
    out = [vocab]
    if g.learned_position_rows:
        out.append(Tensor(g.learned_position_rows * h, h))
    out += [Tensor(h)] * (2 if g.norm == "layernorm" else 1)
    if not g.tied_embeddings:
        out.append(vocab)
    return out


def fsdp_buckets(g: ModelGeometry, tp: int, dp: int, strategy: str) -> list[Bucket]:
    """The rank's buckets: the outside-unit one first (the embedding is the first
    parameter), then one per layer; under ``no_shard`` no units, so one bucket of all."""
    padded = strategy != "no_shard"
    layer = layer_tensors(g, tp)
    if not padded:
        everything = outside_tensors(g, tp) + layer * g.layers
        return [lay_out(everything, dp, False, False)]
    unit = lay_out(layer, dp, True, True)
    return [lay_out(outside_tensors(g, tp), dp, True, False)] + [unit] * g.layers


@dataclass(frozen=True)
class FsdpStatic:
    """What one rank keeps between steps, in elements: the model weights' buffer
    (``weights``: the module's own tensors under ``no_shard``), the gradient buffer, the
    fp32 main weights, and the elements the optimizer steps (its states' and any fp32
    gradient copy's)."""

    weights: int
    gradients: int
    main_weights: int
    stepped: int


def fsdp_static(buckets: Sequence[Bucket], dp: int, strategy: str, index: int) -> FsdpStatic:
    """The buffers of data-parallel rank ``index``: a sharded buffer holds its shard of
    each bucket (size / DP), an unsharded one the whole bucket; the optimizer steps its
    shard's real elements (all of them under ``no_shard``)."""
    weights_sharded = strategy == "optim_grads_params"
    grads_sharded = strategy in ("optim_grads", "optim_grads_params")
    main_sharded = strategy != "no_shard"

    def held(sharded: bool) -> int:
        return sum(b.size // dp if sharded else b.size for b in buckets)

    weights = held(weights_sharded) if strategy != "no_shard" else sum(b.real for b in buckets)
    stepped = sum(b.shard_real(dp, index) if main_sharded else b.real for b in buckets)
    return FsdpStatic(weights, held(grads_sharded), held(main_sharded), stepped)


def _window(units: Sequence[Bucket], limit: int) -> int:
    """Elements of the first unit and those after it taken while the ones taken beyond
    the first are fewer than ``limit`` (the prefetch and queue loops, pgb:4495-4515,
    3938-3948)."""
    if not units:
        return 0
    taken = units[0].size
    for b in units[1:]:
        if taken - units[0].size >= limit:
            break
        taken += b.size
    return taken


@dataclass(frozen=True)
class FsdpInFlight:
    """Elements in flight while a step runs: whole buckets of parameters gathered
    (``gathered``, in the parameters' dtype) and of gradients not yet reduce-scattered
    (``gradients``, in the gradient buffer's dtype), at the forward's and the backward's
    worst moment."""

    forward_gathered: int
    gathered: int
    gradients: int


def fsdp_in_flight(buckets: Sequence[Bucket], strategy: str) -> FsdpInFlight:
    """A bound on what is in flight, added to the activations' peak: under
    ``optim_grads_params`` the outside-unit bucket gathered through forward and backward
    and the units one gather brings (the first and the prefetch window after it); under
    ``optim_grads`` and ``optim_grads_params`` the outside-unit bucket's gradients (from
    the final norm's, right after the head's backward, to the embedding's, the last) and
    the units' the reduce-scatter queue holds (the one filling and up to the queue's
    capacity before it). Each term is at most every bucket; they are not all live at once
    (the units' gradients grow as their activations are freed), so the sum is a bound."""
    units = [b for b in buckets if b.unit]
    outside = sum(b.size for b in buckets if not b.unit)
    gathered = 0
    if strategy == "optim_grads_params":
        gathered = outside + _window(units, PREFETCH_ELEMENTS)
    gradients = 0
    if strategy in ("optim_grads", "optim_grads_params"):
        gradients = outside + _window(units, REDUCE_QUEUE_ELEMENTS)
    return FsdpInFlight(gathered, gathered, gradients)


def in_flight_bytes(settings: StepSettings) -> tuple[int, int]:
    """What Megatron FSDP holds in flight on the settings' rank beyond the activations,
    at the forward's peak and at the backward's (``fsdp_in_flight``): gathered buckets
    in the parameters' dtype, gradient buckets in the gradient buffer's; (0, 0) without
    it."""
    opt = settings.optimizer
    if opt.fsdp == "none":
        return 0, 0
    layout = settings.layout
    buckets = fsdp_buckets(settings.geometry, layout.tp, layout.dp * layout.cp, opt.fsdp)
    flight = fsdp_in_flight(buckets, opt.fsdp)
    p = settings.dtype_bytes
    return p * flight.forward_gathered, p * flight.gathered + opt.grad_bytes * flight.gradients
