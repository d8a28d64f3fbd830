"""The combinations of arguments Megatron-LM rejects, and the values cpmem does not
price, checked on the arguments alone (no world size): ``check_megatron_args``.

Each rule names the flags involved and Megatron-LM's own reason, citing where the
snapshot asserts it (``megatron/training/arguments.py`` ``validate_args``, the
``__post_init__`` of ``ModelParallelConfig`` and ``TransformerConfig``, the layers that
assert at build time). ``parse_megatron_args`` calls it last, so every reader of a run's
arguments gets the same answer. Where the arguments carry their world (a launch script's
torchrun, or the caller's ``--world-size``), whole model replicas are checked here too;
the other rules on the world size (the expert layout's ranks, the micro-batch count)
stay with the run's description.
"""

from __future__ import annotations

from cpmem.errors import InputError
from cpmem.megatron.batch_schedule import schedule_problems
from cpmem.megatron.cuda_graph_rules import cuda_graph_door_problems
from cpmem.megatron.defer_rules import defer_problems
from cpmem.megatron.delay_rules import delay_problems
from cpmem.megatron.fields import MegatronArgs
from cpmem.megatron.flex_rules import flex_problems
from cpmem.megatron.fp8_rules import fp8_problems
from cpmem.megatron.fsdp_rules import fsdp_problems
from cpmem.megatron.layout import layout_problems, virtual_pipeline_size
from cpmem.megatron.moe_rules import moe_problems
from cpmem.megatron.offload_rules import layer_offload_problems, offload_problems
from cpmem.megatron.op_fuser_rules import op_fuser_problems
from cpmem.megatron.optimizer_rules import optimizer_problems
from cpmem.megatron.recompute_modules import module_problems
from cpmem.megatron.stack_rules import stack_problems
from cpmem.megatron.variant_rules import variant_problems
from cpmem.megatron.vocab import resolved_vocab_size
from cpmem.megatron.world_rules import world_problems

Problem = tuple[str, str]
"""(the flags and values involved, the reason)."""

ATTENTION_BACKENDS = ("flash", "fused", "unfused", "local")
"""What ``--attention-backend`` names (``AttnBackend``) and cpmem prices, besides auto."""
CP_COMM_TYPES = ("p2p", "a2a", "all_gather", "a2a+p2p")

POSITIVE = (
    "num_layers",
    "hidden_size",
    "num_attention_heads",
    "seq_length",
    "micro_batch_size",
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "context_parallel_size",
    "global_batch_size",
    "num_query_groups",
    "num_layers_per_virtual_pipeline_stage",
    "num_virtual_stages_per_pipeline_rank",
    "num_experts",
    "moe_router_topk",
    "moe_ffn_hidden_size",
    "moe_shared_expert_intermediate_size",
    "expert_model_parallel_size",
    "expert_tensor_parallel_size",
    "recompute_num_layers",
    "vocab_size",
    "make_vocab_size_divisible_by",
)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _positive(args: MegatronArgs) -> list[Problem]:
    out: list[Problem] = []
    for name in POSITIVE:
        value = getattr(args, name)
        if value is not None and (isinstance(value, bool) or value <= 0):
            out.append((f"{_flag(name)} {value}", "must be a positive integer"))
    return out


def _choices(args: MegatronArgs) -> list[Problem]:
    """Values argparse accepts that cpmem does not price, or argparse's own choices."""
    out: list[Problem] = []
    allowed: tuple[tuple[str, object, tuple[object, ...], str], ...] = (
        ("normalization", args.normalization, ("LayerNorm", "RMSNorm"), ""),
        (
            "position_embedding_type",
            args.position_embedding_type,
            ("learned_absolute", "rope", "none"),
            " (yarn, mrope and relative position embeddings are not priced)",
        ),
        (
            "transformer_impl",
            args.transformer_impl,
            ("transformer_engine", "local"),
            " (the inference-optimized layers are not a training run's)",
        ),
        ("attention_backend", args.attention_backend, ("auto", *ATTENTION_BACKENDS), ""),
        ("recompute_granularity", args.recompute_granularity, (None, "full", "selective"), ""),
        ("cp_comm_type", args.cp_comm_type, CP_COMM_TYPES, " (one type for every layer)"),
    )
    for name, value, values, why in allowed:
        if value not in values:
            shown = [v for v in values if v is not None]
            out.append((f"{_flag(name)} {value}", f"must be one of {shown}{why}"))
    return out


def _model(args: MegatronArgs) -> list[Problem]:
    out: list[Problem] = []
    v = args.flag_values
    if args.bf16 and args.fp16:
        out.append(
            (
                "--bf16 --fp16",
                "name two parameter dtypes; give one (arguments.py:1196, 1205; "
                "transformer_config.py:1432-1435)",
            )
        )
    if args.max_position_embeddings is not None and args.max_position_embeddings < args.seq_length:
        out.append(
            (
                f"--max-position-embeddings {args.max_position_embeddings}",
                f"is below --seq-length {args.seq_length} (arguments.py:1353-1356)",
            )
        )
    if args.kv_channels is None and args.hidden_size % args.num_attention_heads:
        out.append(
            (
                f"--hidden-size {args.hidden_size} --num-attention-heads "
                f"{args.num_attention_heads}",
                "the heads do not divide the hidden size and no --kv-channels is given "
                "(arguments.py:1331-1333)",
            )
        )
    tp = args.tensor_model_parallel_size
    if args.num_attention_heads % tp:
        out.append(
            (
                f"--num-attention-heads {args.num_attention_heads}",
                f"is not divisible by TP {tp} (transformer_config.py:1446-1450)",
            )
        )
    if args.group_query_attention and args.num_query_groups:
        groups = args.num_query_groups
        if groups % tp and tp % groups:
            out.append(
                (
                    f"--num-query-groups {groups}",
                    f"is neither a multiple nor a divisor of TP {tp} "
                    "(transformer_config.py:1461-1468)",
                )
            )
    if args.squared_relu and args.swiglu:
        out.append(("--squared-relu --swiglu", "name two activations (argument_utils.py:320-321)"))
    elif args.squared_relu and args.add_bias_linear and "--no-bias-gelu-fusion" not in v:
        out.append(
            (
                "--squared-relu",
                "with linear biases the fused bias + activation (--no-bias-gelu-fusion not "
                "given) takes only gelu, swiglu or quick_geglu: Megatron-LM raises "
                "(argument_utils.py:318-321, transformer_config.py:2420-2424)",
            )
        )
    if "--encoder-num-layers" in v and "--num-layers" in v:
        out.append(
            (
                "--num-layers --encoder-num-layers",
                "cannot have both (arguments.py:1305-1307)",
            )
        )
    if "--encoder-seq-length" in v and "--seq-length" in v:
        out.append(("--seq-length --encoder-seq-length", "cannot have both (arguments.py:1347)"))
    if args.cross_entropy_loss_fusion and v.get("--cross-entropy-fusion-impl") == "te":
        out.append(
            (
                "--cross-entropy-loss-fusion --cross-entropy-fusion-impl te",
                "Transformer Engine cross entropy loss fusion is disabled due to stability "
                "issues (arguments.py:1697-1702)",
            )
        )
    if args.deterministic_mode and args.cross_entropy_loss_fusion:
        out.append(
            (
                "--deterministic-mode --cross-entropy-loss-fusion",
                "--deterministic-mode requires cross_entropy_loss_fusion=False "
                "(determinism.py:24, 141-148, called at arguments.py:1708-1711)",
            )
        )
    return out


def _attention(args: MegatronArgs) -> list[Problem]:
    out: list[Problem] = []
    cp = args.context_parallel_size
    if cp > 1 and args.seq_length % (2 * cp):
        out.append(
            (
                f"--seq-length {args.seq_length}",
                f"is not divisible by 2 x CP = {2 * cp} (arguments.py:1335-1338)",
            )
        )
    if cp > 1 and args.transformer_impl == "local":
        out.append(
            (
                f"--transformer-impl local --context-parallel-size {cp}",
                "Context parallelism is only supported by TEDotProductAttention! "
                "(dot_product_attention.py:57-59)",
            )
        )
    elif cp > 1 and args.attention_backend == "unfused":
        out.append(
            (
                f"--attention-backend unfused --context-parallel-size {cp}",
                "Transformer Engine disables its unfused attention under context parallelism "
                "(attention/dot_product_attention/utils.py, 'does not support context "
                "parallelism', v2.9-v2.11) and the backend turns flash and fused off "
                "(language_module.py:141-144): no attention backend is left",
            )
        )
    if args.attention_backend == "local" and args.flag_values.get("--spec") != "local":
        out.append(
            (
                "--attention-backend local",
                "is only supported with --spec local (arguments.py:436-437)",
            )
        )
    if "a2a+p2p" in args.cp_comm_type.split() and (
        "--hierarchical-context-parallel-sizes" not in args.flag_values
    ):
        out.append(
            (
                f"--cp-comm-type {args.cp_comm_type}",
                "--hierarchical-context-parallel-sizes must be set when a2a+p2p is used in cp "
                "comm (arguments.py:583-585)",
            )
        )
    out.extend(_attention_env(args))
    return out


_BACKEND_ENV = {
    # language_module.py:129-147: the NVTE switches each --attention-backend sets
    "local": (0, 0, 0),
    "flash": (1, 0, 0),
    "fused": (0, 1, 0),
    "unfused": (0, 0, 1),
    "auto": (1, 1, 1),
}


def _attention_env(args: MegatronArgs) -> list[Problem]:
    expected = _BACKEND_ENV.get(args.attention_backend)
    if expected is None:
        return []
    out: list[Problem] = []
    for name, want in zip(
        ("NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN", "NVTE_UNFUSED_ATTN"), expected, strict=True
    ):
        got = args.env.get(name)
        if got is not None and got.strip() != str(want):
            out.append(
                (
                    f"{name}={got} --attention-backend {args.attention_backend}",
                    f"{name} set to {got}, but expected {want} for attention backend "
                    f"{args.attention_backend} (language_module.py:120-147)",
                )
            )
    return out


def _recompute(args: MegatronArgs) -> list[Problem]:
    out: list[Problem] = []
    granularity, method = args.recompute_granularity, args.recompute_method
    if granularity == "full" and method not in ("uniform", "block"):
        out.append(
            (
                f"--recompute-method {method}",
                "full recompute needs --recompute-method uniform or block "
                "(transformer_config.py:1907-1917)",
            )
        )
    if granularity == "full" and args.recompute_num_layers is None:
        out.append(
            (
                "--recompute-granularity full",
                "needs --recompute-num-layers, between 1 and the layers per pipeline rank "
                "(transformer_config.py:1919-1926)",
            )
        )
    if granularity == "selective" and method is not None:
        out.append(
            (
                f"--recompute-method {method}",
                "recompute method is not yet supported for selective recomputing granularity "
                "(arguments.py:1424-1427)",
            )
        )
    if granularity == "selective" and args.recompute_num_layers is not None:
        out.append(
            (
                f"--recompute-num-layers {args.recompute_num_layers}",
                "must be None with selective recompute (transformer_config.py:1927-1933)",
            )
        )
    return out


def _distributed(args: MegatronArgs) -> list[Problem]:
    out: list[Problem] = []
    v = args.flag_values
    if args.overlap_param_gather and not args.use_distributed_optimizer:
        out.append(
            (
                "--overlap-param-gather",
                "only supported with distributed optimizer, megatron fsdp, or dist_muon "
                "(arguments.py:1025-1027)",
            )
        )
    if args.overlap_param_gather and not args.overlap_grad_reduce:
        out.append(
            (
                "--overlap-param-gather",
                "Must use --overlap-param-gather with --overlap-grad-reduce "
                "(arguments.py:1028-1029)",
            )
        )
    if args.overlap_param_gather_with_optimizer_step:
        if not args.use_distributed_optimizer:
            out.append(
                (
                    "--overlap-param-gather-with-optimizer-step",
                    "only supported with distributed optimizer (arguments.py:1067-1068)",
                )
            )
        if not args.overlap_param_gather:
            out.append(
                (
                    "--overlap-param-gather-with-optimizer-step",
                    "needs --overlap-param-gather (arguments.py:1069-1070)",
                )
            )
        if virtual_pipeline_size(args) is None:
            out.append(
                (
                    "--overlap-param-gather-with-optimizer-step",
                    "only supported with interleaved pipeline parallelism (arguments.py:1071-1072)",
                )
            )
        if v.get("--ckpt-format", "torch_dist") != "torch":
            out.append(
                (
                    "--overlap-param-gather-with-optimizer-step",
                    "not supported with distributed checkpointing yet: give --ckpt-format "
                    "torch (arguments.py:1073-1074; use_dist_ckpt is --ckpt-format != torch, "
                    "common_utils.py:580-581)",
                )
            )
    if "--overlap-p2p-communication-warmup-flush" in v and (
        virtual_pipeline_size(args) is None or "--no-overlap-p2p-communication" in v
    ):
        out.append(
            (
                "--overlap-p2p-communication-warmup-flush",
                "is only compatible with overlap_p2p_comm, which needs the interleaved "
                "schedule (model_parallel_config.py:570-575, arguments.py:1010-1012)",
            )
        )
    return out


def _family(args: MegatronArgs) -> list[Problem]:
    """A BERT run's arguments: a vocabulary file without merges and no tokenizer type is
    BERT's WordPiece vocabulary (examples/bert/pretrain_bert.py:185 defaults the
    tokenizer to BertWordPieceLowerCase, which reads --vocab-file alone);
    pretrain_gpt.py's GPT2BPETokenizer reads a BPE vocabulary with its merge file. The
    functional tests' BERT cases (tests/functional_tests/test_cases/bert/*, run by
    tests/test_utils/recipes/h100/bert.yaml) give exactly this."""
    v = args.flag_values
    if "--vocab-file" in v and "--merge-file" not in v and args.tokenizer_type is None:
        return [
            (
                "--vocab-file without --merge-file or --tokenizer-type",
                "is a BERT run's vocabulary (examples/bert/pretrain_bert.py's WordPiece "
                "tokenizer), not a "
                "GPT model cpmem prices (pretrain_gpt.py's GPT2BPETokenizer reads "
                "--merge-file beside --vocab-file)",
            )
        ]
    return []


def _vocabulary(args: MegatronArgs) -> list[Problem]:
    try:
        resolved_vocab_size(args)
    except InputError as exc:
        return [(str(exc.value), exc.reason)]
    return []


def rule_problems(args: MegatronArgs) -> list[Problem]:
    """Every rule ``args`` breaks, in a fixed order."""
    out = _positive(args)
    if out:
        return out  # the other rules divide by these
    out += _choices(args)
    out += _model(args)
    out += _attention(args)
    out += _recompute(args)
    out += module_problems(args)
    out += offload_problems(args)
    out += layer_offload_problems(args)
    out += layout_problems(args)
    out += world_problems(args)
    out += defer_problems(args)
    out += schedule_problems(args)
    out += _distributed(args)
    out += optimizer_problems(args)
    out += fsdp_problems(args)
    out += fp8_problems(args)
    out += cuda_graph_door_problems(args)
    out += moe_problems(args)
    out += op_fuser_problems(args)
    out += delay_problems(args)
    out += flex_problems(args)
    out += stack_problems(args)
    out += variant_problems(args)
    family = _family(args)
    out += family or _vocabulary(args)
    return out


def refusal(problems: list[Problem]) -> InputError:
    """One ``InputError`` on ``megatron_args`` naming every problem: where there is one,
    its value and reason; else every value, and each reason once after the values that
    share it (one line: the gate's report tabulates it)."""
    if len(problems) == 1:
        value, reason = problems[0]
        return InputError("megatron_args", value, reason)
    by_reason: dict[str, list[str]] = {}
    for value, reason in problems:
        by_reason.setdefault(reason, []).append(value)
    named = "; ".join(f"{', '.join(values)}: {reason}" for reason, values in by_reason.items())
    return InputError(
        "megatron_args",
        ", ".join(value for value, _ in problems),
        f"{len(problems)} arguments are refused: {named}",
    )


def check_megatron_args(args: MegatronArgs) -> None:
    """Raise one ``InputError`` naming every rule ``args`` breaks (none: return)."""
    problems = rule_problems(args)
    if problems:
        raise refusal(problems)
