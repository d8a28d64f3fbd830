"""What a Megatron-LM layer keeps for backward, and how many micro-batches a pipeline
stage keeps at once.

Expected values: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models", Table 2 (bytes per layer: ``sbh(10 + 24/t + 5as/(ht))`` with TP,
``sbh(34/t + 5as/(ht))`` with TP and SP, for 2-byte activations, 1-byte dropout masks,
ffn = 4h, MHA), with the flash and fused kernels' fp32 softmax statistics ``4 s b a / t``
(one fp32 per query row and head, kept for backward by Transformer Engine's
``backends.py``) in place of the ``s x s`` term; Transformer Engine's unfused attention
at the recordings' snapshot (``backends.py`` ``UnfusedDotProductAttention``,
``softmax.py`` ``FusedScaleMaskSoftmax``); and the warm-up counts of Megatron-LM's
``pipeline_parallel/schedules.py`` (``p - r - 1`` without interleaving, lines 2277-2278;
``2 (p - r - 1) + (v - 1) x group`` with it, capped at ``v x m``,
``get_pp_rank_microbatches``), run here as a schedule.
"""

from __future__ import annotations

import pytest

from cpmem.megatron import activations as act
from cpmem.megatron.estimate import in_flight_chunks, price_megatron
from megatron_lm.tiny import run_of, tiny

S, B, H, A = 1024, 4, 512, 8  # the tiny GPT: sequence, micro-batch, hidden, heads


def _korthikanti_tp(t: int) -> int:
    """Table 2, tensor parallelism: s b h (10 + 24 / t), without the s x s term."""
    return S * B * H * 10 + S * B * H * 24 // t


def _flash_stats(t: int) -> int:
    return 4 * S * B * A // t


@pytest.mark.parametrize("t", [1, 2, 4])
def test_a_flash_layer_keeps_table_2s_bytes_plus_the_softmax_statistics(t: int) -> None:
    run = run_of(tiny(tensor_model_parallel_size=t, attention_backend="flash"), world_size=t)
    assert act.layer_bytes(run) == _korthikanti_tp(t) + _flash_stats(t)
    assert act.layer_components(run)["softmax_stats"] == _flash_stats(t)


@pytest.mark.parametrize("t", [2, 4])
def test_with_sequence_parallelism_a_layer_keeps_34_over_t(t: int) -> None:
    args = tiny(tensor_model_parallel_size=t, sequence_parallel=True, attention_backend="flash")
    run = run_of(args, world_size=t)
    assert act.layer_bytes(run) == S * B * H * 34 // t + _flash_stats(t)


@pytest.mark.parametrize("t", [1, 2, 4])
def test_unfused_attention_with_dropout_adds_table_2s_5as2b_over_t(t: int) -> None:
    # the fused masked softmax's bf16 output (2), attention dropout's bool mask (1) and
    # its bf16 output (2) per score: 5 a s^2 b / t; b a / t = 32, 16, 8 (the kernel's
    # rule: a multiple of 4), s = 1024
    run = run_of(tiny(tensor_model_parallel_size=t, attention_backend="unfused"), world_size=t)
    scores = 5 * A * S * S * B // t
    parts = act.layer_components(run)
    assert parts["attention_scores"] == act.attention_scores(run) == scores
    assert "softmax_stats" not in parts
    assert act.layer_bytes(run) == _korthikanti_tp(t) + scores


def test_without_attention_dropout_only_the_softmax_output_is_kept() -> None:
    # dropout(p=0) is the identity: the context GEMM saves the softmax's output itself
    run = run_of(tiny(attention_backend="unfused", attention_dropout=0.0))
    assert act.attention_scores(run) == 2 * A * S * S * B


def test_hidden_dropout_zero_removes_every_hidden_mask() -> None:
    on = run_of(tiny(attention_backend="flash"))
    off = run_of(tiny(attention_backend="flash", hidden_dropout=0.0))
    assert act.layer_components(on)["hidden_dropout_masks"] == 2 * S * B * H  # 2 sites, 1 B
    assert "hidden_dropout_masks" not in act.layer_components(off)
    assert act.layer_bytes(on) - act.layer_bytes(off) == 2 * S * B * H
    assert "embedding_dropout_mask" in act.embedding_components(on)
    assert "embedding_dropout_mask" not in act.embedding_components(off)


def test_selective_recompute_drops_the_scores() -> None:
    run = run_of(tiny(attention_backend="unfused", recompute_granularity="selective"))
    assert act.attention_scores(run) == 0


def test_te_unfused_fallback_softmax_is_fp32_without_the_flag() -> None:
    # b a / t = 1 x 8 / 4 = 2, not a multiple of 4: the fused kernel does not run
    run = run_of(
        tiny(tensor_model_parallel_size=4, micro_batch_size=1, attention_backend="unfused"),
        world_size=4,
    )
    assert act.attention_scores(run) == 7 * (1 * (A // 4) * S * S)


def test_te_unfused_at_16384_keys_runs_the_fallback() -> None:
    args = tiny(
        seq_length=16384,
        max_position_embeddings=16384,
        micro_batch_size=1,
        num_attention_heads=8,
        attention_backend="unfused",
    )
    run = run_of(args, world_size=1)
    assert act.attention_scores(run) == 7 * (8 * 16384 * 16384)


def test_no_masked_softmax_fusion_changes_nothing_under_te() -> None:
    fused = run_of(tiny(attention_backend="unfused", attention_softmax_in_fp32=True))
    unfused = run_of(
        tiny(
            attention_backend="unfused",
            attention_softmax_in_fp32=True,
            masked_softmax_fusion=False,
        )
    )
    assert act.attention_scores(unfused) == act.attention_scores(fused) == 5 * A * S * S * B


# --- recompute -------------------------------------------------------------------------


def test_full_uniform_recompute_keeps_only_each_groups_input() -> None:
    args = tiny(
        attention_backend="flash",
        recompute_granularity="full",
        recompute_method="uniform",
        recompute_num_layers=1,
    )
    run = run_of(args)
    assert act.stage_layers_kept(run, 12) == (0, 12)
    assert act.checkpoint_input_bytes(run) == 2 * S * B * H  # the [s, b, h] bf16 input
    peak = price_megatron(run).peak_components
    assert peak["layers"] == 0
    assert peak["recompute_checkpoints"] == 12 * 2 * S * B * H
    # groups of 4 layers: 3 inputs kept
    grouped = run_of(
        tiny(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=4)
    )
    assert act.stage_layers_kept(grouped, 12) == (0, 3)
    assert act.recompute_group_layers(grouped, 12) == 4


def test_full_block_recompute_keeps_the_layers_it_does_not_checkpoint() -> None:
    run = run_of(
        tiny(recompute_granularity="full", recompute_method="block", recompute_num_layers=5)
    )
    assert act.stage_layers_kept(run, 12) == (7, 5)
    assert act.stage_layers_kept(run_of(tiny()), 12) == (12, 0)


# --- micro-batches in flight ------------------------------------------------------------


def _peak_in_flight(p: int, r: int, m: int, v: int, group: int) -> int:
    """Runs stage ``r``'s schedule (schedules.py): the warm-up forwards, then one forward
    and one backward per remaining chunk, then the cool-down; the most forwards whose
    backward has not run yet."""
    total = m * v
    if v == 1:
        warmup = min(p - r - 1, m)
    else:
        warmup = min(2 * (p - r - 1) + (v - 1) * group, total)
    live = peak = 0
    for _ in range(warmup):
        live += 1
        peak = max(peak, live)
    for _ in range(total - warmup):
        live += 1  # the 1F1B step's forward
        peak = max(peak, live)
        live -= 1  # its backward
    return peak


@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 8), (4, 2), (4, 1), (6, 16)])
def test_1f1b_stage_r_keeps_p_minus_r_micro_batches(p: int, m: int) -> None:
    run = run_of(tiny(pipeline_model_parallel_size=p, global_batch_size=m * 4), world_size=p)
    assert run.microbatches == m
    for r in range(p):
        expected = _peak_in_flight(p, r, m, 1, p)
        assert expected == min(p - r, m)
        assert in_flight_chunks(run, r) == expected


@pytest.mark.parametrize(("p", "v", "m"), [(2, 2, 4), (4, 3, 8), (4, 3, 4), (2, 3, 2)])
def test_interleaved_stages_keep_their_warm_up_plus_one(p: int, v: int, m: int) -> None:
    layers = 12 if v == 3 else 8
    args = tiny(
        num_layers=layers,
        pipeline_model_parallel_size=p,
        num_layers_per_virtual_pipeline_stage=layers // (p * v),
        global_batch_size=m * 4,
    )
    run = run_of(args, world_size=p)
    assert (run.virtual_chunks, run.microbatches) == (v, m)
    for r in range(p):
        assert in_flight_chunks(run, r) == _peak_in_flight(p, r, m, v, p)
    # the last stage: (v - 1) p warm-up forwards and the one of its first 1F1B step
    assert in_flight_chunks(run, p - 1) == min((v - 1) * p + 1, v * m)


def test_a_micro_batch_group_size_changes_the_interleaved_warm_up() -> None:
    args = tiny(
        pipeline_model_parallel_size=2,
        num_layers_per_virtual_pipeline_stage=2,
        microbatch_group_size_per_virtual_pipeline_stage=3,
        global_batch_size=8 * 4,
    )
    run = run_of(args, world_size=2)  # v = 3, m = 8
    for r in range(2):
        assert in_flight_chunks(run, r) == _peak_in_flight(2, r, 8, 3, 3)
    assert in_flight_chunks(run, 0) == 2 * 1 + 2 * 3 + 1


# --- head, embedding, mask --------------------------------------------------------------


def test_the_head_keeps_the_final_norm_and_the_fp32_logits() -> None:
    t = 2
    run = run_of(tiny(tensor_model_parallel_size=t), world_size=t)
    head = act.head_components(run)
    assert head["final_norm"] == 2 * 2 * S * B * H  # its input and output, bf16
    assert head["cross_entropy_fp32_logits"] == 4 * S * B * 50432 // t
    assert act.logits_bytes(run) == 2 * S * B * 50432 // t


def test_the_output_weight_gradient_exists_only_without_accumulation_fusion() -> None:
    t = 2
    fused = run_of(tiny(tensor_model_parallel_size=t), world_size=t)
    plain = run_of(
        tiny(tensor_model_parallel_size=t, gradient_accumulation_fusion=False), world_size=t
    )
    assert act.output_wgrad_bytes(fused) == 0
    assert act.output_wgrad_bytes(plain) == 2 * 50432 // t * H  # 2 V h / t (layers.py)


def test_the_dataloaders_mask_is_b_s_s_bools() -> None:
    assert act.attention_mask_bytes(run_of(tiny())) == B * S * S
    off = run_of(tiny(create_attention_mask_in_dataloader=False))
    assert act.attention_mask_bytes(off) == 0


def test_the_embedding_keeps_int64_ids() -> None:
    parts = act.embedding_components(run_of(tiny()))
    assert parts["token_ids"] == 8 * S * B
    assert parts["embedding_dropout_mask"] == S * B * H
