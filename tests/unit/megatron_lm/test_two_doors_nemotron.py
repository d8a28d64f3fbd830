"""NVIDIA-Nemotron-3-Nano-30B-A3B through both doors: Megatron-LM's own flags for it
(``data/nemotron-3-nano-30b-a3b.flags``: examples/post_training/modelopt/conf/nvidia/ at
the snapshot) and its published ``config.json`` (``examples/nemotron-3-nano-30b-a3b``)
under ``--runtime megatron-lm --training full``: the same stack and shapes, and the same
static memory on the same layout (within 2%; the parameters' buffers exactly).

What differs between the two, and why it moves no static byte: the flags leave the
dropouts at Megatron-LM's 0.1 (the config says 0.0), the run's sequence (8,192) is not the
config's positions (262,144), and ``--moe-grouped-gemm`` adds Transformer Engine's grouped
GEMM workspaces, a process setting the config cannot say.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from cpmem.megatron.args import read_megatron_args
from cpmem.megatron.describe import describe_megatron, megatron_geometry
from cpmem.model.hf_config import load_config
from cpmem.pricing.static import static_memory
from cpmem.step.describe import describe_settings, describe_step

FLAGS = Path(__file__).parent / "data" / "nemotron-3-nano-30b-a3b.flags"
CONFIG = Path(__file__).resolve().parents[3] / "examples/nemotron-3-nano-30b-a3b/config.json"

SHAPES = (
    "hidden",
    "mixers",
    "mlps",
    "mtp_mixers",
    "mtp_mlps",
    "mtp_depths",
    "q_heads",
    "kv_groups",
    "head_dim",
    "vocab",
    "ffn",
    "mamba_heads",
    "mamba_head_dim",
    "mamba_state_dim",
    "mamba_groups",
    "mamba_conv_kernel",
    "mamba_chunk",
    "num_experts",
    "moe_top_k",
    "expert_ffn",
    "shared_expert_ffn",
    "shared_expert_gate",
    "router_scoring",
    "router_bias",
    "gated_mlp",
    "norm",
    "positions",
    "qk_norm",
    "attention_bias",
    "mlp_bias",
    "tied_embeddings",
    "vocab_multiple",
)


def test_the_flags_and_the_config_build_one_model() -> None:
    flags = megatron_geometry(read_megatron_args(FLAGS))
    config = load_config(CONFIG)
    assert {f: getattr(flags, f) for f in SHAPES} == {f: getattr(config, f) for f in SHAPES}
    assert flags.layers == 52 and flags.mixer_count("mamba") == 23


@pytest.mark.parametrize(("tp", "ep", "world"), [(1, 8, 8), (2, 8, 16), (4, 4, 32)])
def test_the_flags_and_the_config_hold_the_same_static_memory(tp: int, ep: int, world: int) -> None:
    args = replace(
        read_megatron_args(FLAGS),
        tensor_model_parallel_size=tp,
        sequence_parallel=tp > 1,
        expert_model_parallel_size=ep,
        expert_tensor_parallel_size=1,
        use_distributed_optimizer=True,
    )
    flags = describe_megatron(args, world_size=world, device="h100", rank="last").settings
    config = describe_settings(
        config=CONFIG,
        runtime="megatron-lm",
        training="full",
        tp=tp,
        ep=ep,
        etp=1,
        dp=world // tp,
        distributed_optimizer=True,
        device="h100",
        rank="last",
    )
    a, b = static_memory(flags, stage=0), static_memory(config, stage=0)
    for part in ("weights", "gradient_buffer", "optimizer_states"):
        assert a.components[part] == b.components[part], part
    assert abs(a.total - b.total) <= 0.02 * b.total


@pytest.mark.parametrize(("tp", "ep", "world"), [(1, 8, 8), (2, 8, 16)])
def test_the_flags_and_the_config_price_the_same_peak(tp: int, ep: int, world: int) -> None:
    """The same run through both doors, priced (tight, the Megatron-LM runtime's): the
    flags with the config's dropouts (0.0; the flags leave Megatron-LM's 0.1), the
    config with the flags' request (--micro-batch-size sequences of --seq-length), layout,
    attention backend and MoE dispatcher settings; the peaks within 2%."""
    from cpmem.pricing.registry import price

    args = replace(
        read_megatron_args(FLAGS),
        tensor_model_parallel_size=tp,
        sequence_parallel=tp > 1,
        expert_model_parallel_size=ep,
        expert_tensor_parallel_size=1,
        use_distributed_optimizer=True,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
    flags = describe_megatron(args, world_size=world, device="h100", rank="last")
    s = flags.settings
    config = describe_step(
        config=CONFIG,
        lengths=[args.seq_length] * args.micro_batch_size,
        runtime=s.runtime,
        training="full",
        tp=tp,
        ep=ep,
        etp=1,
        dp=world // tp,
        distributed_optimizer=True,
        device="h100",
        rank="last",
        microbatches=s.pipeline.microbatches,
        head=s.head,
        grad_bytes=s.optimizer.grad_bytes,
    )
    a, b = price(flags, "tight").peak_bytes, price(config, "tight").peak_bytes
    assert abs(a - b) <= 0.02 * b, (a, b)
