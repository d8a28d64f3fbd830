"""The experts' arguments at the door (``moe_problems``, one of ``rules.rule_problems``'
rules): Megatron-LM's assertions on the experts and on the EP all-to-all overlap, and the
dispatchers and load balancing cpmem prices."""

from __future__ import annotations

from cpmem.megatron.fields import MegatronArgs
from cpmem.megatron.layout import virtual_pipeline_size

Problem = tuple[str, str]

MOE_DISPATCHERS = ("allgather", "alltoall", "flex")
"""The token dispatchers priced; ``flex`` with its HybridEP backend only
(``cpmem.megatron.flex_rules``)."""
MOE_LOAD_BALANCING = ("aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none")
"""The router's load-balancing types priced: each keeps [tokens, experts] scores.
``global_aux_loss`` keeps the saved set ``aux_loss`` keeps: both run
``compute_routing_scores_for_aux_loss`` once and ``switch_load_balancing_loss_func`` on
its scores (megatron-core router.py:804-832, 410-448 and 507-551 at the snapshot); the
global one reduces the tokens per expert over TP x DP x CP instead of TP x CP (an
``E``-element all-reduce) and adds them into two fp32 buffers per router
(``global_tokens_per_expert``, ``E`` elements, and ``ga_steps``, one), registered only
under a positive ``--moe-aux-loss-coeff`` (router.py:204-220), named in the estimate
where the run has them (``describe.GLOBAL_AUX_LOSS_NOTE``)."""
CAPACITY_BALANCING = ("aux_loss", "seq_aux_loss", "global_aux_loss", "none")
"""The load balancing a capacity factor works with (transformer_config.py)."""


def moe_problems(args: MegatronArgs) -> list[Problem]:
    """Megatron-LM's assertions on the experts (arguments.py, transformer_config.py), and
    what cpmem prices of MoE."""
    out: list[Problem] = []
    v = args.flag_values
    if args.num_experts is None:
        moe_only = (
            (
                "--expert-model-parallel-size",
                args.expert_model_parallel_size != 1,
                " (arguments.py:1655-1656)",
            ),
            (
                "--moe-ffn-hidden-size",
                args.moe_ffn_hidden_size is not None,
                " (transformer_config.py:1690-1705)",
            ),
            (
                "--moe-shared-expert-intermediate-size",
                args.moe_shared_expert_intermediate_size is not None,
                "",
            ),
            ("--overlap-moe-expert-parallel-comm", args.overlap_moe_expert_parallel_comm, ""),
        )
        for flag, given, cite in moe_only:
            if given:
                out.append((flag, f"needs --num-experts{cite}"))
        return out
    experts, ep = args.num_experts, args.expert_model_parallel_size
    tp = args.tensor_model_parallel_size
    etp = args.expert_tensor_parallel_size or tp
    if experts % ep:
        out.append(
            (
                f"--expert-model-parallel-size {ep}",
                f"does not divide --num-experts {experts} (arguments.py:1657-1658)",
            )
        )
    if args.moe_router_topk > experts:
        out.append(
            (f"--moe-router-topk {args.moe_router_topk}", f"is above --num-experts {experts}")
        )
    if args.moe_token_dispatcher_type not in MOE_DISPATCHERS:
        out.append(
            (
                f"--moe-token-dispatcher-type {args.moe_token_dispatcher_type}",
                f"is not priced (priced: {', '.join(MOE_DISPATCHERS)})",
            )
        )
    if args.moe_router_load_balancing_type not in MOE_LOAD_BALANCING:
        out.append(
            (
                f"--moe-router-load-balancing-type {args.moe_router_load_balancing_type}",
                f"is not priced (priced: {', '.join(MOE_LOAD_BALANCING)})",
            )
        )
    capacity = args.moe_expert_capacity_factor
    if capacity is not None and capacity >= 0:
        if capacity == 0:
            out.append(("--moe-expert-capacity-factor 0", "keeps no token: a factor > 0"))
        if args.moe_router_load_balancing_type not in CAPACITY_BALANCING:
            out.append(
                (
                    f"--moe-expert-capacity-factor {capacity:g}",
                    "moe_expert_capacity_factor only works with aux_loss, seq_aux_loss, "
                    "global_aux_loss or none load balancing (transformer_config.py)",
                )
            )
    elif args.moe_pad_expert_input_to_capacity:
        out.append(
            (
                "--moe-pad-expert-input-to-capacity",
                "moe_expert_capacity_factor must be set to use "
                "moe_pad_expert_input_to_capacity (transformer_config.py)",
            )
        )
    if args.moe_router_dtype not in (None, "fp32", "fp64"):
        out.append((f"--moe-router-dtype {args.moe_router_dtype}", "must be fp32 or fp64"))
    if args.moe_router_fusion and args.moe_router_dtype == "fp64":
        out.append(
            (
                "--moe-router-fusion with --moe-router-dtype fp64",
                "Transformer Engine's fused router raises 'Current TE does not support "
                "float64 router type.' (transformer_engine/pytorch/router.py:130-131)",
            )
        )
    if tp > 1 and not args.sequence_parallel:
        out.append(
            (
                "--num-experts with --tensor-model-parallel-size > 1",
                "needs --sequence-parallel (MoELayer raises without it in training)",
            )
        )
    if args.add_bias_linear and etp != 1:
        out.append(
            (
                f"--num-experts with linear biases at expert TP {etp}",
                "Bias in Moe is only supported when ETP==1: give --disable-bias-linear or "
                "--expert-tensor-parallel-size 1 (transformer_config.py:2612-2615)",
            )
        )
    if (
        args.moe_router_topk == 1
        and v.get("--moe-router-score-function", "softmax") == "softmax"
        and "--moe-router-pre-softmax" not in v
        and args.moe_router_load_balancing_type != "sinkhorn"
    ):
        out.append(
            (
                "--moe-router-topk 1",
                "Please use --moe-router-pre-softmax when topk is 1 (transformer_config.py:"
                "2661-2669)",
            )
        )
    if args.overlap_moe_expert_parallel_comm:
        out.extend(_ep_overlap(args))
    return out


def _ep_overlap(args: MegatronArgs) -> list[Problem]:
    """transformer_config.py:3002-3040: what the EP all-to-all overlap asserts."""
    flag = "--overlap-moe-expert-parallel-comm"
    needs: list[tuple[bool, str]] = [
        (
            args.pipeline_model_parallel_size == 1 or virtual_pipeline_size(args) is not None,
            "virtual pipeline stages when --pipeline-model-parallel-size > 1",
        ),
        (args.expert_model_parallel_size > 1, "expert model parallelism"),
        (args.moe_token_dispatcher_type in ("alltoall", "flex"), "the alltoall/flex dispatcher"),
        (args.recompute_granularity != "full", "no full recomputation"),
        (args.recompute_method is None, "no recompute method"),
        (args.recompute_num_layers is None, "no --recompute-num-layers"),
        (args.bf16 or args.fp16, "a bf16 or fp16 model"),
    ]
    return [
        (flag, f"needs {what} (transformer_config.py:3002-3040)") for ok, what in needs if not ok
    ]
