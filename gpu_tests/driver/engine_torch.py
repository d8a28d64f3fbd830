"""The torch engine: this package's own decoder, for CP > 1 and for hybrid (GDN) models.

Why: megatron-core's local spec has neither context parallelism over a packed
shared-prefix row nor Gated DeltaNet. This decoder has attention (optional output
gate, qk-norm, rope) and GDN mixers, a SwiGLU MLP, rank-1 LoRA on every linear
projection (frozen random bf16 base), and the three recompute settings. It returns
hidden states: no final norm, no LM head (head.py adds one where a cell asks). TP = 1 only.

Adapters: the harness (rank 1, no dropout) has one rank-1 adapter per projection, as
always measured. Any other rank or dropout follows megatron's fused projections, the
layout cpmem prices (its targets ``qkv``, ``fc1``, ``gdn_in`` are one linear each): the
projections that read one input (q/k/v; gate/up; GDN's qkv/z/b/a) share one adapter
input, ``A(dropout(x))`` (PEFT's order, one mask and one dropped copy), and each has its
own ``B`` on it (``make_lora_group``).
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
    # adapters beyond the harness (make_lora_group); rank 1 and 0.0: the harness's
    lora_rank: int = 1
    lora_dropout: float = 0.0

    @property
    def grouped_adapters(self) -> bool:
        return not (self.lora_rank == 1 and self.lora_dropout == 0)


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


def make_lora_group(
    n_in: int, outs: dict[str, int], device: Any, dtype: Any, rank: int, dropout: float
) -> Any:
    """Frozen bf16 linears of one shared input with one rank-``rank`` adapter input.

    ``adapter_input(x)`` is ``A(dropout(x))`` (torch's dropout before A, PEFT's order;
    ``x`` itself at p = 0), made once per forward; ``project(name, x, mid)`` is that
    projection's frozen output plus its own ``B`` on ``mid``: megatron's LoRA on a fused
    projection (its ``B`` is the stack of these). A group of one output is called as a
    module."""
    torch = load_torch()
    nn = torch.nn
    f = nn.functional

    class LoraGroup(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.ParameterDict(
                {
                    name: nn.Parameter(
                        torch.randn(n, n_in, device=device, dtype=dtype) * n_in**-0.5,
                        requires_grad=False,
                    )
                    for name, n in outs.items()
                }
            )
            self.lora_a = nn.Parameter(torch.randn(rank, n_in, device=device, dtype=dtype) * 0.02)
            self.lora_b = nn.ParameterDict(
                {
                    name: nn.Parameter(torch.randn(n, rank, device=device, dtype=dtype) * 0.02)
                    for name, n in outs.items()
                }
            )

        def adapter_input(self, x: Any) -> Any:
            dropped = f.dropout(x, dropout, training=True) if dropout else x
            return f.linear(dropped, self.lora_a)

        def project(self, name: str, x: Any, mid: Any) -> Any:
            return f.linear(x, self.weight[name]) + f.linear(mid, self.lora_b[name])

        def forward(self, x: Any) -> Any:
            (name,) = self.weight.keys()
            return self.project(name, x, self.adapter_input(x))

    return LoraGroup()


def _projections(module: Any, names: tuple[str, ...], x: Any) -> Callable[[str], Any]:
    """``proj(name)``: projection ``name`` of ``x``, made where it is called (as the
    harness's per-projection layout does); grouped adapters share one adapter input."""
    group = getattr(module, "in_group", None)
    if group is None:
        linears = {n: getattr(module, n) for n in names}
        return lambda name: linears[name](x)
    mid = group.adapter_input(x)
    return lambda name: group.project(name, x, mid)


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

    grouped = ctx.grouped_adapters

    def linear(n_in: int, n_out: int) -> Any:
        """One projection of its own input: the harness's, or a group of one."""
        if grouped:
            return make_lora_group(
                n_in, {"out": n_out}, device, bf16, ctx.lora_rank, ctx.lora_dropout
            )
        return make_lora_linear(n_in, n_out, device, bf16)

    def inputs(module: Any, n_in: int, outs: dict[str, int]) -> None:
        """Projections of one shared input: per-projection (harness) or one group."""
        if grouped:
            module.in_group = make_lora_group(
                n_in, outs, device, bf16, ctx.lora_rank, ctx.lora_dropout
            )
        else:
            for name, n_out in outs.items():
                setattr(module, name, make_lora_linear(n_in, n_out, device, bf16))

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            q_out = g.q_width * (2 if g.attention_output_gate else 1)
            inputs(self, g.hidden, {"q_proj": q_out, "k_proj": g.kv_width, "v_proj": g.kv_width})
            self.o_proj = linear(g.q_width, g.hidden)
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
            proj = _projections(self, ("q_proj", "k_proj", "v_proj"), x)
            q = proj("q_proj").view(t, g.q_heads, -1)
            gate = None
            if g.attention_output_gate:
                q, gate = q.split(g.head_dim, dim=-1)
            k = proj("k_proj").view(t, g.kv_groups, g.head_dim)
            v = proj("v_proj").view(t, g.kv_groups, g.head_dim)
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
            inputs(
                self,
                g.hidden,
                {"in_proj_qkv": 2 * kw + vw, "in_proj_z": vw, "in_proj_b": hv, "in_proj_a": hv},
            )
            self.out_proj = linear(vw, g.hidden)
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
            proj = _projections(self, ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"), x)
            qkv = proj("in_proj_qkv")
            width = qkv.shape[-1]
            # causal depthwise conv over the rank's own tokens (values only; shapes exact)
            conv_in = f.pad(qkv.t()[None], (g.gdn_conv_kernel - 1, 0))
            qkv = f.silu(f.conv1d(conv_in, self.conv, groups=width))[0].t()
            q, k, v = qkv.split([kw, kw, vw], dim=-1)
            rep = hv // hk
            q = q.reshape(t, hk, -1).repeat_interleave(rep, dim=1)
            k = k.reshape(t, hk, -1).repeat_interleave(rep, dim=1)
            v = v.reshape(t, hv, -1)
            beta = torch.sigmoid(proj("in_proj_b"))
            gl = -torch.exp(self.a_log) * f.softplus(proj("in_proj_a").float() + self.dt_bias)
            if ctx.count_gdn_saved:
                with count_saved(ctx.gdn_saved_bytes):
                    o = self.mix(q, k, v, gl, beta, fla_seen=set())
            else:
                o = self.mix(q, k, v, gl, beta)
            z = proj("in_proj_z").view(t, hv, -1)
            o = f.rms_norm(o, (g.gdn_value_dim,), self.out_norm) * f.silu(z)
            return self.out_proj(o.reshape(t, vw))

    class Mlp(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            inputs(self, g.hidden, {"gate_proj": g.ffn, "up_proj": g.ffn})
            self.down_proj = linear(g.ffn, g.hidden)

        def forward(self, x: Any) -> Any:
            proj = _projections(self, ("gate_proj", "up_proj"), x)
            return self.down_proj(f.silu(proj("gate_proj")) * proj("up_proj"))

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
