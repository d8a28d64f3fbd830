"""The torch engine: this package's own decoder, for CP > 1 and for hybrid (GDN) models.

Why: megatron-core's local spec has neither context parallelism over a packed
shared-prefix row nor Gated DeltaNet. This decoder has attention (optional output
gate, qk-norm, rope) and GDN mixers, a SwiGLU MLP, rank-1 LoRA on every linear
projection (frozen random bf16 base), and the three recompute settings. It returns
hidden states: no final norm, no LM head. TP = 1 only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cpmem.model.geometry import ModelGeometry
from cpmem.step.recompute import Recompute

from .cp_attention import Dist, RowLayout, gather_tokens
from .gdn import count_saved, fla_equivalent_saved_bytes, gdn_kernel
from .torchlib import load_torch


@dataclass
class RankContext:
    """What every layer of one rank needs: ownership, positions, collectives, recompute."""

    layout: RowLayout
    rank: int
    dist: Dist
    recompute: Recompute
    positions: Any = None
    gdn_saved_bytes: list[int] = field(default_factory=list)  # per GDN call, fallback
    gdn_fla_bytes: list[int] = field(default_factory=list)  # per GDN piece, fla's list
    count_gdn_saved: bool = False


def make_lora_linear(n_in: int, n_out: int, device: Any, dtype: Any) -> Any:
    """A frozen bf16 linear with a trainable rank-1 adapter (random A and B, as measured)."""
    torch = load_torch()
    nn = torch.nn

    class LoraLinear(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            w = torch.randn(n_out, n_in, device=device, dtype=dtype) * n_in**-0.5
            self.weight = nn.Parameter(w, requires_grad=False)
            self.lora_a = nn.Parameter(torch.randn(1, n_in, device=device, dtype=dtype) * 0.02)
            self.lora_b = nn.Parameter(torch.randn(n_out, 1, device=device, dtype=dtype) * 0.02)

        def forward(self, x: Any) -> Any:
            f = torch.nn.functional
            return f.linear(x, self.weight) + f.linear(f.linear(x, self.lora_a), self.lora_b)

    return LoraLinear()


def _rope(x: Any, positions: Any, theta: float = 1e6) -> Any:
    """Rotary embedding (half-split) on [T, H, D] at the given positions."""
    torch = load_torch()
    d = x.shape[-1]
    inv = theta ** (-torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    ang = positions.float()[:, None] * inv[None, :]
    cos, sin = torch.cos(ang)[:, None, :].to(x.dtype), torch.sin(ang)[:, None, :].to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def _checkpoint(fn: Callable[..., Any], *args: Any) -> Any:
    torch = load_torch()
    return torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False)


def build_torch_model(geometry: ModelGeometry, ctx: RankContext, device: Any) -> Any:
    """Embedding + decoder layers (no final norm, no LM head) with rank-1 LoRA everywhere."""
    torch = load_torch()
    nn = torch.nn
    f = nn.functional
    bf16 = torch.bfloat16
    g = geometry

    def norm_weight(n: int) -> Any:
        return nn.Parameter(torch.ones(n, device=device, dtype=bf16), requires_grad=False)

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            q_out = g.q_width * (2 if g.attention_output_gate else 1)
            self.q_proj = make_lora_linear(g.hidden, q_out, device, bf16)
            self.k_proj = make_lora_linear(g.hidden, g.kv_width, device, bf16)
            self.v_proj = make_lora_linear(g.hidden, g.kv_width, device, bf16)
            self.o_proj = make_lora_linear(g.q_width, g.hidden, device, bf16)
            self.q_norm, self.k_norm = norm_weight(g.head_dim), norm_weight(g.head_dim)

        def core(self, q: Any, kv: Any) -> Any:
            """Each owned piece attends causally to its sequence's keys (lower-right)."""
            from torch.nn.attention.bias import causal_lower_right

            lo, _ = ctx.layout.rank_range(ctx.rank)
            outs = []
            for piece in ctx.layout.pieces(ctx.rank):
                qi = q[piece.start - lo : piece.stop - lo].transpose(0, 1)[None]
                ranges = ctx.layout.key_ranges(piece)
                kvi = (
                    torch.cat([kv[a:b] for a, b in ranges])
                    if len(ranges) > 1
                    else (kv[ranges[0][0] : ranges[0][1]])
                )
                ki, vi = kvi.split(g.head_dim, dim=-1)
                ki, vi = ki.transpose(0, 1)[None], vi.transpose(0, 1)[None]
                n_q, n_k = qi.shape[2], ki.shape[2]
                if n_q == n_k:
                    o = f.scaled_dot_product_attention(qi, ki, vi, is_causal=True, enable_gqa=True)
                else:
                    o = f.scaled_dot_product_attention(
                        qi, ki, vi, attn_mask=causal_lower_right(n_q, n_k), enable_gqa=True
                    )
                outs.append(o[0].transpose(0, 1))
            return torch.cat(outs)

        def forward(self, x: Any) -> Any:
            t = x.shape[0]
            q = self.q_proj(x).view(t, g.q_heads, -1)
            gate = None
            if g.attention_output_gate:
                q, gate = q.split(g.head_dim, dim=-1)
            k = self.k_proj(x).view(t, g.kv_groups, g.head_dim)
            v = self.v_proj(x).view(t, g.kv_groups, g.head_dim)
            q = _rope(f.rms_norm(q, (g.head_dim,), self.q_norm), ctx.positions)
            k = _rope(f.rms_norm(k, (g.head_dim,), self.k_norm), ctx.positions)
            kv = torch.cat([k, v], dim=-1)
            if ctx.dist.world > 1:
                kv = gather_tokens(kv, ctx.layout.rank_tokens, ctx.dist)
            if ctx.recompute.mode == "selective" and "core_attn" in ctx.recompute.modules:
                out = _checkpoint(self.core, q, kv)
            else:
                out = self.core(q, kv)
            if gate is not None:
                out = out * torch.sigmoid(gate)
            return self.o_proj(out.reshape(t, g.q_width))

    class GatedDeltaNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            kw, vw, hv = g.gdn_key_width, g.gdn_value_width, g.gdn_value_heads
            self.in_proj_qkv = make_lora_linear(g.hidden, 2 * kw + vw, device, bf16)
            self.in_proj_z = make_lora_linear(g.hidden, vw, device, bf16)
            self.in_proj_b = make_lora_linear(g.hidden, hv, device, bf16)
            self.in_proj_a = make_lora_linear(g.hidden, hv, device, bf16)
            self.out_proj = make_lora_linear(vw, g.hidden, device, bf16)
            conv = torch.randn(2 * kw + vw, 1, g.gdn_conv_kernel, device=device, dtype=bf16)
            self.conv = nn.Parameter(conv * 0.5, requires_grad=False)
            self.a_log = nn.Parameter(torch.zeros(hv, device=device), requires_grad=False)
            self.dt_bias = nn.Parameter(torch.zeros(hv, device=device), requires_grad=False)
            self.out_norm = norm_weight(g.gdn_value_dim)

        def mix(
            self, q: Any, k: Any, v: Any, gl: Any, beta: Any, fla_seen: set[int] | None = None
        ) -> Any:
            """Pieces in row order; a piece starts from its parent's (or previous piece's)
            final state. Remote states arrive by broadcast, detached (see module notes)."""
            hv, dk, dv = g.gdn_value_heads, g.gdn_key_dim, g.gdn_value_dim
            layout, rank = ctx.layout, ctx.rank
            lo, _ = layout.rank_range(rank)
            zero = q.new_zeros((hv, dk, dv), dtype=torch.float32)
            finals: dict[tuple[int, int], Any] = {}  # (rank, piece index) -> final state
            outs: list[Any] = []
            for src in range(len(layout.rank_tokens)):
                pieces = layout.pieces(src)
                if src == rank:
                    for i, p in enumerate(pieces):
                        seg = layout.segments[p.segment]
                        if p.start == seg.start:  # a segment starts from its parent's end
                            where = (
                                None
                                if seg.parent is None
                                else layout.owner_of_end(
                                    layout.segments[seg.parent].stop, seg.parent
                                )
                            )
                        else:
                            where = layout.owner_of_end(p.start, p.segment)
                        init = zero if where is None else finals[where]
                        a, b = p.start - lo, p.stop - lo
                        o, fin = gdn_kernel(q[a:b], k[a:b], v[a:b], gl[a:b], beta[a:b], init)
                        if fla_seen is not None:  # what fla would have saved instead
                            ctx.gdn_fla_bytes.append(
                                fla_equivalent_saved_bytes(
                                    q[a:b], k[a:b], v[a:b], beta[a:b], init, fla_seen
                                )
                            )
                        finals[(rank, i)] = fin
                        outs.append(o)
                if ctx.dist.world > 1 and pieces:
                    if src == rank:
                        stacked = torch.stack([finals[(rank, i)] for i in range(len(pieces))])
                        sent = ctx.dist.broadcast(stacked.detach(), src)
                    else:
                        empty = zero.new_empty((len(pieces), hv, dk, dv))
                        sent = ctx.dist.broadcast(empty, src)
                        for i in range(len(pieces)):
                            finals[(src, i)] = sent[i]
            return torch.cat(outs)

        def forward(self, x: Any) -> Any:
            t = x.shape[0]
            kw, vw = g.gdn_key_width, g.gdn_value_width
            hk, hv = g.gdn_key_heads, g.gdn_value_heads
            qkv = self.in_proj_qkv(x)
            width = qkv.shape[-1]
            # causal depthwise conv over the rank's own tokens (values only; shapes exact)
            conv_in = f.pad(qkv.t()[None], (g.gdn_conv_kernel - 1, 0))
            qkv = f.silu(f.conv1d(conv_in, self.conv, groups=width))[0].t()
            q, k, v = qkv.split([kw, kw, vw], dim=-1)
            rep = hv // hk
            q = q.reshape(t, hk, -1).repeat_interleave(rep, dim=1)
            k = k.reshape(t, hk, -1).repeat_interleave(rep, dim=1)
            v = v.reshape(t, hv, -1)
            beta = torch.sigmoid(self.in_proj_b(x))
            gl = -torch.exp(self.a_log) * f.softplus(self.in_proj_a(x).float() + self.dt_bias)
            if ctx.count_gdn_saved:
                with count_saved(ctx.gdn_saved_bytes):
                    o = self.mix(q, k, v, gl, beta, fla_seen=set())
            else:
                o = self.mix(q, k, v, gl, beta)
            z = self.in_proj_z(x).view(t, hv, -1)
            o = f.rms_norm(o, (g.gdn_value_dim,), self.out_norm) * f.silu(z)
            return self.out_proj(o.reshape(t, vw))

    class Mlp(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gate_proj = make_lora_linear(g.hidden, g.ffn, device, bf16)
            self.up_proj = make_lora_linear(g.hidden, g.ffn, device, bf16)
            self.down_proj = make_lora_linear(g.ffn, g.hidden, device, bf16)

        def forward(self, x: Any) -> Any:
            return self.down_proj(f.silu(self.gate_proj(x)) * self.up_proj(x))

    class Layer(nn.Module):
        def __init__(self, kind: str) -> None:
            super().__init__()
            self.norm1, self.norm2 = norm_weight(g.hidden), norm_weight(g.hidden)
            self.mixer = Attention() if kind == "attention" else GatedDeltaNet()
            self.mlp = Mlp()

        def body(self, x: Any) -> Any:
            x = x + self.mixer(f.rms_norm(x, (g.hidden,), self.norm1))
            h = f.rms_norm(x, (g.hidden,), self.norm2)
            if ctx.recompute.mode == "selective" and "mlp" in ctx.recompute.modules:
                return x + _checkpoint(self.mlp, h)
            return x + self.mlp(h)

        def forward(self, x: Any) -> Any:
            return _checkpoint(self.body, x) if ctx.recompute.mode == "full" else self.body(x)

    class Decoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            emb = torch.randn(g.vocab, g.hidden, device=device, dtype=bf16) * 0.02
            self.embed = nn.Parameter(emb, requires_grad=False)
            self.layers = nn.ModuleList(Layer(kind) for kind in g.mixers)

        def forward(self, ids: Any) -> Any:
            x = f.embedding(ids, self.embed)
            if ctx.recompute.mode == "full":
                x = x.detach().requires_grad_(True)  # checkpoints need an input with grad
            for layer in self.layers:
                x = layer(x)
            return x

    return Decoder()
