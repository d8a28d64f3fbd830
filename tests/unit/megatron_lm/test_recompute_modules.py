"""``--recompute-modules`` and ``--moe-layer-recompute`` as megatron-core reads them: the
list, its checks (transformer_config.py at the recordings' snapshot, lines named in each
case) and the selective recompute a run gets."""

from __future__ import annotations

from pathlib import Path

import pytest

from cpmem.errors import InputError
from cpmem.megatron.args import read_megatron_args
from cpmem.megatron.describe import megatron_recompute
from cpmem.megatron.recompute_modules import module_problems, read_modules
from cpmem.megatron.rules import check_megatron_args
from cpmem.step.recompute import Mode, Module
from tests.unit.megatron_lm.tiny import tiny

CASE = Path(
    "golden/megatron/cases/moe/gpt3_mcore_te_tp2_pp2_ep4_etp1_selective_recompute_experimental"
)


def test_the_yaml_list_and_the_command_line_words_read_alike() -> None:
    expected = ("layernorm", "mla_up_proj", "mlp", "moe_act")
    assert read_modules("[layernorm mla_up_proj mlp moe_act]") == expected
    assert read_modules("layernorm mla_up_proj mlp moe_act") == expected
    assert read_modules("['layernorm', 'moe_act']") == ("layernorm", "moe_act")


def test_the_recordings_modules_make_its_selective_recompute() -> None:
    args = read_megatron_args(CASE / "model_config.yaml")
    rc = megatron_recompute(args)
    assert rc.mode is Mode.SELECTIVE
    assert rc.modules == (Module.LAYERNORM, Module.MLA_UP_PROJ, Module.MLP, Module.MOE_ACT)


def test_without_the_flag_megatron_recomputes_the_core_attention() -> None:
    # transformer_config.py:1940-1941
    rc = megatron_recompute(tiny(recompute_granularity="selective"))
    assert rc.modules == (Module.CORE_ATTN,)


def test_the_modules_are_unread_without_selective_granularity() -> None:
    args = tiny(recompute_modules="shared_experts", recompute_granularity=None)
    assert module_problems(args) == []
    assert megatron_recompute(args).mode is Mode.NONE


def test_moe_layer_recompute_adds_moe_and_makes_the_recompute_selective() -> None:
    # transformer_config.py:2012-2025
    args = tiny(moe_layer_recompute=True)
    assert megatron_recompute(args).modules == (Module.CORE_ATTN, Module.MOE)
    full = tiny(moe_layer_recompute=True, recompute_granularity="full")
    assert any("2019-2021" in why for _, why in module_problems(full))


@pytest.mark.parametrize(
    ("modules", "changes", "expected"),
    [
        ("core_attn attn_norm", {}, "Invalid choices for recompute_modules"),
        ("moe_act", {"moe_grouped_gemm": False}, "transformer_config.py:1964-1967"),
        ("mla_up_proj", {"multi_latent_attention": False}, "transformer_config.py:1969-1973"),
        ("moe", {"overlap_moe_expert_parallel_comm": True}, "transformer_config.py:3031-3032"),
        (
            "shared_experts",
            {
                "moe_shared_expert_intermediate_size": 1024,
                "flag_values": {"--moe-shared-expert-overlap": True},
            },
            "transformer_config.py:1991-1998",
        ),
        ("gdp_qkv", {}, "changes memory cpmem does not price"),
        ("mhc", {}, "changes memory cpmem does not price"),
    ],
)
def test_megatrons_checks_and_the_unpriced_modules_are_named(
    modules: str, changes: dict[str, object], expected: str
) -> None:
    args = tiny(recompute_granularity="selective", recompute_modules=modules, **changes)
    assert any(expected in why for _, why in module_problems(args)), module_problems(args)


def test_delayed_fp8_refuses_the_discarding_norm_and_activation_checkpoints() -> None:
    # transformer_config.py:2000-2006: --fp8-recipe defaults to delayed
    args = tiny(
        recompute_granularity="selective",
        recompute_modules="layernorm",
        flag_values={"--fp8-format": "hybrid"},
    )
    assert any("2000-2006" in why for _, why in module_problems(args))
    blockwise = tiny(
        recompute_granularity="selective",
        recompute_modules="layernorm",
        flag_values={"--fp8-format": "hybrid", "--fp8-recipe": "blockwise"},
    )
    assert module_problems(blockwise) == []


def test_every_module_problem_is_in_one_refusal() -> None:
    args = tiny(recompute_granularity="selective", recompute_modules="moe_act mla_up_proj")
    with pytest.raises(InputError) as err:
        check_megatron_args(args)
    assert "1964-1967" in err.value.reason and "1969-1973" in err.value.reason
