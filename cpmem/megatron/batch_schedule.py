"""Megatron-LM's ``--step-batch-size-schedule``: the global batch as a step function of
the samples consumed, read as megatron-core's ``StepBatchsizeNumMicroBatchesCalculator``
reads it (``num_microbatches_calculator.py`` at the recordings' snapshot), and the one
batch cpmem prices for it.

The schedule is ``THRESHOLD:BATCH`` pairs (spaces or commas between them); a value may
end in K, M, B or T (10^3 ... 10^12, ``int(float(x) * multiplier)``), the thresholds are
tokens turned into samples by ``// seq_length`` (``_parse_schedule``; ``global_vars.py``
passes ``seq_length``), sorted; the first must be 0, the rest strictly increasing, every
batch positive (``_validate_schedule``). A step runs at the batch of the last threshold
its consumed samples have reached (``_get_batch_size_for_samples``).

What is priced: the batch only sets the number of micro-batches per step, ``batch / (mbs
x DP)``. At PP 1 the step's peak does not depend on that count (gradient accumulation
holds one micro-batch at a time, ``cpmem.pricing.accumulation``), so the run is priced
at its first stage's batch, whatever stage it is in. Under pipeline parallelism the
count moves the peak (micro-batches in flight), so the run is priced where it never
leaves its first stage: ``--train-samples`` (or ``--train-iters`` steps of the first
batch) below the second threshold; else it is refused.
"""

from __future__ import annotations

from itertools import pairwise

from cpmem.megatron.fields import MegatronArgs

Problem = tuple[str, str]
FLAG = "--step-batch-size-schedule"
SUFFIXES = {"K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}
"""``_parse_numeric_value``'s multipliers."""


def _number(text: str) -> int:
    """One threshold or batch, as ``_parse_numeric_value`` reads it."""
    text = text.strip().upper()
    multiplier = 1
    if text and text[-1] in SUFFIXES:
        multiplier, text = SUFFIXES[text[-1]], text[:-1]
    return int(float(text) * multiplier)


def parse_schedule(text: str, seq_length: int) -> list[tuple[int, int]]:
    """``(threshold in samples, batch)`` pairs, sorted; ValueError naming what is wrong
    where megatron-core's parser or validation refuses it."""
    schedule = []
    for entry in text.strip().replace(",", " ").split():
        if ":" not in entry:
            raise ValueError(f"entry {entry!r} is not THRESHOLD:BATCH_SIZE")
        threshold, batch = entry.split(":", 1)
        schedule.append((_number(threshold) // seq_length, _number(batch)))
    schedule.sort(key=lambda pair: pair[0])
    if not schedule:
        raise ValueError("has no entry")
    if schedule[0][0] != 0:
        raise ValueError(f"its first threshold must be 0, not {schedule[0][0]} samples")
    for (before, _), (after, _) in pairwise(schedule):
        if after <= before:
            raise ValueError(f"its thresholds must increase ({before} then {after} samples)")
    if any(batch <= 0 for _, batch in schedule):
        raise ValueError("its batch sizes must be positive")
    return schedule


def _run_samples(args: MegatronArgs, first_batch: int) -> int | None:
    """The samples the run consumes: ``--train-samples``, or ``--train-iters`` steps of
    the first batch (a bound on the samples before the second threshold); None where
    neither is given."""
    for flag, per_step in (("--train-samples", 1), ("--train-iters", first_batch)):
        value = args.flag_values.get(flag)
        if value is not None:
            return int(str(value)) * per_step
    return None


def schedule_batch(args: MegatronArgs) -> int | None:
    """The global batch priced for the run's schedule (its first stage's), None without a
    schedule. The arguments' rules (``schedule_problems``) say where it is refused."""
    if args.step_batch_size_schedule is None:
        return None
    return parse_schedule(args.step_batch_size_schedule, args.seq_length)[0][1]


def schedule_problems(args: MegatronArgs) -> list[Problem]:
    """Every problem with the run's schedule: megatron-core's parser or validation, or a
    pipeline run that leaves its first stage."""
    text = args.step_batch_size_schedule
    if text is None:
        return []
    shown = f"{FLAG} {text}"
    try:
        schedule = parse_schedule(text, args.seq_length)
    except ValueError as exc:
        return [(shown, f"Megatron-LM rejects it: {exc} (num_microbatches_calculator.py)")]
    if args.pipeline_model_parallel_size == 1 or len(schedule) == 1:
        return []
    second = schedule[1][0]
    samples = _run_samples(args, schedule[0][1])
    if samples is not None and samples < second:
        return []
    return [
        (
            shown,
            "changes memory cpmem does not price: under pipeline parallelism the batch sets "
            "the micro-batches in flight, and the run "
            + (
                f"reaches the second stage ({samples:,} samples, the second threshold is "
                f"{second:,})"
                if samples is not None
                else "gives neither --train-samples nor --train-iters to show it stays "
                "in its first stage"
            ),
        )
    ]
