# mypy: disable-error-code="no-untyped-call,no-any-return"
"""Shape-only stand-ins for the two mamba_ssm functions megatron-core 0.16's
``MambaMixer`` trains with: what each allocates in forward and backward and what it saves.

mamba_ssm and causal_conv1d are CUDA packages (Triton kernels, a C++ extension); neither
is installed here, and megatron's ``mamba_mixer.py`` does not even import without triton.
So the functions are restated from their Python source (state-spaces/mamba
``mamba_ssm/ops/triton/ssd_combined.py``, ``ssd_chunk_state.py``, ``ssd_state_passing.py``,
``ssd_bmm.py``, ``ssd_chunk_scan.py``, ``layernorm_gated.py``; Dao-AILab/causal-conv1d
``causal_conv1d/cpp_functions.py``, ``csrc/causal_conv1d.cpp``; read, not run): every
``torch.empty`` / ``zeros`` / ``empty_like`` / ``clone`` / ``sum`` the host code makes,
with its shape and dtype, and each buffer freed where its Python name dies. The kernels
themselves only fill buffers allocated before their launch, so nothing is missed by not
running them. Shapes use b (rows of the micro-batch), l (tokens per row), h heads,
p head dim, g groups, n state dim, Q the chunk size, c = ceil(l / Q) chunks.

- :class:`SplitConv1dScanCombined` is ``MambaSplitConv1dScanCombinedFn`` as
  ``MambaMixer._ssm_training`` calls it (``rmsnorm_weight`` and ``outproj_weight`` None,
  ``norm_before_gate`` False, no initial states, the z gate applied inside the scan).
  Forward: the causal conv output over (x, B, C) (``causal_conv1d_fwd_function``:
  ``empty_like`` of its input), ``_chunk_cumsum_fwd``'s fp32 dt and dA cumsum
  (b, h, c, Q), ``_chunk_state_fwd``'s fp32 states (b, c, h, p, n), ``_state_passing_fwd``'s
  states in the input dtype and fp32 final states (b, h, p·n), ``_bmm_chunk_fwd``'s fp32
  C·Bᵀ (b, c, g, Q, Q), ``_chunk_scan_fwd``'s gated output and pre-gate output out_x
  (b, l, h, p). **Saved**: the whole in_proj output ``zxbcdt`` (b, l, 2·h·p + 2·g·n + h),
  out_x, A, dt_bias (and ``seq_idx`` int32 (b, l) for packed sequences).
  Backward: the conv recomputed, ``dzxbcdt`` and ``dxBC`` (``empty_like``), then
  ``_mamba_chunk_scan_combined_bwd``: a clone of dt, dA cumsum and dt again (fp32), C·Bᵀ,
  the chunk states (fp32) and their passed form (fp32, ``out_dtype`` unset), dD
  partials, ``dout_x`` (``_chunk_scan_bwd_dz``), fp32 state gradients
  (``_chunk_scan_bwd_dstates``), their bf16 form and the bf16 states
  (``_state_passing_bwd``), the ddt workspace (``_chunk_scan_chunk_state_bwd_dx``), fp32 dB
  and dC per split and summed (``_chunk_state_bwd_db``, ``_chunk_scan_bwd_dC``), fp32 dCB
  per split and summed (``_chunk_scan_bwd_dcb``), the reverse cumsum of ddA (flip,
  cumsum, flip), ``_chunk_scan_bwd_ddAcs_stable``'s per-block partials, the conv's fp32
  dweight and dbias (``causal_conv1d_bwd_function``). Non-deterministic mode
  (``MAMBA_DETERMINISTIC`` unset, torch's deterministic algorithms off): no tile workspaces.
- :class:`GatedRMSNorm` is ``LayerNormFn`` (``rmsnorm_fn``, ``is_rms_norm``, no z: the
  mixer calls ``self.norm(y)`` after the scan applied the gate): saves its input and the
  fp32 rstd of each (token, group); backward allocates dx and the fp32 per-program
  weight-gradient partials.

The split count of the dB/dC/dCB kernels and the norm's partial rows depend on the GPU's
SM count (``torch.cuda.get_device_properties(...).multi_processor_count``): H100 SXM's
132 is taken (:data:`SM_COUNT`). ``causal_conv1d`` needs the conv input's row stride
(the in_proj width) to be a multiple of 8, else ``ensure_stride`` copies (b, l, conv dim).
"""

from __future__ import annotations

import math
from typing import Any

import torch

F32 = torch.float32
SM_COUNT = 132  # NVIDIA H100 SXM5 streaming multiprocessors (whitepaper)
DB_BLOCK_MIN = 32  # ssd_combined / ssd_chunk_scan: BLOCK_SIZE_min of the dD partials
DDA_BLOCK_MIN = 32  # _chunk_scan_bwd_ddAcs_stable: BLOCK_SIZE_M_min
STATE_BLOCK_MIN = 64  # _state_passing_bwd: BLOCK_SIZE_min


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _splits(b: int, c: int, h: int, g: int) -> int:
    """``nsplits`` of ``_chunk_state_bwd_db`` / ``_chunk_scan_bwd_dC`` / ``_dcb``."""
    ratio = h // g
    per_program = max(min(_cdiv(b * c * h, SM_COUNT), ratio), 1)
    return _cdiv(ratio, per_program)


def _conv_input(x_bc: torch.Tensor, width: int) -> torch.Tensor | None:
    """``ensure_stride``: a copy of the (x, B, C) view when the row stride (the in_proj
    width) is not a multiple of 8; None when the view is used as is."""
    return None if width % 8 == 0 else x_bc.contiguous()


class SplitConv1dScanCombined(torch.autograd.Function):
    """zxbcdt: (b, l, W) with W = 2·h·p + 2·g·n + h; conv weight (conv_dim, K), bias
    (conv_dim,); dt_bias, A: (h,) fp32; D: (h,). Returns y (b, l, h·p), gated."""

    @staticmethod
    def forward(
        ctx: Any,
        zxbcdt: torch.Tensor,
        conv_weight: torch.Tensor,
        conv_bias: torch.Tensor,
        dt_bias: torch.Tensor,
        a: torch.Tensor,
        d: torch.Tensor,
        chunk: int,
        headdim: int,
        ngroups: int,
        seq_idx: torch.Tensor | None,
    ) -> torch.Tensor:
        b, seq, width = zxbcdt.shape
        h = d.shape[0]
        dim = h * headdim
        conv_dim = conv_weight.shape[0]
        n = (conv_dim - dim) // ngroups // 2
        c = _cdiv(seq, chunk)
        x_bc = zxbcdt[..., dim : dim + conv_dim]
        copy = _conv_input(x_bc, width)
        conv = zxbcdt.new_empty((b, seq, conv_dim))  # causal_conv1d_fwd_function's out
        del copy
        dt_out = zxbcdt.new_empty((b, h, c, chunk), dtype=F32)  # _chunk_cumsum_fwd
        da_cumsum = zxbcdt.new_empty((b, h, c, chunk), dtype=F32)
        states32 = zxbcdt.new_empty((b, c, h, headdim, n), dtype=F32)  # _chunk_state_fwd
        states = zxbcdt.new_empty((b, c, h, headdim * n))  # _state_passing_fwd, C's dtype
        final = zxbcdt.new_empty((b, h, headdim * n), dtype=F32)
        del states32
        cb = zxbcdt.new_empty((b, c, ngroups, chunk, chunk), dtype=F32)  # _bmm_chunk_fwd
        out = zxbcdt.new_empty((b, seq, h, headdim))  # _chunk_scan_fwd: gated output
        out_x = zxbcdt.new_empty((b, seq, h, headdim))  # and the pre-gate output (z given)
        del cb, conv, dt_out, da_cumsum, states, final
        ctx.save_for_backward(zxbcdt, conv_weight, conv_bias, out_x, a, d, dt_bias, seq_idx)
        ctx.geometry = (chunk, headdim, ngroups)
        return out.view(b, seq, dim)

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[Any, ...]:
        zxbcdt, conv_weight, conv_bias, out_x, _a, d, _dt_bias, _seq_idx = ctx.saved_tensors
        chunk, headdim, ngroups = ctx.geometry
        b, seq, width = zxbcdt.shape
        h = d.shape[0]
        dim = h * headdim
        conv_dim = conv_weight.shape[0]
        n = (conv_dim - dim) // ngroups // 2
        c = _cdiv(seq, chunk)
        x_bc = zxbcdt[..., dim : dim + conv_dim]
        copy = _conv_input(x_bc, width)
        conv = zxbcdt.new_empty((b, seq, conv_dim))  # x, B, C recomputed
        del copy
        dzxbcdt = torch.empty_like(zxbcdt)
        dxbc = zxbcdt.new_empty((b, seq, conv_dim))  # empty_like(xBC): dense
        grads = _scan_backward(zxbcdt, out_x, b, seq, h, headdim, ngroups, n, c, chunk)
        # causal_conv1d_bwd_function on ensure_stride(xBC) and into ensure_stride(dxBC_given)
        # (a view of dzxbcdt, copied back when it had to be copied)
        copy = _conv_input(x_bc, width)
        dx_copy = _conv_input(dzxbcdt[..., dim : dim + conv_dim], width)
        dweight = conv_weight.new_zeros(conv_weight.shape, dtype=F32)
        dbias = conv_bias.new_zeros(conv_bias.shape, dtype=F32)
        dweight, dbias = dweight.to(conv_weight.dtype), dbias.to(conv_bias.dtype)
        del copy, dx_copy, conv, dxbc, dout
        ddt_bias, da, dd = grads
        return dzxbcdt, dweight, dbias, ddt_bias, da, dd, None, None, None, None


def _scan_backward(
    zxbcdt: torch.Tensor,
    out_x: torch.Tensor,
    b: int,
    seq: int,
    h: int,
    p: int,
    g: int,
    n: int,
    c: int,
    chunk: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``_mamba_chunk_scan_combined_bwd`` with z, D, dt_bias and the output gradients
    (dx, ddt, dB, dC, dz) handed in as views of dzxbcdt / dxBC: only its own buffers.
    Returns ddt_bias, dA, dD (each (h,) fp32)."""
    new = zxbcdt.new_empty
    dt_in = new((b, seq, h))  # dt.clone()
    da_cumsum, dt32 = new((b, h, c, chunk), dtype=F32), new((b, h, c, chunk), dtype=F32)
    cb = new((b, c, g, chunk, chunk), dtype=F32)  # _bmm_chunk_fwd
    states32 = new((b, c, h, p, n), dtype=F32)  # _chunk_state_fwd
    states = new((b, c, h, p * n), dtype=F32)  # _state_passing_fwd (out_dtype unset: fp32)
    final = new((b, h, p * n), dtype=F32)  # bound to ``_``: lives to the end
    del states32
    # _chunk_scan_bwd_dz (dz given, has_ddAcs False): dD partials and dout_x
    dd_part = new((_cdiv(chunk, DB_BLOCK_MIN), b, c, h, 1), dtype=F32)
    dd = dd_part.sum(dim=(0, 1, 2)).view(h)
    del dd_part
    dout_x = torch.empty_like(out_x)
    dstates32 = new((b, c, h, p, n), dtype=F32)  # _chunk_scan_bwd_dstates (states' dtype)
    # _state_passing_bwd: bf16 state gradients and bf16 states, ddA per chunk
    dstates = new((b, c, h, p * n))
    states_bf16 = new((b, c, h, p * n))
    dda_chunk = new((b, h, c, _cdiv(p * n, STATE_BLOCK_MIN)), dtype=F32).sum(-1)
    del dstates32, states
    # _chunk_scan_chunk_state_bwd_dx: dD partials (zeros) and the ddt workspace
    dd_x = new((_cdiv(chunk, DB_BLOCK_MIN), b, c, h, 1), dtype=F32).sum(dim=(0, 1, 2))
    ddt = new((b, h, c, chunk), dtype=F32)
    splits = _splits(b, c, h, g)
    dda_next = new((b, h, c, chunk), dtype=F32)  # _chunk_state_bwd_db
    db = new((b, seq, splits, g, n), dtype=F32).sum(2)
    dda_prev = new((b, h, c, chunk), dtype=F32)  # _chunk_scan_bwd_dC
    dc = new((b, seq, splits, g, n), dtype=F32).sum(2)
    dcb = new((b, c, splits, g, chunk, chunk), dtype=F32).sum(2)  # _chunk_scan_bwd_dcb
    # _bmm_chunk_bwd writes dB and dC into the dxBC views: no buffer
    flipped = dda_prev.flip([-1])  # ddA_prev = ddA_cumsum_prev.flip.cumsum.flip
    summed = flipped.cumsum(dim=-1)
    del flipped
    dda_rev = summed.flip([-1])
    del summed
    blocks = new((b, h, c, _cdiv(chunk, DDA_BLOCK_MIN), chunk), dtype=F32)
    dda = blocks.sum(dim=3)  # _chunk_scan_bwd_ddAcs_stable
    del blocks
    dda += dda_next + dda_rev
    # _chunk_cumsum_bwd: ddt written into dzxbcdt's view; dA and ddt_bias
    da = new((h,), dtype=F32)
    ddt_bias = new((h,), dtype=F32)
    del dt_in, da_cumsum, dt32, cb, final, dout_x, dstates, states_bf16, dda_chunk
    del dd_x, ddt, dda_next, db, dda_prev, dc, dcb, dda_rev, dda
    return ddt_bias, da, dd


def _norm_partial_rows(group_size: int, ngroups: int) -> int:
    """``_layer_norm_bwd``'s ``nrow_groups``: SM count x ceil(4 / warps) / groups."""
    block = min(65536 // 2, 1 << max(group_size - 1, 0).bit_length())
    warps = min(max(block // 256, 1), 8)
    return math.ceil(SM_COUNT * math.ceil(4 / warps) / ngroups)


class GatedRMSNorm(torch.autograd.Function):
    """mamba_ssm's ``RMSNorm`` with ``group_size`` (no gate: the scan gated already).
    x: (..., N). Saves x (a view of the contiguous input) and the fp32 rstd, one per
    (token, group)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, group_size: int) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        groups = x.shape[-1] // group_size
        out = torch.empty_like(rows)
        rstd = x.new_empty((groups * rows.shape[0],), dtype=F32)
        ctx.save_for_backward(rows, weight, rstd)
        ctx.shape, ctx.group_size = x.shape, group_size
        return out.view(x.shape)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[Any, ...]:
        rows, weight, _rstd = ctx.saved_tensors
        n = rows.shape[-1]
        dx = torch.empty_like(rows)
        partial = rows.new_empty(
            (_norm_partial_rows(ctx.group_size, n // ctx.group_size), n), dtype=F32
        )
        dw = partial.sum(0).to(weight.dtype)
        del partial
        return dx.view(ctx.shape), dw, None
