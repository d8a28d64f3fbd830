"""Megatron-LM's example training scripts, read as written (``data/examples/``: each
copied unedited from NVIDIA/Megatron-LM at d98e8a64, its source path in its header).

Each prices as written with at most ``--world-size`` / ``--vocab-size`` given, or is
refused with every problem in one refusal: Megatron-LM's own reason where Megatron-LM
would reject the run, else the feature cpmem does not price yet (FP8 in Megatron FSDP's
buffers, Megatron FSDP's double buffer).
Expected figures are worked out by hand from the script text:

- world: torchrun's ``--nproc_per_node x --nnodes``; DP = world / (TP x PP x CP);
  micro-batches = global batch / (micro-batch x DP);
- the vocabulary: ``NullTokenizer --vocab-size`` as given, a tokenizer whose files the
  script leaves to its caller (``$2``) needs ``--vocab-size``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cpmem.api import describe_megatron, price_step
from cpmem.errors import InputError
from cpmem.megatron.args import read_megatron_args
from cpmem.step.fp8 import Fp8

EXAMPLES = Path(__file__).parent / "data" / "examples"


def _refused(name: str, **given: int) -> InputError:
    with pytest.raises(InputError) as err:
        describe_megatron(EXAMPLES / name, **given)
    return err.value


def test_gpt3_175b_is_megatrons_own_refusal() -> None:
    err = _refused("gpt3__train_gpt3_175b_distributed.sh")
    # 8 GPUs on 1 node for TP 8 x PP 16; a batch-size schedule beside --global-batch-size
    assert "world_size=8" in err.value
    assert "TP x PP x CP = 8 x 16 x 1 = 128" in err.reason
    assert "'Cannot specify both --step-batch-size-schedule and --global-batch-size'" in (
        err.reason
    )
    assert "$3" not in err.reason  # the vocabulary files left to the caller: GPT-2's BPE
    err = _refused("gpt3__train_gpt3_175b_distributed.sh", world_size=128)
    assert "world_size" not in err.value
    assert "Cannot specify both" in err.reason


def test_mixtral_8x7b_as_written_names_the_world_and_the_tokenizer() -> None:
    err = _refused("mixtral__train_mixtral_8x7b_distributed.sh")
    assert err.value == "world_size=8, --tokenizer-type Llama2Tokenizer"
    assert "ETP x EP x PP = 1 x 8 x 4 = 32" in err.reason  # parallel_state's rule
    assert "$TOKENIZER_MODEL = $2 (the script's argument 2, left to its caller)" in err.reason


def test_mixtral_8x7b_prices_with_its_world_and_vocabulary() -> None:
    step = describe_megatron(
        EXAMPLES / "mixtral__train_mixtral_8x7b_distributed.sh", world_size=32, vocab_size=32_000
    )
    s = step.settings
    assert (s.world_size, s.layout.tp, s.pipeline.pp, s.layout.dp) == (32, 1, 4, 8)  # 32/4
    assert s.pipeline.microbatches == 32  # 256 / (1 x 8)
    g = step.geometry
    assert (g.hidden, g.vocab, g.num_experts, g.moe_top_k, g.kv_groups) == (4096, 32_000, 8, 2, 8)
    args = read_megatron_args(
        EXAMPLES / "mixtral__train_mixtral_8x7b_distributed.sh", world_size=32, vocab_size=32_000
    )
    assert "--no-position-embedding" in args.ignored  # beside rope: no change


def test_mamba_800m_names_its_tokenizer_then_prices_with_a_vocabulary() -> None:
    err = _refused("mamba__train.sh")
    assert err.value == "--tokenizer-type GPTSentencePieceTokenizer"
    assert "$TOKENIZER_PATH = $2" in err.reason and "give --vocab-size" in err.reason
    step = describe_megatron(EXAMPLES / "mamba__train.sh", vocab_size=256_000)
    s = step.settings
    assert (s.world_size, s.layout.dp, s.pipeline.microbatches) == (8, 8, 1)  # 32 / (4 x 8)
    # MODEL_SCALE="800M": the 48-symbol pattern, 20 Mamba-2 mixers (M), 4 attention (*)
    g = step.geometry
    assert len(g.mixers) == 48 and g.mixers.count("mamba") == 20
    assert (g.hidden, g.q_heads, g.kv_groups, g.vocab) == (1024, 16, 8, 256_000)
    assert step.plan.busiest_tokens == 4 * 4096  # micro-batch 4 of --seq-length 4096


def test_llama3_8b_prices_as_written_with_megatrons_default_recipe() -> None:
    """The script gives ``--fp8-format hybrid --fp8-param-gather`` and no ``--fp8-recipe``:
    the snapshot's default, delayed scaling, with its ``--fp8-amax-history-len 1024``; its
    ``--fp8-amax-compute-algo max`` changes no memory."""
    step = describe_megatron(EXAMPLES / "llama__train_llama3_8b_h100_fp8.sh")
    assert step.settings.fp8 == Fp8("delayed", param_gather=True, history=1024)
    s = step.settings
    # GPUS_PER_NODE=8 x NUM_NODES=1; TP 1 PP 1 CP 1: DP 8; 128 / (1 x 8) micro-batches
    assert (s.world_size, s.layout.dp, s.pipeline.microbatches) == (8, 8, 16)
    assert step.geometry.vocab == 128_256  # its MOCK default: NullTokenizer --vocab-size 128256
    args = read_megatron_args(EXAMPLES / "llama__train_llama3_8b_h100_fp8.sh")
    assert "--fp8-amax-compute-algo" in args.ignored


def test_llama3_8b_without_its_fp8_branch_prices_as_the_rest_is_written() -> None:
    text = (EXAMPLES / "llama__train_llama3_8b_h100_fp8.sh").read_text(encoding="utf-8")
    bf16 = text.replace('DTYPE="fp8"', 'DTYPE="bf16"')  # the script's own switch
    step = describe_megatron(bf16)
    s = step.settings
    assert (s.world_size, s.layout.dp, s.pipeline.microbatches) == (8, 8, 16)  # 128/(1x8)
    g = step.geometry
    assert (g.hidden, g.vocab, g.kv_groups, g.head_dim, g.ffn) == (4096, 128_256, 8, 128, 14336)
    assert len(g.mixers) == 32


def test_llama3_8b_with_the_tensorwise_recipe_prices_its_fp8_branch() -> None:
    """The script's FP8 branch with ``--fp8-recipe tensorwise`` added to its array: FP8
    parameters gathered (``--fp8-param-gather``), tensorwise scaling, the rest as
    written."""
    text = (EXAMPLES / "llama__train_llama3_8b_h100_fp8.sh").read_text(encoding="utf-8")
    assert text.count('"--fp8-format hybrid"') == 1
    tensorwise = text.replace(
        '"--fp8-format hybrid"', '"--fp8-format hybrid" "--fp8-recipe tensorwise"'
    )
    step = describe_megatron(tensorwise)
    assert step.settings.fp8 == Fp8("tensorwise", param_gather=True)
    assert step.settings.world_size == 8


def test_gpt_oss_is_refused_with_megatrons_pipeline_rule_alone() -> None:
    err = _refused("gptoss__02_train.sh")
    # PP_SIZE=${WORLD_SIZE}: 8 stages for 12 layers; its gpt-oss flags (quick GeGLU with
    # its offset and clamp, the learnable softmax, the router's z-loss, the unfused
    # bias-dropout-add) are read (test_gpt_oss_flags.py)
    assert err.value == "--num-layers 12"
    assert "does not split evenly over 8 pipeline stages" in err.reason


@pytest.mark.parametrize("pp", [1, 2, 4])
def test_gpt_oss_with_a_pipeline_megatron_accepts_prices_its_fp8_moe_layers(pp: int) -> None:
    # the layout given beside the script; its FP8 (hybrid, delayed, --fp8-param-gather,
    # --fp8-amax-history-len 1024) on MoE layers under --recompute-activations (selective
    # core_attn). Delayed scaling's state by hand (TE b9d690e0 module/base.py:979-981: 3
    # forward and 2 backward quantizers per GEMM; quantization.py:1409-1418: a scale [n]
    # and an amax history [1024, n] fp32 per direction, each in 512 B blocks): per layer
    # the QKV and output projections (1 GEMM each), DotProductAttention (3) and the 4
    # experts' fc1 and fc2 GroupedLinear (4 GEMMs each, EP 1; no shared expert):
    #   1 GEMM:  fwd 512 + 12,288, bwd 512 + 8,192        = 21,504
    #   3 GEMMs: fwd 512 + 36,864, bwd 512 + 24,576       = 62,464
    #   4 GEMMs: fwd 512 + 49,152, bwd 512 + 32,768       = 82,944
    #   layer: 2 x 21,504 + 62,464 + 2 x 82,944           = 271,360
    # over the stage's 12 / PP layers
    from cpmem.pricing.registry import price
    from cpmem.pricing.static import StaticComponent

    step = describe_megatron(EXAMPLES / "gptoss__02_train.sh", pp=pp)
    assert step.settings.fp8 == Fp8("delayed", True, 1024)
    assert step.recompute.label == "selective(core_attn)"
    static = price(step, "tight").static.components
    assert static[StaticComponent.FP8_SCALING_STATE] == 271_360 * 12 // pp


def test_megatron_fsdp_llama3_8b_prices_as_written() -> None:
    # 8 GPUs (torchrun's 8 x 1), DP 8; its mock NullTokenizer's --vocab-size 128256.
    # Megatron FSDP optim_grads_params with --use-nccl-ub (the double buffer on,
    # arguments.py:1172-1176), FP8 delayed with --fp8-param-gather in its buffers
    step = describe_megatron(EXAMPLES / "megatron_fsdp__train_llama3_8b_fsdp_h100_fp8.sh")
    opt = step.settings.optimizer
    assert (opt.fsdp, opt.fsdp_buffers, step.settings.layout.dp) == (
        "optim_grads_params",
        "nccl-ub",
        8,
    )
    assert step.geometry.vocab == 128_256
    assert step.settings.fp8 == Fp8("delayed", True, 1024)


def test_the_deepseek_v3_sbatch_script_is_read_from_the_command_it_hands_srun() -> None:
    err = _refused("megatron_fsdp__sbatch_mfsdp_deepseek_v3.sh")
    # TRAINING_CMD's python line, run by srun inside the sbatch here-document: no torchrun
    # (the world is the job's nodes, "your_own_num_nodes"), Megatron FSDP, a hub
    # tokenizer; every one in the one refusal. Its flex dispatcher is HybridEP's at expert
    # TP 1 with an fp32 router, which is priced: not among them
    assert err.value.startswith("--world-size, ")
    assert "no torchrun launcher" in err.reason
    assert "--moe-token-dispatcher-type" not in err.value
    assert "--tokenizer-type HuggingFaceTokenizer" in err.value
    # Megatron FSDP of its MTP depth and its forced load balancing are priced
    assert "--use-megatron-fsdp" not in err.value
    assert "--moe-router-force-load-balancing" not in err.value


def test_the_deepseek_v3_sbatch_script_prices_with_its_world_and_vocabulary() -> None:
    step = describe_megatron(
        EXAMPLES / "megatron_fsdp__sbatch_mfsdp_deepseek_v3.sh", world_size=256, vocab_size=129_280
    )
    # --moe-router-force-load-balancing: random router logits, the balanced expectation
    assert step.moe_routing == "balanced"
    static = price_step(step, "tight").static.components
    # the outside bucket kept gathered, whole, in bf16: the word embedding and the untied
    # output layer (129,280 x 7168 each: 3232 divides 129,280), the final norm, the MTP
    # depth's enorm, hnorm, final norm (7168 each) and eh_proj (7168 x 14,336):
    # 1,956,147,200 elements; chunk 14,336 (eh_proj's row), padded to 256 x 14,336 =
    # 3,670,016: 534 of them, 1,959,788,544
    outside = 2 * 129_280 * 7168 + 4 * 7168 + 7168 * 14_336
    assert outside == 1_956_147_200 and 533 * 3_670_016 < outside <= 534 * 3_670_016
    assert static["fsdp_kept_gathered"] == 2 * 534 * 3_670_016
