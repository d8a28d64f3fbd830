# mypy: disable-error-code="no-untyped-call,no-any-return"
"""The core attention of one CP rank under each context-parallel communication type
(``cp_comm``): what it allocates, keeps and frees, at buffer level.

- ``all_gather`` (the default; the measured runtime's): every rank's K/V all-gathered
  over the CP group (uneven counts padded to the largest in transit) and the flash
  kernel on local q against the whole row (``kernels.GatherTokens`` +
  ``kernels.FlashAttention``): the kernel keeps the gathered K/V.
- ``p2p`` (ring attention) and ``a2a`` (Ulysses all-to-all over heads) are restated
  from Transformer Engine's published algorithm, ``AttnFuncWithCPAndKVP2P`` and
  ``AttnFuncWithCPAndQKVOA2A`` in transformer_engine/pytorch/attention/
  dot_product_attention/context_parallel.py (read, not run: Transformer Engine does not
  install without CUDA here), non-fp8, flash-attention backend, causal. Only the
  buffers are modelled; the collectives go through the fake process group.

``p2p`` forward: the local K/V are concatenated into one buffer, and at each of the CP
steps the next rank's K/V chunk is received into a fresh buffer while the current one
is attended; TE keeps every step's buffer, partial output and fp32 lse in lists until
the function returns (so the transient reaches CP chunks), and saves local q, the *last
received* K/V chunk (one chunk, no gathered K/V), the bf16 output and the fp32 lse. With
TE's load-balanced causal split, steps after the diagonal attend half of the query
(its second half, a half-size copy), steps before it half of the chunk (half-size K/V
copies). Backward re-runs the ring: a dq buffer, two double buffers each holding a K/V
chunk and its dK/dV (4 chunks), and per step a dq and dK/dV partial plus the flash
backward's own fp32 dq accumulator and softmax-d (head-expanded dK/dV under GQA).
Uneven per-rank counts travel padded to the largest (TE's ring needs equal chunks).

``a2a`` requires the query heads and the KV heads per TP rank to divide by CP. Forward:
q, k, v each re-laid out (a contiguous copy), all-to-all'd (a fresh buffer) and
re-ordered by sequence chunk (``index_select``, a copy) into ``[CP·s, h/CP, d]``, the
flash kernel over them, and the output all-to-all'd back the same way. It saves the
post-all-to-all q, k, v, the returned output and the fp32 lse: the local element
count, no other rank's K/V. Backward all-to-alls the output and its gradient again,
runs the flash backward over ``[CP·s, h/CP, d]`` and all-to-alls dq, dk, dv back.
TE refuses packed ``thd`` input on this path (``qkv_format != "thd"``); the simulator
treats the rank's tokens as one sequence there. Uneven counts are padded to the largest.

A layer's sliding window (``SimModel.window``) under CP, as Transformer Engine runs it
(``attn_forward_func_with_cp`` asserts ``cp_comm_type in ["a2a", "all_gather"]`` for a
window other than (-1, 0) / (-1, -1)):

- ``all_gather``: TE's ``AttnFuncWithCPAndKVAllGather`` gathers every rank's K/V whole
  (``gather_along_first_dim``, then the chunk re-order) and only narrows what each step's
  kernel reads (``get_kv_seq_info_after_all_gather``: a slice ``k_ag[start:end]``, a view
  for batch 1; thd passes the whole gathered K/V with per-step ``cu_seqlens``). So the
  gathered K/V held do not shrink with the window: the same bytes as window 0.
- ``p2p``: refused for a windowed layer (TE's assertion), a SimInputError naming
  ``cp_comm``.
- ``a2a``: the window goes to the kernel over ``[CP·s, h/CP, d]``; nothing held changes.

The value width may differ from the query/key width (multi-head latent attention): every
output buffer here has the value's width.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from oracles.rank_sim import kernels as K
from oracles.rank_sim.geometry import SimInputError, SimModel

F32 = torch.float32
CP_COMMS = ("all_gather", "p2p", "a2a")


def check_cp_comm(cp_comm: str, model: SimModel, tp: int, cp: int) -> str:
    """Raise SimInputError naming ``cp_comm`` for an unknown type or, under ``a2a``,
    heads per TP rank that CP does not divide."""
    if cp_comm not in CP_COMMS:
        raise SimInputError("cp_comm", cp_comm, f"one of {', '.join(CP_COMMS)}")
    windowed = [i for i, kind in enumerate(model.kinds) if kind == "attention" and model.window(i)]
    if cp_comm == "p2p" and cp > 1 and windowed:
        raise SimInputError(
            "cp_comm",
            cp_comm,
            f"layer {windowed[0]} has a sliding window of {model.window(windowed[0])} tokens; "
            "Transformer Engine's CP supports a window under all_gather and a2a only",
        )
    if cp_comm == "a2a" and cp > 1 and "attention" in model.kinds:
        hq = model.q_heads // tp
        hkv = max(model.kv_groups // tp, 1)  # fewer groups than TP: one group per rank
        if hq % cp or hkv % cp:
            raise SimInputError(
                "cp_comm",
                cp_comm,
                f"a2a needs the {hq} query and {hkv} KV heads per TP rank divisible by CP={cp}",
            )
    return cp_comm


def core_attention(
    ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int = 0
) -> torch.Tensor:
    """The rank's core attention (q, k: (n, h, d); v: (n, hkv, dv)) under ``ctx.cp_comm``.
    ``window`` (tokens, 0 = full) changes no buffer under the supported types (module
    docstring); ``check_cp_comm`` has refused it under ``p2p``."""
    layout = ctx.layout
    counts = layout.attention_tokens
    if layout.cp == 1 or ctx.cp_comm == "all_gather":
        if layout.cp > 1:
            k = K.GatherTokens.apply(k, counts, ctx.cp_group)
            v = K.GatherTokens.apply(v, counts, ctx.cp_group)
        return K.FlashAttention.apply(q, k, v)
    if ctx.cp_comm == "p2p":
        return RingAttention.apply(q, k, v, counts, layout.rank, ctx.cp_group)
    return UlyssesAttention.apply(q, k, v, counts, ctx.cp_group)


def _flash_bwd_workspace(q_rows: int, k_rows: int, hq: int, hkv: int, d: int, like: Any) -> None:
    """FlashAttention-2's backward temporaries for one call: fp32 softmax-d and dq
    accumulator, head-expanded dk/dv under GQA (allocated and dropped)."""
    softmax_d = like.new_empty((hq, q_rows + K.FA_BLOCK), dtype=F32)
    dq_accum = like.new_empty((hq, q_rows + K.FA_BLOCK, d), dtype=F32)
    if hkv != hq:
        expanded = (like.new_empty((k_rows, hq, d)), like.new_empty((k_rows, hq, d)))
        del expanded
    del softmax_d, dq_accum


def _ring(send: torch.Tensor, recv: torch.Tensor, group: Any, forward: bool) -> None:
    """One ring step: send to the next (forward) or previous rank, receive from the other."""
    size, me = dist.get_world_size(group), dist.get_rank(group)
    dst, src = ((me + 1) % size, (me - 1) % size) if forward else ((me - 1) % size, (me + 1) % size)
    ops = [
        dist.P2POp(dist.isend, send, dist.get_global_rank(group, dst), group),
        dist.P2POp(dist.irecv, recv, dist.get_global_rank(group, src), group),
    ]
    for req in dist.batch_isend_irecv(ops):
        req.wait()


class RingAttention(torch.autograd.Function):
    """TE ``AttnFuncWithCPAndKVP2P`` (causal, load-balanced halves), buffer level."""

    @staticmethod
    def forward(
        ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
        counts: tuple[int, ...], rank: int, group: Any,
    ) -> torch.Tensor:  # fmt: skip
        cp, width = len(counts), max(counts)
        n, hq, d = q.shape
        hkv = k.shape[1]
        chunk = width * hkv * (d + v.shape[2])  # k and v of one (padded) rank, flattened
        bufs = [q.new_empty((chunk,))]  # torch.cat((k.view(-1), v.view(-1)))
        q_slots: list[torch.Tensor | None] = [None, None]
        outs: list[torch.Tensor] = []
        lses: list[torch.Tensor] = []
        out = lse = None
        for i in range(cp):
            if i < cp - 1:
                bufs.append(q.new_empty((chunk,)))
                _ring(bufs[i], bufs[i + 1], group, forward=True)
            kv_half = None
            if i == 0:  # diagonal tile: full q, full chunk
                q_slots[i % 2] = q
            elif i <= rank:  # lower triangle: full q, first half of the chunk (copies)
                q_slots[i % 2] = q
                kv_half = (q.new_empty((width // 2, hkv, d)), q.new_empty((width // 2, hkv, d)))
            else:  # upper triangle: second half of q (a copy), full chunk
                q_slots[i % 2] = q.new_empty((n // 2, hq, d))
            rows = q_slots[i % 2].shape[0]
            outs.append(q.new_empty((rows, hq, v.shape[2])))
            lses.append(q.new_empty((rows, hq), dtype=F32))
            del kv_half
            if i == 1:
                lse = lses[0].clone()
                out = q.new_zeros((n, hq, v.shape[2]))
        assert out is not None and lse is not None
        ctx.save_for_backward(q, bufs[-1], out, lse)
        ctx.meta = (counts, rank, group, hkv, v.shape[2], k.shape, v.shape)
        del bufs, q_slots, outs, lses
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[Any, ...]:
        q, kv, _out, _lse = ctx.saved_tensors
        counts, rank, group, hkv, dv_dim, k_shape, v_shape = ctx.meta
        cp, width = len(counts), max(counts)
        n, hq, d = q.shape
        dq_buffer = torch.empty_like(q)
        bufs = [kv.new_empty((2, *kv.shape)), kv.new_empty((2, *kv.shape))]  # kv + dkv, twice
        for i in range(cp):
            _ring(bufs[i % 2][0], bufs[(i + 1) % 2][0], group, forward=False)
            j = cp - 1 - i  # the forward step this one reverses
            q_rows, k_rows = n, width
            if 0 < j <= rank:
                k_rows = width // 2
            elif j > rank:
                q_rows = n // 2
            q_part = q if q_rows == n else q.new_empty((q_rows, hq, d))
            dq_ = q.new_empty((q_rows, hq, d))
            dkv_ = kv.new_empty((k_rows * hkv * (d + dv_dim),))
            _flash_bwd_workspace(q_rows, k_rows, hq, hkv, d, q)
            del q_part, dq_, dkv_
        dkv = bufs[cp % 2][1]
        k_numel = k_shape.numel()
        dk = dkv[:k_numel].view(k_shape)
        dv = dkv[k_numel : k_numel + v_shape.numel()].view(v_shape)
        return dq_buffer, dk, dv, None, None, None


def _a2a(xs: list[torch.Tensor], rows: int, heads: list[int], group: Any) -> list[torch.Tensor]:
    """TE ``flash_attn_a2a_communicate`` over several tensors: each is re-laid out (a
    contiguous copy, kept in TE's input list until the call returns), all-to-all'd into a
    fresh buffer and re-ordered by sequence chunk (a copy: ``index_select`` before the
    attention, ``movedim(...).contiguous()`` after it); results (rows, heads, d)."""
    staged = [x.new_empty(x.shape) for x in xs]
    outs = []
    for src, h in zip(staged, heads, strict=True):
        received = torch.empty_like(src)
        dist.all_to_all_single(received, src, group=group)
        outs.append(src.new_empty((rows, h, src.shape[-1])))
        del received
    del staged
    return outs


class UlyssesAttention(torch.autograd.Function):
    """TE ``AttnFuncWithCPAndQKVOA2A`` (Ulysses), buffer level."""

    @staticmethod
    def forward(
        ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
        counts: tuple[int, ...], group: Any,
    ) -> torch.Tensor:  # fmt: skip
        cp, width = len(counts), max(counts)
        n, hq, _d = q.shape
        hkv = k.shape[1]
        src = [x if n == width else x.new_empty((width, *x.shape[1:])) for x in (q, k, v)]
        qa, ka, va = _a2a(src, cp * width, [hq // cp, hkv // cp, hkv // cp], group)
        del src
        out_a = qa.new_empty((*qa.shape[:2], va.shape[2]))  # flash forward, [CP·s, h/CP, dv]
        lse = qa.new_empty((hq // cp, cp * width), dtype=F32)
        (out,) = _a2a([out_a], width, [hq], group)  # back to the local layout
        out = out[:n]
        del out_a
        ctx.save_for_backward(qa, ka, va, out, lse)
        ctx.meta = (counts, group, q.shape, k.shape, v.shape)
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[Any, ...]:
        qa, ka, va, out, _lse = ctx.saved_tensors
        counts, group, q_shape, k_shape, v_shape = ctx.meta
        cp, width = len(counts), max(counts)
        hq, hkv, d = qa.shape[1] * cp, ka.shape[1] * cp, qa.shape[2]
        out_a, dout_a = _a2a([out, dout], cp * width, [hq // cp] * 2, group)
        dq_a, dk_a, dv_a = torch.empty_like(qa), torch.empty_like(ka), torch.empty_like(va)
        _flash_bwd_workspace(cp * width, cp * width, hq // cp, hkv // cp, d, qa)
        del out_a, dout_a
        grads = _a2a([dq_a, dk_a, dv_a], width, [hq, hkv, hkv], group)
        del dq_a, dk_a, dv_a
        dq, dk, dv = (g[: s[0]] for g, s in zip(grads, (q_shape, k_shape, v_shape), strict=True))
        del grads
        return dq, dk, dv, None, None
