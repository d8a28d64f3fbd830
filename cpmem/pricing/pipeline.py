"""A pipeline-parallel step: every stage's peak over its schedule, for any policy.

A stage runs its micro-batches' forwards and backwards in megatron's order
(``cpmem.step.pipeline``); each forward of a (micro-batch, model chunk) keeps its
retained bytes (``components.RETAINED``, with the policy's multiplicative margin) until
that chunk's backward, and a chunk off the first virtual stage also keeps the activation
it received (megatron's ``input_tensors``: the gradient of that input is what its
backward sends back) where its layers keep their saved sets (under full recompute the
chunk's first checkpoint keeps that input as its layer input, already in the retained
bytes). So at each op the stage holds the retained bytes and received
inputs of every chunk in flight, the op's own figure (the policy's estimate of that
chunk's layers for that micro-batch: its forward peak, or its forward+backward figure at
a backward) and its own received input, and a chunk that sends its output on (any but
the last virtual stage) holds that activation while it is sent and, at its backward, the
gradient it receives. Every activation that crosses a stage is one layer input on the
rank: ``[rank tokens / (tp under SP), H]``, bf16. A stage's peak is the largest of those
moments; the step's figure is the busiest stage's (``estimate_bytes``), every stage's is
in ``stage_bytes``.

Each (micro-batch, chunk) is priced by the policy as a model of the chunk's layers: the
first virtual stage's chunk is where the embedding feeds the layers, the last holds the
head and the returned outputs; every other chunk returns nothing (its output leaves the
stage). Per CP rank, an in-flight chunk's retained bytes are its busiest rank's scaled by
that rank's share of the chunk's figure (exact on the busiest rank).

Under fine-grained activation offloading (the step's ``offload``) an in-flight chunk keeps
its retained bytes less what the manager holds on the host (``cpmem.pricing.offload``);
the op's own chunk keeps all of it, and under the combined 1F1B schedule so does the chunk
whose backward runs beside the op's forward (or whose forward runs beside its backward).

With ``pp = 1`` nothing here runs: ``cpmem.pricing.registry.price`` prices the step as
it always has.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from cpmem.pricing.components import Component, retained_bytes
from cpmem.pricing.estimate import Estimate
from cpmem.pricing.head import keeps_norm_input, vocab_shard
from cpmem.pricing.offload import LayerOffload, layer_offloads, merged_partners, offloaded_bytes
from cpmem.pricing.widths import sp_divisor
from cpmem.step.pipeline import Op
from cpmem.step.step import Step
from cpmem.step.trainer import Head

Policy = Callable[[Step], Estimate]


@dataclass(frozen=True)
class Moment:
    """An op on the busiest rank with what the stage held: the chunk's own estimate,
    the in-flight chunks' retained bytes, the received inputs and the send/receive
    buffer."""

    bytes: int
    rank: int
    op: Op
    in_flight: int
    estimate: Estimate
    kept: int
    inputs: int
    buffer: int
    deferred: int = 0

    def components(self, figure: str) -> dict[str, int]:
        """What the stage held at this moment on ``rank``: the chunk's own components
        (its forward's, or at a backward its forward+backward's) scaled to the rank, the
        send/receive buffer, and the in-flight chunks' retained bytes."""
        est = self.estimate
        base = est.components
        if figure == "forward_backward" and self.op.kind == "backward":
            base = est.forward_backward_components or {}
        scale = est.per_rank_bytes[self.rank] / est.estimate_bytes if est.estimate_bytes else 0
        out = {k: int(v * scale) for k, v in base.items()}
        out[str(Component.PIPELINE_INPUTS)] = self.inputs
        out[str(Component.PIPELINE_BUFFERS)] = self.buffer
        if self.deferred:
            out[str(Component.DEFERRED_WGRAD)] = self.deferred
        out[str(Component.PIPELINE_IN_FLIGHT)] = self.bytes - sum(out.values())
        return out


@dataclass(frozen=True)
class StagePeak:
    """One stage's figures per CP rank (forward; forward+backward where the policy prices
    it) and the busiest rank's peak moments."""

    stage: int
    forward: tuple[int, ...]
    forward_backward: tuple[int, ...] | None
    forward_moment: Moment
    forward_backward_moment: Moment | None


def chunk_step(step: Step, microbatch: Step, stage: int, chunk: int) -> Step:
    """The step of one micro-batch's model chunk on ``stage``: its layers only, the head
    and outputs on the last virtual stage, no outputs elsewhere."""
    pipe = step.settings.pipeline
    layers = pipe.chunk_layers(step.geometry.layers, stage, chunk)
    return layers_step(
        step, microbatch, layers, first=pipe.is_first(stage, chunk), last=pipe.is_last(stage, chunk)
    )


def layers_step(step: Step, microbatch: Step, layers: range, first: bool, last: bool) -> Step:
    """The step of one micro-batch's ``layers`` run as a model chunk: the embedding where
    it is ``first``, the head, MTP depths and outputs where it is ``last``, no outputs
    elsewhere."""
    pipe = step.settings.pipeline
    g = step.geometry
    geometry = replace(
        g,
        mixers=g.mixers[layers.start : layers.stop],
        mlps=g.mlps[layers.start : layers.stop],
        windows=g.windows[layers.start : layers.stop],
        # the MTP depths run after the last layer, on the stage holding the head
        mtp_mixers=g.mtp_mixers if last else (),
        mtp_mlps=g.mtp_mlps if last else (),
        mtp_depths=g.mtp_depths if last else 0,
        pipeline_chunk=True,  # the first or last virtual stage may hold no layer
    )
    settings = step.settings.replace(
        geometry=geometry,
        pipeline=type(pipe)(),
        head=step.head if last else Head("hidden"),
        output_bytes=step.settings.output_bytes if last else 0,
        profiles=None,
        holds_embedding=first,
        fp8=None
        if step.settings.fp8 is None
        else step.settings.fp8.sliced(layers.start, layers.stop),
    )
    priced = replace(microbatch, settings=settings)
    if not step.profiles:
        return priced
    share = len(layers) / g.layers  # the whole step's floor, scaled to the chunk's layers
    scaled = step.profiles.scaled(microbatch.signature, priced.signature, share)
    return replace(priced, settings=settings.replace(profiles=scaled))


def stage_activation(microbatch: Step, rank: int) -> int:
    """One activation crossing a stage boundary on CP rank ``rank``: the layer input of
    the micro-batch's rows there (what a chunk receives, sends on, or gets the gradient
    of), ``[rank tokens / (tp under SP), H]`` in the step's dtype."""
    layout = microbatch.plan.layout
    rows = microbatch.plan.rank_tokens[rank] // sp_divisor(layout.tp, layout.sp)
    return rows * microbatch.geometry.hidden * microbatch.dtype_bytes


def deferred_wgrad_bytes(microbatch: Step, rank: int) -> int:
    """What one deferred micro-batch keeps on CP rank ``rank`` from its backward until
    the drain: the output layer's input (``input_parallel``, a layer input, SP-sharded
    where SP is on) and its logits' gradient (``[rank tokens, V/t]`` cast to the input's
    dtype, tensor_parallel/layers.py:642-664), appended to the output layer's buffers
    (layers.py:1227-1232) and released by ``drain_embedding_wgrad_compute`` (utils.py),
    which accumulates their weight gradients into ``main_grad`` in the fused GEMM."""
    rows = microbatch.plan.rank_tokens[rank]
    logits_grad = rows * vocab_shard(microbatch) * microbatch.dtype_bytes
    return logits_grad + stage_activation(microbatch, rank)


def in_flight_bytes(est: Estimate) -> int:
    """What an in-flight chunk keeps until its backward: its retained bytes, with the
    policy's multiplicative margin on them (``margin_factor`` over the rest of the sum),
    as the policy applies it to the bytes of the chunk it runs."""
    factor = est.components.get(str(Component.MARGIN_FACTOR), 0)
    allowance = est.components.get(str(Component.MARGIN_ALLOWANCE), 0)
    base = est.estimate_bytes - factor - allowance
    return int(retained_bytes(est) * (1 + factor / base)) if base > 0 else retained_bytes(est)


ChunkKey = tuple[int, tuple[object, ...], tuple[object, ...], bool, bool]


def _chunk_key(step: Step, microbatch: Step, stage: int, chunk: int) -> ChunkKey:
    """What a chunk's price depends on beyond the step: its micro-batch (by identity:
    repeated micro-batches are one object), its layers' kinds, and whether it ends or
    starts the model."""
    pipe = step.settings.pipeline
    layers = pipe.chunk_layers(step.geometry.layers, stage, chunk)
    g = step.geometry
    return (
        id(microbatch),
        g.mixers[layers.start : layers.stop],
        g.mlps[layers.start : layers.stop],
        pipe.is_last(stage, chunk),
        pipe.is_first(stage, chunk),
    )


def stage_peak(
    step: Step,
    microbatches: list[Step],
    stage: int,
    policy: Policy,
    cache: dict[ChunkKey, Estimate] | None = None,
) -> StagePeak:
    """``stage``'s peak over its schedule. ``cache`` holds chunk prices across the stages
    of one step (chunks of the same micro-batch and layer kinds in the same place price
    alike; a step with learned profiles scales them per chunk and is not cached)."""
    pipe = step.settings.pipeline
    cp = step.plan.layout.cp
    if cache is None or step.profiles:
        cache = {}
    priced: dict[tuple[int, int], Estimate] = {}
    keys: dict[tuple[int, int], ChunkKey] = {}  # repeated micro-batches: one object
    for m, mb in enumerate(microbatches):
        for c in range(pipe.vpp):
            if (id(mb), c) not in keys:
                keys[(id(mb), c)] = _chunk_key(step, mb, stage, c)
            chunk_key = keys[(id(mb), c)]
            if chunk_key not in cache or step.profiles:
                cache[chunk_key] = policy(chunk_step(step, mb, stage, c))
            priced[(m, c)] = cache[chunk_key]
    with_backward = all(e.forward_backward_bytes is not None for e in priced.values())

    def share(est: Estimate, rank: int) -> float:
        return est.per_rank_bytes[rank] / est.estimate_bytes if est.estimate_bytes else 0.0

    # where layers keep their saved sets, a chunk's received input is kept beside them;
    # a full recompute's first checkpoint keeps it as its layer input (already retained)
    keeps_input = step.recompute.keeps_saved_sets

    def received(key: tuple[int, int], rank: int) -> int:
        """The input a chunk off the first virtual stage keeps until its backward; in a
        chunk of the loss alone (no layer) the final norm saves it, which a trained
        head's kept bytes hold already (``head.keeps_norm_input``)."""
        if not keeps_input or pipe.is_first(stage, key[1]):
            return 0
        # off the first, only the last virtual stage may hold no layer: the step's head
        if not pipe.chunk_layers(step.geometry.layers, stage, key[1]) and keeps_norm_input(step):
            return 0
        return stage_activation(microbatches[key[0]], rank)

    ranks = range(cp)
    # per chunk and CP rank: what it keeps in flight and the input it keeps; the live
    # chunks' sums are kept as the schedule runs (the same integers, summed in turn)
    once: dict[tuple[int, int], tuple[list[int], list[int], list[int]]] = {}
    for (m, c), e in priced.items():
        mb = microbatches[m]
        if (id(mb), c) not in once:
            once[(id(mb), c)] = (
                [int(in_flight_bytes(e) * share(e, r)) for r in ranks],
                [received((m, c), r) for r in ranks],
                [stage_activation(mb, r) for r in ranks],
            )
    kept_of = {(m, c): once[(id(microbatches[m]), c)][0] for m, c in priced}
    schedule = pipe.schedule(stage)
    back: dict[int, tuple[int, ...]] = {}
    if step.settings.offload.active:
        kept_of, back = _less_offloaded(step, microbatches, stage, kept_of, schedule)
    input_of = {(m, c): once[(id(microbatches[m]), c)][1] for m, c in priced}
    activation = [once[(id(mb), 0)][2] for mb in microbatches]
    live_kept, live_inputs, live_deferred = [0] * cp, [0] * cp, [0] * cp
    deferred_count = pipe.deferred_microbatches
    fwd, fb = [0] * cp, [0] * cp
    best: dict[str, Moment] = {}
    live: list[tuple[int, int]] = []
    sends_on = [not pipe.is_last(stage, c) for c in range(pipe.vpp)]
    for at, op in enumerate(schedule):
        key = (op.microbatch, op.chunk)
        est = priced[key]
        forward = op.kind == "forward"
        chunk_kept, chunk_input = kept_of[key], input_of[key]
        buffers = activation[op.microbatch] if sends_on[op.chunk] else None
        is_live = key in live
        held = len(live) - is_live
        figures = ("forward", "forward_backward") if forward else ("forward_backward",)
        for r in ranks:
            kept = (
                live_kept[r]
                - (chunk_kept[r] if is_live else 0)
                + (back[at][r] if at in back else 0)
            )
            inputs = live_inputs[r] - (chunk_input[r] if is_live else 0) + chunk_input[r]
            buffer = buffers[r] if buffers is not None else 0
            own = est.per_rank_bytes[r]
            if not forward and est.forward_backward_bytes is not None:
                own = int(est.forward_backward_bytes * share(est, r))
            moment = kept + inputs + own + buffer + live_deferred[r]
            if forward and moment > fwd[r]:
                fwd[r] = moment
            if moment > fb[r]:
                fb[r] = moment
            for figure in figures:
                top = best.get(figure)
                if top is None or moment > top.bytes:
                    best[figure] = Moment(
                        moment, r, op, held + 1, est, kept, inputs, buffer, live_deferred[r]
                    )
        sign = 1 if forward else -1
        for r in ranks:
            live_kept[r] += sign * chunk_kept[r]
            live_inputs[r] += sign * chunk_input[r]
        if forward:
            live.append(key)
        else:
            live.remove(key)
            if op.microbatch < deferred_count and not sends_on[op.chunk]:
                mb = microbatches[op.microbatch]
                for r in ranks:
                    live_deferred[r] += deferred_wgrad_bytes(mb, r)
    return StagePeak(
        stage,
        tuple(fwd),
        tuple(fb) if with_backward else None,
        best["forward"],
        best.get("forward_backward") if with_backward else None,
    )


def _less_offloaded(
    step: Step,
    microbatches: list[Step],
    stage: int,
    kept_of: dict[tuple[int, int], list[int]],
    schedule: list[Op],
) -> tuple[dict[tuple[int, int], list[int]], dict[int, tuple[int, ...]]]:
    """Under activation offloading (``cpmem.pricing.offload``): what each in-flight chunk
    keeps on the device (its retained bytes less what the manager holds on the host), and
    per op of the schedule the offloaded bytes back on the device there: those of the
    chunk the combined 1F1B schedule runs beside it (``merged_partners``)."""
    chunks: dict[tuple[int, int], list[LayerOffload]] = {}
    for m, c in kept_of:
        mb = microbatches[m]
        found = next((v for (n, d), v in chunks.items() if d == c and microbatches[n] is mb), None)
        chunks[(m, c)] = (
            found if found is not None else layer_offloads(chunk_step(step, mb, stage, c))
        )
    sent = offloaded_bytes(chunks, schedule, step.plan.layout.cp)
    less = {}
    for key, kept in kept_of.items():
        left = [k - s for k, s in zip(kept, sent[key], strict=True)]
        # what is offloaded is a part of what the chunk keeps: a negative is a wrong term
        assert min(left) >= 0, f"offloaded bytes above the kept bytes of chunk {key}"
        less[key] = left
    back: dict[int, tuple[int, ...]] = {}
    if step.settings.runtime.overlap_moe_comm:
        back = {at: sent[key] for at, key in merged_partners(schedule).items()}
    return less, back


def price_pipeline(step: Step, policy: Policy) -> Estimate:
    """The busiest stage's figure, with every stage's."""
    pipe = step.settings.pipeline
    microbatches = list(step.microbatch_steps)
    cache: dict[ChunkKey, Estimate] = {}
    stages = [stage_peak(step, microbatches, s, policy, cache) for s in range(pipe.pp)]
    busiest = max(stages, key=lambda p: max(p.forward))
    moment = busiest.forward_moment
    fb_moment = busiest.forward_backward_moment
    fbs = [p.forward_backward for p in stages]
    return replace(
        moment.estimate,
        estimate_bytes=moment.bytes,
        components=moment.components("forward"),
        per_rank_bytes=busiest.forward,
        busiest_rank=moment.rank,
        busiest_tokens=microbatches[moment.op.microbatch].plan.rank_tokens[moment.rank],
        head=step.head,  # the step's head, the last stage's, whichever stage is busiest
        packed_tokens=step.plan.packed_tokens,
        logical_tokens=step.plan.logical_tokens,
        grad_segments=step.plan.grad_segments,
        model=step.geometry.name,
        forward_backward_bytes=None if fb_moment is None else fb_moment.bytes,
        layers_backward_bytes=None,  # the stage's moments, not one chunk's, stand
        forward_backward_components=(
            None if fb_moment is None else fb_moment.components("forward_backward")
        ),
        stage_bytes=tuple(max(p.forward) for p in stages),
        stage_forward_backward_bytes=(
            None if any(f is None for f in fbs) else tuple(max(f or (0,)) for f in fbs)
        ),
        busiest_stage=busiest.stage,
        pipeline_op=(
            f"{moment.op.kind} of micro-batch {moment.op.microbatch}, chunk "
            f"{moment.op.chunk}, {moment.in_flight} in flight"
        ),
    )
