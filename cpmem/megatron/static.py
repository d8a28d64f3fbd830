"""What stays allocated between a Megatron-LM run's steps on one rank (``static_bytes``).

Read after the optimizer step (``mem-allocated-bytes``), a rank holds (sources in
``docs/megatron-runtime.md``):

- its stage's parameters (2 B each in bf16/fp16) and the DDP gradient buffer (4 B in
  fp32 under ``--bf16``, 2 B under ``--fp16``); under the distributed optimizer both are
  contiguous buffers whose parameters start on 64-element boundaries
  (``optimizer/param_layout.py``), each bucket ending on a multiple of lcm(DPxCP, 128);
  the tied output copy of a later stage has a bucket of its own;
- the optimizer's fp32 master copy and Adam's two fp32 moments: the whole stage's
  (18 B/param with the gradient and parameter), or the rank's 1/(DPxCP) share of the
  buffer under ``--use-distributed-optimizer`` (the real elements of its slice: padding
  gets no master copy); under ``--fp16`` the master copy's fp32 gradients, made with
  ``.float()`` at the step and kept until the next ``zero_grad``;
- persistent workspaces allocated through the caching allocator: PyTorch's cuBLAS
  workspace (``CUBLAS_WORKSPACE_CONFIG``), PyTorch's cuBLASLt workspace, kept per
  handle and stream and sized as the cuBLAS one (the recordings' static bytes exceed
  the tensors by one more cuBLAS-workspace size on A100, H100 and GB200 alike, 32 MiB
  under ``:4096:8``), Transformer Engine's cuBLASLt workspace
  (32 MiB + 1 KiB from compute capability 9, else 4 MiB), and Megatron-LM's
  ``GlobalMemoryBuffer`` ("mpu": the output layer's gathered input under sequence
  parallelism, the local attention's ``baddbmm`` input), the larger of what used it.
"""

from __future__ import annotations

import math

from cpmem.errors import InputError
from cpmem.megatron.run import MegatronRun

MIB = 1 << 20
KIB = 1 << 10
PARAM_ALIGN = 64
"""Each parameter of a distributed-optimizer buffer starts on a multiple of 64 elements
(``_pad_start_of_param_if_needed``, ``optimizer/param_layout.py``)."""
BUCKET_ALIGN = 128
"""A bucket ends on a multiple of lcm(DPxCP, 128) elements (``_pad_end_of_bucket``)."""
CUBLAS_DEFAULT_PRE_HOPPER = 8_519_680
"""PyTorch's cuBLAS workspace with ``CUBLAS_WORKSPACE_CONFIG`` unset before compute
capability 9: ``:4096:2:16:8`` = 4096 KiB x 2 + 16 KiB x 8 (``CublasHandlePool.cpp``)."""
CUBLAS_DEFAULT_HOPPER = 32 * MIB
"""... and from compute capability 9: ``:4096:8`` = 32 MiB (the source stored with
``docs/megatron-runtime.md`` widens the Hopper case to majors 9, 10 and 12)."""
DETERMINISTIC_CUBLAS_CONFIG = ":4096:8"
"""``--deterministic-mode`` sets ``CUBLAS_WORKSPACE_CONFIG`` to ``:4096:8`` where it is
unset (``megatron/training/determinism.py``)."""
TE_WORKSPACE_HOPPER = 32 * MIB + KIB
"""Transformer Engine's cuBLASLt workspace from compute capability 9
(``get_cublas_workspace_size_bytes``, ``cpp_extensions/gemm.py``, TE >= 2.8)."""
TE_WORKSPACE_PRE_HOPPER = 4 * MIB
TE_CUBLAS_STREAMS = 4
"""Transformer Engine's grouped GEMM (``TEGroupedMLP``'s ``GroupedLinear``) runs on 4
cuBLAS streams, each with a workspace of the size above, allocated on first use and
kept (``get_multi_stream_cublas_workspace``, ``module/base.py``; ``num_streams`` in its
common library)."""


def cublas_workspace_bytes(config: str) -> int:
    """A ``CUBLAS_WORKSPACE_CONFIG`` value (``:SIZE_KiB:COUNT`` pairs) in bytes."""
    parts = config.strip().split(":")
    if parts[0] != "" or len(parts) < 3 or len(parts) % 2 == 0:
        raise InputError(
            "CUBLAS_WORKSPACE_CONFIG", config, "must be :SIZE:COUNT[:SIZE:COUNT...] (KiB, count)"
        )
    try:
        numbers = [int(p) for p in parts[1:]]
    except ValueError:
        raise InputError(
            "CUBLAS_WORKSPACE_CONFIG", config, "sizes and counts must be integers"
        ) from None
    return sum(size * KIB * count for size, count in zip(numbers[::2], numbers[1::2], strict=True))


def _norm_params(run: MegatronRun, width: int) -> int:
    """A norm's parameters: LayerNorm's weight and bias, RMSNorm's weight."""
    return 2 * width if run.args.normalization == "LayerNorm" else width


def layer_tensors(run: MegatronRun) -> list[int]:
    """Element counts of one transformer layer's parameters on a TP rank, but the routed
    experts' (``expert_layer_tensors``): under MoE the MLP is the router (``[E, h]``,
    replicated over TP, ``router.py``) and the shared experts (a TP-sharded MLP of
    ``--moe-shared-expert-intermediate-size``, ``shared_experts.py``)."""
    a = run.args
    h, t, d = a.hidden_size, run.tp, run.head_dim
    q_out = run.heads * d
    qkv_out = (run.heads + 2 * run.kv_groups) * d
    tensors = [qkv_out * h // t, h * q_out // t]
    biases = [qkv_out // t, h]  # row-parallel biases are whole
    mlp_widths = [run.ffn] if not run.moe else []
    shared = a.moe_shared_expert_intermediate_size
    if run.moe and shared is not None:
        mlp_widths.append(shared)
    if run.moe:
        tensors.append(run.num_experts * h)
        biases.append(run.num_experts)
    for f in mlp_widths:
        fc1_out = 2 * f if run.gated else f
        tensors += [fc1_out * h // t, h * f // t]
        biases += [fc1_out // t, h]
    norm = [h, h] if a.normalization == "LayerNorm" else [h]
    tensors += norm + norm  # the attention's and the MLP's input norms
    if a.add_bias_linear:
        tensors += biases
    if a.qk_layernorm:
        qk = [d, d] if a.normalization == "LayerNorm" else [d]
        tensors += qk + qk
    return tensors


def expert_layer_tensors(run: MegatronRun) -> list[int]:
    """Element counts of one layer's routed experts on a rank: ``E / EP`` local experts,
    each an MLP of ``--moe-ffn-hidden-size`` sharded over ETP (``experts.py``:
    ``SequentialMLP`` and ``TEGroupedMLP`` hold the same elements). Empty for a dense
    run."""
    if not run.moe:
        return []
    h, e, f = run.args.hidden_size, run.etp, run.moe_ffn
    fc1_out = 2 * f if run.gated else f
    one = [fc1_out * h // e, h * f // e]
    if run.args.add_bias_linear:
        one += [fc1_out // e, h]
    return one * run.local_experts


def stage_tensors(run: MegatronRun, stage: int) -> tuple[list[int], list[int]]:
    """(the stage's parameters but the tied output copy, the tied output copy) in
    elements, on one TP rank."""
    a = run.args
    h = a.hidden_size
    tensors: list[int] = []
    for _ in range(run.stage_layers):
        tensors += layer_tensors(run)
    shared: list[int] = []
    vocab_shard = run.padded_vocab // run.tp * h
    if stage == 0:
        tensors.append(vocab_shard)
        if a.position_embedding_type == "learned_absolute":
            tensors.append((a.max_position_embeddings or a.seq_length) * h)
    if stage == run.pp - 1:
        tensors += [h, h] if a.normalization == "LayerNorm" else [h]
        if a.untie_embeddings_and_output_weights:
            tensors.append(vocab_shard)
        elif run.pp > 1:
            shared.append(vocab_shard)  # the tied copy (language_module.py:253-318)
    return tensors, shared


def _buffer_layout(tensors: list[int], shards: int) -> tuple[int, list[tuple[int, int]]]:
    """A distributed-optimizer buffer: (its padded elements, each parameter's span).

    Parameters are laid out in reverse order (the order their gradients arrive), each
    starting on a multiple of 64 elements; the bucket ends on lcm(shards, 128)."""
    spans = []
    numel = 0
    for n in reversed(tensors):
        numel = -(-numel // PARAM_ALIGN) * PARAM_ALIGN
        spans.append((numel, numel + n))
        numel += n
    align = math.lcm(shards, BUCKET_ALIGN)
    return -(-numel // align) * align, spans


def _last_slice_real(tensors: list[int], shards: int) -> tuple[int, int]:
    """(the buffer's padded elements, the real elements in its last of ``shards`` equal
    slices): the last DP rank's share, which holds the bucket's trailing padding and
    gets no master copy for any padding (``_build_model_gbuf_param_range_map``)."""
    numel, spans = _buffer_layout(tensors, shards)
    lo = numel - numel // shards
    return numel, sum(max(0, min(b, numel) - max(a, lo)) for a, b in spans)


def static_components(run: MegatronRun, stage: int | None = None) -> dict[str, int]:
    """The named bytes a rank of ``stage`` (default: the run's) holds between steps."""
    a = run.args
    stage = run.stage if stage is None else stage
    tensors, shared = stage_tensors(run, stage)
    real = sum(tensors) + sum(shared)
    shards = run.dp * run.cp
    p = run.dtype_bytes
    out: dict[str, int] = {}
    experts = expert_layer_tensors(run) * run.stage_layers
    if a.use_distributed_optimizer:
        buffers = [_last_slice_real(tensors, shards)]
        if shared:
            buffers.append(_last_slice_real(shared, shards))
        if experts:
            # the expert-parallel parameters' own buffer, sharded over the expert DP
            # group (distributed_data_parallel.py: intra_expt_dp_group)
            buffers.append(_last_slice_real(experts, run.edp))
        padded = sum(numel for numel, _ in buffers)
        out["parameters"] = p * padded
        out["gradient_buffer"] = run.grad_bytes * padded
        optimizer_elements = sum(last for _, last in buffers)
    else:
        real += sum(experts)
        out["parameters"] = p * real
        out["gradient_buffer"] = run.grad_bytes * real
        optimizer_elements = real
    if p < 4:
        out["master_parameters"] = 4 * optimizer_elements
    out["adam_moments"] = 8 * optimizer_elements
    if a.fp16 or run.grad_bytes < 4:
        out["master_gradients"] = 4 * optimizer_elements  # main_grad.float(): a copy
    out["cublas_workspace"] = cublas_workspace(run)
    out["cublaslt_workspace"] = cublas_workspace(run)
    if a.transformer_impl == "transformer_engine" or _router_te_gemm(run):
        out["te_cublaslt_workspace"] = te_workspace(run)
    if run.moe and a.moe_grouped_gemm and a.transformer_impl == "transformer_engine":
        out["te_grouped_gemm_workspaces"] = TE_CUBLAS_STREAMS * te_workspace(run)
    mpu = mpu_buffer_bytes(run, stage)
    if mpu:
        out["global_memory_buffer"] = mpu
    return out


def _router_te_gemm(run: MegatronRun) -> bool:
    """The MoE router's gating GEMM runs through Transformer Engine's ``general_gemm``
    where TE is installed and the router dtype is not fp64 (``moe_utils.py``,
    ``RouterGatingLinearFunction``), whichever ``--transformer-impl``: it allocates TE's
    cuBLASLt workspace."""
    return run.moe and run.args.moe_router_dtype != "fp64"


def cublas_workspace(run: MegatronRun) -> int:
    config = run.args.env.get("CUBLAS_WORKSPACE_CONFIG")
    if config is None and run.args.deterministic_mode:
        config = DETERMINISTIC_CUBLAS_CONFIG
    if config is not None:
        return cublas_workspace_bytes(config)
    return CUBLAS_DEFAULT_HOPPER if _major(run) >= 9 else CUBLAS_DEFAULT_PRE_HOPPER


def te_workspace(run: MegatronRun) -> int:
    return TE_WORKSPACE_HOPPER if _major(run) >= 9 else TE_WORKSPACE_PRE_HOPPER


def _major(run: MegatronRun) -> int:
    major = run.device.compute_capability_major
    if major is None:
        raise InputError(
            "device",
            run.device.name,
            "has no compute capability on record; the workspaces it sizes need one (use a preset)",
        )
    return major


def mpu_buffer_bytes(run: MegatronRun, stage: int) -> int:
    """Megatron-LM's persistent ``GlobalMemoryBuffer`` "mpu" tensor (``core/utils.py``):
    reused by every request of the same name, grown to the largest."""
    a = run.args
    dtype = run.dtype_bytes
    sizes = [0]
    if run.sp and stage == run.pp - 1:
        sizes.append(dtype * run.tokens * a.hidden_size)  # the output layer's gathered input
    if run.moe and a.moe_token_dispatcher_type == "allgather" and (run.etp > 1 or run.ep > 1):
        # the allgather dispatcher gathers the MoE input over ETP x EP into this buffer
        # (token_dispatcher.py, ``use_global_buffer=True``)
        n_sp = run.tokens // run.tp if run.sp else run.tokens
        sizes.append(dtype * n_sp * run.etp * run.ep * a.hidden_size)
    if run.attention_backend == "local":
        s_k = a.seq_length // run.cp
        sizes.append(
            dtype * a.micro_batch_size * (run.heads // run.tp) * (a.seq_length // run.cp) * s_k
        )
    return max(sizes)
