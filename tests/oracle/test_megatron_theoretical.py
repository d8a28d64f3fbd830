"""``oracles.peers.megatron_args_theoretical``: Megatron-LM's ``report_theoretical_memory``
over its own arguments, each figure worked by hand from the formula's published algebra.

The runs are Megatron-LM's functional-test GPT (``cases/gpt/*/model_config.yaml`` under
``/work/shared/golden-sources/megatron-lm/``: 12 layers, hidden 512, 8 heads, sequence
1,024, micro-batch 4, global batch 32, GPT-2's 50,257-token vocabulary) with the values
``validate_args`` derives (``kv_channels = h/heads = 64``, ``ffn = 4h = 2048``, the
vocabulary padded to a multiple of 128 x TP, ``dp = world/(tp·pp·cp)``), and one
7B-like model. The formula counts no linear biases and no position embedding.

Throughout: ``s·b = 1024 x 4 = 4,096`` tokens, ``s·b·h = 2,097,152``; per layer the
attention's ``2·h²·(1 + groups/heads)·(64·8/512) = 4h² = 1,048,576`` parameters and the
MLP's ``2·h·ffn = 8h² = 2,097,152``, so the layers' TP-split weights are ``12 x
3,145,728 = 37,748,736``; each layer's two LayerNorms ``2·2·h = 2,048`` and the final
norm ``2·h = 1,024`` are held whole: ``12 x 2,048 + 1,024 = 25,600``.
"""

from __future__ import annotations

from typing import Any

import pytest

from oracles.peers import megatron_args_theoretical, megatron_args_weight_and_optimizer_bytes

TOKENS = 1024 * 4  # seq_length x micro_batch_size
SBH = TOKENS * 512
LAYERS_TP_SPLIT = 12 * (4 * 512**2 + 8 * 512**2)  # 37,748,736
LAYERS_WHOLE = 12 * 2 * 2 * 512 + 2 * 512  # 25,600


def _tiny(**overrides: Any) -> dict[str, Any]:
    """The functional tests' tiny GPT at TP 1, PP 1 on 8 GPUs, as argparse leaves it."""
    args: dict[str, Any] = {
        "hybrid_layer_pattern": None,
        "num_layers": 12,
        "hidden_size": 512,
        "num_attention_heads": 8,
        "kv_channels": 64,
        "group_query_attention": False,
        "ffn_hidden_size": 2048,
        "swiglu": False,
        "normalization": "LayerNorm",
        "padded_vocab_size": 50304,  # 50,257 up to a multiple of 128
        "untie_embeddings_and_output_weights": False,
        "multi_latent_attention": False,
        "num_experts": None,
        "moe_shared_expert_intermediate_size": None,
        "moe_latent_size": None,
        "mtp_num_layers": None,
        "tensor_model_parallel_size": 1,
        "pipeline_model_parallel_size": 1,
        "virtual_pipeline_model_parallel_size": None,
        "expert_tensor_parallel_size": 1,
        "expert_model_parallel_size": 1,
        "world_size": 8,
        "data_parallel_size": 8,
        "use_distributed_optimizer": False,
        "seq_length": 1024,
        "micro_batch_size": 4,
        "sequence_parallel": False,
        "recompute_granularity": None,
        "num_microbatches": 1,  # 32 / (4 x 8)
    }
    args.update(overrides)
    return args


def _assert_figures(got: dict[str, float], weights: float, activations: float) -> None:
    assert got["weight_and_optimizer_bytes"] == pytest.approx(weights, rel=1e-12, abs=0)
    assert got["activation_bytes"] == pytest.approx(activations, rel=1e-12, abs=0)
    assert got["total_bytes"] == pytest.approx(weights + activations, rel=1e-12, abs=0)


def test_pp1_distributed_optimizer_without_sp() -> None:
    # weights: 37,748,736 + embedding 512 x 50,304 = 25,755,648, over TP 1, + 25,600 whole
    # = 63,529,984 parameters x (6 + 12/dp 8 = 7.5 B) = 476,474,880 B (454.40 MB)
    weights = (LAYERS_TP_SPLIT + 512 * 50304 + LAYERS_WHOLE) * 7.5
    assert weights == 476_474_880
    # TP 1 has no SP: the without-SP branch. Per layer s·b·h·(10 + 24/1) = 71,303,168,
    # x 12 = 855,638,016; + 8·s·b (token ids) 32,768 + s·b·h (dropout mask) 2,097,152
    # = 857,767,936; PP 1 adds the bf16 logits and the final norm's output:
    # 2·(4,096 x 50,304 + 2,097,152) = 416,284,672; 1,274,052,608 x 1.05
    layers = SBH * 34 * 12
    assert layers == 855_638_016
    activations = (layers + 8 * TOKENS + SBH + 2 * (TOKENS * 50304 + SBH)) * 1.05
    assert activations == pytest.approx(1_337_755_238.4, rel=1e-15)
    got = megatron_args_theoretical(_tiny(use_distributed_optimizer=True))
    _assert_figures(got, weights, activations)


def test_pp1_plain_adam_untied_and_sp_without_selective_recompute() -> None:
    # TP 2 on 8 GPUs: dp 4, vocabulary padded to a multiple of 256: 50,432.
    # weights: (37,748,736 + 512 x 50,432 = 25,821,184) / 2 = 31,784,960, + the untied
    # output layer's 25,821,184 / 2 = 12,910,592 (PP 1: on the same stage), + 25,600 whole
    # = 44,721,152 parameters x 18 B (bf16 weight, fp32 grad, fp32 master, two moments)
    weights = ((LAYERS_TP_SPLIT + 2 * 512 * 50432) / 2 + LAYERS_WHOLE) * 18
    assert weights == 804_980_736
    # SP on but no selective recompute: still the without-SP branch. Per layer
    # s·b·h·(10 + 24/2) = 46,137,344, x 12 = 553,648,128; + 32,768 + 2,097,152;
    # + 2·(4,096 x 50,432 / 2 + 2,097,152) = 210,763,776; = 766,541,824 x 1.05
    activations = (SBH * 22 * 12 + 8 * TOKENS + SBH + 2 * (TOKENS * 50432 / 2 + SBH)) * 1.05
    assert activations == pytest.approx(804_868_915.2, rel=1e-15)
    args = _tiny(
        tensor_model_parallel_size=2,
        data_parallel_size=4,
        padded_vocab_size=50432,
        untie_embeddings_and_output_weights=True,
        sequence_parallel=True,
        num_microbatches=2,
    )
    _assert_figures(megatron_args_theoretical(args), weights, activations)
    assert megatron_args_weight_and_optimizer_bytes(args) == weights


def test_pp2_interleaved_first_stage() -> None:
    # TP 1, PP 2, 3 virtual stages a rank; dp 4, distributed optimizer (6 + 12/4 = 9 B).
    # weights: the first stage's half of the layers 18,874,368 + the embedding
    # 25,755,648, + half the whole weights 12,800 = 44,642,816 x 9 = 401,785,344 B
    weights = (LAYERS_TP_SPLIT / 2 + 512 * 50304 + LAYERS_WHOLE / 2) * 9
    assert weights == 401_785_344
    # without SP: 855,638,016 (all 12 layers: L/pp layers x pp micro-batches in flight)
    # + 8·s·b·pp 65,536 + s·b·h·pp 4,194,304 = 859,897,856, x the interleaving penalty
    # 1 + (2 - 1)/(2 x 3) = 7/6; no output layer at PP 2; x 1.05 = 1,053,374,873.6
    activations = (SBH * 34 * 12 + 8 * TOKENS * 2 + SBH * 2) * (1 + 1 / 6) * 1.05
    assert activations == pytest.approx(1_053_374_873.6, rel=1e-12)
    args = _tiny(
        pipeline_model_parallel_size=2,
        virtual_pipeline_model_parallel_size=3,
        data_parallel_size=4,
        use_distributed_optimizer=True,
        num_microbatches=2,
    )
    _assert_figures(megatron_args_theoretical(args), weights, activations)


def test_sp_and_selective_recompute_branch() -> None:
    # TP 4 on 8 GPUs: dp 2, vocabulary padded to a multiple of 512: 50,688.
    # weights: (37,748,736 + 512 x 50,688 = 25,952,256) / 4 = 15,925,248, + 25,600
    # = 15,950,848 x (6 + 12/2 = 12 B) = 191,410,176 B (182.54 MB)
    weights = ((LAYERS_TP_SPLIT + 512 * 50688) / 4 + LAYERS_WHOLE) * 12
    assert weights == 191_410_176
    # Table 2's SP + selective row: per layer s·b·h·(18 + 4·2048/512) = 34·s·b·h
    # = 71,303,168, x 12 = 855,638,016; + 32,768 + 2,097,152; PP 1: the output layer's
    # input and the cross entropy, 4·s·b·h·(1 + 50,688/512 = 99) = 838,860,800;
    # = 1,696,628,736, all over TP 4 = 424,157,184 B (404.51 MB); no 1.05
    activations = (SBH * 34 * 12 + 8 * TOKENS + SBH + 4 * SBH * (1 + 99)) / 4
    assert activations == 424_157_184
    args = _tiny(
        tensor_model_parallel_size=4,
        data_parallel_size=2,
        padded_vocab_size=50688,
        use_distributed_optimizer=True,
        sequence_parallel=True,
        recompute_granularity="selective",
        num_microbatches=4,
    )
    _assert_figures(megatron_args_theoretical(args), weights, activations)


def test_1f1b_with_fewer_microbatches_than_stages() -> None:
    # TP 2, PP 4, global batch 8: dp 1, 2 micro-batches for 4 stages. SP + selective:
    # 855,638,016 + 8·s·b·4 131,072 + s·b·h·4 8,388,608 = 864,157,696, x min(1, 2/4),
    # no output layer at PP 4, over TP 2 = 216,039,424 B (206.03 MB)
    activations = (SBH * 34 * 12 + 8 * TOKENS * 4 + SBH * 4) * (2 / 4) / 2
    assert activations == 216_039_424
    args = _tiny(
        tensor_model_parallel_size=2,
        pipeline_model_parallel_size=4,
        data_parallel_size=1,
        padded_vocab_size=50432,
        sequence_parallel=True,
        recompute_granularity="selective",
        num_microbatches=2,
    )
    assert megatron_args_theoretical(args)["activation_bytes"] == activations


def test_gqa_swiglu_rmsnorm_7b_like() -> None:
    # 32 layers, h 4096, 32 heads of 128, 8 query groups, SwiGLU ffn 14,336, RMSNorm,
    # vocabulary 131,073 padded to a multiple of 512: 131,584, untied; TP 4, PP 2 on 64
    # GPUs: dp 8. Per layer: attention 2·h²·(1 + 8/32)·(128 x 32/4096) = 2.5h²
    # = 41,943,040, MLP 2·h·14,336·3/2 = 176,160,768; x 32 / 2 stages = 3,489,660,928,
    # + the embedding 4096 x 131,584 = 538,968,064 (the untied output layer is another
    # stage's), over TP 4 = 1,007,157,248; RMSNorm whole: (32 x 2 x 4096 + 4096) / 2
    # = 133,120; x (6 + 12/8) = 7,554,677,760 B (7,204.70 MB)
    h = 4096
    layer = 2 * h * h * 1.25 + 2 * h * 14336 * 1.5
    weights = ((32 * layer / 2 + h * 131584) / 4 + (32 * 2 * h + h) / 2) * 7.5
    assert weights == 7_554_677_760
    # SP + selective: s·b·h = 8192 x 4096 = 33,554,432; (18 + 4 x 14,336/4096 = 14)
    # x 32 layers = 34,359,738,368, + 8·s·b·2 + s·b·h·2, x min(1, 16/2) = 1, over 4
    sbh = 8192 * h
    activations = (sbh * 32 * 32 + 8 * 8192 * 2 + sbh * 2) / 4
    assert activations == 8_606_744_576
    args = _tiny(
        num_layers=32,
        hidden_size=h,
        num_attention_heads=32,
        kv_channels=128,
        group_query_attention=True,
        num_query_groups=8,
        ffn_hidden_size=14336,
        swiglu=True,
        normalization="RMSNorm",
        padded_vocab_size=131584,
        untie_embeddings_and_output_weights=True,
        tensor_model_parallel_size=4,
        pipeline_model_parallel_size=2,
        world_size=64,
        data_parallel_size=8,
        use_distributed_optimizer=True,
        seq_length=8192,
        micro_batch_size=1,
        sequence_parallel=True,
        recompute_granularity="selective",
        num_microbatches=16,
    )
    _assert_figures(megatron_args_theoretical(args), weights, activations)


def test_routed_experts_shard_over_expert_parallel_and_their_own_dp() -> None:
    # 4 experts of width 1,024 on every other layer (moe_layer_freq 2: layers 0, 2, ..,
    # 10), EP 4, TP 1, 8 GPUs: expert dp = 8 // (1 x 4 x 1) = 2. Per MoE layer: routed
    # 2 x 512 x 1,024 x 4 = 4,194,304 (over EP 4), router 512 x 4 + 4 biases = 2,052
    # (whole). TP-split: 6 dense layers x 3,145,728 + 6 MoE layers' attention x 1,048,576
    # + the embedding 25,755,648 = 50,921,472; whole: 6 x 2,048 + 6 x (2,048 + 2,052)
    # + 1,024 = 37,912; experts 6 x 4,194,304 / 4 = 6,291,456.
    # (50,921,472 + 37,912) x (6 + 12/8) + 6,291,456 x (6 + 12/2) = 457,692,852 B
    weights = (50_921_472 + 37_912) * 7.5 + 6_291_456 * 12
    assert weights == 457_692_852
    args = _tiny(
        num_experts=4,
        moe_layer_freq=2,
        moe_ffn_hidden_size=1024,
        add_bias_linear=True,
        expert_model_parallel_size=4,
        use_distributed_optimizer=True,
    )
    assert megatron_args_weight_and_optimizer_bytes(args) == weights


def test_the_arguments_are_left_as_given() -> None:
    args = _tiny(group_query_attention=False, num_query_groups=2)
    megatron_args_theoretical(args)
    assert args["num_query_groups"] == 2  # the source overwrites it on its Namespace


@pytest.mark.parametrize("key", ["seq_length", "num_microbatches", "hybrid_layer_pattern"])
def test_a_missing_argument_is_named(key: str) -> None:
    args = _tiny()
    del args[key]
    with pytest.raises(KeyError, match=key):
        megatron_args_theoretical(args)


def test_gqa_needs_its_query_groups() -> None:
    with pytest.raises(KeyError, match="num_query_groups"):
        megatron_args_theoretical(_tiny(group_query_attention=True))


def test_hybrid_models_have_no_figure() -> None:
    with pytest.raises(ValueError, match="hybrid"):
        megatron_args_theoretical(_tiny(hybrid_layer_pattern="M*M*"))
