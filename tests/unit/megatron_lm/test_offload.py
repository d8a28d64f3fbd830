"""Fine-grained activation offloading (``cpmem.step.offload``, ``cpmem.pricing.offload``,
``cpmem.megatron.offload_rules``) on Megatron-LM's CI case that records it,
``moe/gpt3_moe_mcore_te_tp2_pp2_ep4_etp1_fine_grained_offloading``.

Hand-derived from its ``model_config.yaml`` and megatron-core at 4828d651: sequence 4096,
micro-batch 1, hidden 1024, 32 heads (16 on a TP-2 rank), ``--v-head-dim 128``, SP over
TP 2, 32 experts over EP 4 (8 a rank), top-4, ``--moe-ffn-hidden-size 1024`` with SwiGLU,
bf16, the unfused core (``--attention-backend unfused``).

- ``attn_norm``/``mlp_norm``: the norm's input, the residual stream on the rank's
  sequence shard: 4096 / 2 x 1024 = 2,097,152 elements, 4,194,304 B
  (transformer_layer.py:617-627, 749-758).
- ``core_attn``: the softmax's output, ``[16, 4096, 4096]`` bf16 (TE's fused masked
  softmax: 16 < 4096 < 16384, 4096 % 8 == 0, 1 x 16 heads % 4 == 0):
  268,435,456 elements, 536,870,912 B.
- ``attn_proj``: the core's output, 4096 x (32 x 128 / 2) = 8,388,608 elements,
  16,777,216 B (multi_latent_attention.py:461-464).
- ``expert_fc1``: fc1's input, H per routed row. Each of the EP group's 4 ranks holds
  2048 tokens (SP) x 4 copies = 8192 rows: balanced, a rank receives 8192 rows
  (16,777,216 B); at worst every copy lands on this rank's 8 experts, 4 x 8192 = 32,768
  rows (67,108,864 B) (moe/experts.py:271-274, 701-712).
- ``moe_act``: fc1's output, ``2 x 1024`` per row: 33,554,432 B balanced, 134,217,728 B
  at worst (moe/experts.py:714, 792-810).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from cpmem.api import estimate
from cpmem.errors import InputError
from cpmem.gate.megatron_tier import read_case
from cpmem.megatron.describe import describe_megatron
from cpmem.megatron.offload_rules import offload, offload_problems
from cpmem.pricing.offload import LayerOffload, layer_offloads, merged_partners, offloaded_bytes
from cpmem.pricing.pipeline import chunk_step, stage_peak
from cpmem.pricing.registry import POLICIES, price
from cpmem.reports.cli_render import render_basis
from cpmem.step.offload import MIN_OFFLOADED_ELEMENTS, Offload
from cpmem.step.pipeline import Op
from cpmem.step.step import Step
from megatron_lm.tiny import tiny

CASE = (
    Path(__file__).resolve().parents[3]
    / "golden/megatron/cases/moe/gpt3_moe_mcore_te_tp2_pp2_ep4_etp1_fine_grained_offloading"
    / "model_config.yaml"
)
MODULES = ("expert_fc1", "moe_act", "attn_norm", "mlp_norm", "qkv_linear", "core_attn", "attn_proj")
NORM = 2048 * 1024 * 2
SCORES = 16 * 4096 * 4096 * 2
PROJ = 4096 * 2048 * 2
FC1 = {"balanced": 8192 * 1024 * 2, "concentrated": 32_768 * 1024 * 2}
ACT = {"balanced": 8192 * 2048 * 2, "concentrated": 32_768 * 2048 * 2}


def _case_step(routing: str = "concentrated", **offload_changes: object) -> Step:
    step = describe_megatron(read_case(CASE), world_size=8, device="h100", rank="last")
    settings = step.settings.replace(moe_routing=routing)
    if offload_changes:
        settings = settings.replace(offload=replace(settings.offload, **offload_changes))
    return replace(step, settings=settings)


def test_the_hand_derived_sizes() -> None:
    assert (NORM, SCORES, PROJ) == (4_194_304, 536_870_912, 16_777_216)
    assert FC1 == {"balanced": 16_777_216, "concentrated": 67_108_864}
    assert ACT == {"balanced": 33_554_432, "concentrated": 134_217_728}
    assert MIN_OFFLOADED_ELEMENTS == 1_048_576  # transformer_config.py:1180


def test_the_door_reads_the_cases_modules() -> None:
    step = _case_step()
    assert step.settings.offload == Offload(MODULES, 1_048_576)


@pytest.mark.parametrize("routing", ["balanced", "concentrated"])
def test_each_module_sends_the_hand_derived_bytes(routing: str) -> None:
    """An MLA + MoE layer of the last stage's first chunk, in commit order."""
    step = _case_step(routing)
    layers = layer_offloads(chunk_step(step, step.microbatch_steps[0], 1, 0))
    assert len(layers) == 2
    want = {
        "qkv_linear": 0,
        "core_attn": SCORES,
        "attn_proj": PROJ,
        "attn_norm": NORM,
        "expert_fc1": FC1[routing],
        "moe_act": ACT[routing],
        "mlp_norm": NORM,
    }
    for layer in layers:
        assert layer.groups == tuple(want)
        assert dict(zip(layer.groups, (s[0] for s in layer.sent), strict=True)) == want


def test_a_dense_layers_fused_norm_opens_no_mlp_norm_group() -> None:
    """The first stage's dense layers: Transformer Engine fuses the pre-MLP norm into
    fc1 (``IdentityOp``), so ``mlp_norm`` opens no group (transformer_layer.py:1382-1384)."""
    step = _case_step()
    layers = layer_offloads(chunk_step(step, step.microbatch_steps[0], 0, 0))
    assert [layer.groups for layer in layers] == [
        ("qkv_linear", "core_attn", "attn_proj", "attn_norm")
    ] * 3


def test_a_tensor_below_the_smallest_size_stays() -> None:
    """One element above the norm input's 2,097,152: the norms send nothing; at exactly
    its size they are sent (``numel() < min_offloaded_tensor_size`` stays,
    fine_grained_activation_offload.py:993-994)."""
    at_size = _case_step("balanced", min_elements=2_097_152)
    layer = layer_offloads(chunk_step(at_size, at_size.microbatch_steps[0], 1, 0))[0]
    assert dict(zip(layer.groups, (s[0] for s in layer.sent), strict=True))["attn_norm"] == NORM
    step = _case_step("balanced", min_elements=2_097_153)
    layer = layer_offloads(chunk_step(step, step.microbatch_steps[0], 1, 0))[0]
    sent = dict(zip(layer.groups, (s[0] for s in layer.sent), strict=True))
    assert sent["attn_norm"] == sent["mlp_norm"] == 0
    assert sent["core_attn"] == SCORES


def _chunks(n: int) -> dict[tuple[int, int], list[LayerOffload]]:
    """``n`` micro-batches of one chunk, two layers each sending 100 (core_attn) and 10
    (mlp_norm)."""
    layer = LayerOffload(("core_attn", "mlp_norm"), ((100,), (10,)))
    return {(m, 0): [layer, layer] for m in range(n)}


def _ops(text: str) -> list[Op]:
    return [Op("forward" if t[0] == "F" else "backward", int(t[1]), 0) for t in text.split()]


def test_the_manager_keeps_the_margin_and_the_last_groups() -> None:
    """1F1B's first of two stages (F0 F1 B0 F2 B1 B2): every chunk keeps its last group
    (layer 1's mlp_norm, reloaded ahead); micro-batch 0, the first backward chunk (the
    margin) whose backward is the next after its own forward, keeps its last group of
    each module (layer 1's both): 110 offloaded; the others 100 + 10 + 100 = 210."""
    sent = offloaded_bytes(_chunks(3), _ops("F0 F1 B0 F2 B1 B2"), 1)
    assert sent == {(0, 0): (110,), (1, 0): (210,), (2, 0): (210,)}


def test_a_chunk_whose_own_backward_is_next_keeps_its_last_groups() -> None:
    """The last stage (F0 B0 F1 B1 F2 B2): every chunk's next backward is its own."""
    sent = offloaded_bytes(_chunks(3), _ops("F0 B0 F1 B1 F2 B2"), 1)
    assert sent == {(0, 0): (110,), (1, 0): (110,), (2, 0): (110,)}


def test_the_combined_schedule_pairs_a_forward_with_the_backward_after_it() -> None:
    assert merged_partners(_ops("F0 F1 B0 F2 B1 B2")) == {
        1: (0, 0),
        2: (1, 0),
        3: (1, 0),
        4: (2, 0),
    }
    assert merged_partners(_ops("F0 B0 F1 B1")) == {}  # a chunk's own backward


def test_offloading_prices_no_more_than_without_and_says_host_memory_is_not_in_it() -> None:
    on = price(_case_step("balanced"))
    off = price(_case_step("balanced", modules=()))
    assert on.peak_bytes < off.peak_bytes
    assert on.static == off.static
    assert any("Pinned host memory is not device memory" in n for n in on.notes)
    assert not any("offload=" in n for n in off.notes)


def test_without_stages_nothing_is_in_flight() -> None:
    """PP 1: the running micro-batch is priced with everything on the device."""
    args = tiny(transformer_impl="transformer_engine")
    step = describe_megatron(args, world_size=8, device="h100", rank="last")
    with_offload = replace(step, settings=step.settings.replace(offload=Offload(("core_attn",))))
    assert price(with_offload).peak_bytes == price(step).peak_bytes


def test_the_step_setting_refuses_what_megatron_core_refuses() -> None:
    with pytest.raises(InputError, match=r"transformer_config\.py:1748-1761"):
        Offload(("qkv",))
    with pytest.raises(InputError, match="needs core_attn"):
        Offload(("attn_proj",))
    assert Offload.parse("core_attn+attn_proj").modules == ("core_attn", "attn_proj")


def test_the_modules_are_unread_without_the_switch() -> None:
    args = tiny(offload_modules="[core_attn]")
    assert offload(args) == Offload()
    assert offload_problems(args) == []


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"offload_modules": "[attn_proj]"}, "--offload-modules attn_proj"),
        ({"offload_modules": "[core_atn]"}, "--offload-modules core_atn"),
        ({"offload_modules": None}, "--fine-grained-activation-offloading"),
        (
            {"transformer_impl": "local"},
            "--fine-grained-activation-offloading --transformer-impl local",
        ),
        ({"activation_offload_fraction": 0.5}, "--activation-offload-fraction 0.5"),
        ({"delta_offload_bytes_across_pp_ranks": 1}, "--delta-offload-bytes-across-pp-ranks 1"),
        ({"delay_offload_until_cuda_graph": True}, "--delay-offload-until-cuda-graph"),
        ({"offload_modules": "[fused_group_mlp]"}, "--offload-modules fused_group_mlp"),
        ({"min_offloaded_tensor_size": -1}, "--min-offloaded-tensor-size -1"),
        (
            {
                "offload_modules": "[moe_act]",
                "recompute_granularity": "selective",
                "recompute_modules": "[moe]",
            },
            "--offload-modules moe_act --recompute-modules moe",
        ),
    ],
)
def test_the_door_refuses_with_the_flags(changes: dict[str, object], named: str) -> None:
    base = {
        "fine_grained_activation_offloading": True,
        "offload_modules": "[core_attn]",
        "transformer_impl": "transformer_engine",
    }
    args = tiny(**{**base, **changes})
    assert [flags for flags, _ in offload_problems(args)] == [named]


def test_the_combined_schedule_holds_the_partners_offloaded_groups() -> None:
    """The last stage's busiest forward, micro-batch 2's first chunk, runs beside the
    backward of micro-batch 0's third chunk under ``--overlap-moe-expert-parallel-comm``:
    that chunk's offloaded bytes are on the device. It offloads its first layer's groups
    only (its last layer's are kept: the next backward after its forward holding them is
    its own, the MTP chunk between priced with no layer), balanced:
    536,870,912 + 16,777,216 + 2 x 4,194,304 + 16,777,216 + 33,554,432 = 612,368,384 B."""
    step = _case_step("balanced")
    runtime = replace(step.settings.runtime, overlap_moe_comm=False)
    apart = replace(step, settings=step.settings.replace(runtime=runtime))
    combined = stage_peak(step, list(step.microbatch_steps), 1, POLICIES["tight"]).forward_moment
    alone = stage_peak(apart, list(apart.microbatch_steps), 1, POLICIES["tight"]).forward_moment
    assert combined.op == alone.op == Op("forward", 2, 0)
    partner = SCORES + PROJ + 2 * NORM + FC1["balanced"] + ACT["balanced"]
    assert partner == 612_368_384
    assert combined.kept - alone.kept == partner


def test_the_answer_says_host_memory_is_outside_the_figure() -> None:
    lines = render_basis(price(_case_step("balanced")))
    outside = [line for line in lines if line.startswith("outside the figure: offload=")]
    assert len(outside) == 1 and "Pinned host memory is not device memory" in outside[0]


def test_the_reference_prices_every_saved_tensor_on_the_device_and_says_so() -> None:
    """The reference's widths name no tensor to take off: its figure does not move, and
    the estimate lists ``offload`` among what it does not price."""
    kwargs = {
        "model": "Qwen/Qwen3-1.7B",
        "lengths": [4096],
        "pp": 2,
        "microbatches": 4,
        "attention_backend": "unfused",
        "recompute": "none",
    }
    off = estimate(**kwargs, policy="reference")
    on = estimate(**kwargs, offload="core_attn", policy="reference")
    assert on.peak_bytes == off.peak_bytes
    assert any(o.startswith("offload:") for o in on.ignored_options)
    tight = estimate(**kwargs, offload="core_attn", policy="tight")
    assert tight.peak_bytes < estimate(**kwargs, policy="tight").peak_bytes
