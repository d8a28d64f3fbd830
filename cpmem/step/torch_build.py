"""The PyTorch build a named container runs, and what its ``torch.compile`` does with
megatron-core's fused cross entropy.

megatron-core wraps the fused cross entropy's helpers in ``jit_fuser``, which is
``torch.compile`` on every PyTorch from 2.2.0a0 (``megatron/core/jit.py``:
``is_torch_min_version("2.2.0a0")``; the same test since its first version, 473225f9a5,
2024-01-19), so what the loss allocates is what inductor makes of
``fusions/fused_cross_entropy.py``, and that differs by the container's PyTorch:

- ``compiled_backward_copy`` (every build): ``calculate_gradients`` scatters into the
  saved softmax (``grad_2d[arange_1d, masked_target_1d] -= softmax_update``) and scales it
  in place, a mutation of a graph input; AOTAutograd makes it functional, and inductor
  scatters into a new fp32 ``[tokens, V/t]`` buffer, writes the result back into the
  softmax and casts it to bf16: the softmax, that copy and the bf16 gradient are live
  together. Read on CPU inductor 2.2, 2.5, 2.7, 2.9 and 2.13 (the generated wrapper's
  ``empty_strided`` of the copy; tests/oracle/test_fused_cross_entropy.py runs the
  installed one).
- ``compiled_forward_in_place``: from 2.5 inductor writes ``calculate_predicted_logits``'
  in-place subtraction and ``exp`` straight into the fp32 copy; 2.2 computes them into a
  new fp32 buffer and copies it back (read on CPU inductor 2.2 and 2.5; 2.3-2.4 not read,
  and no named container runs them).
- ``autotune_clones_on_device``: before 2.6, the first launch of a kernel with several
  configs benchmarks each on a device clone of every argument it mutates
  (``CachingAutotuner.bench`` -> ``clone_args``: ``torch/_inductor/triton_heuristics.py``
  at 2.2.0, ``runtime/triton_heuristics.py`` at 2.5.0); 2.6.0 copies such an argument to
  the host instead where its clone would pass the device's peak so far
  (``copy_args_to_cpu_if_needed``, under ``optimize_mem``: inference and backward graphs,
  which these helpers are). Pointwise kernels have two configs unless deterministic
  algorithms are on (``pointwise()``'s ``disable_pointwise_autotuning``), and Megatron-LM
  refuses the fused loss in deterministic mode; the in-place division of the forward and
  the write-back into the softmax of the backward are such kernels, so the first
  micro-batch holds one more fp32 ``[tokens, V/t]`` clone at each.

The builds by container name (the names of ``backend_choice.NAMED_CONTAINERS``), from
NGC's PyTorch release notes: 24.01 ships 2.2.0a0+81ea7a4, 24.10 2.5.0a0+e000cf0ad9, and
every release from 25.01 (2.6.0a0+ecf3bae40a; 25.03: 2.7.0a0+7c8ec84dab; 25.12:
2.10.0a0+b4e4ee81d3) 2.6 or later, which ``dev`` (NGC 25.11) stands for.
"""

from __future__ import annotations

from dataclasses import dataclass

from cpmem.errors import InputError


@dataclass(frozen=True)
class TorchBuild:
    """A container's PyTorch: ``version`` (major, minor; for ``dev``, the oldest of the
    images it stands for) and the release it was read from."""

    version: tuple[int, int]
    release: str

    @property
    def compiled_backward_copy(self) -> bool:
        """The compiled fused loss's backward scatters into a new fp32 copy of the softmax
        (every build ``jit_fuser`` compiles with)."""
        return self.version >= (2, 2)

    @property
    def compiled_forward_in_place(self) -> bool:
        """The compiled forward writes the in-place ``exp`` into the fp32 copy itself."""
        return self.version >= (2, 5)

    @property
    def autotune_clones_on_device(self) -> bool:
        """A mutating kernel's first launch benchmarks its configs on device clones."""
        return self.version < (2, 6)


TORCH_BUILDS: dict[str, TorchBuild] = {
    "dev": TorchBuild((2, 6), "NGC PyTorch 25.01 and later (2.6.0a0+ecf3bae40a onwards)"),
    "ngc-24.10": TorchBuild((2, 5), "NGC PyTorch 24.10: 2.5.0a0+e000cf0ad9"),
    "ngc-24.01": TorchBuild((2, 2), "NGC PyTorch 24.01: 2.2.0a0+81ea7a4"),
}


def torch_build(container: str) -> TorchBuild:
    """The PyTorch build of the named container."""
    try:
        return TORCH_BUILDS[container]
    except KeyError:
        raise InputError("container", container, f"must be one of {sorted(TORCH_BUILDS)}") from None
