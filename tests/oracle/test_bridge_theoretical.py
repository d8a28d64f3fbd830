"""``oracles.peers_bridge``: Megatron-Bridge's ``estimate_training_memory`` over Bridge's own
configuration fields, and over Megatron-LM's arguments, each figure worked by hand from
the formula's algebra (``theoretical_memory_utils.py`` at Megatron-Bridge 067f987d).

The model is Megatron-LM's functional-test GPT (12 layers, hidden 512, 8 heads of 64,
FFN 2,048, sequence 1,024, micro-batch 4, GPT-2's vocabulary padded to a multiple of
128 x TP: 50,304 at TP 1, 50,432 at TP 2), as ``tests/oracle/test_megatron_theoretical.py``
uses it.

Throughout: ``s·b = 4,096`` tokens, ``s·b·h = 2,097,152``. Bridge's parameters a layer:
the attention ``2·h²·(1 + 8/8)·(64·8/512) = 4h² = 1,048,576``, the ungated MLP's two
projections ``2·h·2,048 = 2,097,152``, the norms ``4h = 2,048`` (a LayerNorm's weight and
bias twice, whatever the normalization): 3,147,776; x 12 = 37,773,312, + the final norm
``2h = 1,024`` = 37,774,336, all divided by ``pp·tp``. Its activations a layer: Table 2's
``s·b·h·(18 + 4·ffn/h) = 34·s·b·h = 71,303,168``; x 12 = 855,638,016.
"""

from __future__ import annotations

from typing import Any

import pytest

from oracles.peers_bridge import (
    bridge_args_theoretical,
    bridge_config_from_megatron_args,
    bridge_estimate_training_memory,
)

SBH = 4096 * 512
LAYERS_DENSE = 12 * 3_147_776 + 1_024  # 37,774,336: the layers and the final norm
LAYERS_ACT = 12 * 34 * SBH  # 855,638,016
EMB_TP1 = 512 * 50304  # 25,755,648
EMB_TP2 = 512 * 50432  # 25,821,184


def _config(*, dp: int = 8, dist_opt: bool = False, mbs: int = 4, **model: Any) -> dict[str, Any]:
    """The tiny GPT as a Bridge ``ConfigContainer`` (TP 1, PP 1, CP 1 unless overridden)."""
    fields: dict[str, Any] = {
        "num_layers": 12,
        "hidden_size": 512,
        "num_attention_heads": 8,
        "kv_channels": 64,
        "num_query_groups": 8,
        "ffn_hidden_size": 2048,
        "gated_linear_unit": False,
        "activation_func": "gelu",
        "num_moe_experts": None,
        "share_embeddings_and_output_weights": True,
        "vocab_size": 50304,
        "should_pad_vocab": False,
        "make_vocab_size_divisible_by": 128,
        "tensor_model_parallel_size": 1,
        "pipeline_model_parallel_size": 1,
        "virtual_pipeline_model_parallel_size": None,
        "context_parallel_size": 1,
        "seq_length": 1024,
        "sequence_parallel": False,
        "recompute_granularity": None,
    }
    fields.update(model)
    return {
        "model": fields,
        "train": {"micro_batch_size": mbs},
        "optimizer": {"use_distributed_optimizer": dist_opt},
        "data_parallel_size": dp,
    }


def _assert(got: dict[str, float], weights: float, activations: float) -> None:
    assert got["weight_and_optimizer_bytes"] == pytest.approx(weights, rel=1e-12, abs=0)
    assert got["activation_bytes"] == pytest.approx(activations, rel=1e-12, abs=0)
    assert got["total_bytes"] == pytest.approx(weights + activations, rel=1e-12, abs=0)


def test_pp1_distributed_optimizer() -> None:
    # weights: 37,774,336 / (1 x 1) + the tied embedding 25,755,648 / 1 = 63,529,984
    # parameters x (6 + 12 / (dp 8 x cp 1) = 7.5 B) = 476,474,880 B
    weights = (LAYERS_DENSE + EMB_TP1) * 7.5
    assert weights == 476_474_880
    # 855,638,016 + 8·s·b (token ids) 32,768 + s·b·h (dropout mask) 2,097,152; PP 1 adds
    # the output layer's input and the cross entropy 4·s·b·h·(1 + 50,304/512 = 99.25)
    # = 832,569,344: 1,690,337,280 B over (tp 1 x cp 1); no branch for "no SP"
    activations = LAYERS_ACT + 8 * 4096 + SBH + 4 * SBH * 99.25
    assert activations == 1_690_337_280
    got = bridge_estimate_training_memory(_config(dist_opt=True), num_microbatches=1)
    _assert(got, weights, activations)
    assert got["dense_bytes"] == weights and got["routed_expert_bytes"] == 0
    assert got["dense_bytes_per_parameter"] == 7.5
    assert got["total_parameters"] == 37_774_336 + 25_755_648
    assert got["activation_reported"] == 0.0  # no SP: the report prints the weights alone


def test_tp_pp_and_cp_divide_the_weights_and_the_activations() -> None:
    # TP 2, PP 2, CP 2 on 8 GPUs: dp 1, 8 micro-batches, plain Adam (18 B).
    # weights: 37,774,336 / (2 x 2) = 9,443,584 (the norms split with the layer), + the
    # embedding 25,821,184 / 2 = 12,910,592 (tied; PP 2 adds no output layer here)
    # = 22,354,176 x 18 = 402,375,168 B
    weights = (LAYERS_DENSE / 4 + EMB_TP2 / 2) * 18
    assert weights == 402_375_168
    # 855,638,016 + 8·s·b·pp 65,536 + s·b·h·pp 4,194,304 = 859,897,856, x min(1, 8/2) = 1,
    # no output layer at PP 2, over tp 2 x cp 2 = 214,974,464 B
    activations = (LAYERS_ACT + 8 * 4096 * 2 + SBH * 2) / 4
    assert activations == 214_974_464
    config = _config(
        dp=1,
        vocab_size=50432,
        tensor_model_parallel_size=2,
        pipeline_model_parallel_size=2,
        context_parallel_size=2,
        sequence_parallel=True,
    )
    got = bridge_estimate_training_memory(config, num_microbatches=8)
    _assert(got, weights, activations)
    assert got["total_bytes"] == 617_349_632
    assert got["activation_reported"] == 0.0  # SP without selective recompute


def test_the_distributed_optimizer_shards_over_dp_times_cp() -> None:
    # CP 2, dp 4: the master copy and moments over 4 x 2 = 8 ranks: 6 + 12/8 = 7.5 B;
    # 63,529,984 x 7.5 = 476,474,880. Activations 1,690,337,280 / (1 x 2) = 845,168,640
    config = _config(dp=4, dist_opt=True, context_parallel_size=2)
    got = bridge_estimate_training_memory(config, num_microbatches=1)
    assert got["dense_bytes_per_parameter"] == 7.5
    _assert(got, 476_474_880, 845_168_640)


def test_pipeline_schedules() -> None:
    # PP 4, dp 2, plain Adam: 37,774,336 / 4 = 9,443,584 + 25,755,648 = 35,199,232 x 18
    weights = (LAYERS_DENSE / 4 + EMB_TP1) * 18
    assert weights == 633_586_176
    # 855,638,016 + 8·s·b·4 131,072 + s·b·h·4 8,388,608 = 864,157,696 (no output layer)
    first_stage = LAYERS_ACT + 8 * 4096 * 4 + SBH * 4
    assert first_stage == 864_157_696
    for vpp, m, factor in ((3, 4, 1 + 3 / 12), (None, 2, 2 / 4), (None, 8, 1), (None, None, 1)):
        # interleaved: x 1 + (4 - 1)/(4 x 3) = 1.25 -> 1,080,197,120; 1F1B: x min(1, m/4)
        config = _config(
            dp=2, pipeline_model_parallel_size=4, virtual_pipeline_model_parallel_size=vpp
        )
        got = bridge_estimate_training_memory(config, num_microbatches=m)
        _assert(got, weights, first_stage * factor)
    assert first_stage * 1.25 == 1_080_197_120


def test_moe_layers_routed_experts_and_shared_expert() -> None:
    # 8 experts of width 1,024 on every other layer (freq 2: layers 0, 2, .., 10), top-2,
    # a shared expert of 512, SwiGLU (three projections), TP 2, EP 4, ETP 1, dp 4 on 8
    # GPUs, distributed optimizer. A dense layer: 1,048,576 + 2,048 + 3·512·2,048
    # (3,145,728) = 4,196,352; a MoE layer: 1,048,576 + 2,048 + the shared 3·512·512
    # (786,432) = 1,837,056 (no router weights). Dense: 6 x 4,196,352 + 6 x 1,837,056
    # + 1,024 = 36,201,472, / 2 = 18,100,736, + the embedding 25,821,184 / 2 = 12,910,592
    # = 31,011,328 x (6 + 12/(4 x 1) = 9) = 279,101,952 B.
    # Routed: 3·512·1,024·8 = 12,582,912 a MoE layer, x 6 = 75,497,472, / (1 x 4 x 1)
    # = 18,874,368; shard (4·2·1) // (4·1) = 2: x (6 + 12/2 = 12) = 226,492,416 B.
    dense, routed = 31_011_328 * 9, 18_874_368 * 12
    assert (dense, routed) == (279_101_952, 226_492_416)
    # activations: the mean FFN width (6 x 2,048 + 6 x (1,024 x 2 + 512)) / (12 x 512)
    # = 27,648 / 6,144 = 4.5, so 18 + 18 = 36 a layer: 75,497,472 x 12 = 905,969,664,
    # + 32,768 + 2,097,152, + 4·s·b·h·(1 + 50,432/512 = 99.5) = 834,666,496
    # = 1,742,766,080, over TP 2 = 871,383,040 B
    activations = (36 * SBH * 12 + 8 * 4096 + SBH + 4 * SBH * 99.5) / 2
    assert activations == 871_383_040
    config = _config(
        dp=4,
        dist_opt=True,
        vocab_size=50432,
        tensor_model_parallel_size=2,
        gated_linear_unit=True,
        activation_func="silu",
        num_moe_experts=8,
        moe_layer_freq=2,
        moe_ffn_hidden_size=1024,
        moe_router_topk=2,
        moe_shared_expert_intermediate_size=512,
        expert_model_parallel_size=4,
        expert_tensor_parallel_size=1,
    )
    got = bridge_estimate_training_memory(config, num_microbatches=2)
    _assert(got, dense + routed, activations)
    assert got["dense_bytes"] == dense and got["routed_expert_bytes"] == routed
    assert got["dense_parameters_per_gpu"] == 31_011_328
    assert got["routed_expert_parameters_per_gpu"] == 18_874_368
    assert got["routed_expert_bytes_per_parameter"] == 12
    assert got["total_parameters"] == 36_201_472 + 75_497_472 + 25_821_184


def test_latent_experts_and_mtp_layers() -> None:
    # 4 experts of 1,024 on every layer through a latent of 256, ungated, TP 1: routed
    # 2·256·1,024·4 = 2,097,152 a layer; the latent projections 2·512·256 = 262,144 join
    # the dense weights: 1,048,576 + 2,048 + 262,144 = 1,312,768 a layer, x 12 + 1,024
    # = 15,754,240, + the embedding 25,755,648 = 41,509,888 on the shard.
    config = _config(
        num_moe_experts=4, moe_layer_freq=1, moe_ffn_hidden_size=1024, moe_latent_size=256
    )
    got = bridge_estimate_training_memory(config, num_microbatches=1)
    assert got["dense_parameters_per_gpu"] == 41_509_888
    assert got["routed_expert_parameters_per_gpu"] == 12 * 2_097_152
    # one MTP layer (dense): 13 layers of 3,147,776 + 1,024 = 40,922,112, + 25,755,648
    # = 66,677,760 x 18 = 1,200,199,680 B; activations 13 x 71,303,168 = 926,941,184
    # + 32,768 + 2,097,152 + 832,569,344 = 1,761,640,448 B
    got = bridge_estimate_training_memory(_config(mtp_num_layers=1), num_microbatches=1)
    _assert(got, 1_200_199_680, 1_761_640_448)


def test_uneven_pipeline_stages() -> None:
    # PP 4 with 2 layers first and 4 last: the middle two stages 3 each. Stage sums of
    # 3,147,776 a layer: 6,295,552 / 9,443,328 / 9,443,328 / 12,591,104; the last stage
    # adds the final norm 1,024 and the embedding's output copy 25,755,648 (tied or
    # not), the first the embedding: 32,051,200 / .. / 38,347,776. The most loaded is the
    # last: 38,347,776 / tp 1 x 18 = 690,259,968 B
    config = _config(
        dp=2,
        pipeline_model_parallel_size=4,
        num_layers_in_first_pipeline_stage=2,
        num_layers_in_last_pipeline_stage=4,
    )
    got = bridge_estimate_training_memory(config, num_microbatches=4)
    assert got["dense_parameters_per_gpu"] == 38_347_776
    assert got["weight_and_optimizer_bytes"] == 690_259_968


def test_uneven_stages_take_the_virtual_chunks_round_robin() -> None:
    # Stages of 4, 2, 2, 4 layers in 2 chunks each (chunk sizes 2, 1, 1, 2): stage 0 holds
    # layers 0, 1 and 6, 7; without interleaving it holds 0-3. With MoE layers 0, 1, 6, 7
    # of 4 ungated experts of 1,024 (2·512·1,024·4 = 4,194,304 each), stage 0 holds 4 of
    # them interleaved (16,777,216) and 2 without (8,388,608); no other stage holds one.
    pattern = [1, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0]
    routed = {}
    for vpp in (2, None):
        config = _config(
            dp=2,
            pipeline_model_parallel_size=4,
            virtual_pipeline_model_parallel_size=vpp,
            num_layers_in_first_pipeline_stage=4,
            num_layers_in_last_pipeline_stage=4,
            num_moe_experts=4,
            moe_layer_freq=pattern,
            moe_ffn_hidden_size=1024,
        )
        got = bridge_estimate_training_memory(config, num_microbatches=4)
        routed[vpp] = got["routed_expert_parameters_per_gpu"]
    assert routed == {2: 16_777_216, None: 8_388_608}


def test_three_projections_only_for_swiglu_and_the_report_flag() -> None:
    # gated with GELU is priced as two projections (the source tests for F.silu)
    plain = bridge_estimate_training_memory(_config(), num_microbatches=1)
    geglu = bridge_estimate_training_memory(
        _config(gated_linear_unit=True, activation_func="gelu"), num_microbatches=1
    )
    assert geglu["dense_parameters_per_gpu"] == plain["dense_parameters_per_gpu"]
    # SwiGLU: the MLP 3·512·2,048 = 3,145,728 a layer, 1,048,576 more x 12 layers
    swiglu = bridge_estimate_training_memory(
        _config(gated_linear_unit=True, activation_func="silu"), num_microbatches=1
    )
    more = swiglu["dense_parameters_per_gpu"] - plain["dense_parameters_per_gpu"]
    assert more == 12 * 1_048_576
    # SP + selective recompute is the one case report_theoretical_memory prints activations
    sel = _config(tensor_model_parallel_size=2, vocab_size=50432, dp=4)
    sel["model"].update(sequence_parallel=True, recompute_granularity="selective")
    assert bridge_estimate_training_memory(sel, 1)["activation_reported"] == 1.0
    sel["model"]["recompute_granularity"] = "full"
    assert bridge_estimate_training_memory(sel, 1)["activation_reported"] == 0.0


def test_the_vocabulary_padded_by_the_source() -> None:
    # should_pad_vocab absent (the source's getattr default True): 50,257 up to a
    # multiple of 128 x 2 = 50,432, the same weights as the padded figure above
    config = _config(
        dp=1,
        vocab_size=50257,
        tensor_model_parallel_size=2,
        pipeline_model_parallel_size=2,
        context_parallel_size=2,
    )
    del config["model"]["should_pad_vocab"]
    got = bridge_estimate_training_memory(config, num_microbatches=8)
    assert got["weight_and_optimizer_bytes"] == 402_375_168


def _megatron_args(**overrides: Any) -> dict[str, Any]:
    """Megatron-LM's resolved arguments for the TP 2, PP 2, CP 2 functional test
    (``gpt3_mcore_te_tp2_pp2_cp2``), as ``formula_arguments`` gives them."""
    args: dict[str, Any] = {
        "num_layers": 12,
        "hidden_size": 512,
        "num_attention_heads": 8,
        "kv_channels": 64,
        "group_query_attention": False,
        "num_query_groups": 1,  # argparse's default, unused without GQA
        "swiglu": False,
        "ffn_hidden_size": 2048,
        "normalization": "LayerNorm",
        "padded_vocab_size": 50432,
        "untie_embeddings_and_output_weights": False,
        "tensor_model_parallel_size": 2,
        "pipeline_model_parallel_size": 2,
        "context_parallel_size": 2,
        "virtual_pipeline_model_parallel_size": None,
        "data_parallel_size": 1,
        "use_distributed_optimizer": False,
        "seq_length": 1024,
        "micro_batch_size": 4,
        "sequence_parallel": True,
        "recompute_granularity": None,
        "num_microbatches": 8,
        "world_size": 8,
        "hybrid_layer_pattern": None,
        "multi_latent_attention": False,
        "num_experts": None,
        "moe_layer_freq": 1,
        "moe_ffn_hidden_size": None,
        "moe_shared_expert_intermediate_size": None,
        "moe_latent_size": None,
        "mtp_num_layers": None,
        "expert_tensor_parallel_size": 1,
        "expert_model_parallel_size": 1,
        "moe_router_topk": 2,
        "add_bias_linear": True,
    }
    args.update(overrides)
    return args


def test_megatron_arguments_map_to_the_bridge_fields() -> None:
    cfg = bridge_config_from_megatron_args(_megatron_args())
    m = cfg["model"]
    assert m["num_query_groups"] == 8  # the head count without GQA
    assert m["share_embeddings_and_output_weights"] is True
    assert (m["vocab_size"], m["should_pad_vocab"]) == (50432, False)
    assert (m["gated_linear_unit"], m["activation_func"]) == (False, "gelu")
    assert m["num_moe_experts"] is None and m["moe_router_topk"] is None
    assert cfg["train"] == {"micro_batch_size": 4}
    assert cfg["optimizer"] == {"use_distributed_optimizer": False}
    assert cfg["data_parallel_size"] == 1
    swiglu = bridge_config_from_megatron_args(
        _megatron_args(swiglu=True, group_query_attention=True, num_query_groups=2)
    )["model"]
    assert (swiglu["gated_linear_unit"], swiglu["activation_func"]) == (True, "silu")
    assert swiglu["num_query_groups"] == 2
    # the recording's figures: 402,375,168 B of weights and 214,974,464 B of activations
    # (test_tp_pp_and_cp_divide_the_weights_and_the_activations), 617,349,632 B in all
    _assert(bridge_args_theoretical(_megatron_args()), 402_375_168, 214_974_464)


def test_a_missing_field_is_named() -> None:
    config = _config()
    del config["model"]["hidden_size"]
    with pytest.raises(KeyError, match=r"model\.hidden_size"):
        bridge_estimate_training_memory(config)
    args = _megatron_args()
    del args["context_parallel_size"]
    with pytest.raises(KeyError, match="context_parallel_size"):
        bridge_args_theoretical(args)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("tensor_model_parallel_size", 0, "tensor_model_parallel_size must be positive"),
        ("moe_layer_freq", [1, 0], "2 entries for num_layers=12"),
        ("num_layers_in_first_pipeline_stage", 5, "divide evenly"),  # 7 over 2 stages
    ],
)
def test_bad_values_are_refused_as_the_source_refuses_them(
    field: str, value: Any, message: str
) -> None:
    config = _config(pipeline_model_parallel_size=3, num_moe_experts=4, **{field: value})
    with pytest.raises(ValueError, match=message):
        bridge_estimate_training_memory(config, 2)
