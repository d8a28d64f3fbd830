"""A Megatron-LM run priced by ``tight``'s layer kinds: what a fully trained GPT layer,
its embedding, its head and its data keep, counted by hand from megatron-core's and
Transformer Engine's source (the facts each test names), on the functional tests' tiny
GPT (``megatron_lm.tiny``: h 512, 8 heads of 64, FFN 4h = 2048, GeLU, LayerNorm, learned
positions, dropout 0.1, 4 x 1024 tokens a micro-batch, 12 layers, GPT-2's vocabulary
padded to 50,304).
"""

from __future__ import annotations

import pytest
from megatron_lm.tiny import priced, step_of, tiny

from cpmem.errors import InputError
from cpmem.pricing.estimate import Estimate

H, Q, KV, F, HEADS = 512, 512, 512, 2048, 8
TOKENS, LAYERS, BF16 = 4096, 12, 2
V = 50304


def _retained_per_token(est: Estimate) -> float:
    return est.components["retained_activations"] / (TOKENS * BF16 * LAYERS)


def test_a_gpt_layer_under_the_fused_kernel_keeps_its_tensors_as_megatron_hands_them() -> None:
    """Per token: the two LayerNorms' inputs and outputs (4H, the trained linears save the
    outputs), the QKV output whose views the fused (cuDNN) kernel takes (Q + 2KV), its
    output (Q), fc1's output and GeLU's output (2F), the two residual dropouts' bool masks
    (H bytes: H/2 elements each), the kernel's fp32 softmax statistics (2 per head)."""
    est = priced(tiny(), world_size=8, attention_backend="fused")
    assert _retained_per_token(est) == 4 * H + (2 * Q + 2 * KV) + 2 * F + H + 2 * HEADS


def test_flash_attn_copies_q_k_v_and_its_output() -> None:
    """TE's FlashAttention makes bshd copies of q, k, v (.transpose(0, 1).contiguous()) and
    returns an sbhd copy of its bshd output: the projection's output is freed, one more Q
    is kept (Megatron-LM's A100 runs hold one Q per layer above H100's fused ones)."""
    fused = priced(tiny(), attention_backend="fused")
    flash = priced(tiny(), attention_backend="flash")
    assert _retained_per_token(flash) - _retained_per_token(fused) == Q


def test_query_key_norms_without_rope_hand_their_outputs_to_the_kernel() -> None:
    """--qk-layernorm with learned positions: the norms' outputs are the kernel's q and k
    (Q + KV more); the norms save their inputs, views of the projection's output."""
    plain = priced(tiny(), attention_backend="fused")
    normed = priced(tiny(qk_layernorm=True), attention_backend="fused")
    assert _retained_per_token(normed) - _retained_per_token(plain) == Q + KV


def test_without_dropout_no_mask_is_kept() -> None:
    kept = priced(tiny(), attention_backend="fused")
    none = priced(tiny(hidden_dropout=0.0, attention_dropout=0.0), attention_backend="fused")
    assert _retained_per_token(kept) - _retained_per_token(none) == H


def test_the_unfused_attention_keeps_its_probabilities() -> None:
    """TE's UnfusedDotProductAttention with the fused masked softmax (s = 1024 is within
    16 < s < 16384, the shapes align): the bf16 softmax (2 B), attention dropout's bool
    mask (1 B) and its bf16 output (2 B), per element of b x heads x s x s, every layer."""
    est = priced(tiny(), attention_backend="unfused")
    n = 4 * HEADS * 1024 * 1024
    assert est.components["attention_scores"] == LAYERS * (2 + 1 + 2) * n


def test_the_embedding_keeps_its_ids_and_its_dropout_mask() -> None:
    """The word and position lookups save their int64 indices; the embedding dropout its
    bool mask (language_model_embedding.py)."""
    est = priced(tiny(), attention_backend="fused")
    assert est.components["embedding"] == TOKENS * (8 + 8) + TOKENS * H


def test_the_data_loaders_mask_is_held_while_a_micro_batch_runs() -> None:
    """--create-attention-mask-in-dataloader (the default): a [b, 1, s, s] bool mask."""
    est = priced(tiny(), attention_backend="fused")
    assert est.components["dataloader_mask"] == 4 * 1024 * 1024
    without = priced(tiny(create_attention_mask_in_dataloader=False), attention_backend="fused")
    assert "dataloader_mask" not in without.components


def test_a_trained_output_layer_keeps_the_final_norms_input_and_output() -> None:
    """The cross entropy's fp32 softmax (4 B per logit), the loss's per-token tensors
    (labels, masks, fp32 loss: 21 B), and the final LayerNorm's input and output, which the
    trained output layer saves (2 x H per token)."""
    est = priced(tiny(), attention_backend="fused")
    assert est.components["head_kept"] == 4 * TOKENS * V + 21 * TOKENS + 2 * TOKENS * H * BF16


def test_no_margin_is_priced_on_megatron_lms_runs() -> None:
    est = priced(tiny(), attention_backend="fused")
    assert est.components["margin_factor"] == 0 and est.components["margin_allowance"] == 0


@pytest.mark.parametrize(
    ("device", "deterministic", "picked"),
    [
        ("a100-80gb", False, "flash"),  # below sm90 flash-attn before fused (utils.py:1141)
        ("h100", False, "fused"),  # sm90+: fused before flash (utils.py:1133-1139)
        ("gb200", True, "flash"),  # sm100+: no deterministic fused (utils.py:1067-1070)
        ("gb200", False, "fused"),
    ],
)
def test_auto_prices_transformer_engines_pick(
    device: str, deterministic: bool, picked: str
) -> None:
    step = step_of(tiny(deterministic_mode=deterministic), device=device)
    assert step.settings.runtime.attention_backend == picked
    assert step.settings.runtime.backend_asked == "auto"


def test_unfused_attention_under_cp_is_refused() -> None:
    """Transformer Engine never runs its unfused attention under CP (utils.py:756-760)."""
    with pytest.raises(InputError):
        step_of(tiny(context_parallel_size=2, attention_backend="unfused"))
    step = step_of(tiny(context_parallel_size=2), device="a100-80gb")
    assert "unfused" not in (
        step.settings.runtime.attention_backend,
        *step.settings.runtime.backend_spread,
    )


def test_megatrons_cp_split_gives_every_rank_s_b_over_cp_tokens() -> None:
    step = step_of(
        tiny(context_parallel_size=2, tensor_model_parallel_size=2, sequence_parallel=True)
    )
    assert list(step.plan.rank_tokens) == [2048, 2048]
    assert step.cp_comm == "p2p"  # Megatron-LM's --cp-comm-type default


def test_gradient_accumulation_prices_one_micro_batch_at_a_time() -> None:
    """PP 1: forward_backward_no_pipelining runs each micro-batch's backward before the
    next forward, so 8 micro-batches hold what one does."""
    one = priced(tiny(global_batch_size=32), attention_backend="fused")  # 4 x DP 8: one
    eight = priced(tiny(global_batch_size=256), attention_backend="fused")
    assert one.peak_bytes == eight.peak_bytes


def test_a_lora_run_of_the_same_model_prices_the_adapters_not_the_optimizer() -> None:
    full = priced(tiny(), attention_backend="fused")
    lora = priced(tiny(), attention_backend="fused", lora_rank=8)
    assert full.static is not None and lora.static is not None
    assert "gradient_buffer" in full.static.components
    assert (
        "adapter_params" in lora.static.components
        and "gradient_buffer" not in lora.static.components
    )
    assert lora.static.total < full.static.total


def test_a_recomputed_unfused_core_holds_one_layers_scores_and_their_gradients() -> None:
    """Full recompute of the unfused attention: no layer keeps its s x s tensors, but the
    one being recomputed holds what an unrecomputed layer keeps (bf16 softmax, dropout's
    mask and bf16 output: 5 B per element) and its backward's two bf16 gradients (the
    probabilities' and the scores': 4 B), on top of the layer inputs."""
    full = {"recompute_granularity": "full", "recompute_method": "uniform"}
    n = 4 * HEADS * 1024 * 1024
    unfused = priced(tiny(**full, recompute_num_layers=1), attention_backend="unfused")
    assert "attention_scores" not in unfused.components  # no layer keeps them
    # on the last stage the head's moment is the larger; the first stage (layers only)
    # peaks on the recomputed layer
    one = priced(
        tiny(**full, recompute_num_layers=1, pipeline_model_parallel_size=2),
        attention_backend="unfused",
        rank=0,
    )
    base = priced(
        tiny(**full, recompute_num_layers=1, pipeline_model_parallel_size=2),
        attention_backend="fused",
        rank=0,
    )
    assert one.stage_bytes[0] - base.stage_bytes[0] == (5 + 4) * n
