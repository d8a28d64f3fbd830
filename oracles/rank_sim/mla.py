# mypy: disable-error-code="no-untyped-call,no-any-return"
"""Multi-head latent attention (HF ``deepseek_v3`` / ``kimi_k2``: DeepSeek-V3, Kimi K2,
Moonlight) on one rank, restating megatron-core 0.16's ``MLASelfAttention``
(transformer/multi_latent_attention.py, ``get_query_key_value_tensors`` and its
``qkv_up_proj_and_rope_apply``, unfused rope) with the Transformer Engine layer spec
(models/gpt/gpt_layer_specs.py: ``linear_q_down_proj`` / ``linear_kv_down_proj`` are
``backend.linear()``, TE's duplicated ``TELinear``; the up projections column-parallel
with the q/kv norm in front, as ``TELayerNormColumnParallelLinear`` fuses it).

Per layer, tokens n (n/TP local rows under SP), heads h = heads/TP per rank:

- input RMSNorm (fused) on the residual input;
- ``q_lora_rank`` > 0: q down projection (duplicated, local rows) to ``q_lora_rank``, its
  RMSNorm, SP gather, q up projection (column-parallel) to h x (nope + rope);
  ``q_lora_rank`` 0 (Moonlight): one column-parallel q projection on the gathered input;
- kv down projection (duplicated, local rows) to ``kv_lora_rank + qk_rope_head_dim``,
  split into the compressed KV and the shared rope key; the rope key SP-gathered
  (megatron's ``gather_from_sequence_parallel_region``); the KV RMSNorm, SP gather, kv up
  projection (column-parallel) to h x (nope + v);
- q split into nope and rope parts (views), rope on the rope part; the key's rope part
  rotated once and expanded to h heads; ``torch.cat`` makes query and key
  (n, h, nope + rope); the value split off the kv up output is made contiguous
  (n, h, v): after that the q and kv up outputs are freed;
- the core (cp_comm.py, flash: q, k of width nope + rope, v and out of width v);
- output projection (row-parallel) from h x v.

LoRA: the attention's input-side projections (q down/up or q, kv down/up) are the
``qkv`` target, the output projection ``proj`` (adapters.py names).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from oracles.rank_sim.adapters import LoRAColumn, LoRADuplicated, LoRARow


class MLAttention(nn.Module):
    """One rank's multi-head latent attention layer (module docstring)."""

    window = 0  # MLA families have no sliding windows; build_layers sets it anyway

    def __init__(self, ctx: Any, cfg: Any) -> None:
        super().__init__()
        from oracles.rank_sim.layers import _frozen

        m, t = ctx.model, ctx.layout.tp
        self.ctx = ctx
        self.h = m.q_heads // t
        self.nope, self.rope, self.dv = m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim
        self.qhd = self.nope + self.rope
        spec = ctx.adapters
        self.norm_w = _frozen(m.hidden)
        q_width = m.q_heads * self.qhd // t
        if m.q_lora_rank:
            self.q_down = LoRADuplicated(m.hidden, m.q_lora_rank, spec, "qkv")
            self.q_norm_w = _frozen(m.q_lora_rank)
            self.q_up = LoRAColumn(m.q_lora_rank, q_width, cfg, t, spec, "qkv")
        else:
            self.q_proj = LoRAColumn(m.hidden, q_width, cfg, t, spec, "qkv")
        self.kv_down = LoRADuplicated(m.hidden, m.kv_lora_rank + self.rope, spec, "qkv")
        self.kv_norm_w = _frozen(m.kv_lora_rank)
        kv_width = m.q_heads * (self.nope + self.dv) // t
        self.kv_up = LoRAColumn(m.kv_lora_rank, kv_width, cfg, t, spec, "qkv")
        self.linear_proj = LoRARow(self.h * self.dv, m.hidden, cfg, ctx.layout, spec, "proj")

    def core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        from oracles.rank_sim.cp_comm import core_attention

        return core_attention(self.ctx, q, k, v, self.window)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from oracles.rank_sim.layers import _rope, gather_sp, rmsnorm

        ctx, m, layout = self.ctx, self.ctx.model, self.ctx.layout
        with ctx.label("attention"):
            hn = rmsnorm(x, self.norm_w)
            if m.q_lora_rank:
                qc = rmsnorm(self.q_down(hn), self.q_norm_w)
                q = self.q_up.project(qc)[1]
                del qc
            else:
                q = self.q_proj.project(hn)[1]
            kv_c, k_pe = self.kv_down(hn).split([m.kv_lora_rank, self.rope], dim=-1)
            del hn
            k_pe = gather_sp(k_pe, layout)  # the shared rope key, every token of the row
            kv_n = rmsnorm(kv_c, self.kv_norm_w)
            del kv_c
            kv = self.kv_up.project(kv_n)[1]
            del kv_n
            n = q.shape[0]
            assert ctx.rope is not None
            q_nope, q_pe = q.view(n, self.h, self.qhd).split([self.nope, self.rope], dim=-1)
            k_nope, value = kv.view(n, self.h, self.nope + self.dv).split(
                [self.nope, self.dv], dim=-1
            )
            del q, kv
            query = torch.cat([q_nope, _rope(q_pe, ctx.rope)], dim=-1)
            k_rot = _rope(k_pe[:, None, :], ctx.rope).expand(n, self.h, self.rope)
            key = torch.cat([k_nope, k_rot], dim=-1)
            value = value.contiguous()
            del q_nope, q_pe, k_nope, k_rot, k_pe
            if ctx.recompute.core_attn:
                out = ctx.recompute.checkpoint(self.core, query, key, value)
            else:
                out = self.core(query, key, value)
            return x + self.linear_proj(out.reshape(n, self.h * self.dv))
