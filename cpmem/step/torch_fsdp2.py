"""Which Torch FSDP2 steps (``fsdp`` ``torch_fsdp2``, ``cpmem.pricing.torch_fsdp2``) are
priced: an untied output layer (Megatron-LM requires it, arguments.py:986-987 at
4828d651), no expert parallelism (arguments.py:978-979) and no gradient accumulation
fusion (arguments.py:982-983), gradients in the parameters'
dtype (no mixed-precision policy is given to ``fully_shard``), no MTP depths (their norms
and ``eh_proj`` are no unit of their own) and no FP8 training. The checks every FSDP
setting shares (full training, one stage, GPT layers) are ``StepSettings``'."""

from __future__ import annotations

from cpmem.errors import InputError
from cpmem.model.geometry import ModelGeometry
from cpmem.step.fp8 import Fp8

STRATEGY = "torch_fsdp2"


def torch_fsdp2_problems(
    g: ModelGeometry,
    ep: int,
    grad_bytes: int,
    dtype_bytes: int,
    fp8: Fp8 | None,
    fusion: bool = False,
) -> list[InputError]:
    """Every reason a Torch FSDP2 step of ``g`` is not priced, listed together
    (``fusion``: the runtime's gradient accumulation fusion)."""
    problems = []
    if fusion:
        problems.append(
            InputError(
                "fsdp",
                STRATEGY,
                "Megatron-LM rejects gradient accumulation fusion beside Torch FSDP2 "
                "(arguments.py:982-983): give a runtime without it (the run's arguments "
                "with --no-gradient-accumulation-fusion, --megatron-args)",
            )
        )
    if g.tied_embeddings:
        problems.append(
            InputError(
                "fsdp",
                STRATEGY,
                "Megatron-LM rejects tied embeddings beside Torch FSDP2: --use-torch-fsdp2 "
                "requires --untie-embeddings-and-output-weights (arguments.py:986-987)",
            )
        )
    if ep > 1:
        problems.append(
            InputError(
                "ep",
                ep,
                "Megatron-LM rejects it beside Torch FSDP2: --use-torch-fsdp2 is not "
                "supported with expert parallelism (arguments.py:978-979)",
            )
        )
    if grad_bytes != dtype_bytes:
        problems.append(
            InputError(
                "grad_bytes",
                grad_bytes,
                f"Torch FSDP2 reduces gradients in the parameters' dtype ({dtype_bytes} B: "
                "no mixed-precision policy is given to fully_shard)",
            )
        )
    if g.mtp_depths:
        problems.append(
            InputError(
                "fsdp",
                STRATEGY,
                "Torch FSDP2 with MTP depths is not priced (their norms and eh_proj join "
                "the root unit, not laid out here)",
            )
        )
    if fp8 is not None:
        problems.append(InputError("fsdp", STRATEGY, "Torch FSDP2 with FP8 training is not priced"))
    return problems
