# mypy: disable-error-code="no-untyped-call,no-any-return"
"""One pipeline stage of one rank: the schedule's forwards and backwards of M micro-batches.

``simulate_stage`` builds the stage's layers only (its model chunks) under fake tensors
and the fake TP x CP world of ``runner.py``, then runs, inside one live-storage tracker,
the order of forwards and backwards that megatron-core 0.16's schedule gives this stage,
each micro-batch's graph kept alive from its forward until its backward.

The schedule's order is megatron's own code (``schedule.py``, which names the functions
it calls); the figures are reported as ``result.py``'s types.

**One forward of (micro-batch, chunk)** runs that chunk's layers only. Its input: on the
first virtual stage the embedding output, a bf16 ``[local tokens, H]`` leaf tensor standing
for the vocab-parallel lookup (reduce-scattered under SP), exactly as ``runner._step``
makes it (the embedding table and the token ids are not allocated); elsewhere the received
activation, a bf16 ``requires_grad`` tensor of the shape megatron's ``_communicate``
allocates for ``recv_forward``: the previous virtual stage's output rows on this CP/TP rank
(``tokens / cp``, ``/ tp`` under SP; the rank's own count of the previous layer's kind,
so uneven CP counts travel unpadded), kept until that micro-batch's backward (megatron's
``input_tensors``). Rope tables are made per forward and live until its backward (the
single-rank convention, per forward step). The last virtual stage also runs the head and
loss (``head.py``; ``hidden``: the harness's gather + unpack + mean-square, as
``runner._step``), labels allocated with that forward. Any other virtual stage "sends" its
output: the send itself allocates nothing on the sender, then megatron's own
``deallocate_output_tensor(out, True)`` swaps the output's storage for a 1-element tensor
(the graph is kept; ``deallocate_outputs=False`` keeps the storage instead: megatron-core's
config default, which Megatron-LM's ``core_transformer_config_from_args``,
megatron/training/arguments.py, hard-codes to True; read in its public source, not installed
here). The backward of a non-last chunk
receives a bf16 gradient of the output's shape (allocated when its backward starts) and
runs megatron's own ``custom_backward`` (the engine call that accepts the 1-element
output); the input's gradient is "sent" back and freed with the input after the backward.
Recompute (full/selective) applies per layer as in the single-rank step; checkpointed
regions re-run in backward with the micro-batch's own layout and rope tables. Under
``no-grad`` the run is megatron's ``forward_only``: the forwards in the schedule's order,
each one's tensors dropped when it ends.

**Parameters** follow ``runner.py``'s convention: the stage's parameters (its layers, the
head on the last stage) exist before the tracked step, so they are never counted; the
figures are bytes above the pre-forward baseline (activations, received/sent buffers,
gradients made in backward, LoRA weight gradients included), without the cold kernel
set-up. ``parameter_bytes`` reports the stage's parameters for a caller who adds them.

Approximated: the fake world has no pipeline dimension (megatron's parallel_state knows TP
x CP only; no layer here asks for the pipeline rank, and the sends/receives are
allocations, not collectives); receive buffers are allocated when the op that consumes them
starts (megatron posts the next receive at the end of the previous op: the same moment
between ops, ignoring overlap_p2p_comm's buffers); a gradient sent back is freed when its
backward ends; the embedding table, token ids and position ids are not allocated; no
``num_microbatches_with_partial_activation_checkpoints``, no combined 1F1B
(``overlap_moe_expert_parallel_comm``); megatron's ``variable_seq_lengths`` is assumed
wherever micro-batches differ in length.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from oracles.rank_sim import kernels as K
from oracles.rank_sim.adapters import AdapterSpec
from oracles.rank_sim.cp_comm import check_cp_comm
from oracles.rank_sim.geometry import SimInputError, SimModel
from oracles.rank_sim.head import HeadSpec, padded_vocab
from oracles.rank_sim.layers import RankContext, _config, build_layers, gather_sp
from oracles.rank_sim.layout import RankLayout
from oracles.rank_sim.pipeline.result import StageOp, StagePeak, StageResult
from oracles.rank_sim.pipeline.schedule import check_pipeline, stage_layer_counts, stage_schedule
from oracles.rank_sim.recompute import Recompute
from oracles.rank_sim.runner import (
    _count,
    _needs_input_grad,
    _stream_count,
    _tables,
    _unpack,
    check_micro_batch,
    init_groups,
    release_groups,
)
from oracles.rank_sim.tracker import LiveBytesTracker, PhasePeak, rounded

BF16 = torch.bfloat16


# ----------------------------------------------------------------------------- tracker


class _StageTracker(LiveBytesTracker):
    """LiveBytesTracker that also splits live bytes by the micro-batch whose op
    allocated them (``group``), at each phase's peak."""

    def __init__(self, baseline: list[torch.Tensor]) -> None:
        super().__init__(baseline)
        self.group = -1
        self._group_of: dict[int, int] = {}
        self.by_group: dict[int, int] = {}
        self.peak_groups: dict[str, dict[int, int]] = {}

    def _free(self, key: int) -> None:
        nbytes, _ = self._seen[key]
        super()._free(key)
        g = self._group_of.pop(key)
        self.by_group[g] -= nbytes

    def _groups(self) -> dict[int, int]:
        return {k: v for k, v in sorted(self.by_group.items()) if v}

    def _add(self, st: torch.UntypedStorage) -> None:
        key = int(st._cdata)
        nbytes = st.nbytes()
        if key in self._seen or nbytes == 0 or key in self._baseline:
            return
        size = rounded(nbytes)
        self._seen[key] = (size, self.label)
        self._group_of[key] = self.group
        weakref.finalize(st, self._free, key)
        self.live += size
        self.by_label[self.label] = self.by_label.get(self.label, 0) + size
        self.by_group[self.group] = self.by_group.get(self.group, 0) + size
        peak = self.peaks.setdefault(self.phase, PhasePeak())
        if self.live > peak.bytes:
            peak.bytes = self.live
            peak.components = {k: v for k, v in self.by_label.items() if v}
            self.peak_groups[self.phase] = self._groups()

    def set_phase(self, phase: str) -> None:
        super().set_phase(phase)
        self.peak_groups[phase] = self._groups()


# ---------------------------------------------------------------------------- the run


@dataclass
class _Flight:
    """What the schedule keeps of one (micro-batch, chunk) between its forward and
    backward: megatron's input_tensors / output_tensors entries, plus the batch's labels
    and the forward's rope tables."""

    input: torch.Tensor | None = None
    output: torch.Tensor | None = None  # the sent output (storage freed) or the loss
    out_shape: tuple[int, ...] = ()
    loss: torch.Tensor | None = None
    out: torch.Tensor | None = None  # the harness's unpacked output (its graph keeps it)
    labels: torch.Tensor | None = None
    rope: tuple[torch.Tensor, torch.Tensor] | None = None


def _check_layouts(model: SimModel, layouts: Sequence[RankLayout]) -> None:
    if not layouts:
        raise SimInputError("microbatches", 0, "give one layout per micro-batch (>= 1)")
    first = layouts[0]
    for i, lay in enumerate(layouts):
        lay.check(model.gdn_layers > 0)
        same = (lay.tp, lay.cp, lay.rank, lay.tp_rank, lay.sp)
        if same != (first.tp, first.cp, first.rank, first.tp_rank, first.sp):
            raise SimInputError(
                "layouts",
                i,
                "every micro-batch must be laid out on the same TP x CP world and rank "
                "(tp, cp, rank, tp_rank, sequence_parallel)",
            )


def simulate_stage(
    model: SimModel,
    layouts: Sequence[RankLayout],
    recompute: Recompute,
    *,
    pp: int,
    stage: int,
    vpp: int | None = 1,
    stage_layers: Sequence[int] | None = None,
    microbatch_group_size: int | None = None,
    deallocate_outputs: bool = True,
    compiled: bool = False,
    ep: int = 1,
    routing: str = "concentrated",
    head: str | HeadSpec = "hidden",
    lora_rank: int = 1,
    lora_dropout: float = 0.0,
    lora_targets: str | tuple[str, ...] = "all",
    cp_comm: str = "all_gather",
) -> StageResult:
    """Pipeline rank ``stage`` of ``pp`` (``vpp`` model chunks each) running megatron's
    schedule for ``len(layouts)`` micro-batches (one RankLayout each: the simulated
    TP x CP rank's tokens of that micro-batch). ``stage_layers``: layers per virtual
    stage, index ``chunk * pp + stage`` (default: even). ``microbatch_group_size``:
    megatron's ``microbatch_group_size_per_vp_stage`` (default pp). The other inputs as
    ``runner.simulate_rank``; ``head`` runs on the last virtual stage only. At pp = 1 with
    one micro-batch the figures are ``simulate_rank``'s."""
    from oracles.rank_sim.moe import check_routing, expert_rows

    microbatches = len(layouts)
    chunks, group = check_pipeline(pp, stage, vpp, microbatches, microbatch_group_size)
    counts = stage_layer_counts(model, pp, chunks, stage_layers)
    _check_layouts(model, layouts)
    lay0 = layouts[0]
    model.check_tp(lay0.tp)
    for lay in layouts:  # Mamba layers: megatron's asserts, one packed row each
        check_micro_batch(model, lay, 1)
    model.check_ep(ep, lay0.tp * lay0.cp)
    check_routing(routing)
    head_spec = HeadSpec.parse(head)
    adapters = AdapterSpec.parse(lora_rank, lora_dropout, lora_targets)
    if model.mtp_depths:  # the single-rank step's (mtp.py)
        raise SimInputError("mtp_depths", model.mtp_depths, "pipeline stages run no MTP")
    check_cp_comm(cp_comm, model, lay0.tp, lay0.cp)
    schedule = stage_schedule(microbatches, pp, stage, chunks, group)
    if recompute.no_grad:  # forward only: megatron releases each forward's tensors at once
        ops = tuple(op for op in schedule.ops if op[0] == "forward")
    else:
        ops = schedule.ops
    starts = [sum(counts[:v]) for v in range(len(counts))]
    virtual = [c * pp + stage for c in range(chunks)]
    spans = tuple((starts[v], starts[v] + counts[v]) for v in virtual)
    last_virtual = pp * chunks - 1

    started = time.perf_counter()
    cp_group = init_groups(lay0.tp, lay0.cp, lay0.rank, lay0.tp_rank)
    tracker: _StageTracker

    def set_label(name: str) -> str:
        previous, tracker.label = tracker.label, name
        return previous

    try:
        with FakeTensorMode(allow_non_fake_inputs=True):
            ctx = RankContext(
                model, lay0, recompute, compiled, cp_group, set_label, ep=ep, routing=routing,
                adapters=adapters, cp_comm=cp_comm,
            )  # fmt: skip
            stage_chunks = [_build_chunk(ctx, model, lo, hi) for lo, hi in spans]
            params = [p for layers in stage_chunks for p in layers.parameters()]
            lm_head = None
            if last_virtual in virtual and not head_spec.harness:
                from oracles.rank_sim.head import Head

                lm_head = Head(ctx, _config(model, lay0), head_spec)
                params += list(lm_head.parameters())
            param_bytes = sum(p.numel() * p.element_size() for p in params)
            tied = lm_head is not None and lm_head.tied  # the head holds it already
            if stage == 0 and model.vocab and not tied:  # the embedding table (not built)
                param_bytes += padded_vocab(model.vocab, lay0.tp) // lay0.tp * model.hidden * 2
            tracker = _StageTracker(params)
            with tracker:
                records = _run(
                    ctx, tracker, layouts, ops, stage_chunks, spans, virtual, last_virtual,
                    lm_head, deallocate_outputs,
                )  # fmt: skip
    finally:
        release_groups()

    fwd = [i for i, op in enumerate(records) if op.kind == "forward"]

    def peak_at(indices: list[int]) -> StagePeak:
        best = max(indices, key=lambda i: (records[i].peak_bytes, -i))  # the first highest
        op = records[best]
        phase = f"op{best}"
        return StagePeak(
            op.peak_bytes, best, op.kind, op.microbatch, op.chunk, op.in_flight,
            dict(tracker.peaks[phase].components), dict(tracker.peak_groups.get(phase, {})),
        )  # fmt: skip

    forward = peak_at(fwd)
    both = peak_at(list(range(len(records))))
    if both.bytes <= forward.bytes:
        both = forward
    rows = 0
    if model.moe:
        rows = max(
            expert_rows(model, ctx.local(_count(lay, k)), ep, routing)
            for lay in layouts
            for lo, hi in spans
            for k in model.kinds[lo:hi]
        )
    return StageResult(
        rank=lay0.rank,
        tp_rank=lay0.tp_rank,
        pp=pp,
        stage=stage,
        vpp=chunks,
        microbatches=microbatches,
        schedule=schedule.kind,
        microbatch_group_size=group,
        warmup=schedule.warmup,
        stage_layers=counts,
        chunk_layers=spans,
        forward_peak_bytes=forward.bytes,
        forward_backward_peak_bytes=both.bytes,
        retained_bytes=max(records[i].end_bytes for i in fwd),
        forward_peak=forward,
        forward_backward_peak=both,
        ops=records,
        tokens=tuple(max(lay.attn_local, lay.gdn_local) for lay in layouts),
        parameter_bytes=param_bytes,
        deallocate_outputs=deallocate_outputs,
        seconds=time.perf_counter() - started,
        tracked_ops=tracker.ops,
        expert_rows=rows,
        step={
            "head": head_spec.label,
            **adapters.as_dict(),
            "cp_comm": cp_comm,
            "pp": pp,
            "stage": stage,
            "vpp": chunks,
            "microbatches": microbatches,
        },
    )


def _build_chunk(ctx: RankContext, model: SimModel, lo: int, hi: int) -> Any:
    """Layers [lo, hi) as ``layers.build_layers`` builds them (frozen base, trainable
    adapters): it builds every layer of ``ctx.model``, so it is handed the chunk's slice
    and the whole model put back; the layers keep ``ctx`` and read only shapes of it."""
    ctx.model = model.sliced(lo, hi)
    try:
        return build_layers(ctx)
    finally:
        ctx.model = model


def _run(
    ctx: RankContext,
    tracker: _StageTracker,
    layouts: Sequence[RankLayout],
    ops: tuple[tuple[str, int, int], ...],
    stage_chunks: list[Any],
    spans: tuple[tuple[int, int], ...],
    virtual: list[int],
    last_virtual: int,
    lm_head: Any,
    deallocate: bool,
) -> list[StageOp]:
    flights: dict[tuple[int, int], _Flight] = {}
    records: list[StageOp] = []
    for i, (kind, mb, chunk) in enumerate(ops):
        tracker.set_phase(f"op{i}")
        start = tracker.live
        tracker.group = mb
        tracker.label = "other"
        ctx.layout = layouts[mb]
        v = virtual[chunk]
        if kind == "forward":
            flight = _forward(
                ctx, stage_chunks[chunk], spans[chunk], v == 0, v == last_virtual,
                lm_head, deallocate,
            )  # fmt: skip
            flights[(mb, chunk)] = flight
            in_flight = tuple(flights)
            end = tracker.live  # a forward-only run's tensors still held (runner's retained)
            if ctx.recompute.no_grad:  # forward only: nothing kept for a backward
                del flights[(mb, chunk)]
            del flight
        else:
            in_flight = tuple(flights)
            flight = flights.pop((mb, chunk))
            ctx.rope = flight.rope  # a recomputed region reads the forward's tables
            _backward(flight, tracker, deallocate, v == last_virtual)
            del flight  # the input (and its gradient, sent back), labels, rope, graph
            end = tracker.live
        ctx.rope = None
        tracker.label = "other"
        peak = tracker.peaks[f"op{i}"].bytes
        records.append(StageOp(kind, mb, chunk, v, start, peak, end, in_flight))
    return records


def _forward(
    ctx: RankContext,
    layers: Any,
    span: tuple[int, int],
    first_stage: bool,
    last_stage: bool,
    lm_head: Any,
    deallocate: bool,
) -> _Flight:
    """One chunk's forward of one micro-batch: ``runner._step``'s forward, cut to the
    chunk's layers, with a received input off the first virtual stage and a sent output
    off the last."""
    model, layout, rc = ctx.model, ctx.layout, ctx.recompute
    lo = span[0]
    flight = _Flight()
    grad = torch.no_grad() if rc.no_grad else torch.enable_grad()
    if last_stage and lm_head is not None:  # the batch's labels, as runner._step
        with ctx.label("labels"):
            flight.labels = torch.empty((_stream_count(layout, model.kinds),), dtype=torch.int64)
    with grad:
        if first_stage:
            count = _count(layout, model.kinds[0])
            with ctx.label("embedding"):  # the leaf standing for the embedding lookup
                emb = torch.empty((count, model.hidden), dtype=BF16)
                if layout.sp:
                    from megatron.core.tensor_parallel import mappings

                    emb = mappings.reduce_scatter_to_sequence_parallel_region(emb)
                x = emb
                if (rc.full and not rc.no_grad) or _needs_input_grad(ctx):
                    x = x.detach().requires_grad_(True)
                del emb
        else:  # megatron's recv_forward buffer: the previous virtual stage's output rows
            count = _stream_count(layout, model.kinds[:lo])
            with ctx.label("pp_input"):
                x = torch.empty(
                    (ctx.local(count), model.hidden), dtype=BF16, requires_grad=not rc.no_grad
                )
            flight.input = x
        longest = max(layout.attn_local, layout.gdn_local)
        if _tables(model):
            with ctx.label("rope"):
                tables = (torch.empty((longest, model.head_dim), dtype=BF16),) * 2
                ctx.rope = (tables[0], torch.empty_like(tables[1]))
                del tables
        flight.rope = ctx.rope
        for layer in layers:
            want = _count(layout, layer.kind)
            if layer.kind and want != count:
                with ctx.label("relayout"):
                    x = K.Relayout.apply(x, ctx.local(want))
                count = want
            x = layer(x)
        if last_stage:
            if lm_head is None:  # the harness, as runner._step
                with ctx.label("output"):
                    out = gather_sp(x, layout)
                    if layout.cp > 1:
                        counts = (
                            layout.attention_tokens
                            if count == layout.attn_local
                            else layout.gdn_tokens
                        )
                        out = K.GatherTokens.apply(out, counts, ctx.cp_group)
                    out = _unpack(out, layout.logical_tokens)
                    loss = out.square().mean()
                flight.out = out
                del out
            else:
                loss = lm_head(x, flight.labels)
            flight.loss = loss
            del loss
        else:
            from megatron.core.utils import make_viewless_tensor

            # TransformerBlock's last step: the sent output is never a view
            x = make_viewless_tensor(x, requires_grad=x.requires_grad, keep_graph=True)
            flight.out_shape = tuple(x.shape)
            flight.output = x
            if deallocate and x.requires_grad:  # sent: megatron frees its storage
                from megatron.core.pipeline_parallel.schedules import deallocate_output_tensor

                with ctx.label("pp_output"):
                    deallocate_output_tensor(x, True)
        del x
    return flight


def _backward(flight: _Flight, tracker: LiveBytesTracker, deallocate: bool, last: bool) -> None:
    """megatron's backward_step: from the loss on the last virtual stage, else from the
    received output gradient (custom_backward when the output was deallocated)."""
    tracker.label = "backward"
    if last:
        assert flight.loss is not None
        flight.loss.backward()
        return
    assert flight.output is not None
    if not flight.output.requires_grad:
        return
    tracker.label = "pp_output_grad"
    grad = torch.empty(flight.out_shape, dtype=BF16)  # megatron's recv_backward buffer
    tracker.label = "backward"
    if deallocate:
        from megatron.core.pipeline_parallel.schedules import custom_backward

        custom_backward(flight.output, grad)
    else:
        torch.autograd.backward(flight.output, grad_tensors=grad)
    del grad
