# mypy: disable-error-code="no-untyped-call,no-any-return"
"""One rank's decoder: megatron-core Column/RowParallelLinear projections (frozen bf16,
LoRA adapters per ``adapters.py``), sequence parallel through megatron's mappings, the
CP attention core per ``cp_comm.py``, and the shape-only kernels. MoE feed-forward
layers live in ``moe.py``; the LM head and its loss in ``head.py``.

Layers hold 2-D (tokens, features) activations. Under SP a layer's residual stream holds
tokens / TP rows; each projection's input is gathered first (an adapter keeps the
gathered input for its own gradient, as the reference pricing's SP term says, and the
local norm output is kept next to it; a projection without an adapter gathers through
megatron's own mapping and keeps neither), and the row-parallel output is
reduce-scattered back.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from oracles.rank_sim import kernels as K
from oracles.rank_sim.adapters import AdapterSpec, LoRAColumn, LoRARow
from oracles.rank_sim.geometry import SimModel
from oracles.rank_sim.layout import RankLayout
from oracles.rank_sim.recompute import Recompute

BF16 = torch.bfloat16


@dataclass
class RankContext:
    """What every layer needs: the layout, groups, recompute, and the label setter."""

    model: SimModel
    layout: RankLayout
    recompute: Recompute
    compiled: bool
    cp_group: Any
    set_label: Callable[[str], str] = field(default=lambda label: label)
    rope: tuple[torch.Tensor, torch.Tensor] | None = None
    ep: int = 1  # expert parallel (MoE models; expert tensor parallel 1)
    routing: str = "concentrated"  # MoE routing: balanced | concentrated (oracles/rank_sim/moe.py)
    adapters: AdapterSpec = field(default_factory=AdapterSpec)  # rank, dropout, targets
    cp_comm: str = "all_gather"  # CP attention communication (oracles/rank_sim/cp_comm.py)
    micro_batch: int = 1  # rows of megatron's [s, b, h] the tokens form (Mamba layers)
    prefix: str = ""  # put before every label (an MTP depth's layers: "mtp.")

    @contextlib.contextmanager
    def label(self, name: str) -> Iterator[None]:
        previous = self.set_label(self.prefix + name)
        try:
            yield
        finally:
            self.set_label(previous)

    def local(self, tokens: int) -> int:
        """Rows of the residual stream on this rank for a layer over ``tokens``."""
        return tokens // self.layout.tp if self.layout.sp else tokens


def _frozen(*shape: int, dtype: torch.dtype = BF16) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)


def _config(model: SimModel, layout: RankLayout) -> Any:
    from megatron.core.transformer.transformer_config import TransformerConfig

    from oracles.megatron_layer import megatron_layer_settings

    return TransformerConfig(
        num_layers=1,
        hidden_size=model.hidden,
        ffn_hidden_size=model.ffn,
        num_attention_heads=model.q_heads,
        kv_channels=model.head_dim,
        tensor_model_parallel_size=layout.tp,
        sequence_parallel=layout.sp,
        use_cpu_initialization=True,
        perform_initialization=False,
        **megatron_layer_settings(),
    )


def gather_sp(x: torch.Tensor, layout: RankLayout, keep_local: bool = False) -> torch.Tensor:
    """SP all-gather over the TP group (megatron's mapping); ``keep_local`` also keeps the
    local input for backward, as the measured runtime's fused norm+linear does."""
    return K.gather_sequence(x, layout.sp, keep_local)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return K.FusedRMSNorm.apply(x, weight)


def _rope(x: torch.Tensor, tables: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Unfused rotary embedding on (n, h, d); only the (non-trainable) tables are saved."""
    cos, sin = tables
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[: x.shape[0], None, :] + rot * sin[: x.shape[0], None, :]


class Attention(nn.Module):
    """Pre-norm attention following megatron-core 0.16's ``SelfAttention``
    (``get_query_key_value_tensors``, ``_apply_output_gate``, read in the installed source):
    one QKV(+gate) projection laid out per query group; query (and gate) reshaped to
    heads, a copy when a partition holds more than one group; q/k RMSNorm on the query
    copy and on key views of the projection; rope; CP K/V all-gather and the flash kernel
    (the checkpointed core under ``core_attn``); the output gate as megatron computes it
    (``x * sigmoid(gate.float())`` in fp32, then back to bf16); output projection.

    Gemma (``model.sandwich_norms``): the output projection's result goes through its own
    RMSNorm (HF ``Gemma3DecoderLayer.post_attention_layernorm``) before the residual add.
    OLMo 2 (``model.pre_norms`` off): no input norm, the projection reads the residual
    stream (its adapter keeps the SP-gathered copy, nothing the local shard), the output
    goes through the post-attention norm; its q/k norms (``model.qk_norm_projection``)
    normalise the flattened query and key, as Megatron-Bridge's ``OLMoESelfAttention``
    does (``reshape`` copies the interleaved groups where the rank holds more than one).
    ``model.qk_norm`` off (Llama, Mistral, Qwen2, Gemma 2, gpt-oss) skips the q/k norms;
    ``model.rope`` off (Megatron hybrids without rope, ``nemotron_h``) sends q and k to the
    kernel unrotated.
    ``window`` (set per layer by ``build_layers`` from ``model.window``) reaches the CP
    core (cp_comm.py); the flash kernel keeps the same set with or without a window or a
    logit soft-cap."""

    window = 0  # this layer's sliding window in tokens (0: full causal attention)

    def __init__(self, ctx: RankContext, cfg: Any) -> None:
        super().__init__()
        m, t = ctx.model, ctx.layout.tp
        self.ctx = ctx
        self.d = m.head_dim
        self.hq = m.q_heads // t
        self.per_group_q = m.q_heads // m.kv_groups  # query heads per group
        self.gated = m.gated_attention
        self.group_width = (self.per_group_q * (2 if self.gated else 1) + 2) * self.d
        # Fewer KV groups than TP ranks: megatron all-gathers the projection along the
        # last dim and each rank views its group out of the full-width tensor.
        self.replicated = m.kv_groups < t
        self.groups = 1 if self.replicated else m.kv_groups // t
        self.norm_w = _frozen(m.hidden) if m.pre_norms else None
        if m.qk_norm_projection:  # OLMo 2: norms over the rank's whole query and key
            self.qn_w, self.kn_w = _frozen(self.hq * self.d), _frozen(self.groups * self.d)
        else:
            self.qn_w, self.kn_w = _frozen(m.head_dim), _frozen(m.head_dim)
        self.post_w = _frozen(m.hidden) if m.sandwich_norms else None
        spec = ctx.adapters
        width = m.kv_groups * self.group_width // t
        self.linear_qkv = LoRAColumn(m.hidden, width, cfg, t, spec, "qkv")
        self.linear_proj = LoRARow(self.hq * self.d, m.hidden, cfg, ctx.layout, spec, "proj")
        # gpt-oss: frozen q/k/v and output biases, learned sinks (gpt_oss_kernels.py);
        # Qwen2: frozen q/k/v biases only
        self.qkv_bias = _frozen(width) if m.attention_bias or m.qkv_bias else None
        self.proj_bias = _frozen(m.hidden) if m.attention_bias else None
        self.sinks = _frozen(self.hq, dtype=torch.float32) if m.attention_sinks else None

    def core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        from oracles.rank_sim.cp_comm import core_attention

        out = core_attention(self.ctx, q, k, v, self.window)
        if self.sinks is not None:
            from oracles.rank_sim.gpt_oss_kernels import AttentionSinks

            out = AttentionSinks.apply(out, self.sinks)
        return out

    def _split(
        self, qkv: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        s, d, nq = qkv.shape[0], self.d, self.per_group_q
        if self.replicated:
            from megatron.core.tensor_parallel.mappings import (
                all_gather_last_dim_from_tensor_parallel_region,
            )

            qkv = all_gather_last_dim_from_tensor_parallel_region(qkv[:, None])[:, 0]
            qkv = qkv[..., : self.group_width]
        mixed = qkv.view(s, self.groups, self.group_width)
        sizes = [nq * d, nq * d, d, d] if self.gated else [nq * d, d, d]
        parts = torch.split(mixed, sizes, dim=2)
        query = parts[0].reshape(s, -1, d)  # a copy when the partition has > 1 group
        gate = parts[1].reshape(s, -1, d) if self.gated else None
        if self.replicated:
            query = query[:, : self.hq]
            gate = gate[:, : self.hq] if gate is not None else None
        return query, parts[-2], parts[-1], gate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ctx = self.ctx
        with ctx.label("attention"):
            # the frame holds the projection's input (LoRA: the gathered copy) until it
            # returns; without an input norm (OLMo 2) the projection reads the residual
            # stream, and nothing keeps its local shard beside the adapter's gathered copy
            pre = self.norm_w is not None
            _held, qkv = self.linear_qkv.project(
                rmsnorm(x, self.norm_w) if self.norm_w is not None else x,
                keep_local=None if pre else False,
            )
            s = qkv.shape[0]
            if self.qkv_bias is not None:  # LinearWithFrozenWeight's ``output + bias``
                qkv = qkv + self.qkv_bias
            q, k, v, gate = self._split(qkv)
            del qkv
            if ctx.model.qk_norm and ctx.model.qk_norm_projection:
                # Megatron-Bridge's OLMoESelfAttention: query and key flattened to
                # [s, heads x head_dim] (a copy of the interleaved groups) and normed whole
                q = rmsnorm(q.reshape(s, -1), self.qn_w).view(s, -1, self.d)
                k = rmsnorm(k.reshape(s, -1), self.kn_w).view(s, -1, self.d)
            elif ctx.model.qk_norm:
                q, k = rmsnorm(q, self.qn_w), rmsnorm(k, self.kn_w)
            if ctx.model.rope:
                assert ctx.rope is not None
                q, k = _rope(q, ctx.rope), _rope(k, ctx.rope)
            if ctx.recompute.core_attn:
                out = ctx.recompute.checkpoint(self.core, q, k, v)
            else:
                out = self.core(q, k, v)
            if gate is not None:  # megatron's _apply_output_gate
                gate = gate.contiguous().view(*out.shape)
                out = (out * torch.sigmoid(gate.float())).to(out.dtype)
            out = self.linear_proj(out.reshape(s, self.hq * self.d))
            if self.proj_bias is not None:  # skip_bias_add: added in bias-dropout-add
                out = out + self.proj_bias
            if self.post_w is not None:  # Gemma's post-attention norm
                out = rmsnorm(out, self.post_w)
            return x + out


class GatedDeltaNet(nn.Module):
    """Pre-norm Gated DeltaNet (megatron GatedDeltaNet shape): one input projection to
    q, k, v, z, beta and gate logits; fused conv + SiLU; q/k repeated to the value
    heads; the chunked kernel once per segment piece (a piece starts from its parent
    piece's final state, or from a fresh fp32 state); fused gated RMSNorm; output
    projection."""

    def __init__(self, ctx: RankContext, cfg: Any) -> None:
        super().__init__()
        m, t = ctx.model, ctx.layout.tp
        self.ctx = ctx
        self.hk, self.hv = m.gdn_key_heads // t, m.gdn_value_heads // t
        self.dk, self.dv = m.gdn_key_dim, m.gdn_value_dim
        self.kw, self.vw = self.hk * self.dk, self.hv * self.dv
        self.norm_w = _frozen(m.hidden)
        width, spec = 2 * self.kw + 2 * self.vw + 2 * self.hv, ctx.adapters
        self.in_proj = LoRAColumn(m.hidden, width, cfg, t, spec, "gdn_in")
        self.conv_w = _frozen(2 * self.kw + self.vw, 1, m.gdn_conv_kernel)
        self.a_log = _frozen(self.hv, dtype=torch.float32)
        self.dt_bias = _frozen(self.hv, dtype=torch.float32)
        self.out_norm_w = _frozen(self.dv)
        self.out_proj = LoRARow(self.vw, m.hidden, cfg, ctx.layout, spec, "gdn_out")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ctx = self.ctx
        with ctx.label("gdn"):
            _held, proj = self.in_proj.project(rmsnorm(x, self.norm_w))  # held until return
            s = proj.shape[0]
            qkv, z, bl, al = proj.split([2 * self.kw + self.vw, self.vw, self.hv, self.hv], -1)
            qkv = K.CausalConvSiLU.apply(qkv, self.conv_w)
            q, k, v = qkv.split([self.kw, self.kw, self.vw], dim=-1)
            rep = self.hv // self.hk
            q = q.reshape(s, self.hk, self.dk).repeat_interleave(rep, dim=1)
            k = k.reshape(s, self.hk, self.dk).repeat_interleave(rep, dim=1)
            v = v.reshape(s, self.hv, self.dv)
            beta = torch.sigmoid(bl)
            g = -self.a_log.exp() * F.softplus(al.float() + self.dt_bias)
            outs: list[torch.Tensor] = []
            finals: list[torch.Tensor] = []
            start = 0
            for piece in ctx.layout.gdn_pieces:
                with ctx.label("gdn_state"):
                    h0 = (
                        finals[piece.parent]
                        if piece.parent is not None
                        else q.new_zeros((self.hv, self.dk, self.dv), dtype=torch.float32)
                    )
                stop = start + piece.tokens
                o, fin = K.GatedDeltaRule.apply(
                    q[start:stop], k[start:stop], v[start:stop], g[start:stop],
                    beta[start:stop], h0,
                )  # fmt: skip
                outs.append(o)
                finals.append(fin)
                start = stop
            o = outs[0] if len(outs) == 1 else torch.cat(outs)
            del outs, finals
            o = K.FusedGatedRMSNorm.apply(o, z.reshape(s, self.hv, self.dv), self.out_norm_w)
            return x + self.out_proj(o.reshape(s, self.vw))


class MLP(nn.Module):
    """Pre-norm GLU: fused gate‖up projection; the fused activation kernel, or
    megatron's unfused GLU (act(x0) * (x1 + glu_linear_offset), megatron's ``MLP.forward``
    ``glu``); down projection. ``act`` is SiLU (SwiGLU) or, for ``mlp_activation``
    "gelu_tanh" (Gemma's ``gelu_pytorch_tanh``), ``F.gelu(approximate="tanh")`` (GeGLU;
    one op, saves its input). Gemma (``sandwich_norms``): the down projection's result goes
    through its own RMSNorm (``post_feedforward_layernorm``) inside the MLP; OLMo 2
    (``pre_norms`` off) has that norm and no pre-MLP norm. Under selective ``mlp`` the
    norm and everything after it are checkpointed.

    Ungated (``model.mlp_gated`` off: Megatron without ``--swiglu``): fc1 is F wide and
    the activation megatron's ``MLP.forward`` applies to all of it: ``squared_relu``
    (megatron.core.activations, ``torch.pow(F.relu(x), 2)``: relu keeps its output, pow
    its input, the same tensor) or ``F.gelu`` (keeps its input); fc2's adapter keeps the
    activation: 2F/t either way."""

    def __init__(self, ctx: RankContext, cfg: Any) -> None:
        super().__init__()
        m, t = ctx.model, ctx.layout.tp
        self.ctx = ctx
        self.norm_w = _frozen(m.hidden) if m.pre_norms else None
        ffn = m.dense_ffn or m.ffn  # a dense layer of a model with experts: dense_ffn
        fc1 = (2 if m.mlp_gated else 1) * ffn // t
        self.fc1 = LoRAColumn(m.hidden, fc1, cfg, t, ctx.adapters, "fc1")
        self.fc2 = LoRARow(ffn // t, m.hidden, cfg, ctx.layout, ctx.adapters, "fc2")
        self.post_w = _frozen(m.hidden) if m.sandwich_norms else None

    def body(self, hn: torch.Tensor) -> torch.Tensor:
        ctx = self.ctx
        # a fused norm+fc1 keeps its local input; without a pre-MLP norm (OLMo 2) nothing
        # keeps the residual stream's local shard beside the adapter's gathered copy
        h = self.fc1.project(hn, keep_local=None if self.norm_w is not None else False)[1]
        y = self.fc2(mlp_activation(ctx, h))
        return rmsnorm(y, self.post_w) if self.post_w is not None else y

    def norm_body(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(rmsnorm(x, self.norm_w) if self.norm_w is not None else x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ctx = self.ctx
        with ctx.label("mlp"):
            if ctx.recompute.mlp:
                # Transformer Engine fuses the pre-MLP norm into fc1 (LayerNormMLP /
                # LayerNormColumnParallelLinear), so the checkpointed MLP starts at the
                # norm and keeps only the residual input (oracles/README.md).
                return x + ctx.recompute.checkpoint(self.norm_body, x)
            return x + self.norm_body(x)


class DecoderLayer(nn.Module):
    """Layer ``index``: its mixer (``kind``: attention, GDN, Mamba-2, or "" for none) and
    its feed-forward, ``MoE``, ``MLP`` or none as ``SimModel.mlp_kind(index)`` says
    (Qwen3-MoE's ``mlp_only_layers`` and ``decoder_sparse_step``, DeepSeek-V3's
    ``first_k_dense_replace``; a hybrid stack's one-sub-layer layers, hybrid.py)."""

    def __init__(self, ctx: RankContext, cfg: Any, kind: str, index: int = 0) -> None:
        super().__init__()
        from oracles.rank_sim.mamba import MambaMixer
        from oracles.rank_sim.moe import MoE

        self.ctx, self.kind, self.index = ctx, kind, index
        mixers: dict[str, Callable[[RankContext, Any], nn.Module]] = {
            "attention": attention_layer, "gdn": GatedDeltaNet, "mamba": MambaMixer,
        }  # fmt: skip
        self.mixer = mixers[kind](ctx, cfg) if kind else None
        mlp_kind = ctx.model.mlp_kind(index)
        self.mlp: nn.Module | None = (
            MoE(ctx, cfg) if mlp_kind == "moe" else MLP(ctx, cfg) if mlp_kind else None
        )

    def body(self, x: torch.Tensor) -> torch.Tensor:
        if self.mixer is not None:
            x = self.mixer(x)
        return self.mlp(x) if self.mlp is not None else x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.ctx.recompute.full:
            return self.ctx.recompute.checkpoint(self.body, x)
        return self.body(x)


def mlp_activation(ctx: Any, h: torch.Tensor) -> torch.Tensor:
    """megatron-core 0.16 ``MLP.forward``'s activation on the fc1 output ``h``, shared by
    the dense MLP and an MoE layer's shared expert (``SharedExpertMLP.forward`` calls
    it): the fused ``bias_swiglu`` under ``bias_activation_fusion`` (or inductor's fusion
    of the unfused GLU under ``--compiled``), else the unfused ``glu``,
    ``act(x_glu) * (x_linear + glu_linear_offset)``; a plain MLP's activation."""
    if not ctx.model.mlp_gated:
        return _ungated(h, ctx.model.mlp_activation)
    if ctx.model.fused_swiglu or ctx.compiled:  # inductor fuses the unfused GLU too
        return K.FusedSwiGLU.apply(h)
    x0, x1 = torch.chunk(h, 2, dim=-1)
    gelu = ctx.model.mlp_activation == "gelu_tanh"
    return (F.gelu(x0, approximate="tanh") if gelu else F.silu(x0)) * (x1 + 0.0)


def _ungated(h: torch.Tensor, activation: str) -> torch.Tensor:
    """The ungated MLP's activation, as megatron's ``MLP.forward`` applies it."""
    if activation == "squared_relu":
        from megatron.core.activations import squared_relu

        return squared_relu(h)
    return F.gelu(h)


def attention_layer(ctx: RankContext, cfg: Any) -> nn.Module:
    """The model's attention layer: multi-head latent attention (mla.py) or ``Attention``."""
    if ctx.model.mla:
        from oracles.rank_sim.mla import MLAttention

        return MLAttention(ctx, cfg)
    return Attention(ctx, cfg)


def build_layers(ctx: RankContext) -> nn.ModuleList:
    cfg = _config(ctx.model, ctx.layout)
    layers = nn.ModuleList(
        DecoderLayer(ctx, cfg, kind, i) for i, kind in enumerate(ctx.model.kinds)
    )
    for i, layer in enumerate(layers):  # each attention layer's sliding window
        if layer.kind == "attention":
            layer.mixer.window = ctx.model.window(i)
    from oracles.rank_sim.training import trainable

    full = ctx.adapters.full  # LoRA: a frozen base, only the adapters train; full: all
    for name, p in layers.named_parameters():
        p.requires_grad_(trainable(name, full))
    return layers
