"""Megatron FSDP's arguments (``--use-megatron-fsdp``): what cpmem prices of it and the
values it refuses (``fsdp_problems``, one of ``rules.rule_problems``' rules), and the step's
settings it becomes (``fsdp_strategy``, ``fsdp_grad_element_size``).

Priced (``cpmem.pricing.fsdp``): Megatron FSDP v1 (``--megatron-fsdp-version 1``, the
default) under each ``--data-parallel-sharding-strategy``, with fp32 main weights
(``--megatron-fsdp-main-params-dtype fp32``, the default) and the gradient buffer in
``--megatron-fsdp-main-grads-dtype`` (``auto``: the parameters' dtype, mixed_precision.py,
``_resolve_group_grad_dtype`` in param_and_grad_buffer.py:2313-2322), reduced in that same
dtype (``--megatron-fsdp-grad-comm-dtype`` ``auto`` or equal to it); GPT layers (every
``TransformerLayer`` an FSDP unit: attention, latent or not, and a dense MLP or an MoE
block whose routed experts are buckets of their own over the expert data-parallel group)
on one pipeline stage, and GPT MTP depths (each depth's transformer layer a unit, its
norms and ``eh_proj`` outside every unit: ``cpmem.pricing.fsdp_units``). Refused, each
with its reason: another main-weights dtype (no fp32 copy, or states in another dtype), a
gradient reduced in another dtype (a buffer of its own per bucket,
param_and_grad_buffer.py:4056-4073), v2 (``fully_shard``'s DTensor parameters), and the
layers and stages whose buckets cpmem does not lay out (Mamba and other hybrid layers,
hybrid MTP depths, MTP depths whose ``eh_proj`` is an FP8 weight outside every unit under
``--fp8-param-gather``, pipeline stages).
"""

from __future__ import annotations

from cpmem.megatron.fields import MegatronArgs

Problem = tuple[str, str]

UNPRICED = "changes memory cpmem does not price: "
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def _param_dtype(args: MegatronArgs) -> str:
    return "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32"


def fsdp_grad_element_size(args: MegatronArgs) -> int:
    """The element of Megatron FSDP's gradient buffer: ``--megatron-fsdp-main-grads-dtype``,
    the parameters' dtype under ``auto``."""
    dtype = args.megatron_fsdp_main_grads_dtype
    return DTYPE_BYTES[_param_dtype(args) if dtype == "auto" else dtype]


def fsdp_buffers(args: MegatronArgs) -> str:
    """The step's ``fsdp_buffers``: ``nccl-ub`` under ``--use-nccl-ub`` (which turns the
    double buffer on, arguments.py:1172-1176), ``double-buffer`` under
    ``--fsdp-double-buffer``, else ``dynamic`` (and without Megatron FSDP, or under
    ``no_shard``, whose units the double buffer needs: mcore_fsdp_adapter.py:163-173,
    param_and_grad_buffer.py:2524)."""
    if not args.use_megatron_fsdp or args.data_parallel_sharding_strategy == "no_shard":
        return "dynamic"
    if args.nccl_ub:
        return "nccl-ub"
    return "double-buffer" if args.fsdp_double_buffer else "dynamic"


def fsdp_strategy(args: MegatronArgs) -> str:
    """The step's ``fsdp`` setting: the sharding strategy under Megatron FSDP, else none."""
    return args.data_parallel_sharding_strategy if args.use_megatron_fsdp else "none"


def fsdp_problems(args: MegatronArgs) -> list[Problem]:
    """Every Megatron FSDP value cpmem does not price (none without ``--use-megatron-fsdp``)."""
    if not args.use_megatron_fsdp:
        return []
    out: list[Problem] = []
    if args.megatron_fsdp_version != 1:
        out.append(
            (
                f"--megatron-fsdp-version {args.megatron_fsdp_version}",
                UNPRICED + "Megatron FSDP v2 (fully_shard's DTensor parameters and buffers)",
            )
        )
    if args.megatron_fsdp_main_params_dtype != "fp32":
        out.append(
            (
                f"--megatron-fsdp-main-params-dtype {args.megatron_fsdp_main_params_dtype}",
                UNPRICED + "Megatron FSDP's main weights and optimizer states in another "
                "dtype than fp32 (or none: the optimizer steps the model's weights)",
            )
        )
    comm = args.megatron_fsdp_grad_comm_dtype
    if comm != "auto" and DTYPE_BYTES[comm] != fsdp_grad_element_size(args):
        out.append(
            (
                f"--megatron-fsdp-grad-comm-dtype {comm}",
                UNPRICED + "Megatron FSDP's gradients reduced in another dtype than their "
                "buffer's (a bucket of that dtype per reduction, param_and_grad_buffer.py)",
            )
        )
    layers = []
    if args.hybrid_layer_pattern or args.hybrid_override_pattern:
        layers.append("--hybrid-layer-pattern")
    if args.mtp_num_layers and args.mtp_hybrid_override_pattern:
        layers.append("--mtp-hybrid-override-pattern")
    if args.mtp_num_layers and args.fp8_param_gather:
        layers.append("--mtp-num-layers and --fp8-param-gather")
    if args.pipeline_model_parallel_size > 1:
        layers.append("--pipeline-model-parallel-size")
    if layers:
        out.append(
            (
                "--use-megatron-fsdp with " + ", ".join(layers),
                UNPRICED + "Megatron FSDP's buckets of hybrid layers (MTP depths' "
                "included), of an MTP depth's FP8 eh_proj outside every unit, or over "
                "pipeline stages (cpmem lays out GPT layers, latent attention, MoE blocks "
                "and MTP depths included, on one stage)",
            )
        )
    return out
