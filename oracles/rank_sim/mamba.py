# mypy: disable-error-code="no-untyped-call,no-any-return"
"""One Mamba-2 layer as megatron-core 0.16 builds it for training (``MambaLayer`` with
``MambaMixer`` from ``mamba_stack_spec``: the pre-norm fused into ``in_proj``
(``TELayerNormColumnParallelLinear``), ``out_proj`` a ``TERowParallelLinear``, the
bias-dropout-add residual).

megatron's ``MambaMixer`` cannot be built here: ``megatron/core/ssm/mamba_mixer.py``
imports triton (through the inference tensor ops) and its constructor refuses to run
without mamba_ssm and einops. So this module restates, line by line, the training path
it runs (``MambaMixer.forward`` -> ``_ssm_training`` with ``use_mamba_mem_eff_path``,
megatron's default) on the simulator's own pieces: the fused RMSNorm and SP gather of
the other layers, megatron's ``ColumnParallelLinear`` / ``RowParallelLinear`` with frozen
weights and LoRA (``adapters.py``, targets ``mamba_in`` / ``mamba_out``), and the
shape-only mamba_ssm functions of ``mamba_kernels.py``. Under CP it calls megatron's own
``mamba_context_parallel`` helpers (``_all_to_all_cp2hp``, ``_all_to_all_hp2cp``,
``_undo_attention_load_balancing``, ``_redo_attention_load_balancing``: they import
without einops); the one einops call there (``repeat`` of B and C over the CP ranks that
share a group) is restated.

Widths as megatron derives them (``MambaMixer.__init__``): d_inner = heads x head dim;
in_proj out = 2·d_inner + 2·groups·d_state + heads (z, x, B, C, dt), each TP rank its
heads / TP and groups / TP; conv channels = d_inner + 2·groups·d_state (per rank); the
gated RMSNorm's group size d_inner / groups; chunk 128 and conv kernel 4 (constructor
defaults). The residual stream is (tokens, H) here; the mixer views it as megatron's
(s, b, H) with ``RankContext.micro_batch`` rows, so ``rearrange(...).contiguous()``
copies exactly when b > 1. Packed sequences (the rank's row holds more than one
sequence piece, one micro-batch row) give the scan megatron's int32 ``seq_idx``
(``_create_packed_seq_idx``: an int64 ``repeat_interleave`` cast to int32).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from oracles.rank_sim.adapters import LoRAColumn, LoRARow
from oracles.rank_sim.geometry import SimInputError, SimModel
from oracles.rank_sim.mamba_kernels import GatedRMSNorm, SplitConv1dScanCombined

BF16 = torch.bfloat16


def check_mamba(model: SimModel, tp: int, cp: int, counts: tuple[int, ...]) -> None:
    """megatron's asserts (``MambaMixer.__init__``, ``MambaContextParallel.__init__``)
    as input errors naming the field; equal per-rank counts under CP (its all-to-all)."""
    h, g = model.mamba_heads, model.mamba_groups
    if h % g:
        raise SimInputError("mamba_num_groups", g, f"does not divide the {h} Mamba heads")
    if h % tp or g % tp:
        raise SimInputError("tp", tp, f"does not divide the {h} Mamba heads and {g} groups")
    if cp > 1:
        if (h // tp) % cp:
            raise SimInputError("cp", cp, f"does not divide the {h // tp} Mamba heads per TP rank")
        g_tp = g // tp
        if (g_tp < cp and cp % g_tp) or (g_tp >= cp and g_tp % cp):
            raise SimInputError("cp", cp, f"and the {g_tp} Mamba groups per TP rank do not nest")
        if len(set(counts)) > 1:
            raise SimInputError(
                "rank_tokens", list(counts), "Mamba layers under CP need equal per-rank counts"
            )


def _repeat_groups(t: torch.Tensor, groups: int, state: int, repeat: int) -> torch.Tensor:
    """einops ``repeat(t, "l b (g n) -> l b (g r n)")``: the same tensor at r = 1."""
    if repeat == 1:
        return t
    s, b, _ = t.shape
    return t.view(s, b, groups, 1, state).expand(s, b, groups, repeat, state).reshape(s, b, -1)


class MambaMixer(nn.Module):
    """Pre-norm Mamba-2 mixer with its residual add: the whole ``M`` layer."""

    def __init__(self, ctx: Any, cfg: Any) -> None:
        super().__init__()
        m, lay = ctx.model, ctx.layout
        t, cp = lay.tp, lay.cp
        self.ctx = ctx
        self.p, self.n = m.mamba_head_dim, m.mamba_state
        self.h_tp, self.g_tp = m.mamba_heads // t, m.mamba_groups // t
        self.d_tp = self.h_tp * self.p
        # MambaContextParallel: heads split over CP; groups too, or repeated when fewer
        self.h_cp = self.h_tp // cp
        self.repeat = cp // self.g_tp if self.g_tp < cp else 1
        self.g_cp = 1 if self.g_tp < cp else self.g_tp // cp
        self.d_cp = self.h_cp * self.p
        conv_dim = self.d_cp + 2 * self.g_cp * self.n
        width = 2 * self.d_tp + 2 * self.g_tp * self.n + self.h_tp  # z x B C dt
        self.norm_w = _frozen(m.hidden)
        spec = ctx.adapters
        self.in_proj = LoRAColumn(m.hidden, width, cfg, t, spec, "mamba_in")
        self.conv_w = _frozen(conv_dim, 1, m.mamba_conv_kernel)
        self.conv_b = _frozen(conv_dim)
        self.dt_bias = _frozen(self.h_cp)  # params_dtype
        self.a_log = _frozen(self.h_cp, dtype=torch.float32)
        self.d = _frozen(self.h_cp, dtype=torch.float32)
        self.out_norm_w = _frozen(self.d_tp)
        self.out_proj = LoRARow(self.d_tp, m.hidden, cfg, lay, spec, "mamba_out")

    def _pre_conv_ssm(self, zx: torch.Tensor) -> torch.Tensor:
        """``MambaContextParallel.pre_conv_ssm``: sequence-sharded to head-sharded."""
        from megatron.core.ssm import mamba_context_parallel as mcp

        group, cp, d, gn = self.ctx.cp_group, self.ctx.layout.cp, self.d_tp, self.g_tp * self.n
        z, x, b, c, dt = torch.split(zx, [d, d, gn, gn, self.h_tp], dim=-1)
        z, x = mcp._all_to_all_cp2hp(z, group), mcp._all_to_all_cp2hp(x, group)
        b = mcp._all_to_all_cp2hp(_repeat_groups(b, self.g_tp, self.n, self.repeat), group)
        c = mcp._all_to_all_cp2hp(_repeat_groups(c, self.g_tp, self.n, self.repeat), group)
        dt = mcp._all_to_all_cp2hp(dt, group)
        out = torch.cat([z, x, b, c, dt], dim=-1)
        del z, x, b, c, dt
        return mcp._undo_attention_load_balancing(out, cp, None)

    def _post_conv_ssm(self, y: torch.Tensor) -> torch.Tensor:
        from megatron.core.ssm import mamba_context_parallel as mcp

        cp = self.ctx.layout.cp
        return mcp._all_to_all_hp2cp(
            mcp._redo_attention_load_balancing(y, cp, None), self.ctx.cp_group
        )

    def _seq_idx(self, rows: int, tokens: int) -> torch.Tensor | None:
        """``_create_packed_seq_idx`` for a packed row; None otherwise."""
        if rows != 1 or len(self.ctx.layout.gdn_pieces) < 2:
            return None
        idx = torch.empty((tokens,), dtype=torch.int64)  # repeat_interleave
        return idx.to(torch.int32).unsqueeze(0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from oracles.rank_sim.layers import rmsnorm

        ctx = self.ctx
        lay = ctx.layout
        with ctx.label("mamba"):
            full, zx = self.in_proj.project(rmsnorm(x, self.norm_w))
            tokens, rows = zx.shape[0], ctx.micro_batch
            del full
            zx = zx.view(tokens // rows, rows, zx.shape[-1])  # megatron's [s, b, d]
            if lay.cp > 1:
                zx = self._pre_conv_ssm(zx)
            zx = zx.permute(1, 0, 2).contiguous()  # rearrange "l b d -> b l d"
            a = -torch.exp(self.a_log.float())
            seq_idx = self._seq_idx(rows, zx.shape[1])
            y = SplitConv1dScanCombined.apply(
                zx, self.conv_w.view(self.conv_w.shape[0], -1), self.conv_b,
                self.dt_bias.float(), a, self.d, ctx.model.mamba_chunk, self.p, self.g_cp,
                seq_idx,
            )  # fmt: skip
            del zx, a, seq_idx
            y = y.permute(1, 0, 2).contiguous()  # rearrange "b l d -> l b d"
            if lay.cp > 1:
                y = self._post_conv_ssm(y)
            y = GatedRMSNorm.apply(y, self.out_norm_w, self.d_tp // self.g_tp)
            return x + self.out_proj(y.view(-1, self.d_tp))


def _frozen(*shape: int, dtype: torch.dtype = BF16) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)
