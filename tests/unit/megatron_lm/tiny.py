"""The tiny GPT of Megatron-LM's functional tests, as ``MegatronArgs`` and steps of it.

``golden/megatron/cases/gpt/gpt3_mcore_te_tp2_pp2/model_config.yaml`` (and the family's
other cases): 12 layers, hidden 512, 8 heads, sequence 1024 (1024 learned positions),
micro-batch 4, global batch 32, bf16, GPT-2's BPE vocabulary; the rest Megatron-LM's
defaults (FFN 4h, LayerNorm, linear biases, dropouts 0.1, tied embeddings).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from cpmem.megatron.args import MegatronArgs
from cpmem.megatron.describe import describe_megatron
from cpmem.pricing.estimate import Estimate
from cpmem.pricing.registry import price
from cpmem.step.step import Step

TINY = MegatronArgs(
    num_layers=12,
    hidden_size=512,
    num_attention_heads=8,
    seq_length=1024,
    max_position_embeddings=1024,
    micro_batch_size=4,
    global_batch_size=32,
    bf16=True,
)


FLAGS: dict[str, object] = {
    "--num-layers": 8,
    "--hidden-size": 512,
    "--num-attention-heads": 8,
    "--seq-length": 1024,
    "--max-position-embeddings": 1024,
    "--micro-batch-size": 1,
}
"""The rule tests' base as command-line flags: 8 layers of the tiny GPT's shapes, one
sequence a micro-batch."""


SMALL: dict[str, object] = {
    "--num-layers": 2,
    "--hidden-size": 64,
    "--num-attention-heads": 4,
    "--seq-length": 128,
    "--max-position-embeddings": 128,
    "--micro-batch-size": 1,
}
"""The argument tests' base: the smallest GPT the flags' rules are read on (2 layers, hidden
64, 4 heads, sequence 128, micro-batch 1), the flag under test given beside it."""


def tiny(**changes: Any) -> MegatronArgs:
    """The tiny GPT with some arguments changed (argparse names)."""
    return replace(TINY, **changes)


def step_of(
    args: MegatronArgs,
    world_size: int = 8,
    rank: str | int = "last",
    device: str = "h100",
    attention_backend: str | None = None,
    **overrides: Any,
) -> Step:
    """The step of ``args`` on ``world_size`` GPUs, answered for ``rank``."""
    return describe_megatron(
        args,
        world_size=world_size,
        rank=rank,
        device=device,
        attention_backend=attention_backend,
        **overrides,
    )


def priced(args: MegatronArgs, **options: Any) -> Estimate:
    """``step_of`` priced by ``tight`` (the policy every measured runtime checks)."""
    return price(step_of(args, **options), "tight")


def static_of(args: MegatronArgs, **options: Any) -> dict[str, int]:
    """The named static bytes of the answered rank's stage."""
    est = priced(args, **options)
    assert est.static is not None
    return dict(est.static.components)
