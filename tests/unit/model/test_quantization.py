"""A checkpoint's ``quantization_config`` read as published, every field read or refused.

The published values: deepseek-ai/DeepSeek-V3's and moonshotai/Kimi-K2-Instruct's
``{"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
"weight_block_size": [128, 128]}``; openai/gpt-oss-20b's ``{"modules_to_not_convert":
["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
"lm_head"], "quant_method": "mxfp4"}`` (transformers' MXFP4 documentation prints the
same list for gpt-oss-120b).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cpmem.errors import ConfigError
from cpmem.model.hf_config import load_config
from cpmem.model.presets import PRESETS
from cpmem.model.quantization import quantization_config, read_quantization

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
FP8 = {
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "quant_method": "fp8",
    "weight_block_size": [128, 128],
}


def test_block_fp8_converts_every_decoder_linear() -> None:
    q = read_quantization(FP8)
    assert (q.method, q.value_bits, q.block, q.scale_bytes) == ("fp8", 8, (128, 128), 4)
    assert q.converted == {"attention", "mlp", "shared_expert", "experts"}
    assert q.label == "fp8 e4m3 with 128x128 fp32 block scales"


def test_mxfp4_converts_the_routed_experts_only() -> None:
    q = load_config(EXAMPLES / "gpt-oss-20b" / "config.json").quantization
    assert q is not None
    assert (q.method, q.value_bits, q.block, q.scale_bytes) == ("mxfp4", 4, (1, 32), 1)
    assert q.converted == {"experts"}


def test_modules_to_not_convert_keeps_a_role_in_the_float_dtype() -> None:
    q = read_quantization({**FP8, "modules_to_not_convert": ["model.layers.*.self_attn"]})
    assert q.converted == {"mlp", "shared_expert", "experts"}


@pytest.mark.parametrize("name", ["deepseek-v3", "kimi-k2", "gpt-oss-20b"])
def test_the_published_configs_carry_their_quantization(name: str) -> None:
    assert load_config(EXAMPLES / name / "config.json").quantization == PRESETS[name].quantization
    assert PRESETS[name].quantization is not None


def _config(change: dict[str, Any]) -> dict[str, Any]:
    cfg = json.loads((EXAMPLES / "deepseek-v3" / "config.json").read_text())
    cfg["quantization_config"] = {**cfg["quantization_config"], **change}
    return cfg


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"quant_method": "gptq"}, "quantization_config.quant_method"),
        ({"fmt": "e5m2"}, "quantization_config.fmt"),
        ({"activation_scheme": "static"}, "quantization_config.activation_scheme"),
        ({"weight_block_size": [128]}, "quantization_config.weight_block_size"),
        ({"weight_block_size": None}, "quantization_config.weight_block_size"),
        ({"scale_fmt": "ue8m0"}, "quantization_config.scale_fmt"),
        (
            {"modules_to_not_convert": ["model.layers.*.mlp.gate_proj"]},
            "quantization_config.modules_to_not_convert",
        ),
    ],
)
def test_what_is_not_priced_is_refused_by_name(change: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(_config(change))
    assert err.value.field == field


def test_mlp_names_a_dense_mlp_and_an_moe_block_alike() -> None:
    """transformers names both ``model.layers.N.mlp``: keeping it keeps the experts too."""
    q = read_quantization({**FP8, "modules_to_not_convert": ["model.layers.*.mlp"]})
    assert q.converted == {"attention"}
    q = read_quantization({**FP8, "modules_to_not_convert": ["model.layers.*.mlp.experts"]})
    assert q.converted == {"attention", "mlp", "shared_expert"}


@pytest.mark.parametrize(
    "kept",
    [[], ["model.layers.*.self_attn"], ["model.layers.*.mlp"], ["model.layers.*.mlp.experts"]],
)
def test_the_written_config_reads_back(kept: list[str]) -> None:
    q = read_quantization({**FP8, "modules_to_not_convert": kept})
    assert read_quantization(quantization_config(q)) == q
    oss = PRESETS["gpt-oss-20b"].quantization
    assert oss is not None and read_quantization(quantization_config(oss)) == oss
