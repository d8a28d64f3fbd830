# mypy: disable-error-code="no-untyped-call,no-any-return"
"""One pipeline stage of one rank: the schedule's forwards and backwards of M micro-batches.

``simulate_stage`` builds the stage's layers only (its model chunks) under fake tensors
and the fake TP x CP world of ``runner.py``, then runs, inside one live-storage tracker,
the order of forwards and backwards that megatron-core 0.16's schedule gives this stage,
each micro-batch's graph kept alive from its forward until its backward.

**The order** is megatron's own code (``megatron/core/pipeline_parallel/schedules.py`` as
installed, megatron-core 0.16):

- the warm-up count: ``get_pp_rank_microbatches(num_microbatches, num_model_chunks,
  microbatch_group_size_per_vp_stage, p2p_communicator=...)`` (schedules.py ~l. 738-795),
  called with a stand-in communicator (``_Communicator``: ``.pp_group.size()``,
  ``.pp_group.rank()``, ``.virtual_pipeline_model_parallel_size``). Its branches: ``pp - rank
  - 1`` without interleaving (the count ``forward_backward_pipelining_without_interleaving``
  computes itself, ~l. 2093-2096, capped at M), ``(pp - rank - 1) * 2 + (chunks - 1) *
  group`` with it, 0 at pp = 1 (``forward_backward_no_pipelining``: forward then backward of
  each micro-batch in turn); all capped at the total;
- the forward order: micro-batches in order without interleaving; with it
  ``get_schedule_table(num_microbatches, num_model_chunks, group)`` (~l. 798-825), read as
  ``get_model_chunk_id(k, forward=True)`` / ``get_microbatch_id_in_model_chunk`` do
  (~l. 1079-1091);
- the backward order: the same table with the chunk reversed, ``num_model_chunks - 1 -
  chunk`` (``get_model_chunk_id(k, forward=False)``, ~l. 1079-1084); the micro-batch is
  the table's, because ``backward_step_helper_preprocess`` pops each chunk's oldest input
  (``input_tensors[model_chunk_id].pop(0)``, ~l. 1267) and each chunk's forwards run in
  micro-batch order;
- warm-up forwards, then per steady-state step one forward then one backward
  (``forward_backward_helper_wrapper``: forward first, ~l. 1346-1368; without
  interleaving ~l. 2197-2265), then the cool-down backwards (~l. 1786 ff., ~l. 2267 ff.).
  ``microbatch_group_size_per_vp_stage`` defaults to pp (model_parallel_config.py
  ``__post_init__``); megatron's own checks on it (~l. 995-1015) are restated as input
  errors naming ``microbatches``.

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
from dataclasses import dataclass, field
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


# ---------------------------------------------------------------------------- schedule


class _Group:
    def __init__(self, size: int, rank: int) -> None:
        self._size, self._rank = size, rank

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank


class _Communicator:
    """What ``get_pp_rank_microbatches`` reads from megatron's ``P2PCommunicator``."""

    def __init__(self, pp: int, stage: int, vpp: int | None) -> None:
        self.pp_group = _Group(pp, stage)
        self.virtual_pipeline_model_parallel_size = vpp


@dataclass(frozen=True)
class Schedule:
    """One stage's op order: ``ops`` are ("forward" | "backward", micro-batch, chunk)."""

    kind: str  # "no-pipelining" | "1f1b" | "interleaved"
    microbatches: int
    chunks: int
    group: int  # microbatch_group_size_per_vp_stage (interleaved; pp otherwise)
    warmup: int  # megatron's num_warmup_microbatches (virtual micro-batches)
    total: int  # microbatches x chunks
    ops: tuple[tuple[str, int, int], ...]


def check_pipeline(
    pp: int, stage: int, vpp: int | None, microbatches: int, group: int | None = None
) -> tuple[int, int]:
    """(chunks, group) after the checks; SimInputError naming the field."""
    for name, value in (("pp", pp), ("stage", stage), ("microbatches", microbatches)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise SimInputError(name, value, "must be an integer")
    if pp < 1:
        raise SimInputError("pp", pp, "must be >= 1")
    if not 0 <= stage < pp:
        raise SimInputError("stage", stage, f"outside 0..{pp - 1}")
    if microbatches < 1:
        raise SimInputError("microbatches", microbatches, "must be >= 1")
    chunks = 1 if vpp is None else vpp
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
        raise SimInputError("vpp", vpp, "must be an integer >= 1")
    if chunks > 1 and pp < 2:
        raise SimInputError("vpp", vpp, "interleaving needs pp >= 2 (megatron)")
    g = pp if group is None else group
    if isinstance(g, bool) or not isinstance(g, int) or g < 1:
        raise SimInputError("microbatch_group_size", group, "must be an integer >= 1")
    if chunks > 1:  # forward_backward_pipelining_with_interleaving's own checks
        if not pp <= g <= microbatches:
            raise SimInputError(
                "microbatches",
                microbatches,
                f"interleaving needs pp={pp} <= microbatch_group_size={g} <= microbatches "
                "(megatron's ValueError)",
            )
        final = microbatches % g
        if 0 < final < pp:
            raise SimInputError(
                "microbatches",
                microbatches,
                f"microbatches % microbatch_group_size = {final}: must be 0 or >= pp={pp} "
                "(megatron's RuntimeError)",
            )
    return chunks, g


def stage_schedule(
    microbatches: int, pp: int, stage: int, vpp: int | None = 1, group: int | None = None
) -> Schedule:
    """The order of forwards and backwards megatron-core 0.16 runs on pipeline rank
    ``stage`` (module docstring: which functions it comes from)."""
    from megatron.core.pipeline_parallel.schedules import (
        get_pp_rank_microbatches,
        get_schedule_table,
    )

    chunks, g = check_pipeline(pp, stage, vpp, microbatches, group)
    interleaved = chunks > 1
    comm = _Communicator(pp, stage, chunks if interleaved else None)
    total, _all_warm, warmup, remaining = get_pp_rank_microbatches(
        microbatches, chunks, g, p2p_communicator=comm
    )
    if interleaved:
        table = [tuple(x) for x in get_schedule_table(microbatches, chunks, g)]
        forwards = [(mb, c) for mb, c in table]
        backwards = [(mb, chunks - 1 - c) for mb, c in table]
    else:
        forwards = backwards = [(mb, 0) for mb in range(microbatches)]
    ops: list[tuple[str, int, int]] = [("forward", *forwards[k]) for k in range(warmup)]
    for k in range(remaining):
        ops.append(("forward", *forwards[warmup + k]))
        ops.append(("backward", *backwards[k]))
    ops += [("backward", *backwards[k]) for k in range(remaining, total)]
    kind = "interleaved" if interleaved else ("1f1b" if pp > 1 else "no-pipelining")
    return Schedule(kind, microbatches, chunks, g, warmup, total, tuple(ops))


def stage_layer_counts(
    model: SimModel, pp: int, vpp: int, stage_layers: Sequence[int] | None
) -> tuple[int, ...]:
    """Layers per virtual stage (index c * pp + s: chunk c of stage s, megatron's order)."""
    n = pp * vpp
    if stage_layers is None:
        if model.layers % n:
            raise SimInputError(
                "stage_layers",
                None,
                f"{model.layers} layers do not divide by pp x vpp = {n}; give one count per "
                "virtual stage",
            )
        return (model.layers // n,) * n
    counts = tuple(stage_layers)
    if len(counts) != n:
        raise SimInputError("stage_layers", list(counts), f"needs pp x vpp = {n} counts")
    if any(isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in counts):
        raise SimInputError("stage_layers", list(counts), "every virtual stage needs >= 1 layer")
    if sum(counts) != model.layers:
        raise SimInputError(
            "stage_layers", list(counts), f"sum to {sum(counts)}, not the {model.layers} layers"
        )
    return counts


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


# ------------------------------------------------------------------------------ result


@dataclass
class StageOp:
    """One op of the schedule and the live bytes around it."""

    kind: str  # "forward" | "backward"
    microbatch: int
    chunk: int
    virtual_stage: int
    start_bytes: int  # live when it starts
    peak_bytes: int  # the most live during it
    end_bytes: int  # live when it ends (a forward-only run: before its tensors are dropped)
    in_flight: tuple[tuple[int, int], ...]  # (micro-batch, chunk) graphs alive during it

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "microbatch": self.microbatch,
            "chunk": self.chunk,
            "virtual_stage": self.virtual_stage,
            "start_bytes": self.start_bytes,
            "peak_bytes": self.peak_bytes,
            "end_bytes": self.end_bytes,
            "in_flight": [list(x) for x in self.in_flight],
        }


@dataclass
class StagePeak:
    """A stage peak: its bytes, the op where it happened, what was in flight, the split."""

    bytes: int
    op: int  # index into StageResult.ops
    kind: str
    microbatch: int
    chunk: int
    in_flight: tuple[tuple[int, int], ...]  # (micro-batch, chunk) graphs alive, incl. the op's
    components: dict[str, int] = field(default_factory=dict)  # by label
    by_microbatch: dict[int, int] = field(default_factory=dict)  # by the allocating op's mb

    @property
    def in_flight_chunks(self) -> int:
        return len(self.in_flight)

    @property
    def in_flight_microbatches(self) -> int:
        return len({mb for mb, _ in self.in_flight})

    def as_dict(self) -> dict[str, Any]:
        return {
            "bytes": self.bytes,
            "op": self.op,
            "kind": self.kind,
            "microbatch": self.microbatch,
            "chunk": self.chunk,
            "in_flight": [list(x) for x in self.in_flight],
            "in_flight_chunks": self.in_flight_chunks,
            "in_flight_microbatches": self.in_flight_microbatches,
            "components": self.components,
            "by_microbatch": {str(k): v for k, v in self.by_microbatch.items()},
        }


@dataclass
class StageResult:
    """Incremental bytes above the stage's pre-forward baseline (no cold set-up, no
    parameters); ``ops`` in schedule order."""

    rank: int
    tp_rank: int
    pp: int
    stage: int
    vpp: int
    microbatches: int
    schedule: str  # "no-pipelining" | "1f1b" | "interleaved"
    microbatch_group_size: int
    warmup: int  # megatron's num_warmup_microbatches for this stage
    stage_layers: tuple[int, ...]  # layers per virtual stage (all stages)
    chunk_layers: tuple[tuple[int, int], ...]  # this stage's chunks: [first, stop) layers
    forward_peak_bytes: int
    forward_backward_peak_bytes: int
    retained_bytes: int  # the most live at the end of any forward op
    forward_peak: StagePeak
    forward_backward_peak: StagePeak
    ops: list[StageOp]
    tokens: tuple[int, ...]  # the rank's tokens per micro-batch (max of attention, GDN)
    parameter_bytes: int = 0  # the stage's parameters (not in the peaks)
    deallocate_outputs: bool = True
    seconds: float = 0.0
    tracked_ops: int = 0
    gdn_kernel: str = field(default_factory=lambda: K.GDN_KERNEL)
    expert_rows: int = 0
    step: dict[str, Any] = field(default_factory=dict)

    def as_dict(self, ops: bool = True) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "tp_rank": self.tp_rank,
            "pp": self.pp,
            "stage": self.stage,
            "vpp": self.vpp,
            "microbatches": self.microbatches,
            "schedule": self.schedule,
            "microbatch_group_size": self.microbatch_group_size,
            "warmup": self.warmup,
            "stage_layers": list(self.stage_layers),
            "chunk_layers": [list(x) for x in self.chunk_layers],
            "tokens": list(self.tokens),
            "forward_peak_bytes": self.forward_peak_bytes,
            "forward_backward_peak_bytes": self.forward_backward_peak_bytes,
            "retained_bytes": self.retained_bytes,
            "forward_peak": self.forward_peak.as_dict(),
            "forward_backward_peak": self.forward_backward_peak.as_dict(),
            "parameter_bytes": self.parameter_bytes,
            "deallocate_outputs": self.deallocate_outputs,
            **({"ops": [op.as_dict() for op in self.ops]} if ops else {}),
            "gdn_kernel": self.gdn_kernel,
            **({"expert_rows": self.expert_rows} if self.expert_rows else {}),
            **({"step": self.step} if self.step else {}),
            "seconds": round(self.seconds, 2),
        }


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
