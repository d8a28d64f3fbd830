"""Transformer Engine's op fuser (``--use-transformer-engine-op-fuser``) at the door:
what it changes in the run, the row alignment it gives the grouped experts
(``expert_row_align``), and what it changes that cpmem does not price or Megatron-LM
rejects (``op_fuser_problems``, one of ``rules.rule_problems``' rules).

What the flag changes (Megatron-LM 4828d651, the recordings' code, and the mirror's
d98e8a64):

- ``pretrain_gpt.py`` builds its layers through ``gpt_builders._get_transformer_layer_spec``,
  which does not pass the flag on (``use_te_op_fuser`` stays False): the dense MLPs are
  megatron's own. Only ``TEGroupedMLP`` reads it (MoE with ``--moe-grouped-gemm`` under
  Transformer Engine): it runs fc1, the probability-scaled activation and fc2 as one
  ``te.ops.Sequential`` (``experts.py:_make_fused_ops``). Without grouped GEMMs (megatron's
  ``SequentialMLP``) or under the local implementation the experts do not read it.
- The fused ops' saved set on Hopper (the fused grouped MLP kernel needs compute
  capability 10): fc1's ``GroupedLinear`` its input, ``ScaledSwiGLU`` its input (fc1's
  ``2F`` output) and a bf16 copy of the probabilities, fc2's ``GroupedLinear`` its input
  (Transformer Engine b9d690e0 ``ops/basic/grouped_linear.py:1048``,
  ``ops/basic/swiglu.py:469-472``): ``H + 3F`` a row and the probabilities, the set of
  megatron's fused weighted SwiGLU between Transformer Engine's grouped linears, which
  cpmem prices.
- Padding: at d98e8a64 the flag with ``--moe-grouped-gemm`` sets ``moe_use_grouped_tensor``
  (``transformer_config.py:1410-1411``), and ``TEGroupedMLP`` pads each local expert's
  permuted tokens and probabilities to a multiple of 256 rows (``Fp8Padding`` with
  ``get_align_size_for_quantization``, 256 under the op fuser; ``experts.py:305-314,
  736-748``, ``moe_utils.py:1473-1474``) into new tensors the fused ops save. At 4828d651
  (and 6815c0fe, the commit that recorded the op fuser's run) the bf16 path does not pad
  (``experts.py:581-592`` pads only under FP8 or FP4). cpmem prices the padding
  (``OP_FUSER_ROW_ALIGN``): a bound for the code without it.
- Under FP8 the fused path pads to 256 rows rather than the recipe's 16 or 32
  (``experts.py:297``), as does the router's padding for quantization
  (``moe_utils.py:1350-1351``), and the fused ops quantize their own saved inputs: not
  priced.
"""

from __future__ import annotations

from cpmem.megatron.fields import MegatronArgs
from cpmem.megatron.offload_rules import read_modules as offloaded_modules
from cpmem.megatron.recompute_modules import selective, selective_modules
from cpmem.step.recompute import Module

Problem = tuple[str, str]

FLAG = "--use-transformer-engine-op-fuser"
OP_FUSER_ROW_ALIGN = 256
"""Rows each local expert's segment is padded to a multiple of under the op fuser with
grouped GEMMs: ``get_align_size_for_quantization`` returns 256 where
``use_transformer_engine_op_fuser`` is set ("TE's grouped-tensor and fused grouped-MLP
kernels require 256-token alignment", Megatron-LM d98e8a64 ``moe_utils.py:1472-1474``;
"CUTLASS kernel for grouped GEMM assumes 256 alignment", 4828d651 ``moe_utils.py:1349-1351``)."""

UNPRICED = "changes memory cpmem does not price: "
REJECTED = "Megatron-LM rejects it: "
UNSUPPORTED = (
    "'Fused GroupedMLP is not supported for this configuration.' (experts.py:277-280, "
    "_is_fused_impl_supported, experts.py:323-381)"
)


def fused_experts(args: MegatronArgs) -> bool:
    """Whether the op fuser runs the routed experts: MoE with grouped GEMMs under
    Transformer Engine (``TEGroupedMLP``, the one module that reads the flag)."""
    return (
        args.use_transformer_engine_op_fuser
        and args.num_experts is not None
        and args.moe_grouped_gemm
        and args.transformer_impl == "transformer_engine"
    )


def expert_row_align(args: MegatronArgs) -> int:
    """The multiple each local expert's rows are padded to (``Runtime.moe_row_align``):
    ``OP_FUSER_ROW_ALIGN`` where the op fuser runs the experts, else 0."""
    return OP_FUSER_ROW_ALIGN if fused_experts(args) else 0


def op_fuser_problems(args: MegatronArgs) -> list[Problem]:
    """What the op fuser changes that cpmem does not price, and Megatron-LM's own
    refusals of it (``_is_fused_impl_supported`` asserts, 4828d651 ``experts.py:323-381``)."""
    if not args.use_transformer_engine_op_fuser:
        return []
    out: list[Problem] = []
    if args.fp8 is not None and args.num_experts is not None:
        out.append(
            (
                f"{FLAG} with --fp8-format {args.fp8}",
                UNPRICED + "the experts' rows padded to 256 under FP8 (experts.py:297, "
                "moe_utils.py:1350-1351) and the fused ops' quantized saved inputs",
            )
        )
    if not fused_experts(args):
        return out
    etp = args.expert_tensor_parallel_size or args.tensor_model_parallel_size
    if etp > 1:
        out.append((f"{FLAG} at expert TP {etp}", REJECTED + UNSUPPORTED + ": tensor parallelism"))
    offloaded = {"expert_fc1", "moe_act"} & set(offloaded_modules(args))
    if args.fine_grained_activation_offloading and offloaded:
        out.append(
            (
                f"{FLAG} with --offload-modules {' '.join(sorted(offloaded))}",
                REJECTED + UNSUPPORTED + ": expert_fc1 and moe_act offload run unfused only",
            )
        )
    if args.quick_geglu or (args.squared_relu and args.use_fused_weighted_squared_relu):
        out.append(
            (
                f"{FLAG} with {'--quick-geglu' if args.quick_geglu else '--squared-relu'}",
                UNPRICED + "Transformer Engine's ScaledClampedQGeGLU or ScaledSReLU op "
                "(its saved set not read)",
            )
        )
    elif not args.swiglu:
        out.append((f"{FLAG} without --swiglu", REJECTED + UNSUPPORTED + ": the activation"))
    if selective(args) and Module.MOE_ACT in selective_modules(args):
        out.append(
            (
                f"{FLAG} with --recompute-modules moe_act",
                UNPRICED + "the fused activation op recomputes inside Transformer Engine "
                "(activation_recompute_in_mlp, experts.py:442-487), not megatron's "
                "output-discarding checkpoint cpmem prices",
            )
        )
    if args.moe_token_dispatcher_type == "flex":
        out.append(
            (
                f"{FLAG} with --moe-token-dispatcher-type flex",
                UNPRICED + "the flex dispatcher pads its own dispatch to 256 rows an expert "
                "under the op fuser (HybridEP's pad_multiple, DeepEP's permute align_size: "
                "token_dispatcher.py:1142-1144,1453 at d98e8a64, 1379 at 4828d651): the "
                "dispatched rows, the probabilities it keeps and the combine's buffers padded",
            )
        )
    if args.flag_values.get("--delay-wgrad-compute") is True:
        out.append(
            (
                f"{FLAG} with --delay-wgrad-compute",
                UNPRICED + "the fused ops' own deferred weight gradients (the fused "
                "GroupedLinears' backward_dw, experts.py:869-890): what they keep until then "
                "is not read",
            )
        )
    return out
