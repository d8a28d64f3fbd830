"""Megatron-LM's rules on the layer stack: the hybrid pattern and its spec, the MoE layers'
frequency, multi-token prediction, latent attention, Mamba-2's heads and the router
(``stack_problems``), each with Megatron-LM's reason and where the snapshot asserts it,
or with what cpmem does not price. ``cpmem.megatron.rules`` calls it beside the other
rules, so every problem of a run is named at once.
"""

from __future__ import annotations

from cpmem.megatron.fields import MegatronArgs
from cpmem.megatron.hybrid_pattern import HybridPattern, parse_hybrid_pattern
from cpmem.megatron.stack import latent, mamba_heads
from cpmem.megatron.windows import window_problems

Problem = tuple[str, str]

HYBRID_SPEC = "megatron.core.models.hybrid.hybrid_layer_specs hybrid_stack_spec"
"""``--spec`` of a hybrid run (the functional tests' ``[megatron.core.models.hybrid.
hybrid_layer_specs hybrid_stack_spec]``): the module and the spec's name, the words
``import_module`` reads (hybrid_builders.py:20-23). A pattern without ``--spec`` is read
as this spec's layers: ``pretrain_hybrid.py`` asks for one (hybrid_builders.py:22), and
the post-training examples' builder (``--export-model-type HybridModel``) picks its own
spec of the same layers."""

SCORE_FUNCTIONS = ("softmax", "sigmoid")
"""The router's score functions priced: softmax, and sigmoid's E-wide fp32 scores kept
for backward (``ModelGeometry.router_scoring``)."""


def _pattern_problems(args: MegatronArgs) -> list[Problem]:
    out: list[Problem] = []
    text = args.hybrid_layer_pattern or args.hybrid_override_pattern
    if args.hybrid_layer_pattern is not None and args.hybrid_override_pattern is not None:
        out.append(
            (
                "--hybrid-layer-pattern --hybrid-override-pattern",
                "--hybrid-override-pattern and --hybrid-layer-pattern cannot both be "
                "specified (arguments.py:745-749)",
            )
        )
    if args.spec is not None and args.spec != HYBRID_SPEC:
        out.append(
            (
                f"--spec {args.spec}",
                "changes memory cpmem does not price: a layer spec of the user's (priced: "
                f"{HYBRID_SPEC})",
            )
        )
    if text is None:
        if args.spec == HYBRID_SPEC:
            out.append(
                (
                    f"--spec {args.spec}",
                    "builds a hybrid model from --hybrid-layer-pattern, which is not given",
                )
            )
        return out
    parsed = parse_hybrid_pattern(text)
    if not isinstance(parsed, HybridPattern):
        return [*out, (f"--hybrid-layer-pattern {text}", "; ".join(parsed))]
    if args.num_layers != len(parsed.main):
        out.append(
            (
                f"--num-layers {args.num_layers}",
                f"the pattern's {len(parsed.main)} layers are the stack (arguments.py:787-797)",
            )
        )
    if "E" in parsed.main + parsed.mtp and args.num_experts is None:
        out.append((f"--hybrid-layer-pattern {text}", "its 'E' layers need --num-experts"))
    cuts: tuple[tuple[str, int | bool | None], ...] = (
        ("--num-layers-per-virtual-pipeline-stage", args.num_layers_per_virtual_pipeline_stage),
        ("--num-virtual-stages-per-pipeline-rank", args.num_virtual_stages_per_pipeline_rank),
        ("--account-for-embedding-in-pipeline-split", args.account_for_embedding_in_pipeline_split),
        ("--account-for-loss-in-pipeline-split", args.account_for_loss_in_pipeline_split),
    )
    if parsed.piped:
        cuts += (
            ("--decoder-first-pipeline-num-layers", args.decoder_first_pipeline_num_layers),
            ("--decoder-last-pipeline-num-layers", args.decoder_last_pipeline_num_layers),
        )
    for flag, value in cuts:
        if value not in (None, False):
            out.append(
                (
                    flag,
                    "should not be used with --hybrid-layer-pattern: the pipeline stages are "
                    "its '|' segments (arguments.py:801-839)",
                )
            )
    return out


def _layer_freq_problems(args: MegatronArgs) -> list[Problem]:
    freq = args.moe_layer_freq
    if args.num_experts is None or args.hybrid_layer_pattern or args.hybrid_override_pattern:
        return []  # read only where a GPT's decoder places its MoE layers
    if isinstance(freq, int):
        if freq <= 0:
            return [(f"--moe-layer-freq {freq}", "must be a positive integer")]
        return []
    if len(freq) != args.num_layers:
        return [
            (
                f"--moe-layer-freq of {len(freq)} layers",
                f"Invalid length of moe_layer_pattern: {len(freq)}, expected "
                f"{args.num_layers} (gpt_layer_specs.py:651-657)",
            )
        ]
    return []


def _mtp_problems(args: MegatronArgs) -> list[Problem]:
    if not args.mtp_num_layers:
        return []
    if args.mtp_num_layers < 0:
        return [(f"--mtp-num-layers {args.mtp_num_layers}", "must be a positive integer")]
    if args.position_embedding_type not in ("rope", "none"):
        return [
            (
                f"--mtp-num-layers {args.mtp_num_layers}",
                "Multi-Token Prediction (MTP) is not supported with "
                f"{args.position_embedding_type} position embedding type: rope or none "
                "(arguments.py:882-886)",
            )
        ]
    return []


def _latent_problems(args: MegatronArgs) -> list[Problem]:
    if not latent(args):
        return []
    out: list[Problem] = []
    if args.group_query_attention:
        out.append(
            (
                "--multi-latent-attention --group-query-attention",
                "Group query attention is mutually exclusive with multi latent attention "
                "(arguments.py:1973-1974)",
            )
        )
    for flag, value in (
        ("--q-lora-rank", args.q_lora_rank),
        ("--kv-lora-rank", args.kv_lora_rank),
        ("--qk-head-dim", args.qk_head_dim),
        ("--qk-pos-emb-head-dim", args.qk_pos_emb_head_dim),
        ("--v-head-dim", args.v_head_dim),
    ):
        if value is not None and value <= 0:
            out.append((f"{flag} {value}", "must be a positive integer"))
    return out


def _mamba_problems(args: MegatronArgs) -> list[Problem]:
    """MambaMixer's asserts (ssm/mamba_mixer.py:241-274), where the stack has Mamba-2."""
    text = args.hybrid_layer_pattern or args.hybrid_override_pattern or ""
    if "M" not in text:
        return []
    out: list[Problem] = []
    for flag, value in (
        ("--mamba-state-dim", args.mamba_state_dim),
        ("--mamba-head-dim", args.mamba_head_dim),
        ("--mamba-num-groups", args.mamba_num_groups),
        ("--mamba-num-heads", args.mamba_num_heads),
    ):
        if value is not None and value <= 0:
            out.append((f"{flag} {value}", "must be a positive integer (mamba_mixer.py:241-247)"))
    if out:
        return out
    if args.mamba_num_heads is None and (2 * args.hidden_size) % args.mamba_head_dim:
        out.append(
            (
                f"--mamba-head-dim {args.mamba_head_dim}",
                f"d_inner must be evenly divisible by headdim: 2 x {args.hidden_size} "
                "(mamba_mixer.py:249-251)",
            )
        )
        return out
    heads, groups = mamba_heads(args), args.mamba_num_groups
    tp = args.tensor_model_parallel_size
    if heads % groups:
        out.append(
            (
                f"--mamba-num-groups {groups}",
                f"nheads ({heads}) must be evenly divisible by ngroups (mamba_mixer.py:274)",
            )
        )
    if heads % tp:
        out.append((f"Mamba-2's {heads} heads", f"must be evenly divisible by TP {tp} (:262)"))
    if groups % tp:
        out.append((f"--mamba-num-groups {groups}", f"must be evenly divisible by TP {tp} (:270)"))
    return out


def _router_problems(args: MegatronArgs) -> list[Problem]:
    out: list[Problem] = []
    function = args.moe_router_score_function
    if function not in SCORE_FUNCTIONS:
        out.append(
            (
                f"--moe-router-score-function {function}",
                f"changes memory cpmem does not price (priced: {', '.join(SCORE_FUNCTIONS)})",
            )
        )
    if args.moe_router_enable_expert_bias and function not in ("sigmoid", "sqrtsoftplus"):
        out.append(
            (
                "--moe-router-enable-expert-bias",
                "Expert bias for aux-loss-free routing only supports 'sigmoid' and "
                "'sqrtsoftplus' score functions (transformer_config.py:2617-2625)",
            )
        )
    groups, group_topk = args.moe_router_num_groups, args.moe_router_group_topk
    if group_topk:
        if not groups:
            out.append(
                (
                    f"--moe-router-group-topk {group_topk}",
                    "When using group limited routing, moe_router_num_groups must be "
                    "specified (transformer_config.py:2677-2680)",
                )
            )
        elif args.num_experts is not None and (args.num_experts % groups or group_topk > groups):
            out.append(
                (
                    f"--moe-router-num-groups {groups} --moe-router-group-topk {group_topk}",
                    "the groups must divide the experts and the group top-k be at most the "
                    "groups (transformer_config.py:2682-2689)",
                )
            )
        elif not args.moe_router_enable_expert_bias:
            out.append(
                (
                    f"--moe-router-group-topk {group_topk}",
                    "changes memory cpmem does not price: group-limited routing on the "
                    "scores keeps a [tokens, experts] mask for backward (moe_utils.py "
                    "group_limited_topk); with --moe-router-enable-expert-bias it runs on "
                    "the biased copy, whose top-k values nothing keeps",
                )
            )
    fused = args.use_fused_weighted_squared_relu
    if fused and args.num_experts is not None and args.squared_relu and args.add_bias_linear:
        out.append(
            (
                "--use-fused-weighted-squared-relu with linear biases",
                "Bias is not supported with fused weighted squared relu (moe/experts.py:"
                "987-991): give --disable-bias-linear",
            )
        )
    return out


def stack_problems(args: MegatronArgs) -> list[Problem]:
    """Every rule on the stack ``args`` break, in a fixed order."""
    return (
        _pattern_problems(args)
        + _layer_freq_problems(args)
        + _mtp_problems(args)
        + _latent_problems(args)
        + _mamba_problems(args)
        + _router_problems(args)
        + window_problems(args)
    )
