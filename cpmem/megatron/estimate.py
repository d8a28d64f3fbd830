"""A Megatron-LM run's memory on one rank: ``static_bytes`` and ``peak_bytes``.

``static_bytes`` is what stays allocated between steps (``cpmem.megatron.static``): the
figure Megatron-LM logs as ``mem-allocated-bytes`` after each optimizer step.
``peak_bytes`` is the allocator's peak over a steady step (``mem-max-allocated-bytes``
from the second step on): the static bytes, plus what the rank's in-flight
micro-batches keep through the pipeline schedule, plus the largest moment of one
micro-batch (the head's logits and their fp32 copy on the last stage, a recomputed
group of layers in backward, the dataloader's attention mask).

In flight on pipeline stage ``r`` of ``p`` (``pipeline_parallel/schedules.py``): 1F1B
runs ``p - r - 1`` warm-up forwards before its first backward, so ``p - r`` micro-batches
keep their activations (1 on the last stage); interleaved over ``v`` chunks per rank,
``2 (p - r - 1) + (v - 1) x group`` warm-up chunk forwards (``group``:
``--microbatch-group-size-per-virtual-pipeline-stage``, default ``p``), each of a
chunk's layers; both capped at the step's micro-batches.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cpmem.megatron import activations as act
from cpmem.megatron.run import MegatronRun, describe_megatron_run
from cpmem.megatron.static import static_components


@dataclass(frozen=True)
class MegatronEstimate:
    """The bytes one rank of a Megatron-LM run holds: between steps and at its peak."""

    run: MegatronRun
    stage: int
    static_bytes: int
    peak_bytes: int
    static_components: dict[str, int]
    peak_components: dict[str, int]
    in_flight: int
    """Micro-batch chunk forwards whose activations are kept at the peak."""
    spread: dict[str, int] = field(default_factory=dict)
    """Under ``--attention-backend auto``: the peak with each backend Transformer Engine
    may pick (the priced figure is the covering one)."""

    @property
    def activation_bytes(self) -> int:
        return self.peak_bytes - self.static_bytes

    def to_dict(self) -> dict[str, object]:
        run = self.run
        return {
            "runtime": "megatron-lm",
            "rank": run.stage_rank(self.stage),
            "rank_asked": run.rank_asked,
            "stage": self.stage,
            "world_size": run.world_size,
            "layout": {
                "tp": run.tp,
                "pp": run.pp,
                "cp": run.cp,
                "dp": run.dp,
                "vp": run.virtual_chunks,
                **({"ep": run.ep, "etp": run.etp, "edp": run.edp} if run.moe else {}),
            },
            **({"moe_routing": run.routing} if run.moe else {}),
            "microbatches": run.microbatches,
            "device": run.device.name,
            "attention_backend": run.attention_backend,
            "attention_backend_asked": run.args.attention_backend,
            "static_bytes": self.static_bytes,
            "peak_bytes": self.peak_bytes,
            "activation_bytes": self.activation_bytes,
            "static_components": dict(self.static_components),
            "peak_components": dict(self.peak_components),
            "in_flight_chunks": self.in_flight,
            "backend_spread_peak_bytes": dict(self.spread),
            "ignored_args": list(run.args.ignored),
        }


def in_flight_chunks(run: MegatronRun, stage: int) -> int:
    """Micro-batch chunk forwards stage ``stage`` keeps at once (see the module)."""
    m, p, v = run.microbatches, run.pp, run.virtual_chunks
    if v == 1:
        return min(p - stage, m)
    group = run.args.microbatch_group_size_per_virtual_pipeline_stage or p
    warmup = 2 * (p - stage - 1) + (v - 1) * group
    return min(warmup + 1, v * m)


def _stage_peak(run: MegatronRun, stage: int) -> tuple[int, dict[str, int], int]:
    """(peak bytes above static, its components, chunks in flight) of ``stage``."""
    chunks = in_flight_chunks(run, stage)
    kept_layers, checkpoints = act.stage_layers_kept(run, run.chunk_layers)
    layer = act.layer_bytes(run)
    parts: dict[str, int] = {
        "layers": chunks * kept_layers * layer,
    }
    if checkpoints:
        parts["recompute_checkpoints"] = chunks * checkpoints * act.checkpoint_input_bytes(run)
    if run.args.overlap_moe_expert_parallel_comm and kept_layers:
        # the combined 1F1B step (combined_1f1b.py) runs the next micro-batch's forward
        # beside this one's backward, a layer at a time: one more layer is held
        parts["overlapped_forward_layer"] = layer
    first, last = stage == 0, stage == run.pp - 1
    if first:
        # only chunk 0 embeds: of the in-flight chunk forwards, one in v is chunk 0
        embedded = -(-chunks // run.virtual_chunks)
        parts["embedding"] = embedded * sum(act.embedding_components(run).values())
    moments = {"none": 0}
    recomputed = act.recompute_group_layers(run, run.chunk_layers)
    if recomputed:
        moments["recomputed_group"] = recomputed * layer
    if last:
        head = sum(act.head_components(run).values())
        moments["head_backward"] = (
            head + act.logits_bytes(run) + act.output_wgrad_bytes(run) + act.output_dgrad_bytes(run)
        )
    name, moment = max(moments.items(), key=lambda kv: kv[1])
    if moment:
        parts[name] = moment
    if first or last:
        mask = act.attention_mask_bytes(run)
        if mask:
            parts["attention_mask"] = mask
    return sum(parts.values()), parts, chunks


def _price_stage(run: MegatronRun, stage: int) -> MegatronEstimate:
    static = static_components(run, stage)
    above, parts, chunks = _stage_peak(run, stage)
    static_bytes = sum(static.values())
    return MegatronEstimate(
        run=run,
        stage=stage,
        static_bytes=static_bytes,
        peak_bytes=static_bytes + above,
        static_components=static,
        peak_components=parts,
        in_flight=chunks,
    )


def price_megatron(run: MegatronRun) -> MegatronEstimate:
    """The run's memory on its rank (``busiest``: on the stage whose peak is largest)."""
    if run.rank_asked == "busiest":
        best = max(
            (_price_stage(run, s) for s in range(run.pp)), key=lambda e: (e.peak_bytes, e.stage)
        )
    else:
        best = _price_stage(run, run.stage)
    if run.args.attention_backend == "auto" and run.attention_backend != "local":
        spread = {}
        for backend in ("flash", "unfused"):
            other = describe_megatron_run(
                run.args,
                world_size=run.world_size,
                rank=run.stage_rank(best.stage),
                device=run.device,
                attention_backend=backend,
            )
            spread[backend] = _price_stage(other, best.stage).peak_bytes
        return MegatronEstimate(**{**best.__dict__, "spread": spread})
    return best
