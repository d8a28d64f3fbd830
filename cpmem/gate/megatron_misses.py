"""The Megatron-LM tier's declared misses (``cpmem.gate.megatron_tier``): the recordings a
check is known to fail, each matched by what the run does, with the tensor or the evidence
behind it, and capped twice, in the error it excuses and in bytes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cpmem.step.torch_fsdp2 import STRATEGY as TORCH_FSDP2

TierRow = Any
"""A ``cpmem.gate.megatron_tier.TierRow``: the tier imports this module, so the row's type
is named here, not imported (no import circle)."""

MIB = 1 << 20
STATIC_TOLERANCE = 0.03
"""The static check's tolerance (the tier's ``static`` check; a resumed process's cap reads
it)."""


@dataclass(frozen=True)
class DeclaredMiss:
    """Recordings a check is known to fail, and why. ``applies`` says which runs it is
    for, by what they do; ``limit`` caps the error it excuses (``TierRow.error``'s
    magnitude) and ``cap_bytes`` the bytes (``TierRow.excess_bytes``), so a recording
    further off fails even where the rest matches; ``direction``: ``under`` (the
    recording above the figure), ``over`` or ``any``."""

    check: str
    label: str
    why: str
    applies: Callable[[TierRow], bool]
    limit: float
    cap_bytes: int
    direction: str = "any"
    cap: Callable[[TierRow], float] | None = None
    """Where the bytes it excuses depend on the run (the spread's figure), their cap."""

    def matches(self, row: TierRow, check: str) -> bool:
        if check != self.check:
            return False
        if self.direction != "any" and row.direction(check) != self.direction:
            return False
        cap = self.cap_bytes if self.cap is None else min(self.cap_bytes, self.cap(row))
        if abs(row.error(check)) > self.limit or row.excess_bytes(check) > cap:
            return False
        return self.applies(row)


_PP_BUFFERS = (
    "pipeline runs on GB200 (and one interleaved A100 run) hold 18-36 MiB between steps "
    "beyond the chunks' kept inputs priced (pipeline_received: each chunk's last received "
    "activation and its gradient); the other platforms' runs of the same arguments are "
    "within 3%; not a tensor of the step found. The bytes live between steps are live at "
    "the peak too: a pipeline run's peak is excused up to what its static memory holds "
    "above the priced static, with the caching allocator's block rounding on it "
    "(ALLOCATOR_SLACK)"
)
ALLOCATOR_SLACK = 6 * MIB
"""What the caching allocator's block rounding adds to a peak: the recordings sit up to
5 MiB above the figures of runs every priced tensor explains (the "allocator blocks"
miss)."""
_TP4 = (
    "TP 4 without sequence parallelism: the recordings' activations exceed the priced "
    "ones by 7-9 MiB on H100 (fused) and 13-21 MiB on A100 and GB200 (flash-attn), where "
    "at TP 1 and 2 they are covered; not a tensor of the step found"
)
_INSTANCES_RESUMED = (
    "a resumed run's second process under several distributed-optimizer instances (the MoE "
    "case, --num-distributed-optimizer-instances 2 with --ckpt-fully-parallel-load) peaks "
    "at its first step and holds it to its last (3192 MiB on H100, 2772 MiB on GB200, "
    "from step 51), 334-789 MiB above the first process's steps of the same arguments, "
    "whose static memory it equals: the restart's checkpoint load (the optimizer state, "
    "replicated over the instances, exchanged among the data-parallel ranks), not a "
    "tensor of the step; excused up to what it holds above the case's other recordings"
)


CACHED_DUMMY_SINCE = "2025-08-01"
"""The date of the Megatron-LM commit from which its output layer takes its dummy weight
gradient from Transformer Engine's cache (e7c55de99e, "Changes to enable full iteration
CUDA graph", tensor_parallel/layers.py); before it a ``torch.empty`` freed with the step's
gradients (``cpmem.pricing.dummy_wgrad``)."""
_DEFERRED = (
    "--defer-embedding-wgrad-compute: the recordings peak 12-18 MiB above the figure, "
    "which holds the output layer's input and logits' gradient of every deferred "
    "micro-batch (402 MiB at TP 2, PP 2, limit 2) and the output layer's cached dummy "
    "gradient: Transformer Engine's own cached dummies of the layers' weights (one per "
    "distinct shape, 3 MiB here: cpmem.pricing.dummy_wgrad, unpriced) and about 10-15 MiB "
    "not a tensor found (the same on every device and image, before and after the dummy "
    "was cached)"
)


FSDP_KEEPS_OUTSIDE_SINCE = "2026-05-30"
"""The date of the Megatron-LM commit from which Megatron FSDP keeps its outside-unit
buckets gathered between steps (378d81fbd3, "Preserve non-FSDP-unit buckets across
AllGatherPipeline reset": ``reset(preserve_non_fsdp_units=True)``,
``param_and_grad_buffer.py``); before it every gathered bucket was freed at the reset."""


def _kept_gathered_bytes(row: TierRow) -> float:
    """The outside-unit buckets the row's static memory prices kept gathered, with the
    static check's tolerance."""
    static = row.estimate.static
    kept = 0.0 if static is None else float(static.components.get("fsdp_kept_gathered", 0))
    return kept + STATIC_TOLERANCE * float(row.measured_static)


def _dummy_bytes(row: TierRow) -> float:
    """The output layer's cached dummy gradient the row's static memory prices."""
    static = row.estimate.static
    return 0.0 if static is None else float(static.components.get("dummy_wgrad", 0))


def _resumed_instances(row: TierRow) -> bool:
    """A resumed run's second process with several distributed-optimizer instances."""
    opt = row.step.settings.optimizer
    return bool(row.recording.second_recording and opt.instances > 1 and row.above_case[1] > 0)


DECLARED_MISSES: tuple[DeclaredMiss, ...] = (
    DeclaredMiss(
        "static",
        "pipeline buffers",
        _PP_BUFFERS,
        lambda r: r.pp > 1,
        0.05,
        40 * MIB,
        "under",
    ),
    DeclaredMiss(
        "covers",
        "pipeline buffers",
        _PP_BUFFERS,
        lambda r: r.pp > 1,
        0.05,
        40 * MIB,
        cap=lambda r: r.static_shortfall + ALLOCATOR_SLACK,
    ),
    DeclaredMiss(
        "covers",
        "TP 4 without SP",
        _TP4,
        lambda r: r.step.plan.layout.tp == 4 and not r.step.plan.layout.sp_active,
        0.02,
        22 * MIB,
    ),
    DeclaredMiss(
        "static",
        "MoE overlap",
        "--overlap-moe-expert-parallel-comm keeps 55-59 MiB between steps beyond every "
        "priced tensor on H100 and GB200 (3.7-3.9%): about one more pair of cuBLAS "
        "workspaces (64 MiB), as a second compute stream of the combined 1F1B schedule would "
        "allocate; not confirmed in the source",
        lambda r: r.step.settings.runtime.overlap_moe_comm,
        0.045,
        64 * MIB,
        "under",
    ),
    DeclaredMiss(
        "static",
        "FSDP outside buckets released",
        "a Megatron FSDP recording made before Megatron-LM kept its outside-unit buckets "
        "gathered between steps (378d81fbd3, 2026-05-30, FSDP_KEEPS_OUTSIDE_SINCE) holds "
        "none of them: the snapshot's kept bucket (fsdp_kept_gathered: the embedding, the "
        "final norm and an untied output layer, whole, in the parameters' dtype) is "
        "over-priced there; excused up to that bucket's bytes",
        lambda r: (
            r.step.settings.optimizer.fsdp not in ("none", TORCH_FSDP2)
            and bool(r.values_date)
            and r.values_date < FSDP_KEEPS_OUTSIDE_SINCE
        ),
        0.15,
        64 * MIB,
        "over",
        cap=_kept_gathered_bytes,
    ),
    DeclaredMiss(
        "static",
        "GB200 workspaces",
        "some GB200 runs hold 40-50 MiB less between steps than the same arguments on "
        "A100 and H100 and than GB200's other runs: a container whose cuBLAS workspaces are "
        "smaller than the pair priced; over-priced, never under",
        lambda r: r.platform == "gb200",
        0.20,
        56 * MIB,
        "over",
    ),
    DeclaredMiss(
        "static",
        "resumed process",
        "a resumed run's second process holds 60-180 MiB more than the other recordings of "
        "its case on its device (the 5% CI band lets a rerun drift): its restart's "
        "checkpoint-load buffers outliving the load, not a tensor of the step; excused up "
        "to what it holds above them",
        lambda r: r.recording.second_recording and r.above_case[0] >= 32 * MIB,
        0.28,
        256 * MIB,
        "under",
        cap=lambda r: r.above_case[0] + STATIC_TOLERANCE * r.measured_static,
    ),
    DeclaredMiss(
        "covers",
        "resumed process",
        "a resumed run's second process peaks with its restart's checkpoint-load buffers "
        "(the static miss of the same name) live, up to what it holds above the case's "
        "other recordings",
        lambda r: r.recording.second_recording and r.above_case[1] > 0,
        0.16,
        256 * MIB,
        cap=lambda r: r.above_case[1] + r.floor_excess,
    ),
    DeclaredMiss(
        "covers",
        "resumed process, optimizer instances",
        _INSTANCES_RESUMED,
        lambda r: _resumed_instances(r),
        0.30,
        800 * MIB,
        "under",
        cap=lambda r: r.above_case[1] + r.floor_excess,
    ),
    DeclaredMiss(
        "headroom",
        "resumed process, optimizer instances",
        _INSTANCES_RESUMED,
        lambda r: _resumed_instances(r),
        0.30,
        800 * MIB,
        "under",
        cap=lambda r: r.above_case[1],
    ),
    DeclaredMiss(
        "covers",
        "MoE at EP 1",
        "an MoE run at EP 1 routes every row to the rank's own experts: its worst case is "
        "the balanced expectation, which the tier holds within 10% either side of the "
        "recordings (MOE_BALANCED_TOLERANCE), not above them; the sinkhorn top-1 TP 2 "
        "cases' recordings sit 60-100 MiB (3-5%) above that expectation at EP 2 too, where "
        "the routing bound covers them (one recording, 86 MiB, 2.5%; not a tensor found)",
        lambda r: r.step.geometry.is_moe and r.step.plan.layout.ep == 1,
        0.05,
        128 * MIB,
        "under",
    ),
    DeclaredMiss(
        "static",
        "dummy gradient not cached",
        "a recording of Megatron-LM before its output layer took its dummy weight gradient "
        "from Transformer Engine's cache (commit of 2025-08-01, CACHED_DUMMY_SINCE) holds "
        "none between steps: the snapshot's cached [V/t, h] dummy (dummy_wgrad) is "
        "over-priced there; excused up to that tensor's bytes",
        lambda r: bool(r.values_date) and r.values_date < CACHED_DUMMY_SINCE,
        0.08,
        64 * MIB,
        "over",
        cap=_dummy_bytes,
    ),
    DeclaredMiss(
        "covers",
        "deferred embedding wgrad",
        _DEFERRED,
        lambda r: r.step.settings.pipeline.deferred_wgrad is not None,
        0.015,
        20 * MIB,
        "under",
    ),
    DeclaredMiss(
        "covers",
        "allocator blocks",
        "the caching allocator counts whole blocks, a large-pool block up to 1 MiB above its "
        "request (CUDACachingAllocator.cpp splits a block only where more than 1 MiB "
        "remains): recordings 0.1-5 MiB above the figure (single-node GB200 CP runs, full "
        "recompute)",
        lambda r: True,
        0.0025,
        ALLOCATOR_SLACK,
    ),
)
