"""What the output-discarding checkpoints (``layernorm``, ``moe_act``, ``mla_up_proj``)
drop of a layer, counted by hand from megatron-core's code for the recorded DeepSeek-V3
style run (moe/gpt3_mcore_te_tp2_pp2_ep4_etp1_selective_recompute_experimental: H 1,024,
32 heads, q/k head 128 + rope 64, v head 128, q_lora_rank 1,536, kv_lora_rank 512,
expert FFN 1,024, TP 2 with SP, EP 4, ETP 1; its first three layers dense)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from cpmem.api import describe_step
from cpmem.errors import InputError
from cpmem.megatron.args import read_megatron_args
from cpmem.megatron.describe import describe_megatron
from cpmem.pricing.kinds import mixer_spec, mlp_spec
from cpmem.pricing.registry import inapplicable_options, price
from cpmem.pricing.tight.compose import kept_width, tight_widths
from cpmem.step.step import Step
from tests.unit.megatron_lm.tiny import step_of, tiny

ARGS = read_megatron_args(
    Path(
        "golden/megatron/cases/moe/gpt3_mcore_te_tp2_pp2_ep4_etp1_selective_recompute_experimental"
    )
    / "model_config.yaml"
)


def _step(modules: str, **changes: object) -> Step:
    return describe_megatron(replace(ARGS, recompute_modules=modules, **changes), world_size=8)


def _dropped(step: Step, kind: str) -> int:
    w = tight_widths(step.geometry, step)
    spec = mixer_spec(kind) if kind == "attention" else mlp_spec(kind)
    return spec.checkpoint_dropped(w, step)


def test_layernorm_drops_the_norm_output_where_the_norm_is_a_module() -> None:
    step = _step("layernorm")
    # H / TP under SP: latent attention's input norm and the MoE's pre-MLP norm are
    # TENorm modules (gpt_layer_specs.py:296-313); a dense layer's is fused into fc1
    assert _dropped(step, "attention") == 1024 // 2
    assert _dropped(step, "moe") == 1024 // 2
    assert _dropped(step, "dense") == 0
    # the local spec keeps every norm a module (gpt_layer_specs.py:416-433): the tiny GPT
    # (H 512, TP 1), dense attention and MLP
    local = tiny(transformer_impl="local", recompute_granularity="selective")
    assert _dropped(step_of(replace(local, recompute_modules="layernorm")), "dense") == 512
    assert _dropped(step_of(replace(local, recompute_modules="layernorm")), "attention") == 512
    te = tiny(recompute_granularity="selective", recompute_modules="layernorm")
    assert _dropped(step_of(te), "attention") == 0


def test_mla_up_proj_drops_the_cores_inputs_and_the_up_projections_saved_set() -> None:
    # q and k: 32/2 heads x 192; v: 16 x 128 -> 8,192; the kv up projection's norm output
    # (512/2) and its SP-gathered copy (512); the query's (1,536/2 and 1,536)
    assert _dropped(_step("mla_up_proj"), "attention") == 8192 + 256 + 512 + 768 + 1536


def test_moe_act_drops_all_but_fc1s_output_of_every_routed_row() -> None:
    step = _step("moe_act")
    rows = step.expert_rows_per_token(2)
    assert rows == 8  # concentrated: EP 4 x ETP 1 / SP 2 ranks' tokens x top-4
    # eager rows keep 6 F_e-wide tensors; the checkpoint keeps fc1's output (2 F_e)
    assert _dropped(step, "moe") == 8 * (6 - 2) * 1024
    # beside a moe checkpoint, which drops the whole layer but its norm's input and
    # output, it drops nothing more (the EP overlap refuses ``moe``: off here)
    moe = _step("moe", overlap_moe_expert_parallel_comm=False)
    both = _step("moe moe_act", overlap_moe_expert_parallel_comm=False)
    assert _dropped(both, "moe") == _dropped(moe, "moe") > 8 * (6 - 2) * 1024


def test_shared_experts_drop_the_shared_experts_saved_set() -> None:
    # the fused SwiGLU's fc1 output (2 F_s) and activation output (F_s), F_s 1,024 over
    # TP 2; the checkpoint's input is the norm output the layer keeps anyway
    assert _dropped(_step("shared_experts"), "moe") == 3 * 1024 // 2


def test_the_modules_lower_the_kept_set_by_what_they_drop() -> None:
    base, dropped = _step("mlp"), _step("mlp layernorm mla_up_proj moe_act")
    g = base.geometry
    before = kept_width(g, tight_widths(g, base), base)
    after = kept_width(g, tight_widths(g, dropped), dropped)
    attention = 512 + 11264
    moe = 512 + 8 * 4 * 1024
    assert before - after == g.layers * attention + g.mlp_count("moe") * moe


def test_the_reference_formula_refuses_the_modules_it_never_priced() -> None:
    step = describe_step(
        "qwen3.5-27b", lengths=[4096], recompute="selective", modules="core_attn+layernorm"
    )
    with pytest.raises(InputError) as err:
        price(step, "reference")
    assert err.value.field == "modules" and err.value.value == "layernorm"


def test_a_module_the_model_has_nothing_for_is_named_as_unread() -> None:
    # the tiny GPT: standard attention and dense MLPs under Transformer Engine, no experts
    step = step_of(tiny(), recompute="selective", modules="layernorm+moe_act+mla_up_proj")
    notes = "\n".join(inapplicable_options(step))
    assert "layernorm" in notes and "moe_act" in notes and "mla_up_proj" in notes
