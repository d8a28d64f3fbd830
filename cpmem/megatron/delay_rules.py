"""Megatron-LM's rules on ``--delay-wgrad-compute`` (Transformer Engine's GEMMs keep
their weight gradients' operands until megatron-core's ``backward_dw``, priced by
``cpmem.pricing.delayed_wgrad``), and the combinations cpmem does not price.

megatron-core allows the delay only under the combined 1F1B schedule
(``--overlap-moe-expert-parallel-comm``, transformer_config.py:2597-2601 at 4828d651),
with Transformer Engine (arguments.py:1683-1685) and not beside
``--overlap-dispatch-backward-with-experts-wgrad`` (transformer_config.py:2616-2619).
What the delay keeps is priced for the decoder's attention, dense MLP and MoE layers;
the graphed layers' ``backward_dw`` under CUDA graphs (fine_grained_callables.py:438-449),
an MTP depth's (its ``eh_proj`` with its layer's attention, :789-792) and a hybrid
stack's Mamba or Gated DeltaNet mixers' are not. Nor is the combined schedule at PP 1
with several micro-batches (``delay_at_pp1``, checked where the world is known): it runs a
micro-batch's forward beside the previous one's backward (combined_1f1b.py:98-119), and
gradient accumulation at PP 1 is priced one micro-batch at a time
(``cpmem.pricing.accumulation``), so the store and that backward's retained set would be
missing beside the other's forward.
"""

from __future__ import annotations

from cpmem.megatron.fields import MegatronArgs

Problem = tuple[str, str]
FLAG = "--delay-wgrad-compute"
REJECTS = "Megatron-LM rejects it: "
UNPRICED = "changes memory cpmem does not price: "


def delay_problems(args: MegatronArgs) -> list[Problem]:
    """Every rule of the delay ``args`` breaks (none where it is not asked)."""
    if not args.delay_wgrad_compute:
        return []
    out: list[Problem] = []
    if not args.overlap_moe_expert_parallel_comm:
        out.append(
            (
                f"{FLAG} without --overlap-moe-expert-parallel-comm",
                REJECTS + "'overlap_moe_expert_parallel_comm must be enabled when enabling "
                "delay_wgrad_compute' (transformer_config.py:2597-2601)",
            )
        )
    if args.transformer_impl != "transformer_engine":
        out.append(
            (
                f"{FLAG} with --transformer-impl {args.transformer_impl}",
                REJECTS + "'Delaying wgrad compute is only supported with transformer_engine "
                "implementation' (arguments.py:1683-1685)",
            )
        )
    if args.flag_values.get("--overlap-dispatch-backward-with-experts-wgrad") not in (
        None,
        False,
    ):
        out.append(
            (
                f"{FLAG} with --overlap-dispatch-backward-with-experts-wgrad",
                REJECTS + "'delay_wgrad_compute and overlap_dispatch_backward_with_experts_"
                "wgrad are mutually exclusive' (transformer_config.py:2616-2619)",
            )
        )
    graphed = args.cuda_graph_impl != "none" or args.enable_cuda_graph or args.external_cuda_graph
    unpriced = (
        (graphed, "CUDA graphs", "the graphed layers' delayed weight gradients"),
        (bool(args.mtp_num_layers), "--mtp-num-layers", "an MTP depth's delayed GEMMs"),
        (
            bool(args.hybrid_layer_pattern or args.hybrid_override_pattern),
            "a hybrid layer pattern",
            "the Mamba or Gated DeltaNet mixers' delayed GEMMs",
        ),
    )
    for on, what, tensors in unpriced:
        if on:
            out.append((f"{FLAG} with {what}", UNPRICED + tensors))
    return out


def delay_at_pp1(microbatches: int) -> Problem:
    """The refusal of the delay at PP 1 over ``microbatches`` (more than one) per step."""
    return (
        f"{FLAG} with {microbatches} micro-batches at --pipeline-model-parallel-size 1",
        UNPRICED + "the combined 1F1B schedule runs a micro-batch's forward beside the "
        "previous one's backward (combined_1f1b.py:98-119 at 4828d651): that backward's "
        "retained set and weight-gradient store live across the forward, and PP 1 is priced "
        "one micro-batch at a time",
    )
