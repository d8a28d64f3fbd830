"""Megatron-LM's rules on a run's world and batch, checked where the arguments carry
their world (a launch script's torchrun, or the caller's ``--world-size``), so they are
listed with every other problem of the arguments (``rules.rule_problems``).
"""

from __future__ import annotations

from cpmem.megatron.fields import MegatronArgs

Problem = tuple[str, str]


def _replicas(args: MegatronArgs) -> list[Problem]:
    """The world the launch gives (or the caller), where it is known: Megatron-LM's
    assertion that it holds whole model replicas (arguments.py:424-434; the GTP weight
    shards, refused, are 1)."""
    world = args.world_size
    if world is None:
        return []
    tp, pp, cp = (
        args.tensor_model_parallel_size,
        args.pipeline_model_parallel_size,
        args.context_parallel_size,
    )
    out: list[Problem] = []
    if world % (tp * pp * cp):
        out.append(
            (
                f"world_size={world}",
                f"world size ({world}) is not divisible by total_model_size (TP x PP x CP = "
                f"{tp} x {pp} x {cp} = {tp * pp * cp}) (arguments.py:432-434)",
            )
        )
    etp = args.expert_tensor_parallel_size or tp
    ep = args.expert_model_parallel_size
    if args.num_experts and world % (etp * ep * pp):
        out.append(
            (
                f"world_size={world}",
                f"world_size ({world}) is not divisible by expert_tensor_model_pipeline_parallel "
                f"size (ETP x EP x PP = {etp} x {ep} x {pp} = {etp * ep * pp}) "
                "(parallel_state.py:880-884)",
            )
        )
    return out


def _batch(args: MegatronArgs) -> list[Problem]:
    """A batch-size schedule beside a global batch size: validate_args raises
    ``ValueError('Cannot specify both --step-batch-size-schedule and --global-batch-size')``
    (arguments.py:695-701; the schedule's flag itself is refused, refused.py)."""
    if "--step-batch-size-schedule" in args.flag_values and args.global_batch_size is not None:
        return [
            (
                "--step-batch-size-schedule with --global-batch-size",
                "Megatron-LM rejects it: 'Cannot specify both --step-batch-size-schedule and "
                "--global-batch-size' (arguments.py:695-701)",
            )
        ]
    return []


def world_problems(args: MegatronArgs) -> list[Problem]:
    """Every world and batch rule ``args`` breaks."""
    return _replicas(args) + _batch(args)
