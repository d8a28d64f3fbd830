"""Fit or refuse a Megatron-LM run on its device, and the longest sequence that fits.

A Megatron-LM step's shape is fixed by its arguments (micro-batch size, sequence
length, schedule), so a run is admitted whole or refused: nothing is split. The budget
is the device's rule for the allocator's peak (``cpmem.pricing.device_budget``): the
device's total less the runtime's 3% reserve and the memory outside PyTorch's allocator
(``NON_TORCH_BYTES``), or the budget the caller gives. The figure compared is
``peak_bytes``: the allocator's peak already includes the static bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from cpmem.errors import InputError
from cpmem.megatron.estimate import MegatronEstimate, price_megatron
from cpmem.megatron.run import MegatronRun, describe_megatron_run
from cpmem.pricing.device_budget import NON_TORCH_BYTES, RESERVE_FRACTION
from cpmem.units import fmt_gib

SEQUENCE_STEP = 128
"""``megatron_capacity`` searches sequence lengths in steps of 128 tokens (and of
2 x CP, which Megatron-LM's load-balanced CP split needs)."""


def device_peak_budget(run: MegatronRun) -> int:
    """What the run's device leaves the allocator: total - 3% - NON_TORCH_BYTES."""
    total = run.device.total_bytes
    return max(0, total - int(RESERVE_FRACTION * total) - NON_TORCH_BYTES)


@dataclass(frozen=True)
class MegatronDecision:
    action: str  # "fit" | "refuse"
    estimate: MegatronEstimate
    budget_bytes: int
    budget_source: str
    suggestion: str | None = None

    def to_dict(self) -> dict[str, object]:
        return {
            "action": self.action,
            "required_bytes": self.estimate.peak_bytes,
            "budget_bytes": self.budget_bytes,
            "budget_source": self.budget_source,
            "suggestion": self.suggestion,
            "estimate": self.estimate.to_dict(),
        }


def _full_recompute(run: MegatronRun) -> MegatronRun:
    args = replace(
        run.args, recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1
    )
    return replace(run, args=args)


def admit_megatron(run: MegatronRun, budget_bytes: int | None = None) -> MegatronDecision:
    """``fit`` where the run's ``peak_bytes`` is within the budget, else ``refuse`` with
    what full recompute would need (when the run does not recompute fully already)."""
    if budget_bytes is not None and (isinstance(budget_bytes, bool) or budget_bytes < 0):
        raise InputError("budget_bytes", budget_bytes, "must be an integer >= 0")
    source = "given" if budget_bytes is not None else f"device {run.device.name}"
    budget = device_peak_budget(run) if budget_bytes is None else int(budget_bytes)
    est = price_megatron(run)
    if est.peak_bytes <= budget:
        return MegatronDecision("fit", est, budget, source)
    suggestion = None
    if run.args.recompute_granularity != "full":
        other = price_megatron(_full_recompute(run))
        verdict = "fits" if other.peak_bytes <= budget else "still does not fit"
        suggestion = (
            "full recompute (--recompute-granularity full --recompute-method uniform "
            f"--recompute-num-layers 1) needs {fmt_gib(other.peak_bytes)} GiB: {verdict}"
        )
    return MegatronDecision("refuse", est, budget, source, suggestion)


@dataclass(frozen=True)
class MegatronCapacity:
    seq_length: int | None
    estimate: MegatronEstimate | None
    budget_bytes: int
    limit: str

    def to_dict(self) -> dict[str, object]:
        return {
            "seq_length": self.seq_length,
            "budget_bytes": self.budget_bytes,
            "limit": self.limit,
            "estimate": None if self.estimate is None else self.estimate.to_dict(),
        }


def megatron_capacity(run: MegatronRun, budget_bytes: int | None = None) -> MegatronCapacity:
    """The longest ``--seq-length`` (a multiple of 128 and of 2 x CP) whose peak fits,
    the run's other arguments unchanged; bounded by ``--max-position-embeddings`` under
    learned absolute positions."""
    budget = device_peak_budget(run) if budget_bytes is None else int(budget_bytes)
    step = SEQUENCE_STEP * max(1, 2 * run.cp // SEQUENCE_STEP or 1)
    cap = 1 << 22
    limit = "the budget"
    if run.args.position_embedding_type == "learned_absolute" and run.args.max_position_embeddings:
        cap = run.args.max_position_embeddings // step * step
        limit = "--max-position-embeddings"

    def priced(seq: int) -> MegatronEstimate:
        args = replace(run.args, seq_length=seq)
        return price_megatron(
            describe_megatron_run(
                args,
                world_size=run.world_size,
                rank=run.rank_asked if run.rank_asked in ("last", "busiest") else run.rank,
                device=run.device,
                attention_backend=run.attention_backend,
            )
        )

    lo, hi = 0, cap // step  # in steps; lo fits (0: nothing), hi the upper bound
    if hi == 0:
        return MegatronCapacity(None, None, budget, limit)
    if priced(hi * step).peak_bytes <= budget:
        return MegatronCapacity(hi * step, priced(hi * step), budget, limit)
    limit = "the budget"
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if priced(mid * step).peak_bytes <= budget:
            lo = mid
        else:
            hi = mid
    if lo == 0:
        return MegatronCapacity(None, None, budget, limit)
    return MegatronCapacity(lo * step, priced(lo * step), budget, limit)
