# mypy: disable-error-code="no-untyped-call,no-any-return"
"""A pipeline stage's schedule: the order of forwards and backwards megatron-core 0.16 runs
on one pipeline rank (``stage_schedule``), the checks on its arguments (``check_pipeline``)
and the layers of each virtual stage (``stage_layer_counts``). ``stage.py`` runs it.

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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from oracles.rank_sim.geometry import SimInputError, SimModel


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
