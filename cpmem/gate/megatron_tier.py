"""The gate's second measured tier: Megatron-LM's functional-test recordings.

Every recording of ``golden/megatron/recordings.csv`` (the GPT and MoE families) is priced from its
case's own ``model_config.yaml`` on the rank Megatron-LM logs (``rank="last"``), its
recipe's world size and its platform's device, and held to:

- ``static``: ``static_bytes`` within ``STATIC_TOLERANCE`` (3%) of the last finite
  ``mem-allocated-bytes`` (what stays allocated after an optimizer step);
- ``covers``: ``peak_bytes`` at least the largest ``mem-max-allocated-bytes`` (the
  allocator's peak since the process started);
- ``headroom``: ``peak_bytes`` at most 10% above that peak where it is at least 8 GiB,
  at most 20% below; over every recording, the median headroom at most 10%. Under
  ``--attention-backend auto`` Transformer Engine picks the backend per container; the
  priced figure is the covering backend's, and the headroom is read against the
  smallest backend figure that covers the recording (``backend_spread_peak_bytes``).

A recording the model does not explain is a declared miss (``DECLARED_MISSES``), with
the tensor or the evidence that explains it; any other failure fails the tier.
Recordings whose file names no platform (``golden_values_dev.json``,
``golden_values_lts.json``) are counted and not priced; cases whose arguments cpmem
refuses are counted with the refused flag.

The recordings' own tolerance: Megatron-LM's CI passes a run whose memory stays within
5% of the recorded values (``test_pretraining_regular_pipeline.py``), so two runs of the
same case may differ by up to about 5% (the ``_2nd`` files, and the same case across
containers, show it); a 3% static check is tighter than the runtime holds itself to.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from pathlib import Path

from cpmem.errors import InputError
from cpmem.golden.megatron import Recording, load_recordings
from cpmem.megatron.args import MegatronArgs, read_megatron_args
from cpmem.megatron.estimate import MegatronEstimate, price_megatron
from cpmem.megatron.run import describe_megatron_run

STATIC_TOLERANCE = 0.03
LARGE_PEAK_BYTES = 8 << 30
HEADROOM_LARGE = 0.10
HEADROOM_SMALL = 0.20
HEADROOM_MEDIAN = 0.10
CHECKS = ("static", "covers", "headroom")


@dataclass(frozen=True)
class DeclaredMiss:
    """Recordings a check is known to fail, and why: ``case`` a regular expression over
    case names, ``platform`` over ``environment_platform``, ``second`` whether only a
    resumed run's ``_2nd`` file, ``direction`` ``under`` (the recording above the
    figure) or ``over`` (below it) or ``any``."""

    check: str
    case: str
    why: str
    limit: float
    """The largest error the declaration excuses (``TierRow.error``'s magnitude): a
    recording further off fails even where the rest matches."""
    platform: str = ".*"
    direction: str = "any"
    second: bool | None = None
    min_pp: int = 1
    """The declaration covers runs of at least this many pipeline stages (a case's name
    says its layout, its arguments decide it)."""

    def matches(self, row: TierRow, check: str) -> bool:
        rec = row.recording
        where = f"{rec.environment}_{rec.platform}"
        if self.second is not None and rec.second_recording != self.second:
            return False
        if self.direction != "any" and row.direction(check) != self.direction:
            return False
        if abs(row.error(check)) > self.limit or row.estimate.run.pp < self.min_pp:
            return False
        return (
            check == self.check
            and re.fullmatch(self.case, rec.case) is not None
            and re.fullmatch(self.platform, where) is not None
        )


_PP_BUFFERS = (
    "pipeline runs (PP 2/4) keep 8-13 MiB between steps beyond every priced tensor "
    "(interleaved over 3 chunks: 24-28 MiB, up to 45 MiB on GB200 with overlapped "
    "gradient reduction; at most 8.5% of the static bytes) on all three platforms: two to three "
    "(interleaved: six to seven) [s, b, h] bf16 tensors of 4 MiB outliving the step; "
    "the schedule's source (schedules.py, p2p_communication.py) keeps no such buffer "
    "by reading, so the tensor is not found yet"
)
_GB200_WORKSPACE = (
    "GB200 runs of these cases hold 40-50 MiB less between steps than the same "
    "arguments on A100 and H100 and than GB200's deterministic runs: a container "
    "whose cuBLAS/cuBLASLt workspaces are smaller than the 32 MiB pair priced; "
    "over-priced, never under"
)
_RESUMED_OUTLIER = (
    "one resumed process's second recording holds 100-200 MiB more than every other "
    "recording of its case (the 5% CI band lets a rerun drift): its restart's "
    "checkpoint-load buffers outliving the load, not a tensor of the step"
)
_AUTO_BACKEND = (
    "--attention-backend auto at TP 4: the flash/fused figure is 8-21 MiB (0.7-2.1%) "
    "under these recordings (the same cases' other platforms are covered), so the "
    "smallest covering backend figure is the unfused one, 29-47% above"
)
_WORST_ROUTING = (
    "MoE routing priced at its worst case (every token's copies on this rank's experts "
    "as far as top-k allows): at EP 4-8 with one or two experts a rank that is 4x the "
    "balanced rows; the recordings sit near the balanced figure, so the covering figure "
    "is 20-85% above them (a bound, not the expectation)"
)
DECLARED_MISSES: tuple[DeclaredMiss, ...] = (
    DeclaredMiss("headroom", r"gpt3_moe_mcore_te_ep8_.*", _WORST_ROUTING, 0.85),
    DeclaredMiss(
        "headroom", r"gpt3_mcore_te_tp2_pp1_te_a2a_ovlp_8experts_etp1_ep4.*", _WORST_ROUTING, 0.85
    ),
    DeclaredMiss(
        "headroom",
        r"gpt3_mcore_te_tp2_pp1_(resume_torch_dist_)?te_8experts2parallel_top2router",
        _WORST_ROUTING,
        0.30,
    ),
    DeclaredMiss(
        "static",
        r"gpt3_mcore_te_tp2_pp1_te_a2a_ovlp_8experts_etp1_ep4.*",
        "--overlap-moe-expert-parallel-comm keeps 55-59 MiB between steps beyond every "
        "priced tensor on H100 and GB200 (3.7-3.9%): about one more cuBLAS and cuBLASLt "
        "workspace pair (64 MiB), as a second compute stream of the combined 1F1B "
        "schedule would allocate; not confirmed in the source",
        0.045,
        direction="under",
    ),
    DeclaredMiss("static", r".*_pp[24]_.*", _PP_BUFFERS, 0.085, direction="under", min_pp=2),
    DeclaredMiss(
        "static",
        r".*(nondeterministic|reshard).*",
        _GB200_WORKSPACE,
        0.16,
        "dev_dgx_gb200",
        "over",
    ),
    DeclaredMiss(
        "static",
        r"gpt3_mcore_te_tp2_pp2_resume_torch_dist_cp2_nondeterministic",
        _RESUMED_OUTLIER,
        0.28,
        "dev_dgx_h100",
        "under",
        second=True,
    ),
    DeclaredMiss(
        "static",
        r"gpt3_mcore_te_tp(4_pp1|1_pp4_vp1)_resume_torch_dist_dist_optimizer_overlap_grad_reduce",
        _RESUMED_OUTLIER,
        0.27,
        "lts_dgx_a100",
        "under",
        second=True,
    ),
    DeclaredMiss("covers", r".*cp2_nondeterministic", _RESUMED_OUTLIER, 0.16, second=True),
    DeclaredMiss(
        "covers",
        r"gpt3_mcore_te_tp2_pp2_cp2.*_1node",
        "GB200 single-node CP runs peak 0.1-1.0 MiB (under 0.1%) above the figure: "
        "the allocator counts whole blocks, up to 1 MiB above a request each",
        0.002,
        "dev_dgx_gb200",
    ),
    DeclaredMiss(
        "covers",
        r".*qk_layernorm.*",
        "the query/key norms at TP 4 hold 2-8 MiB more per step than their outputs "
        "priced (a contiguous copy of their strided input, not confirmed)",
        0.01,
        r"lts_dgxa100_dracooci.*",
    ),
    DeclaredMiss("headroom", r"gpt3_mcore_te_tp4_pp[12]_.*", _AUTO_BACKEND, 0.50),
    DeclaredMiss(
        "headroom",
        r".*_pp4_vp1_resume.*",
        "--attention-backend auto, interleaved: the pipeline's unpriced 24-28 MiB (the "
        "static miss above) leaves the flash figure 3-17 MiB under these recordings, "
        "so the smallest covering backend figure is the unfused one, 52-66% above",
        0.70,
    ),
)


@dataclass(frozen=True)
class TierRow:
    recording: Recording
    estimate: MegatronEstimate

    @property
    def measured_static(self) -> float:
        assert self.recording.allocated_last_bytes is not None
        return self.recording.allocated_last_bytes

    @property
    def measured_peak(self) -> float:
        assert self.recording.max_allocated_max_bytes is not None
        return self.recording.max_allocated_max_bytes

    @property
    def static_error(self) -> float:
        return self.estimate.static_bytes / self.measured_static - 1

    @property
    def explained_peak(self) -> int:
        """The smallest backend figure that covers the recording (the priced figure
        where the backend is named, or where no other covers)."""
        covering = [p for p in self.estimate.spread.values() if p >= self.measured_peak]
        return min(covering) if covering else self.estimate.peak_bytes

    @property
    def headroom(self) -> float:
        return self.explained_peak / self.measured_peak - 1

    @property
    def headroom_limit(self) -> float:
        return HEADROOM_LARGE if self.measured_peak >= LARGE_PEAK_BYTES else HEADROOM_SMALL

    def passed(self, check: str) -> bool:
        if check == "static":
            return abs(self.static_error) <= STATIC_TOLERANCE
        if check == "covers":
            return self.estimate.peak_bytes >= self.measured_peak
        return self.headroom <= self.headroom_limit

    def error(self, check: str) -> float:
        """How far the recording is from passing ``check``'s figure: the static error,
        the peak's error against the recording, or the headroom."""
        if check == "static":
            return self.static_error
        if check == "covers":
            return self.estimate.peak_bytes / self.measured_peak - 1
        return self.headroom

    def direction(self, check: str) -> str:
        """``under`` where the recording is above the figure, else ``over``."""
        if check == "static":
            return "under" if self.static_error < 0 else "over"
        return "under" if self.estimate.peak_bytes < self.measured_peak else "over"

    def declared(self, check: str) -> DeclaredMiss | None:
        return next((m for m in DECLARED_MISSES if m.matches(self, check)), None)


@dataclass(frozen=True)
class MegatronTier:
    rows: tuple[TierRow, ...]
    refused: dict[str, tuple[str, ...]]
    """The refusal's message -> the recordings it refused."""
    unnamed_platform: tuple[str, ...]
    no_values: tuple[str, ...]

    def failing(self, check: str) -> list[TierRow]:
        """Rows failing ``check`` that no declared miss explains."""
        return [r for r in self.rows if not r.passed(check) and r.declared(check) is None]

    def declared_failures(self, check: str) -> list[TierRow]:
        return [r for r in self.rows if not r.passed(check) and r.declared(check) is not None]

    def count(self, check: str) -> int:
        return sum(r.passed(check) for r in self.rows)

    @property
    def median_headroom(self) -> float:
        return statistics.median(r.headroom for r in self.rows) if self.rows else 0.0

    @property
    def passed(self) -> bool:
        return all(not self.failing(c) for c in CHECKS) and self.median_headroom <= HEADROOM_MEDIAN


def price_recording(
    recording: Recording, golden_dir: Path, args: MegatronArgs | None = None
) -> MegatronEstimate:
    """A recording's case priced as it ran: its arguments (read from its case's
    ``model_config.yaml`` unless given), world size, device, last rank."""
    if args is None:
        args = read_megatron_args(recording.model_config(golden_dir))
    run = describe_megatron_run(
        args, world_size=recording.world_size, rank="last", device=recording.device
    )
    return price_megatron(run)


def run_tier(golden_dir: Path, family: str | None = None) -> MegatronTier:
    """The tier over the recordings of ``family`` (default: every family)."""
    rows: list[TierRow] = []
    refused: dict[str, list[str]] = {}
    unnamed: list[str] = []
    empty: list[str] = []
    cases: dict[Path, MegatronArgs | InputError] = {}
    for rec in load_recordings(golden_dir, family):
        if not rec.has_values:
            empty.append(rec.recording_id)
            continue
        if not rec.device:
            unnamed.append(rec.recording_id)
            continue
        path = rec.model_config(golden_dir)
        if path not in cases:  # every recording of a case ran the same arguments
            try:
                cases[path] = read_megatron_args(path)
            except InputError as exc:
                cases[path] = exc
        try:
            read = cases[path]
            if isinstance(read, InputError):
                raise read
            est = price_recording(rec, golden_dir, read)
        except InputError as exc:
            refused.setdefault(str(exc), []).append(rec.recording_id)
            continue
        rows.append(TierRow(rec, est))
    return MegatronTier(
        tuple(rows),
        {k: tuple(v) for k, v in refused.items()},
        tuple(unnamed),
        tuple(empty),
    )


def megatron_check(golden_dir: Path) -> dict[str, object]:
    """The tier as one gate check: passed, and per check what passed, what is declared
    and what fails (recording ids)."""
    tier = run_tier(golden_dir)
    per_check = {
        c: {
            "passed": tier.count(c),
            "declared": len(tier.declared_failures(c)),
            "failing": [r.recording.recording_id for r in tier.failing(c)],
        }
        for c in CHECKS
    }
    return {
        "passed": tier.passed,
        "recordings": len(tier.rows),
        "checks": per_check,
        "median_headroom": tier.median_headroom,
        "refused": {k: len(v) for k, v in tier.refused.items()},
        "unnamed_platform": len(tier.unnamed_platform),
        "no_values": len(tier.no_values),
    }
