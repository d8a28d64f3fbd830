"""Recordings whose world size the snapshot does not give, priced at every world their
arguments allow: ``TP x PP x CP x DP`` for each DP that divides the global batch over
the micro-batch (Megatron-LM's calculator asserts ``batch % (mbs x DP) == 0``). Shown in
``golden/reports/megatron.md`` beside the refusal, never counted: choosing the DP that
matches a recording best would fit one integer to it.
"""

from __future__ import annotations

from dataclasses import dataclass

from cpmem.errors import InputError
from cpmem.golden.megatron import Recording
from cpmem.megatron.args import MegatronArgs
from cpmem.megatron.batch_schedule import schedule_batch
from cpmem.megatron.describe import describe_megatron
from cpmem.pricing.registry import price
from cpmem.step.backend_choice import container_for_image


@dataclass(frozen=True)
class Candidate:
    """One data-parallel size: its world, micro-batches per step and priced static and
    peak bytes."""

    dp: int
    world_size: int
    microbatches: int
    static_bytes: int
    peak_bytes: int


def dp_candidates(args: MegatronArgs) -> list[int]:
    """Every DP that divides the run's global batch (its schedule's first stage) over its
    micro-batch; none where neither is given."""
    batch = args.global_batch_size or schedule_batch(args)
    mbs = args.micro_batch_size
    if batch is None or batch % mbs:
        return []
    replicas = batch // mbs
    return [d for d in range(1, replicas + 1) if replicas % d == 0]


def static_by_dp(args: MegatronArgs, recording: Recording, image: str) -> list[Candidate]:
    """The recording's last rank priced at each candidate DP (``dp_candidates``) on its
    device, in its image's container; a DP the run's rules refuse is left out."""
    model = (
        args.tensor_model_parallel_size
        * args.pipeline_model_parallel_size
        * args.context_parallel_size
    )
    out = []
    for dp in dp_candidates(args):
        try:
            step = describe_megatron(
                args,
                world_size=model * dp,
                device=recording.device,
                rank="last",
                container=container_for_image(image),
            )
        except InputError:
            continue
        estimate = price(step, "tight")
        assert estimate.static is not None
        out.append(
            Candidate(
                dp,
                model * dp,
                step.settings.pipeline.microbatches,
                estimate.static.total,
                estimate.peak_bytes,
            )
        )
    return out


def world_sections(refusals: list[tuple[Recording, MegatronArgs, str]]) -> list[str]:
    """The report's lines: per recording refused for its world size alone (with its
    arguments and image), its static memory and peak priced at each candidate DP beside
    the recorded ones, and what the peak holds above the static memory, priced and
    recorded: at PP 1 the distributed optimizer's shard moves both figures alike, so the
    difference (the step's activations and transients) checks the pricing whatever the
    world."""
    lines: list[str] = []
    for rec, args, image in refusals:
        measured = rec.allocated_last_bytes
        peak = rec.max_allocated_max_bytes
        rows = static_by_dp(args, rec, image)
        if not rows or measured is None or peak is None:
            continue
        above = {c.peak_bytes - c.static_bytes for c in rows}
        spread = f"{min(above) / 1e9:.3f}" + ("" if len(above) == 1 else f"-{max(above) / 1e9:.3f}")
        lines += [
            f"`{rec.recording_id}` ({rec.device}, {image}): recorded static "
            f"{measured / 1e9:.3f} GB, peak {peak / 1e9:.3f} GB. The peak above the static "
            f"memory: recorded {(peak - measured) / 1e9:.3f} GB, priced {spread} GB "
            f"({(min(above) / (peak - measured) - 1) * 100:+.1f}%).",
            "",
            "| DP | world | micro-batches | priced static GB | against the recording | "
            "priced peak GB | against the recording |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        lines += [
            f"| {c.dp} | {c.world_size} | {c.microbatches} | {c.static_bytes / 1e9:.3f} | "
            f"{(c.static_bytes / measured - 1) * 100:+.1f}% | {c.peak_bytes / 1e9:.3f} | "
            f"{(c.peak_bytes / peak - 1) * 100:+.1f}% |"
            for c in rows
        ]
        lines.append("")
    return lines
