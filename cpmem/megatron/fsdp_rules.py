"""Megatron FSDP's arguments (``--use-megatron-fsdp``) and Torch FSDP2's
(``--use-torch-fsdp2``): what cpmem prices of them and the values it refuses
(``fsdp_problems``, one of ``rules.rule_problems``' rules), and the step's settings they
become (``fsdp_strategy``, ``fsdp_grad_element_size``).

Torch FSDP2 is the step's ``fsdp`` setting ``torch_fsdp2`` (``cpmem.pricing.torch_fsdp2``):
priced with bf16 or fp32 parameters, Adam or SGD, GPT layers on one stage, each unit
resharded after its forward; what Megatron-LM rejects beside it is refused with its own
reason (``torch_fsdp2_problems``).

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
    """The step's ``fsdp`` setting: ``torch_fsdp2`` under ``--use-torch-fsdp2``, the
    sharding strategy under Megatron FSDP, else none."""
    if args.use_torch_fsdp2:
        return "torch_fsdp2"
    return args.data_parallel_sharding_strategy if args.use_megatron_fsdp else "none"


REJECTS = "Megatron-LM rejects it beside --use-torch-fsdp2: "


def torch_fsdp2_problems(args: MegatronArgs) -> list[Problem]:
    """What Megatron-LM rejects beside ``--use-torch-fsdp2`` (its own reasons,
    arguments.py:973-989 and 1545 at 4828d651), and what of it cpmem does not price:
    weights kept gathered after the forward, FP8 training, MTP depths, hybrid
    layers, and Megatron FSDP's arguments beside it (none without it)."""
    if not args.use_torch_fsdp2:
        return []
    v = args.flag_values
    rejected = [
        (
            args.pipeline_model_parallel_size > 1,
            "--pipeline-model-parallel-size",
            "not supported with pipeline parallelism (arguments.py:976-977)",
        ),
        (
            args.expert_model_parallel_size > 1,
            "--expert-model-parallel-size",
            "not supported with expert parallelism (arguments.py:978-979)",
        ),
        (
            args.use_distributed_optimizer,
            "--use-distributed-optimizer",
            "not supported with MCore's distributed optimizer (arguments.py:980-981)",
        ),
        (
            args.gradient_accumulation_fusion,
            "gradient accumulation fusion (on by default)",
            "not supported with gradient accumulation fusion: give "
            "--no-gradient-accumulation-fusion (arguments.py:982-983)",
        ),
        (
            v.get("--ckpt-format", "torch_dist") not in ("torch_dist", "torch_dcp"),
            f"--ckpt-format {v.get('--ckpt-format')}",
            "requires --ckpt-format torch_dist or torch_dcp (arguments.py:984-985)",
        ),
        (
            not args.untie_embeddings_and_output_weights,
            "tied embeddings",
            "requires --untie-embeddings-and-output-weights (arguments.py:986-987)",
        ),
        (args.fp16, "--fp16", "not supported with fp16 yet (arguments.py:988-989)"),
        (
            args.optimizer not in ("sgd", "adam"),
            f"--optimizer {args.optimizer}",
            "emerging optimizer does not support Torch-FSDP2 for now (arguments.py:1532, 1545)",
        ),
    ]
    out = [(value, REJECTS + reason) for broken, value, reason in rejected if broken]
    unpriced = [
        (
            not args.torch_fsdp2_reshard_after_forward,
            "--torch-fsdp2-no-reshard-after-forward",
            "every unit's weights kept gathered from its forward to its backward",
        ),
        (
            args.fp8 is not None,
            "--fp8-format",
            "FP8 training under Torch FSDP2 (its weights' FP8 copies per micro-batch)",
        ),
        (
            bool(args.mtp_num_layers),
            "--mtp-num-layers",
            "MTP depths under Torch FSDP2 (their norms and eh_proj in the root unit)",
        ),
        (
            bool(args.hybrid_layer_pattern or args.hybrid_override_pattern),
            "--hybrid-layer-pattern",
            "hybrid layers under Torch FSDP2",
        ),
        (
            args.use_megatron_fsdp,
            "--use-megatron-fsdp",
            "Megatron FSDP's arguments validated beside Torch FSDP2, which wraps the model "
            "(training.py:1820-1823)",
        ),
    ]
    out += [
        (f"--use-torch-fsdp2 with {value}", UNPRICED + reason)
        for broken, value, reason in unpriced
        if broken
    ]
    return out


def fsdp_problems(args: MegatronArgs) -> list[Problem]:
    """Every Megatron FSDP value cpmem does not price (none without ``--use-megatron-fsdp``),
    and Torch FSDP2's (``torch_fsdp2_problems``)."""
    out: list[Problem] = torch_fsdp2_problems(args)
    if not args.use_megatron_fsdp:
        return out
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
