"""Pipeline parallelism: which layers each stage holds, and the order it runs its
micro-batches' forwards and backwards.

The layers are cut as megatron-core cuts them: ``pp`` stages of ``vpp`` model chunks
each; virtual stage ``j = chunk * pp + stage`` holds the ``j``-th block of consecutive
layers (megatron's interleaved layout), the first stage also the embedding, the last
the output layer and the loss. Even by default; megatron's first/last-stage counts (the
other stages share the rest evenly) or an explicit count per stage or per virtual stage.

The order is megatron-core 0.16's ``pipeline_parallel/schedules.py``, restated (cpmem
imports no megatron; ``tests/oracle/test_pipeline_schedule.py`` holds it to megatron's
own functions):

- 1F1B (``forward_backward_pipelining_without_interleaving``): stage ``s`` runs
  ``min(pp - s - 1, M)`` warm-up forwards, then one forward and one backward at a time,
  then the remaining backwards; micro-batches in order.
- interleaved 1F1B (``forward_backward_pipelining_with_interleaving``): ``M x vpp``
  (micro-batch, chunk) forwards in ``get_schedule_table``'s order (groups of ``pp``
  micro-batches, every chunk of a group before the next group), ``(pp - s - 1) x 2 +
  (vpp - 1) x pp`` of them warm-up (``get_pp_rank_microbatches``, all of them when that
  is at least ``M x vpp``); the ``k``-th backward is the ``k``-th table entry with its
  chunk reversed (``vpp - 1 - chunk``).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from cpmem.errors import InputError, require_nonnegative_int, require_positive_int
from cpmem.units import counted

OpKind = Literal["forward", "backward"]


@dataclass(frozen=True)
class Op:
    """One forward or backward of one micro-batch's model chunk on a stage."""

    kind: OpKind
    microbatch: int
    chunk: int


@dataclass(frozen=True)
class Pipeline:
    """``pp`` stages of ``vpp`` chunks, ``microbatches`` per step, ``layers`` per
    virtual stage (``pp x vpp`` counts in virtual-stage order; None: even). The first
    virtual stage may hold no layer (the embedding alone) and the last none (the final
    norm, the output layer and the loss): Megatron-LM builds such a chunk where the
    embedding and the loss count as layers (``--account-for-embedding-in-pipeline-split``,
    ``--account-for-loss-in-pipeline-split``: ``get_num_layers_to_build`` takes one layer
    off those chunks and asserts only ``>= 0``; an empty ``TransformerBlock`` runs,
    transformer_block.py:189-201, 798-801). Every other virtual stage holds a layer."""

    pp: int = 1
    vpp: int = 1
    microbatches: int = 1
    layers: tuple[int, ...] | None = None
    group: int | None = None
    """Interleaved: contiguous micro-batches per virtual stage (megatron's
    ``--microbatch-group-size-per-virtual-pipeline-stage``; None: ``pp``)."""
    deferred_wgrad: int | None = None
    """The output layer's weight gradient deferred to the pipeline's drain (megatron's
    ``--defer-embedding-wgrad-compute``): the first ``deferred_wgrad`` micro-batches of
    the step (0: every one, megatron's ``--wgrad-deferral-limit`` 0) keep the output
    layer's input and their logits' gradient until the drain; None: not deferred."""

    def __post_init__(self) -> None:
        require_positive_int("pp", self.pp)
        require_positive_int("vpp", self.vpp)
        require_positive_int("microbatches", self.microbatches)
        if self.group is not None:
            require_positive_int("microbatch_group", self.group)
        if self.deferred_wgrad is not None:
            require_nonnegative_int("deferred_wgrad", self.deferred_wgrad)
            if self.pp == 1:
                # model_parallel_config.py:545-548
                raise InputError(
                    "deferred_wgrad",
                    self.deferred_wgrad,
                    "the output layer's weight gradient is deferred to the pipeline's drain: "
                    "it needs pp > 1 (megatron-core refuses it without pipeline parallelism)",
                )
        if self.vpp > 1 and self.pp == 1:
            raise InputError("vpp", self.vpp, "virtual stages need pp > 1")
        if self.vpp > 1:
            # megatron's interleaved schedule refuses a group of micro-batches outside
            # [pp, M], and a last group shorter than pp
            # (forward_backward_pipelining_with_interleaving)
            group, m = self.group_size, self.microbatches
            if not self.pp <= group <= m:
                raise InputError(
                    "microbatches",
                    m,
                    f"interleaving (vpp {self.vpp}) runs groups of {counted(group, 'micro-batch')}, "
                    f"which megatron's schedule needs in [pp={self.pp}, M={m}]",
                )
            if 0 < m % group < self.pp:
                raise InputError(
                    "microbatches",
                    m,
                    f"leaves a last group of {counted(m % group, 'micro-batch')}, fewer than pp "
                    f"({self.pp}), which megatron's interleaved schedule refuses",
                )
        if self.layers is not None:
            if len(self.layers) != self.pp * self.vpp:
                raise InputError(
                    "stage_layers",
                    list(self.layers),
                    f"needs {self.pp * self.vpp} counts (pp x vpp), one per virtual stage",
                )
            for j, n in enumerate(self.layers):
                require_nonnegative_int("stage_layers", n)
                if n == 0 and 0 < j < len(self.layers) - 1:
                    raise InputError(
                        "stage_layers",
                        list(self.layers),
                        f"virtual stage {j} holds no layer; only the first (the embedding "
                        "alone) or the last (the output layer and loss alone) may",
                    )

    @property
    def active(self) -> bool:
        return self.pp > 1

    @property
    def deferred_microbatches(self) -> int:
        """Micro-batches whose output-layer input and logits' gradient the last stage
        keeps until the drain: the first ``deferred_wgrad`` of the step (every one at 0;
        tensor_parallel/layers.py:1227-1232, 660-664 append while the buffer holds fewer
        than the limit), none where nothing is deferred."""
        if self.deferred_wgrad is None:
            return 0
        if self.deferred_wgrad == 0:
            return self.microbatches
        return min(self.deferred_wgrad, self.microbatches)

    @property
    def group_size(self) -> int:
        """Contiguous micro-batches per virtual stage of the interleaved schedule."""
        return self.pp if self.group is None else self.group

    @property
    def virtual_stages(self) -> int:
        return self.pp * self.vpp

    def virtual_layers(self, total_layers: int) -> tuple[range, ...]:
        """The layers of each virtual stage, in virtual-stage order."""
        return _virtual_layers(self, total_layers)

    def _split(self, total_layers: int) -> tuple[range, ...]:
        field, value = ("vpp", self.vpp) if self.vpp > 1 else ("pp", self.pp)
        counts = self.layers or even_counts(total_layers, self.virtual_stages, field, value)
        if sum(counts) != total_layers:
            raise InputError(
                "stage_layers", list(counts), f"add up to {sum(counts)}, not {total_layers} layers"
            )
        out, start = [], 0
        for n in counts:
            out.append(range(start, start + n))
            start += n
        return tuple(out)

    def chunk_layers(self, total_layers: int, stage: int, chunk: int) -> range:
        """The layers of ``stage``'s model chunk ``chunk``."""
        return self.virtual_layers(total_layers)[chunk * self.pp + stage]

    def is_first(self, stage: int, chunk: int) -> bool:
        """The chunk that holds the embedding: virtual stage 0."""
        return stage == 0 and chunk == 0

    def is_last(self, stage: int, chunk: int) -> bool:
        """The chunk that holds the output layer and the loss: the last virtual stage."""
        return stage == self.pp - 1 and chunk == self.vpp - 1

    def schedule(self, stage: int) -> list[Op]:
        """``stage``'s forwards and backwards in the order megatron runs them."""
        if not 0 <= stage < self.pp:
            raise InputError("stage", stage, f"must be in [0, {self.pp})")
        table = schedule_table(self.microbatches, self.vpp, self.group_size)
        forwards = [Op("forward", m, c) for m, c in table]
        backwards = [Op("backward", m, self.vpp - 1 - c) for m, c in table]
        warmup = min(warmup_count(self.pp, stage, self.vpp, self.group_size), len(table))
        order = forwards[:warmup]
        for k in range(len(table) - warmup):
            order += [forwards[warmup + k], backwards[k]]
        return order + backwards[len(table) - warmup :]


def warmup_count(pp: int, stage: int, vpp: int, group: int | None = None) -> int:
    """Warm-up forwards before the steady 1F1B state (before capping at the total);
    interleaved: ``(vpp - 1) x group`` on every stage (``group``: pp by default)."""
    if pp == 1:
        return 0
    if vpp == 1:
        return pp - stage - 1
    return (pp - stage - 1) * 2 + (vpp - 1) * (pp if group is None else group)


def schedule_table(microbatches: int, chunks: int, group: int) -> list[tuple[int, int]]:
    """(micro-batch, chunk) forwards in order: groups of ``group`` micro-batches, every
    chunk of a group before the next group (megatron's ``get_schedule_table``)."""
    table: list[tuple[int, int]] = []
    for start in range(0, microbatches, group):
        ids = range(start, min(start + group, microbatches))
        table += [(m, c) for c in range(chunks) for m in ids]
    return table


def even_counts(total: int, parts: int, field: str, value: int) -> tuple[int, ...]:
    """``total`` layers in ``parts`` equal blocks (megatron requires them to divide);
    ``field`` = ``value`` is the input that asked for ``parts``."""
    if total % parts:
        raise InputError(field, value, f"{parts} blocks do not divide {total} layers evenly")
    return (total // parts,) * parts


def stage_layer_counts(
    total: int,
    pp: int,
    vpp: int = 1,
    *,
    first: int | None = None,
    last: int | None = None,
    explicit: Sequence[int] | None = None,
) -> tuple[int, ...] | None:
    """Per-virtual-stage counts from megatron's options: ``first`` / ``last`` layers on
    the first / last stage and the rest shared evenly by the others, or ``explicit``
    counts per stage (``pp`` of them) or per virtual stage (``pp x vpp``); a stage's
    layers divide evenly over its ``vpp`` chunks. None: even (``Pipeline`` cuts them)."""
    if explicit is not None and (first is not None or last is not None):
        raise InputError("stage_layers", list(explicit), "give counts or first/last, not both")
    if explicit is None and first is None and last is None:
        return None
    if explicit is not None:
        counts = [require_nonnegative_int("stage_layers", n) for n in explicit]
        if len(counts) == pp * vpp:
            return tuple(counts)  # ``Pipeline`` refuses an empty middle virtual stage
        for n in counts:
            require_positive_int("stage_layers", n)
        if len(counts) != pp:
            raise InputError(
                "stage_layers", counts, f"needs {pp} counts (one per stage) or {pp * vpp}"
            )
        per_stage = counts
    else:
        if pp < 2:
            raise InputError("first_stage_layers", first or last, "needs pp > 1")
        head = require_positive_int("first_stage_layers", first) if first is not None else None
        tail = require_positive_int("last_stage_layers", last) if last is not None else None
        middle = pp - (head is not None) - (tail is not None)
        rest = total - (head or 0) - (tail or 0)
        if (middle == 0 and rest != 0) or (middle and (rest <= 0 or rest % middle)):
            raise InputError(
                "first_stage_layers" if head is not None else "last_stage_layers",
                head if head is not None else tail,
                f"leaves {rest} layers for {middle} other stages (they must divide evenly)",
            )
        shared = [rest // middle] * middle if middle else []
        per_stage = ([head] if head is not None else []) + shared + ([tail] if tail else [])
    if sum(per_stage) != total:
        raise InputError("stage_layers", per_stage, f"add up to {sum(per_stage)}, not {total}")
    # stage s's chunk c is virtual stage c * pp + s
    chunked = [even_counts(n, vpp, "vpp", vpp) for n in per_stage]
    return tuple(chunked[s][c] for c in range(vpp) for s in range(pp))


@functools.lru_cache(maxsize=256)
def _virtual_layers(pipeline: Pipeline, total_layers: int) -> tuple[range, ...]:
    """``Pipeline.virtual_layers``, computed once per pipeline and depth (every chunk of
    every stage asks for it while a step is priced)."""
    return pipeline._split(total_layers)
