"""Megatron-LM's rules on the output layer's weight gradient deferred to the pipeline's
drain (``--defer-embedding-wgrad-compute``, ``--wgrad-deferral-limit``), and the one
combination cpmem does not price.

megatron-core refuses the deferral without pipeline parallelism, without gradient
accumulation fusion, and with a negative limit (``ModelParallelConfig.__post_init__``,
model_parallel_config.py:545-558). Under sequence parallelism the drain all-gathers each
kept input into two named buffers of megatron's ``GlobalMemoryBuffer`` ("mpu_0",
"mpu_1", utils.py ``drain_embedding_wgrad_compute``), which persist after it: cpmem does
not price those, so the deferral is refused there.
"""

from __future__ import annotations

from cpmem.megatron.fields import MegatronArgs

Problem = tuple[str, str]
REJECTS = "Megatron-LM rejects it: "


def defer_problems(args: MegatronArgs) -> list[Problem]:
    """Every rule of the deferral ``args`` breaks (none where it is not asked: a limit
    alone is read nowhere, layers.py:1227-1232, 1253-1260)."""
    if not args.defer_embedding_wgrad_compute:
        return []
    flag = "--defer-embedding-wgrad-compute"
    out: list[Problem] = []
    if args.pipeline_model_parallel_size == 1:
        out.append(
            (
                f"{flag} with --pipeline-model-parallel-size 1",
                REJECTS + "'Cannot defer embedding wgrad compute when pipeline model "
                "parallel is not used' (model_parallel_config.py:545-548)",
            )
        )
    if not args.gradient_accumulation_fusion:
        out.append(
            (
                f"{flag} with --no-gradient-accumulation-fusion",
                REJECTS + "'Cannot defer embedding wgrad compute when gradient accumulation "
                "fusion is not used' (model_parallel_config.py:550-553)",
            )
        )
    if args.wgrad_deferral_limit < 0:
        out.append(
            (
                f"--wgrad-deferral-limit {args.wgrad_deferral_limit}",
                REJECTS + "'Wgrad deferral limit should be greater than or equal to 0 when "
                "it is enabled!' (model_parallel_config.py:555-558)",
            )
        )
    if args.sequence_parallel and args.tensor_model_parallel_size > 1:
        out.append(
            (
                f"{flag} with --sequence-parallel",
                "changes memory cpmem does not price: the drain's all-gathered inputs, two "
                "persistent buffers of megatron's GlobalMemoryBuffer ('mpu_0', 'mpu_1', "
                "utils.py drain_embedding_wgrad_compute)",
            )
        )
    return out
