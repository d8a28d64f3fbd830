"""The gate's second measured tier: Megatron-LM's functional-test recordings.

Every recording of ``golden/megatron/recordings.csv`` (the GPT, MoE, hybrid and Nemotron
families) is read from its case's own ``model_config.yaml`` into the one step description
(``cpmem.megatron.describe``), answered for the rank Megatron-LM logs (``rank="last"``) on
its recipe's world size and its platform's device, priced by ``tight`` (the structure
every measured runtime checks; Megatron-LM's runs carry no fitted margin), and held to:

- ``static``: ``static_bytes`` (the answered stage's static memory) within
  ``STATIC_TOLERANCE`` (3%) of the last finite ``mem-allocated-bytes``;
- ``covers``: ``peak_bytes`` (``Estimate.peak_bytes``: static memory plus the step's
  forward+backward figure on that stage, the figure users get) at least the largest
  ``mem-max-allocated-bytes``;
- ``headroom``: ``peak_bytes`` at most 10% above that peak where it is at least 8 GiB,
  at most 20% below; over every recording, the median headroom at most 10%. An MoE run
  whose router has no capacity is priced at the worst case it can reach, a bound loose
  by construction: it must cover, and its headroom is its balanced expectation's, within
  ``MOE_BALANCED_TOLERANCE`` (10%) of the recording either side (the recordings sit near
  balanced routing); ``median_bound_headroom`` reports ``peak_bytes``' median, the
  bound's included.

Under ``--attention-backend auto`` the backend is the one Transformer Engine's selection
picks in the container of the CI image the recording was made in
(``golden/megatron/recorded_images.csv``, ``backend_choice.container_for_image``): the
``lts`` environment ran NGC PyTorch 24.01 until 2025-11-06, whose deterministic A100 runs
are unfused, and later images flash or fused. ``spread`` holds ``peak_bytes`` under each
backend another container picks, reported, never counted as the figure.

A recording the model does not explain is a declared miss (``cpmem.gate.megatron_misses``): matched
by what the run does (its layout, backend, device, a resumed process's second recording),
the tensor or the evidence behind it, and capped twice: the error it excuses
(``limit``) and the bytes (``cap_bytes``). Anything else fails the tier. Recordings
whose file names no platform are counted and not priced; cases whose arguments cpmem
refuses, and recordings whose world size the snapshot does not give, are counted with
every reason (``Refusal``); ``MegatronTier.by_feature`` groups the recordings by the
feature families their arguments turn on (``cpmem.golden.megatron_features``), priced or
refused.

The recordings' own tolerance: Megatron-LM's CI passes a run whose memory stays within
5% of the recorded values (``test_pretraining_regular_pipeline.py``), so two runs of the
same case may differ by up to about 5%; a 3% static check is tighter than the runtime
holds itself to.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from cpmem.errors import InputError
from cpmem.gate.megatron_misses import DECLARED_MISSES, STATIC_TOLERANCE, DeclaredMiss
from cpmem.gate.tier_vocab import tier_vocab
from cpmem.golden.megatron import Recording, load_recordings
from cpmem.golden.megatron_features import FEATURE_TAGS
from cpmem.golden.megatron_history import load_recorded_images
from cpmem.megatron.args import MegatronArgs, read_megatron_args
from cpmem.megatron.describe import describe_megatron
from cpmem.pricing.estimate import Estimate
from cpmem.pricing.registry import backend_spread, price
from cpmem.step.backend_choice import container_for_image
from cpmem.step.step import Step

LARGE_PEAK_BYTES = 8 << 30
HEADROOM_LARGE = 0.10
HEADROOM_SMALL = 0.20
HEADROOM_MEDIAN = 0.10
MOE_BALANCED_TOLERANCE = 0.10
"""Of an MoE run without a router capacity: how near the recording its balanced
expectation must be, either side (the recordings sit near balanced routing; the worst
case, a bound, must cover)."""
CHECKS = ("static", "covers", "headroom")
POLICY = "tight"


@dataclass(frozen=True)
class TierRow:
    """One recording, the step it ran and the estimate of it."""

    recording: Recording
    step: Step
    estimate: Estimate
    spread: dict[str, int] = field(default_factory=dict)
    """``peak_bytes`` under each backend another container's Transformer Engine picks."""
    balanced_peak: int | None = None
    """Of an MoE run: ``peak_bytes`` under balanced routing (the priced figure is the
    worst case a router without capacity can reach)."""
    case_floor: tuple[float, float] | None = None
    """The smallest (static, peak) bytes the other recordings of its case on its device
    hold, of those priced at the same figures (None where there is none)."""
    values_date: str = ""
    """The date of the Megatron-LM commit that recorded it (``recorded_images.csv``): the
    code the recording ran, where it differs from the snapshot cpmem prices."""

    @property
    def above_case(self) -> tuple[float, float]:
        """What the recording holds above ``case_floor``: (static, peak) bytes, 0 where
        it holds less or has no floor."""
        if self.case_floor is None:
            return (0.0, 0.0)
        static, peak = self.case_floor
        return (max(0.0, self.measured_static - static), max(0.0, self.measured_peak - peak))

    @property
    def floor_excess(self) -> float:
        """What ``case_floor``'s peak holds above this row's figure (0 below it, or with no
        floor): the miss of the case's other recordings, held to the checks on their rows."""
        if self.case_floor is None:
            return 0.0
        return max(0.0, self.case_floor[1] - self.peak_bytes)

    @property
    def static_shortfall(self) -> float:
        """The bytes the recording holds between steps above the priced static memory."""
        return max(0.0, self.measured_static - self.static_bytes)

    @property
    def static_bytes(self) -> int:
        static = self.estimate.static
        assert static is not None
        return static.total

    @property
    def peak_bytes(self) -> int:
        return self.estimate.peak_bytes

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
        return self.static_bytes / self.measured_static - 1

    @property
    def routing_bound(self) -> bool:
        """Whether the priced figure is a routing bound loose by construction: an MoE run
        whose router has no capacity, priced at the worst case it can reach. Its headroom
        is the balanced expectation's (the recordings sit near it), its cover the
        bound's (``peak_bytes``)."""
        return self.balanced_peak is not None and self.step.moe_routing == "concentrated"

    @property
    def headroom_figure(self) -> int:
        """The figure the headroom check reads: ``peak_bytes``, or of a routing bound the
        balanced expectation's."""
        if self.routing_bound:
            assert self.balanced_peak is not None
            return self.balanced_peak
        return self.peak_bytes

    @property
    def headroom(self) -> float:
        return self.headroom_figure / self.measured_peak - 1

    @property
    def bound_headroom(self) -> float:
        """``peak_bytes`` over the recording: the figure users get, a bound or not."""
        return self.peak_bytes / self.measured_peak - 1

    @property
    def headroom_limit(self) -> float:
        if self.routing_bound:
            return MOE_BALANCED_TOLERANCE
        return HEADROOM_LARGE if self.measured_peak >= LARGE_PEAK_BYTES else HEADROOM_SMALL

    def passed(self, check: str) -> bool:
        if check == "static":
            return abs(self.static_error) <= STATIC_TOLERANCE
        if check == "covers":
            return self.peak_bytes >= self.measured_peak
        if self.routing_bound:  # the expectation: near the recording, either side
            return abs(self.headroom) <= self.headroom_limit
        return self.headroom <= self.headroom_limit

    def error(self, check: str) -> float:
        """How far the recording is from the check's figure: the static error, or the
        peak's error against the recording (covers and headroom)."""
        return self.static_error if check == "static" else self.headroom

    def excess_bytes(self, check: str) -> float:
        """The bytes a failure of ``check`` is off by: the static bytes' distance from
        the recording, the recording above the peak, the peak above its headroom limit."""
        if check == "static":
            return abs(self.static_bytes - self.measured_static)
        if check == "covers":
            return max(0.0, self.measured_peak - self.peak_bytes)
        over = self.headroom_figure - self.measured_peak * (1 + self.headroom_limit)
        if self.routing_bound:
            under = self.measured_peak * (1 - self.headroom_limit) - self.headroom_figure
            return max(0.0, over, under)
        return max(0.0, over)

    def direction(self, check: str) -> str:
        """``under`` where the recording is above the figure, else ``over``."""
        if check == "static":
            return "under" if self.static_error < 0 else "over"
        return "under" if self.peak_bytes < self.measured_peak else "over"

    def declared(self, check: str) -> DeclaredMiss | None:
        return next((m for m in DECLARED_MISSES if m.matches(self, check)), None)

    # --- what the run does (the declared misses' predicates) ---------------------
    @property
    def pp(self) -> int:
        return self.step.settings.pipeline.pp

    @property
    def interleaved(self) -> bool:
        return self.step.settings.pipeline.vpp > 1

    @property
    def platform(self) -> str:
        return self.recording.device


def read_case(model_config: Path) -> MegatronArgs:
    """A case's arguments as the tier reads them: as written, with the vocabulary the tier
    assumes for a tokenizer file it cannot read (``cpmem.gate.tier_vocab``)."""
    return read_megatron_args(model_config, vocab_size=tier_vocab(model_config))


def price_recording(
    recording: Recording,
    golden_dir: Path,
    args: MegatronArgs | None = None,
    image: str | None = None,
    values_date: str = "",
) -> TierRow:
    """A recording's case priced as it ran: its arguments (read from its case's
    ``model_config.yaml`` unless given), world size, device, last rank, and the container
    of the CI image it was recorded in (``recorded_images.csv`` unless given, with the
    date of the commit that recorded it; ``values_date`` where the image is given)."""
    if recording.world_size is None:
        raise InputError("world_size", None, recording.world_size_basis)
    if args is None:
        args = read_case(recording.model_config(golden_dir))
    if image is None:
        recorded = load_recorded_images(golden_dir)[recording.recording_id]
        image, values_date = recorded.base_image, recorded.values_date
    step = describe_megatron(
        args,
        world_size=recording.world_size,
        device=recording.device,
        rank="last",
        container=container_for_image(image),
    )
    est = price(step, POLICY)
    # an MoE run's balanced expectation, priced beside its figure (routing_figures)
    balanced = est.routing_figures.get("balanced") if step.geometry.is_moe else None
    return TierRow(
        recording, step, est, backend_spread(step, POLICY), balanced, values_date=values_date
    )


@dataclass(frozen=True)
class Refusal:
    """A recording the tier does not price, and every reason: its arguments' refusal
    (field ``megatron_args``) and, where the snapshot does not give it, its world size's
    (field ``world_size``)."""

    recording: Recording
    problems: tuple[InputError, ...]

    @property
    def message(self) -> str:
        return "; ".join(str(p) for p in self.problems)

    @property
    def refused_values(self) -> str:
        """What is refused, without the reasons: the arguments, or the missing world size."""
        return "; ".join(
            "world size unknown" if p.field == "world_size" else str(p.value) for p in self.problems
        )


@dataclass(frozen=True)
class FeatureCount:
    """The recordings of one feature family (``megatron_features``): priced and refused."""

    feature: str
    recordings: tuple[str, ...]
    priced: tuple[str, ...]
    refusals: tuple[Refusal, ...]

    @property
    def cases(self) -> tuple[str, ...]:
        return tuple(sorted({rid.rsplit("/", 1)[0] for rid in self.recordings}))


@dataclass(frozen=True)
class MegatronTier:
    rows: tuple[TierRow, ...]
    refused: dict[str, tuple[str, ...]]
    """The refusal's message -> the recordings it refused."""
    unnamed_platform: tuple[str, ...]
    no_values: tuple[str, ...]
    refusals: tuple[Refusal, ...] = ()
    """Every refused recording with its reasons (``refused`` groups them by message)."""
    recordings: tuple[Recording, ...] = ()
    """Every recording the tier was run over, priced or not."""

    def by_feature(self) -> tuple[FeatureCount, ...]:
        """Each feature family's recordings (``FEATURES`` order; families no recording
        exercises left out): what is priced and what is refused, with the reasons."""
        priced = {r.recording.recording_id for r in self.rows}
        out = []
        for tag in FEATURE_TAGS:
            recs = tuple(r.recording_id for r in self.recordings if tag in r.features)
            if not recs:
                continue
            out.append(
                FeatureCount(
                    tag,
                    recs,
                    tuple(rid for rid in recs if rid in priced),
                    tuple(f for f in self.refusals if tag in f.recording.features),
                )
            )
        return tuple(out)

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
    def median_bound_headroom(self) -> float:
        """The median headroom of ``peak_bytes``, the figure users get, MoE bounds in."""
        return statistics.median(r.bound_headroom for r in self.rows) if self.rows else 0.0

    @property
    def passed(self) -> bool:
        return all(not self.failing(c) for c in CHECKS) and self.median_headroom <= HEADROOM_MEDIAN


def copied_values(
    recordings: tuple[Recording, ...] | list[Recording],
    args_of: Callable[[Recording], MegatronArgs | InputError],
) -> dict[str, InputError]:
    """Recordings whose golden-values file (its git blob) is also another case's while
    the cases run different arguments: one file cannot measure both, so it measures none
    but the arguments most of its cases run, where there are such (a resumed run and its
    frozen twin share theirs); with no such majority, none (golden/megatron/README.md:
    Megatron-LM's commit 3383a104cc added the hybrid cases' ``lts`` files as a copy of a
    GPT case's). Each, by recording id, with the reason."""
    by_blob: dict[str, list[Recording]] = {}
    for rec in recordings:
        by_blob.setdefault(rec.git_blob, []).append(rec)
    out: dict[str, InputError] = {}
    for blob, recs in by_blob.items():
        runs = {rec.case: args_of(rec) for rec in recs}
        groups: list[list[str]] = []  # the cases, grouped by the arguments they run
        for case, args in runs.items():
            same = next((g for g in groups if runs[g[0]] == args), None)
            if same is None:
                groups.append([case])
            else:
                same.append(case)
        if len(groups) < 2:
            continue
        groups.sort(key=len, reverse=True)
        # where most of its cases run one set of arguments, the file is theirs
        kept = set(groups[0]) if len(groups[0]) > len(groups[1]) else set()
        for rec in recs:
            if rec.case in kept:
                continue
            others = sorted(c for c in runs if c != rec.case)
            out[rec.recording_id] = InputError(
                "recording",
                f"blob {blob[:10]}",
                f"the same golden-values file as {', '.join(others)}, whose arguments "
                "differ: not a measurement of this case",
            )
    return out


def run_tier(golden_dir: Path, family: str | None = None) -> MegatronTier:
    """The tier over the recordings of ``family`` (default: every family); a recording
    whose file is another case's (``copied_values``) is refused with the reason."""
    rows: list[TierRow] = []
    refusals: list[Refusal] = []
    unnamed: list[str] = []
    empty: list[str] = []
    cases: dict[Path, MegatronArgs | InputError] = {}
    images = load_recorded_images(golden_dir)
    recordings = load_recordings(golden_dir, family)

    def args_of(rec: Recording) -> MegatronArgs | InputError:
        path = rec.model_config(golden_dir)
        if path not in cases:  # every recording of a case ran the same arguments
            try:
                cases[path] = read_case(path)
            except InputError as exc:
                cases[path] = exc
        return cases[path]

    copied = copied_values(recordings, args_of)
    for rec in recordings:
        if not rec.has_values:
            empty.append(rec.recording_id)
            continue
        if not rec.device:
            unnamed.append(rec.recording_id)
            continue
        read = args_of(rec)
        problems = [read] if isinstance(read, InputError) else []
        if rec.recording_id in copied:
            problems.append(copied[rec.recording_id])
        if rec.world_size is None:
            problems.append(InputError("world_size", None, rec.world_size_basis))
        if problems:
            refusals.append(Refusal(rec, tuple(problems)))
            continue
        assert isinstance(read, MegatronArgs)
        try:
            recorded = images[rec.recording_id]
            rows.append(
                price_recording(rec, golden_dir, read, recorded.base_image, recorded.values_date)
            )
        except InputError as exc:
            refusals.append(Refusal(rec, (exc,)))
    refused: dict[str, list[str]] = {}
    for refusal in refusals:
        refused.setdefault(refusal.message, []).append(refusal.recording.recording_id)
    return MegatronTier(
        _above_case(rows),
        {k: tuple(v) for k, v in refused.items()},
        tuple(unnamed),
        tuple(empty),
        tuple(refusals),
        tuple(recordings),
    )


def _above_case(rows: list[TierRow]) -> tuple[TierRow, ...]:
    """Each row with the floor of the other recordings of its case on its device priced
    at its figures (``TierRow.case_floor``)."""
    groups: dict[tuple[str, str, int, int], list[TierRow]] = {}

    def key(row: TierRow) -> tuple[str, str, int, int]:
        rec = row.recording
        return (rec.case, rec.device, row.static_bytes, row.peak_bytes)

    for row in rows:
        groups.setdefault(key(row), []).append(row)
    out = []
    for row in rows:
        others = [o for o in groups[key(row)] if o is not row]
        if not others:
            out.append(row)
            continue
        floor = (min(o.measured_static for o in others), min(o.measured_peak for o in others))
        out.append(replace(row, case_floor=floor))
    return tuple(out)


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
        "median_bound_headroom": tier.median_bound_headroom,
        "refused": {k: len(v) for k, v in tier.refused.items()},
        "features": {
            f.feature: {"recordings": len(f.recordings), "priced": len(f.priced)}
            for f in tier.by_feature()
        },
        "unnamed_platform": len(tier.unnamed_platform),
        "no_values": len(tier.no_values),
    }
