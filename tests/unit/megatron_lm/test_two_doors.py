"""The same Megatron-LM run through both doors: its own flags (``--megatron-args``) and a
published config with ``--runtime megatron-lm --training full`` and the layout's flags.
One step description, one policy: the same bytes.

Expected outcome: equality of the two doors' figures (neither computed by hand here; the
layer terms are held to hand counts in tests/unit/pricing/test_megatron_runtime.py).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from cpmem.api import describe_megatron
from cpmem.megatron.args import MegatronArgs
from cpmem.pricing.registry import price
from cpmem.step.describe import describe_step

LLAMA_CONFIG = Path(__file__).resolve().parents[3] / "examples/llama-3.1-8b-style/config.json"

LLAMA_FLAGS = MegatronArgs(
    # Llama-3.1-8B as Megatron-LM's examples train it (examples/llama): the geometry of
    # the published config, its tokenizer's vocabulary stated
    num_layers=32,
    hidden_size=4096,
    ffn_hidden_size=14336,
    num_attention_heads=32,
    group_query_attention=True,
    num_query_groups=8,
    swiglu=True,
    normalization="RMSNorm",
    position_embedding_type="rope",
    add_bias_linear=False,
    untie_embeddings_and_output_weights=True,
    tokenizer_type="NullTokenizer",
    vocab_size=128256,
    hidden_dropout=0.0,
    attention_dropout=0.0,
    seq_length=8192,
    max_position_embeddings=131072,
    micro_batch_size=1,
    global_batch_size=8,
    bf16=True,
    tensor_model_parallel_size=4,
    pipeline_model_parallel_size=2,
    sequence_parallel=True,
    use_distributed_optimizer=True,
)


@pytest.mark.parametrize(
    ("changes", "keywords"),
    [
        ({}, {}),
        ({"recompute_granularity": "selective"}, {"recompute": "selective"}),
        ({"context_parallel_size": 2}, {"cp": 2}),
    ],
    ids=["none", "selective", "cp2"],
)
def test_flags_and_config_price_the_same_run(
    changes: dict[str, object], keywords: dict[str, object]
) -> None:
    args = replace(LLAMA_FLAGS, **changes)  # type: ignore[arg-type]
    world, dp = 16, 2 // int(keywords.get("cp", 1))  # type: ignore[call-overload]
    flags = describe_megatron(args, world_size=world, device="h100")
    config = describe_step(
        config=LLAMA_CONFIG,
        lengths=[8192],  # one micro-batch: --micro-batch-size 1 of --seq-length tokens
        runtime="megatron-lm",
        training="full",
        tp=4,
        pp=2,
        dp=dp,
        microbatches=8 // dp,
        distributed_optimizer=True,
        device="h100",
        **keywords,  # type: ignore[arg-type]
    )
    a, b = price(flags), price(config)
    assert a.policy == b.policy == "tight"
    assert a.static is not None and b.static is not None
    assert a.static.components == b.static.components
    assert (a.peak_bytes, a.estimate_bytes) == (b.peak_bytes, b.estimate_bytes)
