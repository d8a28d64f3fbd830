"""What a pipeline stage's run reports: each op of the schedule with the live bytes around
it (``StageOp``), the stage's peaks with what was in flight (``StagePeak``) and the whole
stage (``StageResult``), each as a plain dict. ``stage.py`` fills them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from oracles.rank_sim import kernels as K


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
