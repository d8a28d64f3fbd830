# mypy: disable-error-code="no-untyped-call,no-any-return"
"""Shape-only kernels and collectives: what each allocates and saves, no arithmetic.

The simulator runs under ``FakeTensorMode``; only allocations count. Each autograd
function below allocates in forward and backward the buffers the named GPU kernel
allocates, and saves what it saves for backward:

- flash attention (FlashAttention-2 varlen contract): saves q, k, v, out and fp32
  logsumexp; backward allocates dq, dk, dv, an fp32 dq accumulator and softmax-d, and
  head-expanded dk/dv under GQA before summing them.
- the chunked gated delta rule: saved set of the saved-tensor oracle's stand-in
  (q, k, v, fp32 q/k rms reciprocals, fp32 chunk-local gate cumsum, beta, the per-64
  WY matrix A, the initial state); forward/backward workspace laid out after
  fla-core 0.6.0's ``chunk_gated_delta_rule_fwd`` / ``_bwd`` (source read, not run:
  w, u, per-chunk states h in the input dtype, v_new; in backward the recomputed
  w/u/h/v_new plus dv_local and dh; an fp32 A before the triangular solve, which 0.6.0's
  fused intra-chunk path no longer allocates, is kept as a transient: at most
  256 bytes per token and value head). fla 0.6.0 saves l2-normalised copies of q and k
  where the stand-in saves q and k themselves: the same sizes. Run (``fla_kernel.py``),
  fla also copies a non-contiguous v (``input_guard``) and saves the copy, where the
  stand-in saves the layer's view of the conv output (pinning all of it); its forward
  allocates the l2norm and v copies, its backward ``prepare_wy_repr_bwd``'s dk/dv,
  ``l2norm_bwd``'s outputs and an fp32 (NK, T, H) dg (NK = dk/32 on CPU), none of which
  the stand-in has.
  This stand-in is used where fla-core does not import; where it does, the kernel is
  fla's own autograd function with its triton launches made shape-only
  (``fla_kernel.py``). ``select_gdn_kernel`` picks (``RANK_SIM_GDN_KERNEL`` /
  ``--gdn-kernel``: auto, fla, stand-in); ``GDN_KERNEL`` names the one in use.
- the fused causal conv + SiLU: saves its input.
Collectives go through ``torch.distributed`` on the fake process group, so the
buffers they fill are real allocations of the right size.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist

from oracles.rank_sim.geometry import SimInputError

CHUNK = 64
FA_BLOCK = 128

GDN_KERNEL_ENV = "RANK_SIM_GDN_KERNEL"
GDN_KERNEL_CHOICES = ("auto", "fla", "stand-in")
STAND_IN = "stand-in"
GDN_KERNEL = STAND_IN  # set by select_gdn_kernel (at import, from the environment)


class FlashAttention(torch.autograd.Function):
    """q, k: (n_q / n_k, h, d); v: (n_k, hkv, dv). Returns out (n_q, hq, dv): the value's
    width (dv = d except under multi-head latent attention)."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = q.new_empty((*q.shape[:2], v.shape[2]))
        lse = q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, ...]:
        q, k, v, _out, _lse = ctx.saved_tensors
        n_q, hq, d = q.shape
        softmax_d = q.new_empty((hq, n_q + FA_BLOCK), dtype=torch.float32)
        dq_accum = q.new_empty((hq, n_q + FA_BLOCK, d), dtype=torch.float32)
        dq = q.new_empty(q.shape)
        if k.shape[1] != hq:  # GQA: per-query-head dk/dv, then summed over the group
            dk_e = k.new_empty((k.shape[0], hq, d))
            dv_e = v.new_empty((v.shape[0], hq, v.shape[2]))
            dk = dk_e.view(k.shape[0], k.shape[1], -1, d).sum(2)
            dv = dv_e.view(v.shape[0], v.shape[1], -1, v.shape[2]).sum(2)
            del dk_e, dv_e
        else:
            dk, dv = k.new_empty(k.shape), v.new_empty(v.shape)
        del softmax_d, dq_accum
        return dq, dk, dv


class StandInGatedDeltaRule(torch.autograd.Function):
    """q, k: (n, h, dk); v: (n, h, dv); g: (n, h) fp32; beta: (n, h); h0: (h, dk, dv) fp32.
    Returns (o, final_state)."""

    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        h0: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n, h, dk = k.shape
        dv = v.shape[2]
        nt = -(-n // CHUNK)
        f32 = torch.float32
        q_rstd = q.new_empty((n, h), dtype=f32)
        k_rstd = k.new_empty((n, h), dtype=f32)
        g_cum = g.new_empty((n, h), dtype=f32)
        a32 = k.new_empty((n, h, CHUNK), dtype=f32)
        a = k.new_empty((n, h, CHUNK))
        del a32
        w, u = k.new_empty((n, h, dk)), v.new_empty((n, h, dv))
        states = k.new_empty((nt, h, dk, dv))
        v_new = v.new_empty((n, h, dv))
        final = h0.new_empty((h, dk, dv), dtype=f32)
        o = v.new_empty((n, h, dv))
        del w, u, states, v_new
        ctx.save_for_backward(q, q_rstd, k, k_rstd, v, g_cum, beta, a, h0)
        return o, final

    @staticmethod
    def backward(ctx: Any, do: torch.Tensor, dfinal: torch.Tensor | None) -> tuple[Any, ...]:
        q, _qr, k, _kr, v, g_cum, beta, _a, h0 = ctx.saved_tensors
        n, h, dk = k.shape
        dv = v.shape[2]
        nt = -(-n // CHUNK)
        w, u = k.new_empty((n, h, dk)), v.new_empty((n, h, dv))
        states = k.new_empty((nt, h, dk, dv))
        v_new = v.new_empty((n, h, dv))
        dv_local = v.new_empty((n, h, dv))
        dh = k.new_empty((nt, h, dk, dv))
        dh0 = h0.new_empty(h0.shape)
        dvv = v.new_empty(v.shape)
        dq, dkk, dw = q.new_empty(q.shape), k.new_empty(k.shape), k.new_empty((n, h, dk))
        dg = g_cum.new_empty(g_cum.shape)
        db = beta.new_empty(beta.shape)
        del w, u, states, v_new, dv_local, dh, dw
        return dq, dkk, dvv, dg, db, dh0


GatedDeltaRule: Any = StandInGatedDeltaRule  # the layers call GatedDeltaRule.apply


def select_gdn_kernel(mode: str | None = None) -> str:
    """Bind ``GatedDeltaRule`` to fla's own autograd function (``fla``), the stand-in
    (``stand-in``), or fla where it imports (``auto``, the default; mode None reads
    ``RANK_SIM_GDN_KERNEL``). Returns and sets ``GDN_KERNEL``: "fla-core X.Y.Z" or
    "stand-in". ``fla`` where fla does not import is a SimInputError naming the flag."""
    global GatedDeltaRule, GDN_KERNEL
    if mode is None:
        mode = os.environ.get(GDN_KERNEL_ENV) or "auto"
    if mode not in GDN_KERNEL_CHOICES:
        raise SimInputError("gdn_kernel", mode, f"expected one of {', '.join(GDN_KERNEL_CHOICES)}")
    if mode == STAND_IN:
        GatedDeltaRule, GDN_KERNEL = StandInGatedDeltaRule, STAND_IN
        return GDN_KERNEL
    from oracles.rank_sim import fla_kernel

    ok, why = fla_kernel.importable()
    if ok:
        GatedDeltaRule, GDN_KERNEL = fla_kernel.FlaGatedDeltaRule, fla_kernel.label()
    elif mode == "fla":
        raise SimInputError(
            "gdn_kernel", mode, f"fla-core is not importable ({why}); use --gdn-kernel stand-in"
        )
    else:
        GatedDeltaRule, GDN_KERNEL = StandInGatedDeltaRule, STAND_IN
    return GDN_KERNEL


class CausalConvSiLU(torch.autograd.Function):
    """Fused causal depthwise conv + SiLU over (n, c): saves the input (and weight)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        return x.new_empty(x.shape)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        x, _w = ctx.saved_tensors
        return x.new_empty(x.shape), None


class FusedSwiGLU(torch.autograd.Function):
    """A fused SwiGLU kernel (megatron's bias_swiglu / TE): saves its gate‖up input."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return x.new_empty(x.shape)


class FusedRMSNorm(torch.autograd.Function):
    """A fused RMSNorm kernel (TE / apex): saves its input and the fp32 rstd."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        rstd = x.new_empty(x.shape[:-1], dtype=torch.float32)
        ctx.save_for_backward(x, rstd, weight)
        return x.new_empty(x.shape)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        x, _r, _w = ctx.saved_tensors
        return x.new_empty(x.shape), None


class FusedGatedRMSNorm(torch.autograd.Function):
    """fla's fused gated RMSNorm, norm(o)·w·silu(z): saves o, z and the fp32 rstd."""

    @staticmethod
    def forward(ctx: Any, o: torch.Tensor, z: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        rstd = o.new_empty(o.shape[:-1], dtype=torch.float32)
        ctx.save_for_backward(o, z, rstd, weight)
        return o.new_empty(o.shape)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        o, z, _r, _w = ctx.saved_tensors
        return o.new_empty(o.shape), z.new_empty(z.shape), None


def _group_size(group: Any) -> int:
    return 1 if group is None else dist.get_world_size(group)


class GatherTokens(torch.autograd.Function):
    """All-gather along tokens over a group with uneven counts: each rank's rows padded
    to the largest count in transit (one buffer of group x max rows); backward
    reduce-scatters (a fresh local-size gradient)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, counts: tuple[int, ...], group: Any) -> torch.Tensor:
        ctx.local = x.shape[0]
        width = max(counts)
        src = x if x.shape[0] == width else x.new_empty((width, *x.shape[1:]))
        buf = x.new_empty((width * len(counts), *x.shape[1:]))
        if group is not None:
            dist.all_gather_into_tensor(buf, src.contiguous(), group=group)
        del src
        return buf[: sum(counts)]

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return grad.new_empty((ctx.local, *grad.shape[1:])), None, None


class GatherSequence(torch.autograd.Function):
    """Sequence-parallel all-gather in front of a column-parallel projection, keeping the
    local (norm output) input for backward. The measured runtime keeps both the local norm
    output and the gathered adapter input under SP (the reference design's per-sub-layer
    ``2H/t + H``, docs/pricing.md); megatron's local mapping keeps
    only the gathered copy (through the adapter)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.save_for_backward(x)
        size = dist.get_world_size(group)
        out = x.new_empty((x.shape[0] * size, *x.shape[1:]))
        dist.all_gather_into_tensor(out, x.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        (x,) = ctx.saved_tensors
        return grad.new_empty(x.shape), None


def gather_sequence(x: torch.Tensor, sp: bool, keep_local: bool = False) -> torch.Tensor:
    """SP all-gather over the TP group (megatron's mapping, which keeps nothing); with
    ``keep_local`` ``GatherSequence``, which also keeps the local input. x itself
    without SP."""
    if not sp:
        return x
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import mappings

    if keep_local:
        return GatherSequence.apply(x, parallel_state.get_tensor_model_parallel_group())
    return mappings.gather_from_sequence_parallel_region(x)


class Relayout(torch.autograd.Function):
    """All-to-all of the residual stream between the attention and the GDN token layouts
    (a fresh buffer of the new count; backward the reverse)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, tokens: int) -> torch.Tensor:
        ctx.local = x.shape[0]
        return x.new_empty((tokens, *x.shape[1:]))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return grad.new_empty((ctx.local, *grad.shape[1:])), None


def group_size(group: Any) -> int:
    return _group_size(group)


class _Refused:
    """``GatedDeltaRule`` when the environment asked for a kernel that does not import:
    the first GDN layer raises the one-line reason (no silent fall-back)."""

    def __init__(self, exc: SimInputError) -> None:
        self.exc = exc

    def apply(self, *args: Any) -> Any:
        raise self.exc


try:
    select_gdn_kernel()
except SimInputError as _exc:
    GatedDeltaRule, GDN_KERNEL = _Refused(_exc), f"unavailable ({_exc})"
