"""FP8's arguments at the door (``fp8_problems``, one of ``rules.rule_problems``' rules):
the recipe (``--fp8-recipe``, default ``delayed``, with its ``--fp8-amax-history-len``,
default 1, under ``delayed``) and ``--fp8-param-gather`` (given or not: without it the
bf16 weights beside Transformer Engine's cached FP8 copies), each
refused with the reason ``cpmem.step.fp8`` gives where cpmem does not price it, so a run
learns them with its other refused flags; what the step decides beyond them (training,
layer kinds, device) is checked where the step is built. ``--fp8-param-gather`` without
``--fp8-format`` builds no FP8 parameter (Megatron-LM's ``fp8_model_init`` runs only under
``--fp8-format``), so it changes nothing. The router's padding for FP8
(``--moe-router-padding-for-quantization``) is read here too: Megatron-LM's rules on it, and
under FP8 on MoE layers a refusal (``router_padding_problems``).
"""

from __future__ import annotations

from cpmem.megatron.fields import MegatronArgs
from cpmem.megatron.optimizer_rules import OPTIMIZER_KIND
from cpmem.step.fp8 import (
    BESIDE_MUON,
    DELAYED_BF16_LAYERS,
    GATHER_REASONS,
    IN_FSDP,
    PRICED_RECIPES,
    RECIPE_REASONS,
    Fp8,
)

Problem = tuple[str, str]

FP8_ONLY = ("--no-fp8-wgrad", "--disable-fp8-wgrad")
"""Flags read only under ``--fp8-format`` (ignored without it) whose memory cpmem does not
price there: the weight gradients in high precision (TE then keeps the linears'
high-precision inputs for them)."""


ROUTER_PADDING = ("--moe-router-padding-for-quantization", "--moe-router-padding-for-fp8")
"""The router's padding for FP8 (the second an alias of the first, transformer_config.py:
2203-2209 at 4828d651)."""
ROUTER_PADDING_REASON = (
    "changes memory cpmem does not price: every source rank pads its routing map so each "
    "expert's count is a multiple of 16 (32 under MXFP8) (token_dispatcher.py:625-630 at "
    "4828d651, pad_routing_map), up to 15 (31) rows an expert from each of the EP x ETP "
    "ranks a local expert receives from, through the dispatch's buffers as well as the "
    "experts' saved set; the experts then skip their own padding "
    "(moe_utils.skip_routed_expert_padding), which is what cpmem prices "
    "(cpmem.pricing.kinds.moe_padding)"
)


def router_padding_problems(args: MegatronArgs) -> list[Problem]:
    """The router's padding for FP8: what Megatron-LM's ``TransformerConfig`` rejects of it
    (``transformer_config.py:2211-2221`` at 4828d651: without FP8 or FP4, or under the
    ``allgather`` dispatcher, which is the default), and under FP8 on MoE layers the
    refusal (``ROUTER_PADDING_REASON``); beside a dense model it changes nothing."""
    given = [f for f in ROUTER_PADDING if f in args.flag_values]
    if not given:
        return []
    flags = ", ".join(given)
    if args.fp8 is None:
        why = (
            "fp8/fp4 must be specified when moe_router_padding_for_quantization is True "
            "(Megatron-LM's TransformerConfig raises it, transformer_config.py:2211-2215 "
            "at 4828d651)"
        )
        return [(flags, why)]
    if args.moe_token_dispatcher_type in ("allgather", "alltoall_seq"):
        why = (
            "allgather and alltoall_seq dispatcher does not support "
            "moe_router_padding_for_quantization (Megatron-LM's TransformerConfig raises it, "
            f"transformer_config.py:2217-2221 at 4828d651; --moe-token-dispatcher-type "
            f"{args.moe_token_dispatcher_type})"
        )
        return [(flags, why)]
    if args.num_experts is None:
        return []
    return [(f"{flags} with --fp8-format {args.fp8}", ROUTER_PADDING_REASON)]


REUSE = "--reuse-grad-buf-for-mxfp8-param-ag"


def mxfp8_gather_problems(args: MegatronArgs) -> list[Problem]:
    """MXFP8 parameters gathered (``--fp8-recipe mxfp8 --fp8-param-gather``) and the
    gradient buffer reused for their all-gather (``REUSE``), as Megatron-LM runs them at
    4828d651: priced under the distributed optimizer with ``REUSE``
    (``cpmem.step.fp8.GATHER_REASONS``' note) and without the distributed optimizer
    without it; every other combination fails in Megatron-LM or Transformer Engine, named
    here with their reasons. Megatron FSDP turns ``REUSE`` off (``arguments.py:1083``)."""
    if args.use_megatron_fsdp:
        return []
    reuse = args.reuse_grad_buf_for_mxfp8_param_ag
    mxfp8 = args.fp8 is not None and args.fp8_recipe == "mxfp8" and args.fp8_param_gather
    out: list[Problem] = []
    if mxfp8 and args.use_distributed_optimizer and not reuse:
        why = (
            "megatron-core maps each MXFP8 weight into the parameter buffer "
            "(modify_underlying_storage, param_and_grad_buffer.py:1186-1211 at 4828d651) "
            "and Transformer Engine's replace_raw_data raises NotImplementedError for an "
            "MXFP8Tensor (tensor/utils.py:68-69 at b9d690e0); with "
            f"{REUSE} they are not mapped"
        )
        out.append(
            ("--fp8-recipe mxfp8 with --fp8-param-gather and --use-distributed-optimizer", why)
        )
    if not reuse:
        return out
    if not args.fp8_param_gather:
        why = (
            "Reuse grad buffer only when keeping params in MXFP8 (megatron-core's DDP config "
            "asserts it, distributed_data_parallel_config.py:253-254 at 4828d651)"
        )
        out.append((REUSE, why))
    if args.overlap_param_gather_with_optimizer_step:
        why = (
            "overlap_param_gather_with_optimizer_step is not supported with "
            "reuse_grad_buf_for_mxfp8_param_ag (optimizer_config.py:424-428 at 4828d651)"
        )
        out.append((f"{REUSE} with --overlap-param-gather-with-optimizer-step", why))
    if not args.use_distributed_optimizer:
        why = (
            "the optimizer step copies the main parameters into the parameter buffer "
            "(_copy_main_params_to_param_buffer, optimizer.py:731-735 at 4828d651), which "
            "only the distributed optimizer defines (distrib_optimizer.py:2811): without it "
            "the step fails"
        )
        out.append((f"{REUSE} without --use-distributed-optimizer", why))
    elif args.fp8 is not None and args.fp8_recipe != "mxfp8" and args.fp8_param_gather:
        why = (
            "changes memory cpmem does not price: after each all-gather megatron-core "
            "zeroes the parameter buffer (_post_param_sync, param_and_grad_buffer.py:"
            "279-300 at 4828d651), into which the other recipes' FP8 weights are mapped"
        )
        out.append((f"{REUSE} with --fp8-recipe {args.fp8_recipe}", why))
    return out


def bf16_layers(args: MegatronArgs) -> tuple[int, ...]:
    """The decoder layers ``--first-last-layers-bf16`` keeps out of FP8, 0-based: the first
    ``--num-layers-at-start-in-bf16`` and the last ``--num-layers-at-end-in-bf16`` (1
    each by default) of the whole stack, whatever stage holds them (megatron-core's
    ``is_first_last_bf16_layer`` reads the global layer number, ``fp8_utils.py:513-531``
    at 4828d651); the MTP depths run in FP8 (their context is asked with no layer
    number, ``multi_token_prediction.py``)."""
    if not args.first_last_layers_bf16:
        return ()
    n = args.num_layers
    start, end = args.num_layers_at_start_in_bf16, args.num_layers_at_end_in_bf16
    return tuple(i for i in range(n) if i < start or i >= n - end)


def megatron_fp8(args: MegatronArgs) -> Fp8 | None:
    """The step's FP8 setting for ``args`` (None without ``--fp8-format``)."""
    if args.fp8 is None:
        return None
    history = args.fp8_amax_history_len if args.fp8_recipe == "delayed" else 1
    return Fp8(args.fp8_recipe, args.fp8_param_gather, history, bf16_layers(args))


def fp8_problems(args: MegatronArgs) -> list[Problem]:
    out = router_padding_problems(args) + mxfp8_gather_problems(args)
    if args.fp8 is None:
        return out
    recipe = args.fp8_recipe
    if recipe not in PRICED_RECIPES:
        reason = RECIPE_REASONS.get(recipe, "is not a recipe of the snapshot")
        default = "" if "--fp8-recipe" in args.given else " (Megatron-LM's default)"
        out.append(
            (f"--fp8-recipe {recipe}{default}", "changes memory cpmem does not price: " + reason)
        )
    if args.fp8_param_gather and recipe in GATHER_REASONS:
        out.append(
            (
                f"--fp8-recipe {recipe} with --fp8-param-gather",
                "changes memory cpmem does not price: " + GATHER_REASONS[recipe],
            )
        )
    strategy = args.data_parallel_sharding_strategy
    if args.use_megatron_fsdp and strategy != "optim_grads_params":
        out.append(
            (
                f"--fp8-format {args.fp8} with --data-parallel-sharding-strategy {strategy}",
                "changes memory cpmem does not price: " + IN_FSDP,
            )
        )
    if OPTIMIZER_KIND.get(args.optimizer) == "muon":
        out.append(
            (
                f"--fp8-format {args.fp8} with --optimizer {args.optimizer}",
                "changes memory cpmem does not price: " + BESIDE_MUON,
            )
        )
    given = [f for f in FP8_ONLY if f in args.flag_values]
    if given:
        out.append(
            (
                ", ".join(given),
                "changes memory cpmem does not price under FP8: weight gradients in high "
                "precision (and the inputs kept for them)",
            )
        )
    if args.first_last_layers_bf16:
        out += _bf16_layer_problems(args)
    return out


def _bf16_layer_problems(args: MegatronArgs) -> list[Problem]:
    """What Megatron-LM's ``TransformerConfig`` rejects of ``--first-last-layers-bf16``
    under FP8 (``transformer_config.py:1334-1363`` at 4828d651)."""
    out: list[Problem] = []
    if args.fp8_recipe == "delayed":
        out.append(
            (f"--first-last-layers-bf16 with --fp8-recipe {args.fp8_recipe}", DELAYED_BF16_LAYERS)
        )
    per_stage = args.num_layers // args.pipeline_model_parallel_size
    for flag, count in (
        ("--num-layers-at-start-in-bf16", args.num_layers_at_start_in_bf16),
        ("--num-layers-at-end-in-bf16", args.num_layers_at_end_in_bf16),
    ):
        if not 0 <= count <= per_stage:
            out.append(
                (
                    f"{flag} {count}",
                    f"must be between 0 and number of layers per pipeline stage ({per_stage}) "
                    "(transformer_config.py:1344-1363 at 4828d651)",
                )
            )
    return out
