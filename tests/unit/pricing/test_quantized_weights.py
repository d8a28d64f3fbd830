"""A quantized checkpoint's frozen base: as stored (values and their scales, only for the
linears the checkpoint converts) or dequantized (the default), every expected byte count
derived by hand below from the published shapes.

DeepSeek-V3 (hidden 7,168; 128 heads; q_lora_rank 1,536; kv_lora_rank 512; rope 64,
nope 128, v 128; 256 routed experts + 1 shared of 2,048; fp8 e4m3 with 128 x 128 fp32
block scales). gpt-oss-20b (hidden 2,880; 32 experts of 2,880; mxfp4: 4-bit values, one
e8m0 byte per 32 values along the input).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from cpmem.api import describe_step, estimate
from cpmem.errors import InputError
from cpmem.model.hf_config import load_config
from cpmem.model.presets import PRESETS
from cpmem.plan.layout import ParallelLayout
from cpmem.pricing.kinds import mixer_spec, mlp_spec
from cpmem.pricing.layer_parameters import Linear
from cpmem.pricing.quantized import layers_stored, linear_stored, mtp_stored
from cpmem.pricing.static import static_memory
from cpmem.pricing.weights import rank_weights
from cpmem.units import GIB

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
V3, OSS = PRESETS["deepseek-v3"], PRESETS["gpt-oss-20b"]
FP8, MXFP4 = V3.quantization, OSS.quantization
assert FP8 is not None and MXFP4 is not None


def test_one_fp8_matrix_is_its_bytes_and_its_block_scales() -> None:
    """A routed expert's down_proj, 7,168 x 2,048: one byte a value, and
    ceil(7168/128) x ceil(2048/128) = 56 x 16 = 896 fp32 scales."""
    down = Linear("experts", 7168, 2048, "experts", "cols", 256)
    one = linear_stored(down, FP8, tp=1, ep=256, etp=1)
    assert (one.elements, one.values, one.scales) == (14_680_064, 14_680_064, 896 * 4)
    eight = linear_stored(down, FP8, tp=1, ep=8, etp=1)  # 32 local experts
    assert eight.bytes == 32 * (14_680_064 + 3_584)


def test_a_sharded_matrix_holds_the_scales_of_its_slice() -> None:
    """kv_b_proj (32,768 x 512, column-parallel) at TP 8: 4,096 x 512 bytes and
    (4096/128) x (512/128) = 128 scales; o_proj (7,168 x 16,384, row-parallel) at TP 8:
    7,168 x 2,048 and 56 x 16 scales; a block the matrix does not fill is still one scale
    (100 x 300: 1 x 3)."""
    kv_b = linear_stored(Linear("attention", 32768, 512, "sharded"), FP8, 8, 1, 1)
    assert (kv_b.values, kv_b.scales) == (2_097_152, 128 * 4)
    o = linear_stored(Linear("attention", 7168, 16384, "sharded", "cols"), FP8, 8, 1, 1)
    assert (o.values, o.scales) == (14_680_064, 896 * 4)
    odd = linear_stored(Linear("mlp", 100, 300, "replicated"), FP8, 8, 1, 1)
    assert (odd.values, odd.scales) == (30_000, 3 * 4)


def test_one_mxfp4_expert_is_half_a_byte_a_value_and_a_byte_per_32() -> None:
    """gpt-oss-20b's expert down_proj, 2,880 x 2,880: 8,294,400 values in 4,147,200 bytes,
    2,880 x 90 one-byte scales (its ``down_proj_scales`` [32, 2880, 90])."""
    down = Linear("experts", 2880, 2880, "experts", "cols", 32)
    one = linear_stored(down, MXFP4, 1, 32, 1)
    assert (one.elements, one.values, one.scales) == (8_294_400, 4_147_200, 259_200)


def _v3_moe_layer_by_hand() -> tuple[int, int]:
    """One DeepSeek-V3 MoE layer at TP 1, EP 1: its linears' elements and fp32 scales."""
    shapes = [
        (1536, 7168),  # q_a_proj
        (128 * 192, 1536),  # q_b_proj
        (512 + 64, 7168),  # kv_a_proj_with_mqa
        (128 * (128 + 128), 512),  # kv_b_proj
        (7168, 128 * 128),  # o_proj
    ] + [(2048, 7168), (2048, 7168), (7168, 2048)] * 257  # 256 routed + 1 shared expert
    elements = sum(r * c for r, c in shapes)
    scales = sum(-(-r // 128) * -(-c // 128) for r, c in shapes)
    assert scales == 672 + 2304 + 280 + 1024 + 7168 + 257 * 3 * 896
    return elements, scales


def test_a_deepseek_moe_layer_as_stored() -> None:
    elements, scales = _v3_moe_layer_by_hand()
    layer = layers_stored(V3, FP8, 1, 1, 1, [3])  # layer 3: the first MoE layer
    assert (layer.elements, layer.bytes) == (elements, elements + 4 * scales)


def test_the_base_as_stored_replaces_the_converted_linears_only() -> None:
    """The rank's weights stored = its weights in bf16 - 2 B per converted element + their
    stored bytes; the embedding, output layer and norms are unchanged (bf16)."""
    elements, scales = _v3_moe_layer_by_hand()
    layout = ParallelLayout()
    bf16 = rank_weights(V3, layout, [3], first=True, last=True)
    stored = rank_weights(V3, layout, [3], first=True, last=True, quantized=FP8)
    assert stored.layers == bf16.layers - 2 * elements + elements + 4 * scales
    assert (stored.embedding, stored.output_layer) == (bf16.embedding, bf16.output_layer)
    # the MTP depth is one MoE layer (its linears as any layer's) beside eh_proj, bf16
    assert stored.mtp == bf16.mtp - 2 * elements + elements + 4 * scales
    assert mtp_stored(V3, FP8, 1, 1, 1).elements == elements


def test_the_linears_are_the_layers_weight_matrices() -> None:
    """The linears' elements are the sub-layers' parameters but the norms, the router
    (H x E, with gpt-oss's bias) and the biases and sinks: nothing is left out of a
    converted role."""
    h = V3.hidden
    attn = mixer_spec("attention").parameters(V3)
    mla_norms = h + 1536 + 512  # input norm, q_a_layernorm, kv_a_layernorm
    assert (
        _elements(mixer_spec("attention").linears(V3)) == attn.sharded + attn.replicated - mla_norms
    )
    moe = mlp_spec("moe").parameters(V3)
    assert (
        _elements(mlp_spec("moe").linears(V3))
        == moe.sharded + moe.experts + moe.replicated - h - 256 * h
    )
    oss = mlp_spec("moe").parameters(OSS)
    biases = 32 * (2 * 2880 + 2880)  # gate_up_proj_bias and down_proj_bias per expert
    assert _elements(mlp_spec("moe").linears(OSS)) == oss.experts - biases


def _elements(linears: tuple[Linear, ...]) -> int:
    return sum(lin.rows * lin.cols * lin.count for lin in linears)


def _base(model: str, **kw: object) -> int:
    return estimate(model=model, lengths=[1024], **kw).static.components["base_weights"]


def test_the_default_is_dequantized_and_moves_no_figure() -> None:
    """Dequantized is the default, priced as the same model without its quantization."""
    step = describe_step("gpt-oss-20b", [1024])
    assert step.settings.quantized_weights == "dequantized"
    plain = replace(step.settings, geometry=replace(OSS, quantization=None))
    assert static_memory(step.settings) == static_memory(plain)


# Published totals: DeepSeek-V3's 671B (its technical report and card), gpt-oss-20b's
# 20.91B and its checkpoint's 12.8 GiB, gpt-oss-120b's 60.8 GiB (OpenAI's gpt-oss model
# card, table 1: parameters and checkpoint size). ART's trainer builds no MTP layer, so
# DeepSeek-V3's base is the 671B main model.
def test_deepseek_v3_base_at_the_dtype_named() -> None:
    assert _base("deepseek-v3") / 2 == pytest.approx(671e9, rel=0.01)  # bf16
    assert _base("deepseek-v3", quantized_weights="stored") == pytest.approx(671e9, rel=0.01)  # fp8


def test_gpt_oss_base_at_the_dtype_named() -> None:
    assert _base("gpt-oss-20b") / 2 == pytest.approx(20.91e9, rel=0.01)  # bf16
    assert _base("gpt-oss-20b", quantized_weights="stored") / GIB == pytest.approx(12.8, abs=0.05)
    cfg = json.loads((EXAMPLES / "gpt-oss-20b" / "config.json").read_text())
    cfg.update(num_hidden_layers=36, num_local_experts=128)
    cfg["layer_types"] = ["sliding_attention", "full_attention"] * 18
    big = load_config(cfg)
    stored = rank_weights(big, ParallelLayout(), quantized=big.quantization).total
    assert stored / GIB == pytest.approx(60.8, abs=0.05)


def test_the_answer_names_how_the_weights_are_held() -> None:
    est = estimate(model="gpt-oss-20b", lengths=[1024], quantized_weights="stored")
    assert est.assumptions["base_weights"] == (
        "the checkpoint's experts linears as stored, mxfp4 e2m1 with one e8m0 scale per 32 "
        "values; the rest in bf16"
    )
    default = estimate(model="deepseek-v3", lengths=[1024]).to_dict()["assumptions"]
    assert default["base_weights"].startswith(
        "dequantized to bf16 from the checkpoint's fp8 e4m3 with 128x128 fp32 block scales"
    )
    assert "base_weights" not in estimate(model="qwen3-1.7b", lengths=[1024]).assumptions


def test_full_training_of_a_quantized_checkpoint_is_priced_dequantized() -> None:
    kw = {"training": "full", "runtime": "megatron-lm", "tp": 8, "ep": 8}
    with pytest.raises(InputError) as err:
        describe_step("deepseek-v3", [1024], quantized_weights="stored", **kw)
    assert err.value.field == "quantized_weights"
    est = estimate(model="deepseek-v3", lengths=[1024], **kw)
    assert "full training trains the dequantized weights" in est.assumptions["base_weights"]


def test_stored_on_a_plain_checkpoint_is_named_not_priced() -> None:
    est = estimate(model="qwen3-1.7b", lengths=[1024], quantized_weights="stored")
    assert "quantized_weights: qwen3-1.7b's checkpoint is not quantized" in est.ignored_options
    assert _base("qwen3-1.7b", quantized_weights="stored") == _base("qwen3-1.7b")


def test_a_kind_without_its_linears_refuses_stored() -> None:
    q = replace(FP8)
    nemotron = replace(PRESETS["nemotron-3-nano-30b-a3b"], quantization=q)
    with pytest.raises(InputError, match="mamba layers are not priced as stored"):
        rank_weights(nemotron, ParallelLayout(), quantized=q)


def test_a_dense_fp8_checkpoint_as_stored() -> None:
    """Qwen3-1.7B in block FP8 (the form of Qwen's ``-FP8`` releases, ``lm_head`` kept):
    one layer's q_proj 2,048 x 2,048, k_proj and v_proj 1,024 x 2,048, o_proj 2,048 x
    2,048, gate/up 6,144 x 2,048 and down 2,048 x 6,144, each with its 128 x 128 scales."""
    cfg = json.loads((EXAMPLES / "qwen3-1.7b" / "config.json").read_text())
    cfg["quantization_config"] = {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "modules_to_not_convert": ["lm_head"],
        "quant_method": "fp8",
        "weight_block_size": [128, 128],
    }
    g = load_config(cfg)
    assert g.quantization is not None
    shapes = [(2048, 2048), (1024, 2048), (1024, 2048), (2048, 2048)]
    shapes += [(6144, 2048), (6144, 2048), (2048, 6144)]
    elements = sum(r * c for r, c in shapes)
    scales = sum((r // 128) * (c // 128) for r, c in shapes)
    layer = layers_stored(g, g.quantization, 1, 1, 1, [0])
    assert (layer.elements, layer.bytes) == (elements, elements + 4 * scales)
    # at TP 2 each rank holds half of every matrix and half of its scales
    half = layers_stored(g, g.quantization, 2, 1, 1, [0])
    assert (half.elements, half.scales) == (elements // 2, 4 * scales // 2)


def test_a_gated_deltanet_checkpoint_refuses_stored() -> None:
    q4 = replace(PRESETS["qwen3.5-4b"], quantization=FP8)
    with pytest.raises(InputError, match="gdn layers are not priced as stored"):
        rank_weights(q4, ParallelLayout(), quantized=FP8)
