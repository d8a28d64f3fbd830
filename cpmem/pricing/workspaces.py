"""The buffers a process keeps once its first step has run, beside its tensors: the
libraries' GEMM workspaces and megatron's persistent ``GlobalMemoryBuffer``. The same
for every runtime; sized from the run's own environment and the libraries' defaults.

- PyTorch's cuBLAS workspace, one per (cuBLAS handle, stream), allocated through the
  caching allocator and kept (``aten/src/ATen/cuda/CublasHandlePool.cpp``:
  ``setWorkspaceForHandle`` keeps ``cublas_handle_stream_to_workspace``; handles come from
  a per-thread pool window). A training step runs cuBLAS from two threads: the forward on
  the caller's and the backward on autograd's device thread
  (``torch/csrc/autograd/engine.cpp`` runs a CUDA device's backward on a thread of its
  own), so two workspaces (``CUBLAS_THREADS``); a step without backward one. Sized by
  ``CUBLAS_WORKSPACE_CONFIG`` (``:SIZE_KiB:COUNT`` pairs; Megatron-LM's
  ``--deterministic-mode`` sets ``:4096:8`` where unset, ``training/determinism.py``),
  else PyTorch's default (``parseChosenWorkspaceSize``): ``:4096:8`` = 32 MiB from compute
  capability 9, ``:4096:2:16:8`` before.
- Transformer Engine's cuBLASLt workspace, one per device (``get_workspace``, cached):
  32 MiB + 1 KiB from compute capability 9, 4 MiB before
  (``transformer_engine/pytorch/cpp_extensions/gemm.py``, ``get_cublas_workspace_size_bytes``,
  TE >= 2.8); TE's grouped GEMM (``GroupedLinear``) keeps one more per cuBLAS stream
  (``TE_CUBLAS_STREAMS``).
- under ``--tp-comm-overlap`` (``StepSettings.tp_comm_overlap``) the userbuffer GEMMs'
  cuBLASLt workspace, ``TE_UB_STREAMS`` copies, beside the plain one; the userbuffers
  are outside PyTorch's allocator (named in the answer, not priced).
- megatron's ``GlobalMemoryBuffer`` ("mpu", ``core/utils.py``): reused by every request of
  its name, grown to the largest: a trained output layer's sequence-parallel gather of its
  input (``LinearWithGradAccumulationAndAsyncCommunication``; a frozen one,
  ``LinearWithFrozenWeight``, gathers into a fresh tensor), the allgather MoE dispatcher's
  gathered tokens, the local attention's ``baddbmm`` input. Sized by the step's tokens.

Checked on both measured runtimes: ART's processes gain exactly 96 MiB + 1 KiB between
their first and second steps on the H200 (two cuBLAS workspaces of 32 MiB and TE's;
golden cells), and Megatron-LM's recordings hold them between steps on A100, H100 and
GB200 (``cpmem.gate.megatron_tier``).
"""

from __future__ import annotations

from cpmem.errors import InputError
from cpmem.pricing.components import OUTSIDE_FIGURE
from cpmem.pricing.kinds.moe_dispatch import HYBRIDEP_BUFFERS_NOTE
from cpmem.pricing.widths import sp_divisor
from cpmem.step.step import Step, StepSettings
from cpmem.units import MIB

KIB = 1 << 10
CUBLAS_DEFAULT_PRE_HOPPER = 4096 * KIB * 2 + 16 * KIB * 8
"""PyTorch's cuBLAS workspace with ``CUBLAS_WORKSPACE_CONFIG`` unset before compute
capability 9: ``:4096:2:16:8`` = 8,519,680 B (``parseChosenWorkspaceSize``)."""
CUBLAS_DEFAULT_HOPPER = 4096 * KIB * 8
"""... and from compute capability 9: ``:4096:8`` = 32 MiB (the source widens the Hopper
case to majors 9, 10 and 12 in later releases; cpmem prices it from 9 on)."""
DETERMINISTIC_CUBLAS_CONFIG = ":4096:8"
"""``--deterministic-mode`` sets ``CUBLAS_WORKSPACE_CONFIG`` where the run leaves it unset."""
CUBLAS_THREADS = 2
"""Threads that run cuBLAS in a training step: the forward's and autograd's device thread."""
TE_WORKSPACE_HOPPER = 32 * MIB + KIB
TE_WORKSPACE_PRE_HOPPER = 4 * MIB
TE_CUBLAS_STREAMS = 4
"""Transformer Engine's grouped GEMM runs on 4 cuBLAS streams, each with a workspace of
TE's size, allocated on first use and kept (``get_multi_stream_cublas_workspace``,
``module/base.py``; ``num_streams`` in its common library)."""
TE_UB_STREAMS = 3
"""Under ``--tp-comm-overlap`` the userbuffer GEMMs take a workspace of
``_NUM_MAX_UB_STREAMS`` (3) copies of TE's size in one tensor (``get_cublas_workspace(device,
ub=True, ...)``, ``cpp_extensions/gemm.py:31,42-52``, asked for by ``general_gemm`` with a
userbuffer, line 133; TE b9d690e0). The function is ``lru_cache``-d per ``ub``, so the plain
workspace stays beside it: the row-parallel projections' weight-gradient GEMMs run without
a userbuffer (``module/linear.py:769-797``, ``ub_bulk_wgrad`` a column-parallel layer's
only, ``:1503-1507``). The userbuffers themselves are allocated by ``cuMemCreate`` /
``cudaMalloc`` (``comm_gemm_overlap.cpp:326,703``), outside PyTorch's allocator."""
DEFAULT_COMPUTE_CAPABILITY = 9
"""Where the step names no device: the measured runtime's H200 (compute capability 9.0)."""


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


def compute_capability(settings: StepSettings) -> int:
    """The device's compute capability major; ``DEFAULT_COMPUTE_CAPABILITY`` where the step
    names no device or one of unknown capability (a device given by its total bytes):
    Hopper's workspaces, the largest sizes of every default."""
    device = settings.device
    if device is None or device.compute_capability_major is None:
        return DEFAULT_COMPUTE_CAPABILITY
    return device.compute_capability_major


def cublas_workspace(settings: StepSettings) -> int:
    """One cuBLAS workspace of the run's process."""
    env = settings.runtime.environment()
    config = env.get("CUBLAS_WORKSPACE_CONFIG")
    if config is None and settings.runtime.deterministic:
        config = DETERMINISTIC_CUBLAS_CONFIG
    if config is not None:
        return cublas_workspace_bytes(config)
    if compute_capability(settings) >= 9:
        return CUBLAS_DEFAULT_HOPPER
    return CUBLAS_DEFAULT_PRE_HOPPER


def te_workspace(settings: StepSettings) -> int:
    return TE_WORKSPACE_HOPPER if compute_capability(settings) >= 9 else TE_WORKSPACE_PRE_HOPPER


def uses_te_gemm(settings: StepSettings) -> bool:
    """Transformer Engine's GEMMs run: its modules, or (whatever the implementation) an MoE
    router's gating GEMM, which runs through TE's ``general_gemm`` where TE is installed
    (``moe_utils.py``, ``RouterGatingLinearFunction``)."""
    return settings.runtime.transformer_impl == "transformer_engine" or settings.geometry.is_moe


def workspace_components(
    settings: StepSettings, stage: int, step: Step | None = None
) -> dict[str, int]:
    """The named workspaces a warm process holds on pipeline ``stage`` (none on a cold
    step: the first step's activations hold its kernel set-up); with the ``step`` whose
    tokens size it, megatron's global buffer."""
    if settings.cold:
        return {}
    threads = CUBLAS_THREADS if settings.recompute.keeps_gradients else 1
    out = {"cublas_workspaces": threads * cublas_workspace(settings)}
    if uses_te_gemm(settings):
        out["te_cublaslt_workspace"] = te_workspace(settings)
        if settings.tp_comm_overlap:
            out["te_userbuffer_workspace"] = TE_UB_STREAMS * te_workspace(settings)
    runtime = settings.runtime
    te_grouped = runtime.moe_grouped_gemm and runtime.transformer_impl == "transformer_engine"
    if settings.geometry.is_moe and te_grouped:
        out["te_grouped_gemm_workspaces"] = TE_CUBLAS_STREAMS * te_workspace(settings)
    mpu = 0 if step is None else global_buffer_bytes(step, stage)
    if mpu:
        out["global_memory_buffer"] = mpu
    return out


def global_buffer_bytes(step: Step, stage: int) -> int:
    """megatron's persistent ``GlobalMemoryBuffer`` "mpu" tensor on ``stage``, for the
    busiest micro-batch rank of ``step``: the largest of its uses."""
    settings = step.settings
    g, layout, b = step.geometry, step.plan.layout, step.dtype_bytes
    tokens = step.plan.busiest_tokens
    sizes = [0]
    last = stage == settings.pipeline.pp - 1
    trained_head = settings.training == "full" and not step.head.returns_hidden
    if layout.sp_active and last and trained_head:
        sizes.append(b * tokens * g.hidden)  # the output layer's gathered input
    spans = layout.etp * layout.ep
    if g.is_moe and settings.runtime.moe_dispatcher == "allgather" and spans > 1:
        # the allgather dispatcher gathers the MoE input over ETP x EP into this buffer
        # (token_dispatcher.py, ``use_global_buffer=True``)
        local = tokens // sp_divisor(layout.tp, layout.sp)
        sizes.append(b * local * spans * g.hidden)
    if settings.runtime.attention_backend == "local" and step.request is not None:
        lengths = step.request.sequence_lengths
        longest = max(lengths) // layout.cp
        sizes.append(b * len(lengths) * (g.q_heads // layout.tp) * longest * longest)
    return max(sizes)


USERBUFFERS_NOTE = (
    "tp_comm_overlap: Transformer Engine's userbuffers are device memory outside PyTorch's "
    "allocator (cuMemCreate/cudaMalloc), " + OUTSIDE_FIGURE
)


NCCL_UB_NOTE = (
    "fsdp_buffers: under --use-nccl-ub Megatron FSDP's buffers come from an NCCL memory "
    "pool (ncclMemAlloc through a PyTorch MemPool, param_and_grad_buffer.py:2046-2060, "
    "2163-2200: in this figure, kept apart from other tensors); NCCL's own resources for "
    "the registered buffers and symmetric windows are device memory outside PyTorch's "
    "allocator, " + OUTSIDE_FIGURE
)


def outside_allocator_notes(settings: StepSettings) -> tuple[str, ...]:
    """What the step keeps on the device outside PyTorch's allocator, which no figure
    holds: the userbuffers of ``--tp-comm-overlap``, the HybridEP dispatcher's buffers
    (``cpmem.pricing.kinds.moe_dispatch``), NCCL's resources for Megatron FSDP's user
    buffers (``--use-nccl-ub``)."""
    notes: tuple[str, ...] = ()
    if settings.tp_comm_overlap and uses_te_gemm(settings):
        notes += (USERBUFFERS_NOTE,)
    if settings.runtime.moe_dispatcher == "hybridep":
        notes += (HYBRIDEP_BUFFERS_NOTE,)
    if settings.optimizer.fsdp_buffers == "nccl-ub":
        notes += (NCCL_UB_NOTE,)
    return notes
