"""gpt-oss's Megatron-LM flags read onto the layer kinds' fields, and the example script
priced against the Hugging Face door's gpt-oss.

Expected values are worked out by hand from megatron-core's source (the snapshot's line
numbers, d98e8a64, where the flag is read; megatron-core 0.16's where it runs):

- quick GeGLU, unfused (experts.py:998-1011 at the snapshot): ``x_glu.clamp`` is a new
  F_e-wide tensor that the jit-fused ``quick_gelu`` keeps as its input; ``x_linear.clamp``
  is consumed by ``+ offset`` (a scalar add keeps nothing), and both clamps keep their
  input, a view of the fc1 output the row keeps anyway: one F_e-wide tensor a routed row
  more than the unclamped GLU. Unclamped, ``quick_gelu`` keeps a view and the product
  keeps ``quick_gelu``'s output and ``x_linear + offset``: the eager SwiGLU's set.
- the router's z-loss (moe_utils.py:169-170, router.py:655-658): ``logsumexp`` keeps the
  ``[tokens, E]`` logits and its ``[tokens]`` result (which ``square`` keeps again), in
  the router's dtype (``--moe-router-dtype fp32``: 4 B): ``(E + 1) x 4`` bytes per token
  and MoE layer.
- the learnable softmax: ``heads / TP`` parameters a layer (Transformer Engine's
  ``softmax_offset``, attention/dot_product_attention/dot_product_attention.py:471-476 at
  b9d690e0), and Transformer Engine's selection
  under it (utils.py:708-742 at TE v2.11): FlashAttention off; fused from cuDNN 9.13.1,
  under CP only with a2a; unfused not under CP.

The tiny GPT (``tiny.py``): 12 layers, hidden 512 (FFN 4h = 2,048 without SwiGLU), 8
heads, micro-batch 4 x 1,024 tokens on world 8 (TP 1, DP 8).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from cpmem.errors import InputError
from cpmem.megatron.args import read_megatron_args
from cpmem.megatron.describe import megatron_run_with
from cpmem.model.hf_config import load_config
from cpmem.pricing.registry import price
from cpmem.step.describe import describe_step
from tests.unit.megatron_lm.tiny import priced, step_of, tiny

EXAMPLES = Path(__file__).parent / "data" / "examples"
SCRIPT = EXAMPLES / "gptoss__02_train.sh"
TOKENS = 4 * 1024  # the tiny GPT's micro-batch
LAYERS = 12
MOE = {
    "num_experts": 4,
    "moe_router_topk": 2,
    "add_bias_linear": False,
    "position_embedding_type": "rope",
    "moe_router_dtype": "fp32",
    "hidden_dropout": 0.0,
    "attention_dropout": 0.0,
}


def _retained(**changes: object) -> int:
    return priced(tiny(**{**MOE, **changes})).components["retained_activations"]


def test_the_clamp_keeps_one_expert_row_tensor_more() -> None:
    geometry = step_of(tiny(**MOE, quick_geglu=True, activation_func_clamp_value=7.0))
    assert geometry.settings.geometry.gated_mlp
    assert geometry.settings.geometry.activation_clamp == 7.0
    grown = _retained(quick_geglu=True, activation_func_clamp_value=7.0) - _retained(
        quick_geglu=True
    )
    # top-2 of 4 experts, all local at EP 1: 2 rows a token, F_e = 4h = 2,048, bf16
    assert grown == LAYERS * TOKENS * 2 * 2048 * 2


def test_the_offset_prices_nothing() -> None:
    # x_linear + offset is formed whatever the offset (experts.py:1007-1009)
    assert _retained(quick_geglu=True, glu_linear_offset=1.0) == _retained(quick_geglu=True)


def test_the_z_loss_keeps_the_logits_and_their_logsumexp() -> None:
    grown = _retained(quick_geglu=True, moe_z_loss_coeff=1e-3) - _retained(quick_geglu=True)
    assert grown == LAYERS * TOKENS * (4 + 1) * 4
    # the router's dtype: the params' bf16 without --moe-router-dtype (router.py:106-111)
    bf16 = _retained(quick_geglu=True, moe_z_loss_coeff=1e-3, moe_router_dtype=None)
    assert bf16 - _retained(quick_geglu=True, moe_router_dtype=None) == LAYERS * TOKENS * 5 * 2


def test_the_learnable_softmax_is_a_parameter_per_head_and_tes_backend_choice() -> None:
    plain = priced(tiny(**MOE, quick_geglu=True))
    sinks = priced(tiny(**MOE, quick_geglu=True, softmax_type="learnable"))
    # 8 heads x 12 layers: bf16 weight 2 B, fp32 main gradient 4 B, fp32 master and two
    # Adam moments 12 B (no distributed optimizer in the tiny GPT)
    assert sinks.peak_bytes - plain.peak_bytes == 8 * LAYERS * (2 + 4 + 12)
    assert sinks.attention_backend == "fused"  # cuDNN 9.15 in the dev container
    cp = {**MOE, "quick_geglu": True, "softmax_type": "learnable", "context_parallel_size": 2}
    assert step_of(tiny(**cp, cp_comm_type="a2a")).settings.runtime.attention_backend == "fused"
    # all_gather: fused needs a2a, unfused no CP, flash no learnable: no backend left
    with pytest.raises(InputError, match="no backend"):
        step_of(tiny(**cp, cp_comm_type="all_gather"))
    with pytest.raises(InputError, match="FlashAttention off"):
        step_of(tiny(**MOE, quick_geglu=True, softmax_type="learnable"), attention_backend="flash")


@pytest.mark.parametrize(
    ("changes", "shown", "why"),
    [
        ({"add_bias_linear": True}, "--quick-geglu with linear biases", "fused bias + quick"),
        ({"num_experts": None}, "--quick-geglu with dense MLP layers", "dense MLP"),
        ({"swiglu": True}, "--quick-geglu --swiglu", "assert not args.swiglu"),
        ({"activation_func_clamp_value": -1.0}, "--activation-func-clamp-value -1", "> 0"),
        ({"softmax_type": "off-by-one"}, "--softmax-type off-by-one", "off-by-one"),
        (
            {"softmax_type": "learnable", "attention_backend": "flash"},
            "--softmax-type learnable --attention-backend flash",
            "no backend is left",
        ),
    ],
)
def test_what_is_not_priced_is_refused(changes: dict, shown: str, why: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(InputError) as err:
        step_of(tiny(**{**MOE, "quick_geglu": True, **changes}))
    assert shown in err.value.value
    assert why in err.value.reason


def test_a_clamp_or_offset_without_quick_geglu_is_refused() -> None:
    with pytest.raises(InputError) as err:
        step_of(tiny(**MOE, swiglu=True, activation_func_clamp_value=7.0, glu_linear_offset=1.0))
    assert err.value.value == "--activation-func-clamp-value 7, --glu-linear-offset 1"


def test_the_unfused_bias_dropout_add_reads_as_the_fused() -> None:
    base = "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 128 "
    base += "--max-position-embeddings 128 --micro-batch-size 1 --bf16 --vocab-size 1024"
    unfused = read_megatron_args(base + " --no-bias-dropout-fusion")
    assert unfused.ignored == ("--no-bias-dropout-fusion",)
    assert unfused == read_megatron_args(base)


GPT_OSS_SCRIPT_CONFIG = {
    # the script's model as a Hugging Face gpt-oss config.json: hidden 512, 12 layers, 64
    # heads of kv-channels 512 / 64 = 8 over 8 groups, 4 experts of 2,048, top-2, the
    # 128,256 NullTokenizer vocabulary, 8,192 positions, untied, windows of 127 + 1 on
    # the odd 1-based layers, the clamp 7.0; no attention bias (--disable-bias-linear)
    "model_type": "gpt_oss",
    "hidden_size": 512,
    "num_hidden_layers": 12,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 8,
    "intermediate_size": 2048,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "vocab_size": 128256,
    "sliding_window": 128,
    "layer_types": ["sliding_attention", "full_attention"] * 6,
    "swiglu_limit": 7.0,
    "attention_bias": False,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": False,
}


@pytest.mark.parametrize(("pp", "stage_layers"), [(1, 12), (2, 6)])
def test_the_gpt_oss_example_prices_as_the_hugging_face_doors_gpt_oss(
    pp: int, stage_layers: int
) -> None:
    # the script with the pipeline given beside it; its FP8 on MoE layers is refused at
    # the step (test_example_scripts.py), so both doors price the step in bf16
    run, rest = megatron_run_with(SCRIPT, {"pp": pp})
    assert rest == {}
    arguments = {**run.arguments, "fp8": None}
    megatron = price(describe_step(run.geometry, **arguments), "tight")
    hf = load_config(GPT_OSS_SCRIPT_CONFIG, name="gpt-oss-script")
    # the fields the Hugging Face config cannot state are the run's: gpt-oss's expert and
    # router biases off (--disable-bias-linear), Megatron-LM's dropouts 0.1 (not given),
    # the z-loss (--moe-z-loss-coeff, fp32 router)
    assert hf.mlp_bias and hf.router_bias and hf.hidden_dropout == 0.0
    run_fields = {"mlp_bias": False, "router_bias": False, "hidden_dropout": 0.1}
    run_fields |= {"attention_dropout": 0.1, "router_z_loss_bytes": 4}
    same = price(describe_step(replace(hf, **run_fields), **arguments), "tight")
    assert megatron.peak_bytes == same.peak_bytes
    # the one tensor gpt-oss's own config never trains with: the z-loss's logits and
    # logsumexp, (4 + 1) x 4 B per token of the 8,192-token micro-batch on each of the
    # busiest stage's MoE layers (one micro-batch in flight on the last stage at PP 2)
    no_z = replace(hf, **{**run_fields, "router_z_loss_bytes": 0})
    without = price(describe_step(no_z, **arguments), "tight")
    assert megatron.peak_bytes - without.peak_bytes == stage_layers * 8192 * 5 * 4
