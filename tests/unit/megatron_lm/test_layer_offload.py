"""Whole-layer activation offloading (``--cpu-offloading-num-layers``; ``Offload.layers``,
``cpmem.pricing.layer_offload``, ``cpmem.megatron.offload_rules``). No Megatron-LM CI
recording runs it: the bytes are derived by hand from Transformer Engine's schedule
(b9d690e0 ``pytorch/cpu_offload.py`` ``DefaultOffloadSynchronizer``: layer ``i < N`` is
freed on the device when layer ``L - N + i``'s forward begins, reloaded when layer
``L - 1 - N + i``'s backward begins) and the tiny GPT's shapes (``tiny.py``).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from cpmem.api import describe_step, estimate
from cpmem.errors import InputError
from cpmem.megatron.args import parse_megatron_args
from cpmem.megatron.offload_rules import layer_offload_problems, offload
from cpmem.pricing.layer_offload import (
    layer_sizes,
    offloaded_at,
    offloaded_retained_bytes,
    on_device_at,
    taken_off,
)
from cpmem.pricing.registry import price
from cpmem.reports.cli_render import render_basis
from cpmem.step.offload import TE_MIN_OFFLOADED_ELEMENTS, Offload
from megatron_lm.tiny import FLAGS, step_of, tiny

MIB = 1024 * 1024


def test_te_offloads_tensors_of_256k_elements_and_more() -> None:
    """cpu_offload.py ``_check_if_offload``: ``if t.numel() < 256 * 1024: return False``."""
    assert TE_MIN_OFFLOADED_ELEMENTS == 262_144
    assert Offload.whole_layers(3) == Offload((), 262_144, 3)


def test_the_door_reads_the_count_as_whole_layers() -> None:
    assert offload(tiny(cpu_offloading_num_layers=4)) == Offload.whole_layers(4)
    # a count of 0 or below leaves cpu_offloading off (arguments.py:1730-1731)
    assert offload(tiny(cpu_offloading_num_layers=0)) == Offload()
    assert not offload(tiny(cpu_offloading_num_layers=-1)).active
    args = parse_megatron_args({**FLAGS, "--cpu-offloading-num-layers": 2})
    assert args.cpu_offloading_num_layers == 2


def test_equal_layers_keep_at_most_l_minus_n_on_the_device() -> None:
    """TE's docstring: activation memory ``(num_layers - num_offloaded_layers) * T``. 12
    layers of 1 byte, 4 offloaded: layer 0 is freed at layer 8's forward, so layers 0-7
    are all on the device at layer 7 (8 bytes) and never more; at the last layer the 4
    offloaded ones are off."""
    sizes = [1] * 12
    assert [on_device_at(sizes, 4, j) for j in range(12)] == [1, 2, 3, 4, 5, 6, 7, 8, 8, 8, 8, 8]
    assert offloaded_at(sizes, 4, 11) == 4
    assert offloaded_at(sizes, 4, 7) == 0
    assert offloaded_at(sizes, 4, 9) == 2  # layers 0 and 1 freed at layers 8 and 9


def test_a_large_first_layer_limits_what_is_taken_off() -> None:
    """Sizes 10, 1, 1, 1 with the first 2 offloaded: layer 0 is freed only when layer 2's
    forward begins (L - N + 0 = 2), so at layer 1 the device holds 10 + 1 of the 13; the
    figure, which prices all 13 at every moment, may take off 2, not the 11 off the device
    at the last layer."""
    sizes = [10, 1, 1, 1]
    assert [on_device_at(sizes, 2, j) for j in range(4)] == [10, 11, 2, 2]
    assert offloaded_at(sizes, 2, 3) == 11
    assert taken_off(sizes, 2, {3}) == 2
    assert taken_off([1] * 12, 4, {11}) == 4


def test_a_moment_before_the_offloaded_layers_are_freed_takes_nothing_off() -> None:
    """A kind whose last layer is layer 0 (an MoE first layer before dense ones): the
    figure prices its backward with only layer 0 kept, which is back on the device by
    then (reloaded from layer L - 1 - N + 0's backward): nothing comes off."""
    assert offloaded_at([1] * 12, 1, 0) == 0
    assert taken_off([1] * 12, 1, {0, 11}) == 0
    assert taken_off([1] * 12, 1, {11}) == 1


def _replay(sizes: list[int], n: int) -> list[tuple[str, int, int]]:
    """Transformer Engine's ``DefaultOffloadSynchronizer`` (b9d690e0 cpu_offload.py
    586-654) replayed event by event, written from its code, not from cpmem's: per
    layer's forward and backward, the bytes of the layers' tensors on the device.

    ``_init_offload_synchronization_dicts``: layer ``i < n`` finishes its offload (its
    device tensors released) at ``fwd_step`` of layer ``L - n + i`` and starts its reload
    at ``bwd_step`` of layer ``L - 1 - n + i``; ``bwd_step`` first releases the previous
    backward layer (``release_all_memory``), as autograd frees a layer's saved tensors
    once its backward has run."""
    count = len(sizes)
    finish = {count - n + i: i for i in range(n)}
    reload = {count - 1 - n + i: i for i in range(n)}
    on = [False] * count
    out = []
    for j in range(count):
        if j in finish:  # fwd_step: release_activation_forward_gpu_memory
            on[finish[j]] = False
        on[j] = True  # the layer's forward saves its tensors (push_tensor)
        out.append(("forward", j, sum(s for s, o in zip(sizes, on, strict=True) if o)))
    for b in range(count - 1, -1, -1):
        if b + 1 < count:  # bwd_step: the previous layer's memory released
            on[b + 1] = False
        if b in reload:  # start_reload
            on[reload[b]] = True
        out.append(("backward", b, sum(s for s, o in zip(sizes, on, strict=True) if o)))
    return out


@pytest.mark.parametrize(
    ("sizes", "n"),
    [([1] * 12, 4), ([1] * 12, 11), ([10, 1, 1, 1], 2), ([3, 1, 4, 1, 5, 9, 2, 6], 5)],
)
def test_the_window_is_transformer_engines_schedule(sizes: list[int], n: int) -> None:
    """``on_device_at`` at every layer's forward and backward equals the replay, and
    ``offloaded_at`` is what the layers up to it hold less that."""
    for _, j, device in _replay(sizes, n):
        assert on_device_at(sizes, n, j) == device
        assert offloaded_at(sizes, n, j) == sum(sizes[: j + 1]) - device


TINY_TOKENS = 4 * 1024  # micro-batch 4 of 1,024
PROJ_INPUT = TINY_TOKENS * 8 * 64 * 2  # the output projection's bf16 input: heads x d at TP 1


def test_the_tiny_gpt_takes_off_its_offloaded_layers_projection_inputs() -> None:
    """The tiny GPT (12 equal layers, TP 1, Transformer Engine's fused norms): of what a
    layer saves cpmem names the output projection's input, 4,096 x 512 bf16 = 4 MiB
    (2,097,152 elements, above TE's smallest); 4 layers offloaded take 16 MiB off the
    retained set and the figure, forward and forward+backward."""
    assert PROJ_INPUT == 4 * MIB
    base = price(step_of(tiny(tensor_model_parallel_size=1)), "tight")
    off = price(step_of(tiny(tensor_model_parallel_size=1, cpu_offloading_num_layers=4)), "tight")
    name = "retained_activations"
    assert base.components[name] - off.components[name] == 4 * PROJ_INPUT
    assert base.estimate_bytes - off.estimate_bytes == 4 * PROJ_INPUT
    assert base.peak_bytes - off.peak_bytes == 4 * PROJ_INPUT


def test_the_answer_says_host_memory_is_outside_the_figure() -> None:
    est = price(step_of(tiny(cpu_offloading_num_layers=4)), "tight")
    lines = [line for line in render_basis(est) if "offload=layers:4" in line]
    assert len(lines) == 1
    assert lines[0].startswith("outside the figure:")
    assert "at most 8 layers'" in lines[0] and "Pinned host memory" in lines[0]


def test_the_reference_prices_every_saved_tensor_on_the_device_and_says_so() -> None:
    kwargs = {"model": "Qwen/Qwen3-1.7B", "lengths": [4096], "recompute": "none"}
    on = estimate(**kwargs, offload="layers:4", policy="reference")
    assert on.peak_bytes == estimate(**kwargs, policy="reference").peak_bytes
    assert any(o.startswith("offload:") for o in on.ignored_options)


@pytest.mark.parametrize(
    ("changes", "named", "reason"),
    [
        ({"cpu_offloading_num_layers": 12}, "--num-layers 12", "only for layers less than 12"),
        (
            {"cpu_offloading_num_layers": 2, "pipeline_model_parallel_size": 2},
            "--pipeline-model-parallel-size 2",
            "no support for Pipeline parallelism",
        ),
        (
            {"cpu_offloading_num_layers": 2, "recompute_granularity": "selective"},
            "--recompute-granularity selective",
            "does not work when activation recomputation is enabled",
        ),
        (
            {"cpu_offloading_num_layers": 2, "fine_grained_activation_offloading": True},
            "--fine-grained-activation-offloading",
            "cannot be enabled with cpu_offloading",
        ),
        (
            {"cpu_offloading_num_layers": 2, "cuda_graph_impl": "local"},
            "--cuda-graph-impl local",
            "CUDA graphs not supported with CPU offloading",
        ),
        ({"cpu_offloading_num_layers": 2, "fp8": "hybrid"}, "--fp8-format hybrid", "FP8 copies"),
        (
            {"cpu_offloading_num_layers": 2, "env": {"NVTE_CPU_OFFLOAD_V1": "1"}},
            "NVTE_CPU_OFFLOAD_V1=1",
            "first offloading path",
        ),
    ],
)
def test_the_door_refuses_with_the_flags(
    changes: dict[str, object], named: str, reason: str
) -> None:
    problems = layer_offload_problems(tiny(**changes))
    assert len(problems) == 1
    flags, why = problems[0]
    assert flags.startswith("--cpu-offloading-num-layers 2") or "12" in flags
    assert named in flags and reason in why


def test_one_step_inside_the_rules_is_read() -> None:
    assert layer_offload_problems(tiny(cpu_offloading_num_layers=11)) == []
    assert (
        layer_offload_problems(tiny(cpu_offloading_num_layers=2, cuda_graph_impl="full_iteration"))
        == []
    )
    assert layer_offload_problems(tiny(recompute_granularity="full")) == []


def test_the_step_setting_refuses_what_megatron_core_refuses() -> None:
    kwargs = {"model": "Qwen/Qwen3-1.7B", "lengths": [4096]}
    with pytest.raises(InputError, match=r"transformer_config\.py:1614-1617"):
        describe_step(**kwargs, recompute="selective", offload="layers:2")
    with pytest.raises(InputError, match=r"fewer layers than the model's 28"):
        describe_step(**kwargs, recompute="none", offload="layers:28")
    with pytest.raises(InputError, match=r"transformer_config\.py:1609-1612"):
        describe_step(**kwargs, recompute="none", offload="layers:2", pp=2, microbatches=2)
    with pytest.raises(InputError, match="one or the other"):
        Offload(("core_attn",), layers=2)
    with pytest.raises(InputError, match="'layers:N' alone"):
        Offload.parse("layers:2+core_attn")
    assert Offload.parse("layers:2").words == ["layers:2"]


def test_a_kind_whose_last_layer_is_the_first_takes_nothing_off() -> None:
    """The tiny GPT with its first layer MoE (8 experts, top 2, grouped GEMM, no biases)
    and 11 dense: by hand, the MoE layer names the output projection's input (4 MiB),
    its module pre-MLP norm's input (4,096 x 512 bf16, 4 MiB), the experts' fc1 input
    (8,192 routed rows x 512, 8 MiB) and the activation's input (8,192 x 2,048, 32 MiB):
    48 MiB; a dense layer 4 MiB. The figure prices the MoE kind's backward at layer 0
    with only layer 0 kept, and layer 0 is back on the device by then: nothing comes off."""
    args = tiny(
        tensor_model_parallel_size=1,
        num_experts=8,
        moe_layer_freq=(1,) + (0,) * 11,
        add_bias_linear=False,
        moe_grouped_gemm=True,
        cpu_offloading_num_layers=4,
    )
    step = step_of(args)
    assert layer_sizes(step, TINY_TOKENS) == [48 * MIB] + [4 * MIB] * 11
    assert offloaded_retained_bytes(step, TINY_TOKENS) == 0


def test_a_mamba_stack_offloads_nothing_and_says_so() -> None:
    """megatron-core's ``MambaStack`` opens no offload context (ssm/mamba_block.py):
    20 of Nemotron 3 Nano's 52 layers, whose attention and MoE layers name tensors off
    the device at every moment of the figure were it a transformer block, take nothing
    off."""
    kwargs = {
        "model": "nemotron-3-nano-30b-a3b",
        "lengths": [4096],
        "recompute": "none",
        "runtime": "megatron-lm",
        "training": "full",
    }
    on = estimate(**kwargs, offload="layers:20")
    assert on.peak_bytes == estimate(**kwargs).peak_bytes
    assert any("Mamba stack opens no offload context" in n for n in on.notes)


def test_the_first_layers_input_stays_held_by_the_models_forward() -> None:
    """Under the local spec every norm is a module, so a layer names its attention norm's
    input (4,096 x 512 bf16, 4 MiB), its pre-MLP norm's input (4 MiB) and the output
    projection's input (4 MiB): 12 MiB; but layer 0's attention norm input is the block's
    input, ``decoder_input``, which ``GPTModel.forward`` holds through the head
    (gpt_model.py:545-600; only inference wraps it to free it): 8 MiB. The first 4 of 12
    layers offloaded: 8 + 3 x 12 = 44 MiB off (at most 96 MiB of the 140 on the device,
    from layer 8's forward on)."""
    args = tiny(tensor_model_parallel_size=1, transformer_impl="local")
    step = step_of(replace(args, cpu_offloading_num_layers=4))
    assert layer_sizes(step, TINY_TOKENS) == [8 * MIB] + [12 * MIB] * 11
    assert offloaded_retained_bytes(step, TINY_TOKENS) == 44 * MIB
    base = price(step_of(args), "tight")
    assert base.peak_bytes - price(step, "tight").peak_bytes == 44 * MIB


def test_the_retained_activations_are_read_from_the_source_not_measured() -> None:
    """No Megatron-LM recording runs whole-layer offloading: the term it moves names the
    source; the terms it does not move keep the recordings."""
    est = price(step_of(tiny(cpu_offloading_num_layers=4)), "tight")
    assert est.provenance["retained_activations"].label == "structure (source)"
    assert est.provenance["head_kept"].label == "measured (megatron-lm)"
    base = price(step_of(tiny()), "tight")
    assert base.provenance["retained_activations"].label == "measured (megatron-lm)"
