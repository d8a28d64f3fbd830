"""The saved-tensor oracle's reference layers: pre-norm attention (flash-style SDPA,
optional output gate), the SwiGLU MLP (fused or unfused) and the Gated DeltaNet mixer, each
with frozen bf16 weights and rank-1 LoRA, and the building blocks they share (``LoRALinear``,
the fused-kernel contracts of RMSNorm, SwiGLU, the causal conv and the gated delta rule,
rope tables). ``oracles.saved_tensors`` builds and measures them; oracles/README.md says
which kernel each restates.

Nothing here imports cpmem.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor

BF16 = torch.bfloat16


# --------------------------------------------------------------------------- building blocks


def _frozen(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.randn(*shape, dtype=BF16) * 0.02, requires_grad=False)


class LoRALinear(nn.Module):
    """Frozen bf16 base weight plus a trainable rank-1 adapter: y = xWᵀ + s·(xAᵀ)Bᵀ.

    With W frozen, the base matmul saves nothing; the adapter's first matmul saves x
    (so every adapted projection retains its input) and its second the rank-1 xAᵀ.
    """

    def __init__(self, n_in: int, n_out: int, scale: float = 1.0) -> None:
        super().__init__()
        self.weight = _frozen(n_out, n_in)
        self.lora_a = nn.Parameter(torch.randn(1, n_in, dtype=BF16) * 0.02)
        self.lora_b = nn.Parameter(torch.randn(n_out, 1, dtype=BF16) * 0.02)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (
            F.linear(x, self.weight) + F.linear(F.linear(x, self.lora_a), self.lora_b) * self.scale
        )


class _FusedRMSNormFn(torch.autograd.Function):
    """A fused RMSNorm kernel's contract: saves its input and the fp32 rstd, not the output.

    (torch's own CPU rms_norm decomposes and saves an fp32 copy of the input; fused GPU
    kernels — TE, apex, fla — do not.)
    """

    @staticmethod
    def forward(ctx, x, weight, eps):  # type: ignore[no-untyped-def]
        xf = x.float()
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, rstd, weight)
        return (xf * rstd).to(x.dtype) * weight

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        x, rstd, weight = ctx.saved_tensors
        xf, gw = x.float(), (grad * weight).float()
        n = xf * rstd
        gx = rstd * (gw - n * (gw * n).mean(-1, keepdim=True))
        return gx.to(x.dtype), None, None


class FusedRMSNorm(nn.Module):
    def __init__(self, width: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width, dtype=BF16), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _FusedRMSNormFn.apply(x, self.weight, self.eps)


def rope_tables(seq: int, dim: int, theta: float = 1e6) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    ang = torch.outer(torch.arange(seq, dtype=torch.float32), inv)
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos().to(BF16), ang.sin().to(BF16)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (b, s, h, d); the tables are not trainable, so only they are saved."""
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None, :] + rot * sin[:, None, :]


# --------------------------------------------------------------------------- reference layers


class AttentionLayer(nn.Module):
    """Pre-norm attention sub-layer with a flash-style kernel (SDPA), Qwen3/Qwen3.5 style.

    q/k RMSNorm, rope, SDPA (CPU flash kernel: saves q, k, v, out and the fp32
    logsumexp; GQA native, K/V not repeated), optional sigmoid output gate whose
    logits come from the same projection as q (Qwen3.5), rank-1 LoRA on every
    projection, residual add.
    """

    def __init__(
        self, hidden: int, q_heads: int, kv_groups: int, head_dim: int, gated: bool
    ) -> None:
        super().__init__()
        self.h, self.g, self.d, self.gated = q_heads, kv_groups, head_dim, gated
        self.norm = FusedRMSNorm(hidden)
        self.q_proj = LoRALinear(hidden, q_heads * head_dim * (2 if gated else 1))
        self.k_proj = LoRALinear(hidden, kv_groups * head_dim)
        self.v_proj = LoRALinear(hidden, kv_groups * head_dim)
        self.q_norm = FusedRMSNorm(head_dim)
        self.k_norm = FusedRMSNorm(head_dim)
        self.o_proj = LoRALinear(q_heads * head_dim, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        hn = self.norm(x)
        qg = self.q_proj(hn).view(b, s, self.h, -1)
        q, gate = (qg[..., : self.d], qg[..., self.d :]) if self.gated else (qg, None)
        q = self.q_norm(q)
        k = self.k_norm(self.k_proj(hn).view(b, s, self.g, self.d))
        v = self.v_proj(hn).view(b, s, self.g, self.d)
        cos, sin = rope_tables(s, self.d)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        o = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            is_causal=True,
            enable_gqa=self.h != self.g,
        )
        o = o.transpose(1, 2).reshape(b, s, self.h * self.d)
        if gate is not None:
            o = o * torch.sigmoid(gate.reshape(b, s, self.h * self.d))
        return x + self.o_proj(o)


class _FusedSwiGLUFn(torch.autograd.Function):
    """A fused SwiGLU kernel: saves only its (gate ‖ up) input and recomputes silu in backward."""

    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def]
        ctx.save_for_backward(x)
        a, b = x.chunk(2, dim=-1)
        return F.silu(a) * b

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        (x,) = ctx.saved_tensors
        a, b = x.chunk(2, dim=-1)
        sa = torch.sigmoid(a)
        ga = grad * b * sa * (1 + a * (1 - sa))
        return torch.cat([ga, grad * a * sa], dim=-1)


class SwiGLUMLP(nn.Module):
    """Pre-norm SwiGLU MLP sub-layer with rank-1 LoRA on its projections.

    activation: ``fused`` (one gate‖up projection, fused kernel), ``unfused``
    (separate gate/up projections, F.silu then a multiply — HF style), or
    ``unfused-sigmoid`` (silu spelled x·sigmoid(x), which also keeps the sigmoid).
    """

    def __init__(self, hidden: int, ffn: int, activation: str = "fused") -> None:
        super().__init__()
        if activation not in ("fused", "unfused", "unfused-sigmoid"):
            raise ValueError(activation)
        self.activation = activation
        self.norm = FusedRMSNorm(hidden)
        if activation == "fused":
            self.gate_up = LoRALinear(hidden, 2 * ffn)
        else:
            self.gate = LoRALinear(hidden, ffn)
            self.up = LoRALinear(hidden, ffn)
        self.down = LoRALinear(ffn, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hn = self.norm(x)
        if self.activation == "fused":
            act = _FusedSwiGLUFn.apply(self.gate_up(hn))
        elif self.activation == "unfused":
            act = F.silu(self.gate(hn)) * self.up(hn)
        else:
            g = self.gate(hn)
            act = g * torch.sigmoid(g) * self.up(hn)
        return x + self.down(act)


class _CausalConvSiLUFn(torch.autograd.Function):
    """A fused causal depthwise conv + SiLU (causal-conv1d style): saves input and weight only."""

    @staticmethod
    def forward(ctx, x, weight):  # type: ignore[no-untyped-def]
        ctx.save_for_backward(x, weight)
        return _causal_conv_silu(x, weight)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        x, weight = ctx.saved_tensors
        with torch.enable_grad():
            xd = x.detach().requires_grad_()
            (gx,) = torch.autograd.grad(_causal_conv_silu(xd, weight), xd, grad)
        return gx, None


def _causal_conv_silu(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x: (b, s, c), weight: (c, 1, w)."""
    w = weight.shape[-1]
    xt = F.pad(x.transpose(1, 2), (w - 1, 0))
    return F.silu(F.conv1d(xt, weight, groups=x.shape[-1])).transpose(1, 2)


CHUNK = 64


class _GatedDeltaCoreFn(torch.autograd.Function):
    """The fused chunked gated-delta-rule kernel's contract (fla ``chunk_gated_delta_rule``
    with in-kernel q/k l2 norm): saves q, k, v, the fp32 q/k rms reciprocals, the fp32
    chunk-local cumulative gate, beta, the per-64-token-chunk WY matrix A (input dtype)
    and the initial state; per-chunk states are recomputed in backward.

    q, k: (b, s, hk, dk); v: (b, s, hv, dv) with hv a multiple of hk (grouped value
    heads are expanded inside, not saved); g: (b, s, hv) fp32 log-decay; beta: (b, s, hv).
    """

    @staticmethod
    def forward(ctx, q, k, v, g, beta, initial_state):  # type: ignore[no-untyped-def]
        b, s, h, _ = v.shape
        rep = h // q.shape[2]
        q_rstd = torch.rsqrt(q.float().pow(2).sum(-1) + 1e-6)
        k_rstd = torch.rsqrt(k.float().pow(2).sum(-1) + 1e-6)
        n = -(-s // CHUNK)
        pad = n * CHUNK - s
        gc = F.pad(g.float(), (0, 0, 0, pad)).view(b, n, CHUNK, h).cumsum(2)
        kn = (k.float() * k_rstd[..., None]).repeat_interleave(rep, dim=2)
        kn = F.pad(kn, (0, 0, 0, 0, 0, pad)).view(b, n, CHUNK, h, -1)
        bt = F.pad(beta.float(), (0, 0, 0, pad)).view(b, n, CHUNK, h)
        kk = torch.einsum("bnihd,bnjhd->bnhij", kn, kn)
        gh = gc.permute(0, 1, 3, 2)
        low = torch.tril(
            kk * (gh[..., :, None] - gh[..., None, :]).exp() * bt.permute(0, 1, 3, 2)[..., :, None],
            -1,
        )
        eye = torch.eye(CHUNK, dtype=torch.float32)
        a = torch.linalg.solve_triangular(eye + low, eye.expand_as(low), upper=False)
        a = a.permute(0, 1, 3, 2, 4).reshape(b, n * CHUNK, h, CHUNK)[:, :s].to(v.dtype)
        g_cum = gc.reshape(b, n * CHUNK, h)[:, :s].contiguous()
        if isinstance(q, FakeTensor):  # shapes are all that count; skip the token loop
            o = torch.empty_like(v)
        else:
            o = _gated_delta_recurrent(q, k, v, g, beta, initial_state)
        ctx.save_for_backward(q, q_rstd, k, k_rstd, v, g_cum, beta, a, initial_state)
        return o

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        q, _qr, k, _kr, v, g_cum, beta, _a, h0 = ctx.saved_tensors
        # Recover the per-token log-decay from the chunk-local cumulative sum.
        s = g_cum.shape[1]
        prev = torch.cat([torch.zeros_like(g_cum[:, :1]), g_cum[:, :-1]], dim=1)
        first = (torch.arange(s) % CHUNK == 0).view(1, s, 1)
        g = torch.where(first, g_cum, g_cum - prev)
        with torch.enable_grad():
            ins = [t.detach().requires_grad_() for t in (q, k, v, g, beta)]
            o = _gated_delta_recurrent(*ins, h0)
            grads = torch.autograd.grad(o, ins, grad)
        return (*grads, None)


def _gated_delta_recurrent(q, k, v, g, beta, h0):  # type: ignore[no-untyped-def]
    """Token-by-token gated delta rule with l2-normed q/k (the kernel's semantics)."""
    rep = v.shape[2] // q.shape[2]
    q, k = q.repeat_interleave(rep, dim=2), k.repeat_interleave(rep, dim=2)
    b, s, h, dk = q.shape
    qf = F.normalize(q.float(), dim=-1) * dk**-0.5
    kf = F.normalize(k.float(), dim=-1)
    state = (
        h0.float().expand(b, h, dk, v.shape[-1]).clone()
        if h0 is not None
        else torch.zeros(b, h, dk, v.shape[-1])
    )
    outs = []
    for t in range(s):
        state = state * g[:, t].float().exp()[..., None, None]
        kt, vt = kf[:, t], v[:, t].float()
        delta = (vt - torch.einsum("bhkv,bhk->bhv", state, kt)) * beta[:, t].float()[..., None]
        state = state + kt[..., :, None] * delta[..., None, :]
        outs.append(torch.einsum("bhkv,bhk->bhv", state, qf[:, t]))
    return torch.stack(outs, dim=1).to(v.dtype)


class _FusedGatedRMSNormFn(torch.autograd.Function):
    """A fused gated RMSNorm (norm(o)·w·silu(z)): saves o, z and the fp32 rstd."""

    @staticmethod
    def forward(ctx, o, z, weight, eps):  # type: ignore[no-untyped-def]
        of = o.float()
        rstd = torch.rsqrt(of.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(o, z, rstd, weight)
        return ((of * rstd) * weight.float() * F.silu(z.float())).to(o.dtype)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        o, z, _rstd, weight = ctx.saved_tensors
        with torch.enable_grad():
            od, zd = o.detach().requires_grad_(), z.detach().requires_grad_()
            of = od.float()
            y = of * torch.rsqrt(of.pow(2).mean(-1, keepdim=True) + 1e-6)
            y = (y * weight.float() * F.silu(zd.float())).to(o.dtype)
            go, gz = torch.autograd.grad(y, (od, zd), grad)
        return go, gz, None, None


class GatedDeltaNetLayer(nn.Module):
    """Pre-norm Gated DeltaNet sub-layer (Qwen3.5 / megatron GatedDeltaNet shape).

    One LoRA'd input projection to q, k, v, z, beta-logits and gate-logits; fused
    causal conv + SiLU over q‖k‖v; the fused chunked kernel (saved set above);
    fused gated RMSNorm with z; LoRA'd output projection; residual add.
    ``repeat_qk``: megatron repeats q and k to the value-head count before the kernel
    (the kernel then saves the repeated copies); without it the kernel takes grouped
    q/k and saves them at key-head width.
    """

    def __init__(
        self,
        hidden: int,
        key_heads: int,
        key_dim: int,
        value_heads: int,
        value_dim: int,
        conv_kernel: int,
        repeat_qk: bool = True,
    ) -> None:
        super().__init__()
        self.hk, self.dk, self.hv, self.dv = key_heads, key_dim, value_heads, value_dim
        self.repeat_qk = repeat_qk
        kw, vw = key_heads * key_dim, value_heads * value_dim
        self.kw, self.vw = kw, vw
        self.norm = FusedRMSNorm(hidden)
        self.in_proj = LoRALinear(hidden, 2 * kw + 2 * vw + 2 * value_heads)
        self.conv_weight = _frozen(2 * kw + vw, 1, conv_kernel)
        self.a_log = nn.Parameter(torch.zeros(value_heads), requires_grad=False)
        self.dt_bias = nn.Parameter(torch.ones(value_heads), requires_grad=False)
        self.out_norm_weight = nn.Parameter(torch.ones(value_dim, dtype=BF16), requires_grad=False)
        self.out_proj = LoRALinear(vw, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        kw, vw, hv = self.kw, self.vw, self.hv
        proj = self.in_proj(self.norm(x))
        qkv, z, bl, al = proj.split([2 * kw + vw, vw, hv, hv], dim=-1)
        qkv = _CausalConvSiLUFn.apply(qkv, self.conv_weight)
        q, k, v = qkv.split([kw, kw, vw], dim=-1)
        q, k = q.view(b, s, self.hk, self.dk), k.view(b, s, self.hk, self.dk)
        v = v.view(b, s, hv, self.dv)
        if self.repeat_qk and hv != self.hk:
            q = q.repeat_interleave(hv // self.hk, dim=2)
            k = k.repeat_interleave(hv // self.hk, dim=2)
        beta = torch.sigmoid(bl)
        g = -self.a_log.float().exp() * F.softplus(al.float() + self.dt_bias)
        o = _GatedDeltaCoreFn.apply(q, k, v, g, beta, None)
        o = _FusedGatedRMSNormFn.apply(o, z.view(b, s, hv, self.dv), self.out_norm_weight, 1e-6)
        return x + self.out_proj(o.reshape(b, s, vw))


__all__ = [
    "BF16",
    "AttentionLayer",
    "FusedRMSNorm",
    "GatedDeltaNetLayer",
    "LoRALinear",
    "SwiGLUMLP",
    "apply_rope",
    "rope_tables",
]
