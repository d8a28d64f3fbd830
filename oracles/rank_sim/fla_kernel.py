# mypy: disable-error-code="no-untyped-call,no-any-return"
"""fla-core's own chunked gated delta rule, run shape-only under fake tensors.

Where ``fla`` imports, the simulator's GDN kernel is fla's public
``fla.ops.gated_delta_rule.chunk_gated_delta_rule`` (the entry point the measured
runtime's layer calls), which applies fla's own ``ChunkGatedDeltaRuleFunction``
(fla/ops/gated_delta_rule/chunk.py). Every line of fla's Python runs as written: its
``input_guard`` (``.contiguous()`` on every input), the l2norm of q and k
(``use_qk_l2norm_in_kernel=True``, as the runtime calls it), the buffers each helper
allocates (``torch.empty`` / ``torch.zeros`` / ``new_empty`` in
fla/ops/utils/cumsum.py ``chunk_local_cumsum``, fla/ops/gated_delta_rule/chunk_fwd.py
``chunk_gated_delta_rule_fwd_intra``, fla/ops/common/chunk_delta_h.py
``chunk_gated_delta_rule_fwd_h`` / ``chunk_gated_delta_rule_bwd_dhu``,
fla/ops/common/chunk_o.py ``chunk_fwd_o`` / ``chunk_bwd_dv_local`` / ``chunk_bwd_dqkwg``,
fla/ops/gated_delta_rule/wy_fast.py ``recompute_w_u_fwd`` / ``prepare_wy_repr_bwd``,
fla/modules/norm/l2norm.py ``l2norm_fwd`` / ``l2norm_bwd``), and what its forward hands
to ``ctx.save_for_backward``. The only thing replaced is the triton launch itself:
``kernel[grid](...)`` (triton/runtime/jit.py ``KernelInterface.__getitem__``, which
every ``@triton.jit`` / ``@triton.autotune`` / ``@triton.heuristics`` kernel inherits)
becomes a no-op that records the kernel's name. The output buffers a launch fills were
allocated by fla before the launch, so the shapes and dtypes are fla's own; nothing
here restates them. (This is one level below patching the helpers to ``torch.empty``
stand-ins: fla's temporaries, e.g. the zeroed ``A`` of the fused kkt/solve_tril path,
come from its code too.)

Device guards, found by running, not patched: ``input_guard`` enters
``custom_device_ctx(tensor.device.index)``, and fake CPU tensors have index ``None``,
so it is a null context; ``autocast_custom_fwd/bwd`` are
``torch.amp.custom_fwd/bwd(device_type="cuda")``, which on the CPU build only read the
(disabled) autocast state. fla's import warns "Triton is not supported on current
platform, roll back to CPU" and goes on. fla's backend ``dispatch`` finds no eligible
backend (FlashQLA, Ascend) on CPU and runs the default triton path.

Scope: the launch patch is active only inside :func:`shape_only_launches`, entered
around the forward call and, through hooks on fla's autograd node, around that node's
backward; it is restored on exit (depth-counted, so nested use is safe).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from importlib import metadata
from typing import Any

import torch

DIST = "fla-core"
_lock = threading.RLock()
_depth = 0
_saved_getitem: Any = None
LAUNCHES: list[str] = []  # kernel names launched (shape-only) since the last clear


def version() -> str | None:
    try:
        return metadata.version(DIST)
    except metadata.PackageNotFoundError:
        return None


def importable() -> tuple[bool, str]:
    """Whether fla's chunked gated delta rule imports here, and why not."""
    try:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Triton is not supported on current platform"
            import fla.ops.gated_delta_rule.chunk  # noqa: F401
    except Exception as exc:  # ImportError, or triton failing at import
        return False, f"{type(exc).__name__}: {exc}"
    return True, ""


def label() -> str:
    return f"{DIST} {version()}"


def _kernel_name(kernel: Any) -> str:
    # Heuristics -> Autotuner -> JITFunction -> python function, each one's ``fn``
    obj = kernel
    for _ in range(8):
        inner = getattr(obj, "fn", None)
        if inner is None:
            break
        obj = inner
    return getattr(obj, "__name__", type(kernel).__name__)


def _shape_only_getitem(self: Any, grid: Any) -> Any:
    def launch(*args: Any, **kwargs: Any) -> None:
        LAUNCHES.append(_kernel_name(self))

    return launch


def _enter() -> None:
    global _depth, _saved_getitem
    from triton.runtime.jit import KernelInterface

    with _lock:
        if _depth == 0:
            _saved_getitem = KernelInterface.__getitem__
            KernelInterface.__getitem__ = _shape_only_getitem
        _depth += 1


def _exit() -> None:
    global _depth, _saved_getitem
    from triton.runtime.jit import KernelInterface

    with _lock:
        _depth -= 1
        if _depth == 0:
            KernelInterface.__getitem__ = _saved_getitem
            _saved_getitem = None


@contextlib.contextmanager
def shape_only_launches() -> Iterator[None]:
    """Triton launches are no-ops (recorded in ``LAUNCHES``) inside this block."""
    _enter()
    try:
        yield
    finally:
        _exit()


def launches_patched() -> bool:
    return _depth > 0


class FlaGatedDeltaRule:
    """Drop-in for ``kernels.StandInGatedDeltaRule``: same call, fla's code.

    q, k: (n, h, dk); v: (n, h, dv); g: (n, h) fp32 gate logits (fla cumsums them);
    beta: (n, h); h0: (h, dk, dv) fp32. Returns (o (n, h, dv), final (h, dk, dv) fp32).
    fla takes ``[B, T, H, ...]``: one batch row per piece (no ``cu_seqlens``), the
    piece's initial state, and its final state returned (the layer chains pieces)."""

    @staticmethod
    def apply(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        h0: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule

        with shape_only_launches():
            o, final = chunk_gated_delta_rule(
                q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), g.unsqueeze(0),
                beta.unsqueeze(0), initial_state=h0.unsqueeze(0), output_final_state=True,
                use_qk_l2norm_in_kernel=True,
            )  # fmt: skip
        node = o.grad_fn
        if node is not None:  # fla's ChunkGatedDeltaRuleFunction node: its backward too
            node.register_prehook(lambda grad_outputs: _enter())
            node.register_hook(lambda grad_inputs, grad_outputs: _exit())
        return o.squeeze(0), final.squeeze(0)
