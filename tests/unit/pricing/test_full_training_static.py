"""What a fully trained rank holds between steps (``training="full"``, Megatron-LM's
runs): parameters, DDP buffers, the optimizer's master copy and moments, the workspaces
(``cpmem.pricing.static``, ``param_buffers``, ``weights.stage_tensors``, ``workspaces``).

Expected values: the tiny GPT's parameters counted by hand; the bytes per parameter of
``docs/user-guide/features/dist_optimizer.md`` (18 B/param without the distributed
optimizer, 6 + 12/d with it) and the buffer layout of ``optimizer/param_layout.py`` /
``distrib_optimizer.py`` (each parameter starting on 64 elements, in reverse order, the
bucket ending on lcm(d, 128), each rank owning one contiguous 1/d slice and a master copy
of the real elements in it), restated here; PyTorch's documented cuBLAS workspace sizes
(``CUBLAS_WORKSPACE_CONFIG``: SIZE KiB x COUNT) and Transformer Engine's
``get_cublas_workspace_size_bytes`` (32 MiB + 1 KiB from compute capability 9, else
4 MiB).
"""

from __future__ import annotations

import math

import pytest
from megatron_lm.tiny import static_of, step_of, tiny

from cpmem.errors import InputError
from cpmem.pricing.weights import stage_tensors
from cpmem.pricing.workspaces import cublas_workspace_bytes
from cpmem.step.step import Step

H = 512
V = 50304  # 50257 padded to a multiple of 128 (TP 1)
# one layer: QKV 3h*h + 3h bias, projection h*h + h, fc1 4h*h + 4h, fc2 4h*h + h,
# two LayerNorms 2 * 2h: 12h^2 + 13h
LAYER = 12 * H * H + 13 * H
# 12 layers, the word embedding V*h, 1024 learned positions, the final LayerNorm 2h;
# tied: no output weight at PP 1
TINY_PARAMS = 12 * LAYER + V * H + 1024 * H + 2 * H
MIB = 1 << 20


def _tiny_tensor_sizes(d_vocab: int = V) -> list[int]:
    """The tiny GPT's parameter sizes, in model order, listed by hand."""
    layer = [3 * H * H, 3 * H, H * H, H, 4 * H * H, 4 * H, 4 * H * H, H, H, H, H, H]
    return [d_vocab * H, 1024 * H] + layer * 12 + [H, H]


def _stage(step: Step, stage: int) -> tuple[list[int], list[int]]:
    """(the stage's dense parameters, the tied output copy) on one rank."""
    s = step.settings
    layers = [i for c in range(s.pipeline.vpp) for i in s.pipeline.chunk_layers(12, stage, c)]
    t = stage_tensors(
        s.geometry, s.layout, layers, first=stage == 0, last=stage == s.pipeline.pp - 1
    )
    return list(t.dense), list(t.tied_copy)


def _optimizer(parts: dict[str, int]) -> int:
    """The optimizer's bytes per owned element: master copy and Adam's moments."""
    return parts["optimizer_states"]


def _last_rank_real_share(sizes: list[int], d: int) -> int:
    """Real elements in the last of ``d`` equal slices of a one-bucket buffer laid out
    in reverse order, each parameter starting on a multiple of 64, the bucket padded
    to lcm(d, 128) (param_layout.py, distrib_optimizer.py)."""
    spans = []
    start = 0
    for n in reversed(sizes):
        start = -(-start // 64) * 64
        spans.append((start, start + n))
        start += n
    align = math.lcm(d, 128)
    numel = -(-start // align) * align
    lo, hi = numel - numel // d, numel
    return sum(max(0, min(b, hi) - max(a, lo)) for a, b in spans)


def test_the_tiny_gpt_has_its_parameters_counted_by_hand() -> None:
    assert TINY_PARAMS == 64_109_568
    assert sum(_tiny_tensor_sizes()) == TINY_PARAMS
    tensors, shared = _stage(step_of(tiny()), 0)
    assert sum(tensors) == TINY_PARAMS and shared == []


def test_tensor_parallel_shards_all_but_row_parallel_biases_norms_and_positions() -> None:
    # per TP rank at t = 2: weights 12h^2 / 2; QKV and fc1 biases (3h + 4h) / 2; the
    # projection's and fc2's biases h + h whole; norms 4h whole; vocabulary 50432 / 2
    # rows; positions 1024 x h whole; final norm 2h
    t = 2
    layer = 12 * H * H // t + (3 * H + 4 * H) // t + 2 * H + 4 * H
    expected = 12 * layer + 50432 // t * H + 1024 * H + 2 * H
    tensors, _ = _stage(step_of(tiny(tensor_model_parallel_size=t)), 0)
    assert sum(tensors) == expected


def test_without_the_distributed_optimizer_a_parameter_costs_18_bytes() -> None:
    # 2 (bf16 parameter) + 4 (fp32 gradient) + 4 (fp32 master) + 8 (Adam's two moments)
    parts = static_of(tiny(), world_size=8)
    optimizer = parts["weights"] + parts["gradient_buffer"] + parts["optimizer_states"]
    assert optimizer == 18 * TINY_PARAMS
    assert "master_gradients" not in parts  # the master's gradient is a view of main_grad


@pytest.mark.parametrize("world", [8, 5])
def test_the_distributed_optimizer_holds_6_per_padded_element_and_12_per_owned(
    world: int,
) -> None:
    d = world  # TP 1, PP 1, CP 1: DP is the world
    parts = static_of(
        tiny(use_distributed_optimizer=True, global_batch_size=None), world_size=world
    )
    # every tensor is a multiple of h = 512 elements: no start padding; the bucket ends
    # on lcm(d, 128): 128 at d = 8 (the count already is a multiple), 640 at d = 5
    align = math.lcm(d, 128)
    padded = -(-TINY_PARAMS // align) * align
    assert padded == {8: TINY_PARAMS, 5: TINY_PARAMS + 512}[d]
    share = parts["optimizer_states"] // 12  # the fp32 master (4) and Adam's moments (8)
    assert parts["weights"] == 2 * padded
    assert parts["gradient_buffer"] == 4 * padded
    assert parts["optimizer_states"] == 12 * share
    total = parts["weights"] + parts["gradient_buffer"] + parts["optimizer_states"]
    assert total == 6 * padded + 12 * share
    # one bucket: the last slice is P_padded / d long and ends with all the padding
    assert share == padded // d - (padded - TINY_PARAMS)


def test_the_last_rank_owns_p_over_d_where_the_bucket_needs_no_padding() -> None:
    assert _last_rank_real_share(_tiny_tensor_sizes(), 8) == TINY_PARAMS // 8
    parts = static_of(tiny(use_distributed_optimizer=True), world_size=8)
    assert parts["optimizer_states"] // 12 == _last_rank_real_share(_tiny_tensor_sizes(), 8)


def test_the_last_of_five_slices_holds_the_buckets_512_padding_elements() -> None:
    # P + 512 = 64,110,080 = 100,172 x 640; the last fifth ends with the 512 padding
    assert _last_rank_real_share(_tiny_tensor_sizes(), 5) == (TINY_PARAMS + 512) // 5 - 512


def test_the_last_rank_owns_the_real_elements_of_its_slice() -> None:
    parts = static_of(tiny(use_distributed_optimizer=True, global_batch_size=None), world_size=5)
    assert parts["optimizer_states"] // 12 == _last_rank_real_share(_tiny_tensor_sizes(), 5)


def test_the_busiest_rank_owns_the_first_slice_all_real() -> None:
    # the first of five slices holds no padding: (P + 512) / 5 real elements, 512 more
    # than the last rank's
    args = tiny(use_distributed_optimizer=True, global_batch_size=None)
    parts = static_of(args, world_size=5, rank="busiest")
    assert parts["optimizer_states"] // 12 == (TINY_PARAMS + 512) // 5


def test_fp16_keeps_fp16_gradients_and_fp32_master_gradients() -> None:
    parts = static_of(tiny(bf16=False, fp16=True), world_size=8)
    p = TINY_PARAMS
    assert parts["weights"] == 2 * p
    assert parts["gradient_buffer"] == 2 * p  # the DDP buffer in the parameters' dtype
    assert parts["master_gradients"] == 4 * p  # main_grad.float(): a copy, not a view
    assert parts["optimizer_states"] == (4 + 8) * p


def test_bf16_gradients_reduced_in_bf16_get_an_fp32_master_gradient() -> None:
    parts = static_of(tiny(grad_reduce_in_bf16=True), world_size=8)
    assert parts["gradient_buffer"] == 2 * TINY_PARAMS
    assert parts["master_gradients"] == 4 * TINY_PARAMS


def test_fp32_training_has_no_master_copy() -> None:
    parts = static_of(tiny(bf16=False), world_size=8)
    assert parts["weights"] == 4 * TINY_PARAMS and parts["gradient_buffer"] == 4 * TINY_PARAMS
    assert "master_gradients" not in parts
    assert parts["optimizer_states"] == 8 * TINY_PARAMS  # Adam's moments; no master copy


def test_a_tied_last_stage_of_a_pipeline_holds_its_own_output_copy() -> None:
    t = 2
    run = step_of(tiny(tensor_model_parallel_size=t, pipeline_model_parallel_size=2))
    first, first_shared = _stage(run, 0)
    last, last_shared = _stage(run, 1)
    assert last_shared == [50432 // t * H]  # V/t x h, zero-filled and all-reduced
    assert first_shared == []
    assert 50432 // t * H in first  # the word embedding itself
    assert 50432 // t * H not in last
    untied = step_of(
        tiny(
            tensor_model_parallel_size=t,
            pipeline_model_parallel_size=2,
            untie_embeddings_and_output_weights=True,
        )
    )
    tensors, shared = _stage(untied, 1)
    assert shared == [] and 50432 // t * H in tensors  # its own output weight


def test_the_tied_copy_pays_the_optimizer_bytes_of_a_parameter() -> None:
    args = tiny(tensor_model_parallel_size=2, pipeline_model_parallel_size=2)
    tensors, shared = _stage(step_of(args), 1)
    parts = static_of(args)  # the last rank: stage 1
    assert parts["optimizer_states"] == 12 * (sum(tensors) + sum(shared))


# --- workspaces -------------------------------------------------------------------------


def test_cublas_workspace_configs_are_size_kib_times_count() -> None:
    assert cublas_workspace_bytes(":4096:8") == 33_554_432  # 4096 KiB x 8 = 32 MiB
    assert cublas_workspace_bytes(":4096:2:16:8") == 8_519_680  # 4096 KiB x 2 + 16 KiB x 8
    for bad in ("4096:8", ":4096", ":4096:8:16", ":a:8"):
        with pytest.raises(InputError) as err:
            cublas_workspace_bytes(bad)
        assert err.value.field == "CUBLAS_WORKSPACE_CONFIG"


@pytest.mark.parametrize(
    ("device", "cublas", "te"),
    [
        ("a100", 8_519_680, 4 * MIB),  # compute capability 8
        ("h100", 32 * MIB, 32 * MIB + 1024),  # 9
        ("gb200", 32 * MIB, 32 * MIB + 1024),  # 10
    ],
)
def test_workspaces_by_compute_capability(device: str, cublas: int, te: int) -> None:
    parts = static_of(tiny(), device=device)
    # CUBLAS_WORKSPACE_CONFIG unset: PyTorch's default, one per thread running cuBLAS (the
    # forward's and autograd's)
    assert parts["cublas_workspaces"] == 2 * cublas
    assert parts["te_cublaslt_workspace"] == te


def test_the_environment_and_deterministic_mode_set_the_cublas_workspace() -> None:
    a100 = tiny(env={"CUBLAS_WORKSPACE_CONFIG": ":4096:8"})
    assert static_of(a100, device="a100")["cublas_workspaces"] == 2 * 32 * MIB
    deterministic = tiny(deterministic_mode=True)
    # megatron/training/determinism.py: ":4096:8" where the variable is unset
    assert static_of(deterministic, device="a100")["cublas_workspaces"] == 2 * 32 * MIB


def test_the_local_implementation_has_no_te_workspace() -> None:
    assert "te_cublaslt_workspace" not in static_of(tiny(transformer_impl="local"))


def test_a_device_without_a_compute_capability_gets_the_largest_defaults() -> None:
    # PyTorch's Hopper default (32 MiB) and TE's 32 MiB + 1 KiB: the largest of the sizes
    parts = static_of(tiny(), device="mi300x", attention_backend="flash")
    assert parts["cublas_workspaces"] == 2 * 32 * MIB
    assert parts["te_cublaslt_workspace"] == 32 * MIB + 1024


def test_auto_needs_the_devices_compute_capability() -> None:
    # Transformer Engine's attention choice reads it: no silent pick on an unknown device
    with pytest.raises(InputError) as err:
        static_of(tiny(), device="mi300x")
    assert err.value.field == "device"


def test_the_global_memory_buffer_holds_the_output_layers_gathered_input() -> None:
    # sequence parallelism: the last stage gathers s x b x h bf16 into the "mpu" buffer
    sp = static_of(tiny(tensor_model_parallel_size=2, sequence_parallel=True))
    assert sp["global_memory_buffer"] == 2 * 1024 * 4 * H
    assert "global_memory_buffer" not in static_of(tiny())
    # the local attention's baddbmm input: b x (a/t) x s x s in bf16
    local = static_of(tiny(transformer_impl="local"))
    assert local["global_memory_buffer"] == 2 * 4 * 8 * 1024 * 1024


def test_a_frozen_output_layer_gathers_into_a_fresh_tensor() -> None:
    # LoRA: megatron's LinearWithFrozenWeight gathers the sequence itself, no mpu buffer
    sp = static_of(tiny(tensor_model_parallel_size=2, sequence_parallel=True), lora_rank=8)
    assert "global_memory_buffer" not in sp


def test_a_pipeline_stage_keeps_each_chunks_last_input_and_its_gradient() -> None:
    # TransformerBlock.set_input_tensor keeps the received [s, b, h] activation, and the
    # received leaf's .grad: 2 x 1024 x 4 x 512 bf16 per chunk off the first virtual stage
    one = 2 * 1024 * 4 * H * 2
    assert static_of(tiny(pipeline_model_parallel_size=2))["pipeline_received"] == one
    first = static_of(tiny(pipeline_model_parallel_size=2), rank=0)
    assert "pipeline_received" not in first  # the first stage embeds
    interleaved = tiny(pipeline_model_parallel_size=2, num_layers_per_virtual_pipeline_stage=2)
    assert static_of(interleaved)["pipeline_received"] == 3 * one  # three chunks, all receive
    assert static_of(interleaved, rank=0)["pipeline_received"] == 2 * one  # chunk 0 embeds
