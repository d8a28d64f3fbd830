"""The step's rules on how the optimizer's state is sharded: Megatron FSDP's reach and the
distributed optimizer's instances, each problem listed (``StepSettings`` raises them with
the layout's)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cpmem.errors import InputError

if TYPE_CHECKING:
    from cpmem.step.step import StepSettings


def fsdp_problems(settings: StepSettings) -> list[InputError]:
    """Megatron FSDP is priced for full training of GPT layers (attention, latent or
    not, and a dense MLP or an MoE block: each a ``TransformerLayer`` unit whose
    tensors' shapes ``cpmem.pricing.fsdp_units`` gives, MTP depths' included) on one
    pipeline stage."""
    strategy = settings.optimizer.fsdp
    if strategy == "none":
        return []
    g, problems = settings.geometry, []
    if settings.training != "full":
        problems.append(InputError("fsdp", strategy, "Megatron FSDP is priced for --training full"))
    if settings.pipeline.pp > 1:
        problems.append(
            InputError("fsdp", strategy, "Megatron FSDP over pipeline stages is not priced")
        )
    kinds = set(g.mixers) | set(g.mlps) | set(g.mtp_mixers) | set(g.mtp_mlps)
    if not kinds <= {"attention", "dense", "moe"} or g.attention_sinks:
        problems.append(
            InputError(
                "fsdp",
                strategy,
                "Megatron FSDP's buckets are laid out for GPT layers, MTP depths' "
                "included (attention, latent or not, without sinks; a dense MLP or an "
                "MoE block); this model has " + ", ".join(sorted(kinds)),
            )
        )
    return problems


def optimizer_instance_problems(settings: StepSettings) -> list[InputError]:
    """The distributed optimizer's instances split its DP x CP group, and the routed
    experts' expert data-parallel group, into equal parts (parallel_state.py asserts
    both divide)."""
    n = settings.optimizer.instances
    layout = settings.layout
    problems = []
    if (layout.dp * layout.cp) % n:
        problems.append(
            InputError(
                "optimizer_instances",
                n,
                f"must divide DP x CP = {layout.dp} x {layout.cp} (parallel_state.py: the "
                "data-parallel size divisible by the instances)",
            )
        )
    expert_dp = settings.world_size // (layout.etp * layout.ep * settings.pipeline.pp)
    if settings.geometry.is_moe and expert_dp % n:
        problems.append(
            InputError(
                "optimizer_instances",
                n,
                f"must divide the expert data-parallel size {expert_dp} (world / (ETP x EP "
                "x PP); parallel_state.py asserts it)",
            )
        )
    return problems
