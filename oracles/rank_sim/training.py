# mypy: disable-error-code="no-untyped-call,no-any-return"
"""Full-parameter training as Megatron-LM runs it, on the simulated rank: what its step
allocates beyond a LoRA step's, besides the layers' own saved sets (adapters.py: a
trained projection saves its input).

Static memory is not simulated: the bf16 parameters, their fp32 ``main_grad`` (views of
megatron DDP's contiguous gradient buffer) and the distributed optimizer's state exist
before the step; here every ``main_grad`` is a fake tensor made before the tracker
starts, so it is never counted. What is simulated is what the step allocates:

- **The gradient hook.** megatron's ``DistributedDataParallel`` marks every trainable
  parameter ``grad_added_to_main_grad = False`` and hooks its gradient accumulator
  (``_make_backward_post_hook``, distributed_data_parallel.py, installed): once autograd
  has put a gradient in ``param.grad`` (stealing the node's output, no copy),
  ``main_grad.add_(param.grad)`` (in place; skipped where the GEMM already accumulated
  it) and ``param.grad = None``. So a weight gradient lives from the moment its node
  returns it until that node's backward is done: one at a time. Here the same
  accumulator (``expand_as(p).grad_fn.next_functions[0][0]``, as DDP finds it) gets a
  pre-hook that drops the gradient instead of storing it: on fake tensors autograd's
  ``AccumulateGrad`` would store a copy (a fake tensor's Python object counts as a second
  reference, so the gradient is never stolen) and the fp32 ``add_`` would allocate an
  upcast copy, neither of which a GPU makes.
- **Gradient accumulation fusion** (Megatron-LM's ``--gradient-accumulation-fusion``
  default; off with ``--no-gradient-accumulation-fusion``). On: megatron's linear
  (``LinearWithGradAccumulationAndAsyncCommunication.backward``) accumulates the weight
  gradient into the fp32 ``main_grad`` inside the GEMM (apex's
  ``fused_weight_gradient_mlp_cuda``: in place, nothing allocated; its stand-in here does
  nothing) and, because DDP set ``grad_added_to_main_grad``, returns a dummy: with
  Transformer Engine installed (every Megatron-LM container), TE's ``get_dummy_wgrad``,
  which caches ONE bf16 tensor per distinct (shape, dtype) and keeps it
  (transformer_engine/pytorch/module/base.py, TE >= 2.4); TE's own linears and grouped
  linears return the same dummies. The cache is restated here (label ``dummy_wgrad``):
  allocated at a weight shape's first backward and kept. Off: each weight's bf16 gradient
  ``grad_output.t() @ input`` is made, handed to autograd and freed by the hook.
- **megatron's persistent all-gather buffer.** Under SP a trained megatron
  ``ColumnParallelLinear`` gathers its input into ``get_global_memory_buffer()``'s
  "mpu" tensor (forward and again in backward), one buffer grown to the largest gathered
  input and kept (core/utils.py ``GlobalMemoryBuffer``; label ``mpu_buffer``). The
  simulator's projections are megatron-core's own modules; Transformer Engine's layers
  (Megatron-LM's default ``--transformer-impl``) gather into a fresh tensor per call
  instead, freed after the GEMM. The LM head's output layer is megatron's own in both.

What trains: every parameter of the layers, the head and the embedding except
``FROZEN`` (DeepSeek-V3's ``e_score_correction_bias``, megatron's ``expert_bias``
buffer). A norm's, a conv's or a gate's weight gradient is parameter-sized and not
allocated by the shape-only kernels (their saved sets do not change).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

BF16, F32 = torch.bfloat16, torch.float32
FROZEN = ("score_bias",)  # buffers, not parameters, in megatron
ADAPTERS = ("lora_a", "lora_b", "fc1_a", "fc1_b", "fc2_a", "fc2_b")
"""The adapters' A and B: a linear's (adapters.py) and the routed experts' grouped ones
(moe.py, one tensor per linear for every local expert)."""


def trainable(name: str, full: bool) -> bool:
    """Whether parameter ``name`` trains: under full training all but ``FROZEN``; under
    LoRA the adapters' A and B (``ADAPTERS``)."""
    if full:
        return not name.endswith(FROZEN)
    return name.endswith(ADAPTERS)


class _FusedWgrad:
    """apex's ``fused_weight_gradient_mlp_cuda``: the weight-gradient GEMMs accumulate
    into ``main_grad`` in place (nothing allocated)."""

    @staticmethod
    def wgrad_gemm_accum_fp32(total_input: Any, grad_output: Any, main_grad: Any) -> None:
        return None

    wgrad_gemm_accum_fp16 = wgrad_gemm_accum_fp32


class _Dummies:
    """Transformer Engine's ``get_dummy_wgrad`` cache for one step."""

    def __init__(self, set_label: Callable[[str], str]) -> None:
        self.set_label = set_label
        self.cache: dict[tuple[Any, ...], torch.Tensor] = {}

    def get(self, shape: Sequence[int], dtype: torch.dtype, zero: bool = False) -> torch.Tensor:
        key = (*shape, dtype)
        if key not in self.cache:
            previous = self.set_label("dummy_wgrad")
            try:
                self.cache[key] = torch.empty(tuple(shape), dtype=dtype)
            finally:
                self.set_label(previous)
        if zero:
            self.cache[key].fill_(0)
        return self.cache[key].detach()


_ACTIVE: list[_Dummies] = []


def dummy_wgrad(shape: Sequence[int], dtype: torch.dtype = BF16) -> torch.Tensor:
    """The active step's cached dummy weight gradient (Transformer Engine's grouped
    linears return one per expert weight shape under gradient accumulation fusion)."""
    return _ACTIVE[-1].get(shape, dtype)


def _fold_into_main_grad(grads: tuple[Any, ...]) -> tuple[Any, ...]:
    """megatron DDP's hook, shape-only: the gradient goes into ``main_grad`` in place and
    ``param.grad`` ends None (module docstring)."""
    return (None,)


def prepare(params: Sequence[nn.Parameter]) -> list[Any]:
    """What megatron's DDP gives every trainable parameter before the step: a fp32
    ``main_grad`` (static; a fake tensor made outside the tracker), the
    ``grad_added_to_main_grad`` flag and the gradient hook. Returns the gradient
    accumulators, which must live as long as the step (DDP's ``grad_accs``)."""
    accumulators = []
    for p in params:
        if not p.requires_grad:
            continue
        p.main_grad = torch.empty(p.shape, dtype=F32)
        p.grad_added_to_main_grad = False
        accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
        accumulator.register_prehook(_fold_into_main_grad)
        accumulators.append(accumulator)
    return accumulators


@contextlib.contextmanager
def full_training(set_label: Callable[[str], str]) -> Iterator[_Dummies]:
    """Install, for one step, Transformer Engine's dummy-gradient cache and apex's fused
    weight-gradient GEMMs into megatron's tensor_parallel/layers.py, and a labelled
    global memory buffer into parallel_state; restore them afterwards."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import layers as tpl
    from megatron.core.utils import GlobalMemoryBuffer

    class LabelledBuffer(GlobalMemoryBuffer):  # type: ignore[misc]
        def get_tensor(self, *args: Any, **kwargs: Any) -> torch.Tensor:
            previous = set_label("mpu_buffer")
            try:
                return super().get_tensor(*args, **kwargs)
            finally:
                set_label(previous)

    dummies = _Dummies(set_label)
    names = ("HAVE_TE", "get_dummy_wgrad", "fused_weight_gradient_mlp_cuda")
    saved = {name: getattr(tpl, name) for name in names if hasattr(tpl, name)}
    buffer = parallel_state._GLOBAL_MEMORY_BUFFER
    tpl.HAVE_TE = True
    tpl.get_dummy_wgrad = lambda shape, dtype, zero=False: dummies.get(shape, dtype, zero)
    tpl.fused_weight_gradient_mlp_cuda = _FusedWgrad
    parallel_state._GLOBAL_MEMORY_BUFFER = LabelledBuffer()
    _ACTIVE.append(dummies)
    try:
        yield dummies
    finally:
        _ACTIVE.pop()
        parallel_state._GLOBAL_MEMORY_BUFFER = buffer
        for name in names:
            if name in saved:
                setattr(tpl, name, saved[name])
            else:
                delattr(tpl, name)
        dummies.cache.clear()


class TrainedGroupedLinear(torch.autograd.Function):
    """Every local expert's trained linear over its rows (Transformer Engine's
    ``GroupedLinear`` / ``SequentialMLP``'s expert linears): saves the rows, its input,
    for the weight gradient (the same tensor a LoRA adapter's A saves). Backward: the
    input gradient, and the weight gradient of every local expert at once (the grouped
    GEMM's output list; ``weight`` lays them out as one tensor) without gradient
    accumulation fusion, or with it the GEMMs accumulate into ``main_grad`` and TE returns
    its cached dummy, one per expert weight shape (``dummy_wgrad``)."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, weight: torch.Tensor, experts: int, fusion: bool
    ) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.experts, ctx.fusion = experts, fusion
        return x.new_empty((x.shape[0], weight.shape[1]))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        x, weight = ctx.saved_tensors
        dx = x.new_empty(x.shape)
        if ctx.fusion:
            dummy_wgrad((weight.shape[0] // ctx.experts, weight.shape[1]), weight.dtype)
            return dx, None, None, None
        return dx, weight.new_empty(weight.shape), None, None
