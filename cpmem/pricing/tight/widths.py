"""What every layer kind's module of ``tight`` reads: the widths of one model at one
layout, and the LoRA'd projection's forming moment they share."""

from __future__ import annotations

from dataclasses import dataclass

from cpmem.pricing.widths import LayerWidths

LORA_SUM_COPIES = 3
"""Where a LoRA'd projection forms its output, three output-wide tensors are live: the
frozen base output, the rank-1 adapter's delta ``B(Ax)`` (output-wide) and their sum. A
pass without gradients (every layer under full recompute, a no-grad forward, a
checkpointed module's forward) saves nothing, so that moment is its peak: on the SwiGLU's
gate‖up projection ``3 x 2F/t`` (``mlp.nograd_width``), on attention's QKV projection
``3 x projection/t`` (``attention.nograd_width``). Rank simulator
(oracles/rank_sim/layers.py ``LoRAColumn``), 8,192 tokens at TP1: the full-recompute
forward peak is the layer inputs plus ``2H + 6F`` (Qwen3.5-4B: 142,848 elements per token
= 33H + rope + 57,856); under selective ``mlp`` the forward peak minus the retained set is
``H + 6F`` (38,912 on Qwen3-1.7B, 57,856 on Qwen3.5-4B)."""


@dataclass(frozen=True)
class TightWidths(LayerWidths):
    """Elements per token kept by one layer of each kind (oracle saved sets, by kind name
    in ``saved``), plus the parts a selective recompute drops: the core attention's and
    the SwiGLU's."""

    tp: int
    """The TP degree the widths are sharded by (workspaces added to them follow it)."""
    attention_core: int = 0
    mlp_core: int = 0
    moe_kept: int = 0
    """What an MoE sub-layer keeps outside its ``MoELayer`` (``moe.kept_width``): all a
    ``moe`` checkpoint keeps of it."""
    fp8_attention: int = 0
    fp8_dense: int = 0
    fp8_moe: int = 0
    """What FP8 changes in the attention, dense-MLP and MoE kinds' widths
    (``cpmem.pricing.kinds.fp8``), part of ``saved``: what a layer kept in bf16 under FP8
    (``Fp8.bf16_layers``) does not have."""
