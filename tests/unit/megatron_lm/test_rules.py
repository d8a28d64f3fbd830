"""The combinations Megatron-LM rejects (``cpmem.megatron.rules``), each refused when
the arguments are read, with Megatron-LM's reason and where the snapshot (d98e8a64)
asserts it; and a combination one step inside each rule is read.
"""

from __future__ import annotations

from typing import Any

import pytest

from cpmem.errors import InputError
from cpmem.megatron.args import MegatronArgs, parse_megatron_args
from cpmem.megatron.rules import check_megatron_args, rule_problems
from tests.unit.megatron_lm.tiny import FLAGS

BASE = dict(FLAGS)
MOE = {"--num-experts": 8, "--disable-bias-linear": True}


def _read(flags: dict[str, object], env: dict[str, object] | None = None) -> MegatronArgs:
    return parse_megatron_args({**BASE, **flags}, env)


def _refusal(flags: dict[str, object], env: dict[str, object] | None = None) -> InputError:
    with pytest.raises(InputError) as err:
        _read(flags, env)
    assert err.value.field == "megatron_args"
    return err.value


RULES: list[tuple[str, dict[str, Any], dict[str, Any], str, str]] = [
    # (name, refused flags, read flags one step inside the rule, the value named, reason)
    (
        "full recompute without --recompute-num-layers",
        {"--recompute-granularity": "full", "--recompute-method": "uniform"},
        {
            "--recompute-granularity": "full",
            "--recompute-method": "uniform",
            "--recompute-num-layers": 1,
        },
        "--recompute-granularity full",
        "needs --recompute-num-layers, between 1 and the layers per pipeline rank "
        "(transformer_config.py:1919-1926)",
    ),
    (
        "full recompute without a method",
        {"--recompute-granularity": "full", "--recompute-num-layers": 1},
        {
            "--recompute-granularity": "full",
            "--recompute-method": "block",
            "--recompute-num-layers": 1,
        },
        "--recompute-method None",
        "full recompute needs --recompute-method uniform or block",
    ),
    (
        "selective recompute with a layer count",
        {"--recompute-granularity": "selective", "--recompute-num-layers": 2},
        {"--recompute-granularity": "selective"},
        "--recompute-num-layers 2",
        "must be None with selective recompute (transformer_config.py:1927-1933)",
    ),
    (
        "Transformer Engine's fused cross entropy",
        {"--cross-entropy-loss-fusion": True, "--cross-entropy-fusion-impl": "te"},
        {"--cross-entropy-loss-fusion": True, "--cross-entropy-fusion-impl": "native"},
        "--cross-entropy-loss-fusion --cross-entropy-fusion-impl te",
        "Transformer Engine cross entropy loss fusion is disabled due to stability issues "
        "(arguments.py:1697-1702)",
    ),
    (
        "the fused cross entropy under deterministic mode",
        {"--cross-entropy-loss-fusion": True, "--deterministic-mode": True},
        {"--deterministic-mode": True},
        "--deterministic-mode --cross-entropy-loss-fusion",
        "--deterministic-mode requires cross_entropy_loss_fusion=False",
    ),
    (
        "unfused attention under CP",
        {"--context-parallel-size": 2, "--attention-backend": "unfused"},
        {"--context-parallel-size": 2, "--attention-backend": "fused"},
        "--attention-backend unfused --context-parallel-size 2",
        "Transformer Engine disables its unfused attention under context parallelism",
    ),
    (
        "the local implementation under CP",
        {"--context-parallel-size": 2, "--transformer-impl": "local"},
        {"--transformer-impl": "local"},
        "--transformer-impl local --context-parallel-size 2",
        "Context parallelism is only supported by TEDotProductAttention! "
        "(dot_product_attention.py:57-59)",
    ),
    (
        "the local attention backend without the local spec",
        {"--attention-backend": "local"},
        {"--attention-backend": "flash"},
        "--attention-backend local",
        "is only supported with --spec local (arguments.py:436-437)",
    ),
    (
        "bf16 with fp16",
        {"--bf16": True, "--fp16": True},
        {"--fp16": True},
        "--bf16 --fp16",
        "name two parameter dtypes; give one (arguments.py:1196, 1205",
    ),
    (
        "the sequence against 2 x CP",
        {"--context-parallel-size": 4, "--seq-length": 1020, "--max-position-embeddings": 1024},
        {"--context-parallel-size": 4, "--seq-length": 1016, "--max-position-embeddings": 1024},
        "--seq-length 1020",
        "is not divisible by 2 x CP = 8 (arguments.py:1335-1338)",
    ),
    (
        "heads against TP",
        {
            "--num-attention-heads": 6,
            "--hidden-size": 384,
            "--tensor-model-parallel-size": 4,
            "--sequence-parallel": True,
        },
        {"--num-attention-heads": 8, "--tensor-model-parallel-size": 4},
        "--num-attention-heads 6",
        "is not divisible by TP 4 (transformer_config.py:1446-1450)",
    ),
    (
        "query groups against TP",
        {
            "--group-query-attention": True,
            "--num-query-groups": 3,
            "--tensor-model-parallel-size": 2,
        },
        {
            "--group-query-attention": True,
            "--num-query-groups": 4,
            "--tensor-model-parallel-size": 2,
        },
        "--num-query-groups 3",
        "is neither a multiple nor a divisor of TP 2 (transformer_config.py:1461-1468)",
    ),
    (
        "layers against PP",
        {"--num-layers": 10, "--pipeline-model-parallel-size": 4},
        {"--num-layers": 12, "--pipeline-model-parallel-size": 4},
        "--num-layers 10",
        "does not split evenly over 4 pipeline stages (arguments.py:968-969, 985-998)",
    ),
    (
        "the hidden size against the heads",
        {"--hidden-size": 500},
        {"--hidden-size": 500, "--kv-channels": 64},
        "--hidden-size 500 --num-attention-heads 8",
        "the heads do not divide the hidden size and no --kv-channels is given",
    ),
    (
        "fewer positions than the sequence",
        {"--max-position-embeddings": 512},
        {"--max-position-embeddings": 2048},
        "--max-position-embeddings 512",
        "is below --seq-length 1024 (arguments.py:1353-1356)",
    ),
    (
        "squared ReLU with the fused bias + GeLU",
        {"--squared-relu": True},
        {"--squared-relu": True, "--no-bias-gelu-fusion": True},
        "--squared-relu",
        "Megatron-LM raises (argument_utils.py:318-321, transformer_config.py:2420-2424)",
    ),
    (
        "squared ReLU with SwiGLU",
        {"--squared-relu": True, "--swiglu": True, "--disable-bias-linear": True},
        {"--squared-relu": True, "--disable-bias-linear": True},
        "--squared-relu --swiglu",
        "name two activations",
    ),
    (
        "the parameter all-gather overlap without the distributed optimizer",
        {"--overlap-param-gather": True, "--overlap-grad-reduce": True},
        {
            "--overlap-param-gather": True,
            "--overlap-grad-reduce": True,
            "--use-distributed-optimizer": True,
        },
        "--overlap-param-gather",
        "only supported with distributed optimizer, megatron fsdp, or dist_muon",
    ),
    (
        "the parameter all-gather overlap without the gradient overlap",
        {"--overlap-param-gather": True, "--use-distributed-optimizer": True},
        {"--use-distributed-optimizer": True},
        "--overlap-param-gather",
        "Must use --overlap-param-gather with --overlap-grad-reduce",
    ),
    (
        "the optimizer-step overlap with distributed checkpoints",
        {
            "--pipeline-model-parallel-size": 4,
            "--num-virtual-stages-per-pipeline-rank": 2,
            "--use-distributed-optimizer": True,
            "--overlap-grad-reduce": True,
            "--overlap-param-gather": True,
            "--overlap-param-gather-with-optimizer-step": True,
        },
        {
            "--pipeline-model-parallel-size": 4,
            "--num-virtual-stages-per-pipeline-rank": 2,
            "--use-distributed-optimizer": True,
            "--overlap-grad-reduce": True,
            "--overlap-param-gather": True,
            "--overlap-param-gather-with-optimizer-step": True,
            "--ckpt-format": "torch",
        },
        "--overlap-param-gather-with-optimizer-step",
        "not supported with distributed checkpointing yet: give --ckpt-format torch",
    ),
    (
        "a2a+p2p without hierarchical CP sizes",
        {"--context-parallel-size": 4, "--cp-comm-type": "a2a+p2p"},
        {
            "--context-parallel-size": 4,
            "--cp-comm-type": "a2a+p2p",
            "--hierarchical-context-parallel-sizes": "2 2",
        },
        "--cp-comm-type a2a+p2p",
        "--hierarchical-context-parallel-sizes must be set when a2a+p2p is used in cp comm",
    ),
    (
        "an NVTE switch against the attention backend",
        {"--attention-backend": "flash"},
        {"--attention-backend": "fused"},
        "NVTE_FUSED_ATTN=1 --attention-backend flash",
        "NVTE_FUSED_ATTN set to 1, but expected 0 for attention backend flash",
    ),
    (
        "P2P warm-up overlap without the interleaved schedule",
        {"--overlap-p2p-communication-warmup-flush": True},
        {},
        "--overlap-p2p-communication-warmup-flush",
        "is only compatible with overlap_p2p_comm",
    ),
    (
        "expert-only flags without experts",
        {"--expert-model-parallel-size": 2},
        {**MOE, "--expert-model-parallel-size": 2},
        "--expert-model-parallel-size",
        "needs --num-experts (arguments.py:1655-1656)",
    ),
    (
        "experts against EP",
        {**MOE, "--expert-model-parallel-size": 3},
        {**MOE, "--expert-model-parallel-size": 4},
        "--expert-model-parallel-size 3",
        "does not divide --num-experts 8 (arguments.py:1657-1658)",
    ),
    (
        "expert biases at expert TP 2",
        {"--num-experts": 8, "--tensor-model-parallel-size": 2, "--sequence-parallel": True},
        {
            "--num-experts": 8,
            "--tensor-model-parallel-size": 2,
            "--sequence-parallel": True,
            "--expert-tensor-parallel-size": 1,
        },
        "--num-experts with linear biases at expert TP 2",
        "Bias in Moe is only supported when ETP==1",
    ),
    (
        "top-1 routing after the softmax",
        {**MOE, "--moe-router-topk": 1},
        {**MOE, "--moe-router-topk": 1, "--moe-router-pre-softmax": True},
        "--moe-router-topk 1",
        "Please use --moe-router-pre-softmax when topk is 1",
    ),
    (
        "the EP all-to-all overlap without EP",
        {
            **MOE,
            "--bf16": True,
            "--moe-token-dispatcher-type": "alltoall",
            "--overlap-moe-expert-parallel-comm": True,
        },
        {
            **MOE,
            "--bf16": True,
            "--moe-token-dispatcher-type": "alltoall",
            "--overlap-moe-expert-parallel-comm": True,
            "--expert-model-parallel-size": 2,
        },
        "--overlap-moe-expert-parallel-comm",
        "needs expert model parallelism (transformer_config.py:3002-3040)",
    ),
    (
        "MoE under TP without sequence parallelism",
        {**MOE, "--tensor-model-parallel-size": 2},
        {**MOE, "--tensor-model-parallel-size": 2, "--sequence-parallel": True},
        "--num-experts with --tensor-model-parallel-size > 1",
        "needs --sequence-parallel",
    ),
]


@pytest.mark.parametrize(
    ("refused", "read", "named", "reason"),
    [r[1:] for r in RULES],
    ids=[r[0] for r in RULES],
)
def test_each_rule_refuses_with_megatrons_reason(
    refused: dict[str, Any], read: dict[str, Any], named: str, reason: str
) -> None:
    env = {"NVTE_FUSED_ATTN": 1} if named.startswith("NVTE_") else None
    err = _refusal(refused, env)
    assert err.value == named
    assert reason in err.reason
    assert rule_problems(_read(read, env)) == []


def test_every_broken_rule_is_named_in_one_refusal() -> None:
    err = _refusal(
        {"--bf16": True, "--fp16": True, "--num-layers": 10, "--pipeline-model-parallel-size": 4}
    )
    assert err.value == "--bf16 --fp16, --num-layers 10"
    assert err.reason.startswith("2 arguments are refused: ")


def test_check_megatron_args_raises_on_arguments_built_directly() -> None:
    """The rules hold for ``MegatronArgs`` built without reading flags too (what the
    run's description calls)."""
    args = MegatronArgs(
        num_layers=8,
        hidden_size=512,
        num_attention_heads=8,
        seq_length=1024,
        micro_batch_size=1,
        max_position_embeddings=1024,
        recompute_granularity="full",
        recompute_method="uniform",
    )
    with pytest.raises(InputError) as err:
        check_megatron_args(args)
    assert err.value.value == "--recompute-granularity full"
    check_megatron_args(MegatronArgs(**{**args.__dict__, "recompute_num_layers": 1}))


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--normalization", "BatchNorm", "must be one of ['LayerNorm', 'RMSNorm']"),
        ("--position-embedding-type", "yarn", "yarn, mrope and relative position embeddings"),
        ("--transformer-impl", "inference_optimized", "not a training run's"),
        ("--attention-backend", "magic", "must be one of"),
    ],
)
def test_values_cpmem_does_not_price_are_refused(flag: str, value: str, says: str) -> None:
    flags: dict[str, object] = {flag: value}
    if flag.startswith("--moe"):
        flags.update(MOE)
    err = _refusal(flags)
    assert err.value == f"{flag} {value}"
    assert says in err.reason


def test_a_non_positive_size_is_refused_before_the_rules_that_divide_by_it() -> None:
    err = _refusal({"--tensor-model-parallel-size": 0})
    assert (err.value, err.reason) == (
        "--tensor-model-parallel-size 0",
        "must be a positive integer",
    )
