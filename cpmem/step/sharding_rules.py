"""The step's rules on how the optimizer's state is sharded: Megatron FSDP's and Torch
FSDP2's reach (``fsdp_problems``) and the distributed optimizer's instances
(``optimizer_instance_problems``), each problem listed (``StepSettings`` raises them with
the layout's)."""

from __future__ import annotations

from cpmem.errors import InputError
from cpmem.model.geometry import ModelGeometry
from cpmem.plan.layout import ParallelLayout
from cpmem.step.fp8 import Fp8
from cpmem.step.torch_fsdp2 import STRATEGY as TORCH_FSDP2
from cpmem.step.torch_fsdp2 import torch_fsdp2_problems


def fsdp_problems(
    strategy: str,
    g: ModelGeometry,
    training: str,
    pp: int,
    layout: ParallelLayout,
    grad_bytes: int,
    dtype_bytes: int,
    fp8: Fp8 | None,
    fusion: bool,
) -> list[InputError]:
    """Megatron FSDP and Torch FSDP2 are priced for full training of GPT layers
    (attention, latent or not, and a dense MLP or an MoE block: each a
    ``TransformerLayer`` unit whose tensors' shapes ``cpmem.pricing.fsdp_units`` gives,
    Megatron FSDP's MTP depths included) on one pipeline stage; Torch FSDP2 as
    ``cpmem.step.torch_fsdp2`` says (``fusion``: the runtime's gradient accumulation
    fusion)."""
    if strategy == "none":
        return []
    problems = []
    torch2 = strategy == TORCH_FSDP2
    name = "Torch FSDP2" if torch2 else "Megatron FSDP"
    laid = "units" if torch2 else "buckets"
    mtp = "" if torch2 else ", MTP depths' included"
    if training != "full":
        problems.append(InputError("fsdp", strategy, f"{name} is priced for --training full"))
    if pp > 1:
        problems.append(InputError("fsdp", strategy, f"{name} over pipeline stages is not priced"))
    kinds = set(g.mixers) | set(g.mlps) | set(g.mtp_mixers) | set(g.mtp_mlps)
    if not kinds <= {"attention", "dense", "moe"} or g.attention_sinks:
        problems.append(
            InputError(
                "fsdp",
                strategy,
                f"{name}'s {laid} are laid out for GPT layers{mtp} (attention, latent or "
                "not, without sinks; a dense MLP or an MoE block); this model has "
                + ", ".join(sorted(kinds)),
            )
        )
    if torch2:
        problems += torch_fsdp2_problems(g, layout.ep, grad_bytes, dtype_bytes, fp8, fusion)
    return problems


def optimizer_instance_problems(
    instances: int, layout: ParallelLayout, world_size: int, pp: int, is_moe: bool
) -> list[InputError]:
    """The distributed optimizer's instances split its DP x CP group, and the routed
    experts' expert data-parallel group, into equal parts (parallel_state.py asserts
    both divide)."""
    problems = []
    if (layout.dp * layout.cp) % instances:
        problems.append(
            InputError(
                "optimizer_instances",
                instances,
                f"must divide DP x CP = {layout.dp} x {layout.cp} (parallel_state.py: the "
                "data-parallel size divisible by the instances)",
            )
        )
    expert_dp = world_size // (layout.etp * layout.ep * pp)
    if is_moe and expert_dp % instances:
        problems.append(
            InputError(
                "optimizer_instances",
                instances,
                f"must divide the expert data-parallel size {expert_dp} (world / (ETP x EP "
                "x PP); parallel_state.py asserts it)",
            )
        )
    return problems
