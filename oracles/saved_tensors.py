"""Saved-tensor oracle: what autograd keeps for backward during one forward of real modules.

Counting rule (see oracles/README.md): every tensor autograd packs for backward is
recorded once per *untyped storage* (views share it, so a saved slice costs its whole
storage), and storages owned by parameters are skipped (frozen base weights and LoRA
factors are not activations). The same counting runs on real tensors and under
``FakeTensorMode``, where real model widths cost no memory.

Nothing here imports cpmem: the oracle measures modules, it never prices them.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

BF16 = torch.bfloat16
# A saved storage narrower than hidden / SMALL_FRACTION bf16 elements per token is a
# "small term" (fp32 norm/softmax statistics, rank-1 LoRA intermediates, rope tables,
# per-head gate scalars); the reference widths do not price them.
SMALL_FRACTION = 8


def storage_key(t: torch.Tensor) -> int:
    """Identity of a tensor's untyped storage (the StorageImpl address; views share it)."""
    return int(t.untyped_storage()._cdata)


def storage_keys(tensors: Iterable[torch.Tensor]) -> set[int]:
    return {storage_key(t) for t in tensors}


# --------------------------------------------------------------------------- counting


@dataclass
class SavedStorage:
    """One retained storage: its size, and the first tensor that saved it."""

    nbytes: int
    dtype: torch.dtype
    shape: tuple[int, ...]
    label: str


@dataclass
class SavedTensorCounter:
    """saved_tensors_hooks that record each saved storage once, skipping excluded ones.

    ``exclude`` holds storage keys of parameters (and anything else the caller says is
    not an activation). ``label`` may be switched during forward (module pre-hooks) to
    attribute storages to sub-layers; a storage keeps the label of its first save.
    """

    exclude: set[int] = field(default_factory=set)
    label: str = ""
    records: dict[int, SavedStorage] = field(default_factory=dict)
    _keep: list[Any] = field(default_factory=list)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        key = storage_key(t)
        if key not in self.exclude and key not in self.records and not isinstance(t, nn.Parameter):
            st = t.untyped_storage()
            self._keep.append(st)  # keep the address from being reused while we count
            self.records[key] = SavedStorage(st.nbytes(), t.dtype, tuple(t.shape), self.label)
        return t

    @contextlib.contextmanager
    def __call__(self) -> Iterator[SavedTensorCounter]:
        with torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t):
            yield self

    def bytes(self, label: str | None = None) -> int:
        return sum(r.nbytes for r in self.records.values() if label in (None, r.label))

    def keys(self, label: str | None = None) -> set[int]:
        return {k for k, r in self.records.items() if label in (None, r.label)}

    def release(self) -> None:
        self._keep.clear()


class LiveStorageTracker(TorchDispatchMode):
    """Tracks every storage an op creates during forward; afterwards reports those still alive.

    An independent check of the hooks: after forward, the storages that survive are
    exactly those autograd holds for backward, plus the returned output.
    """

    def __init__(self) -> None:
        super().__init__()
        self._refs: list[tuple[StorageWeakRef, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                st = t.untyped_storage()
                self._refs.append((StorageWeakRef(st), st.nbytes()))
        return out

    def live(self, exclude: set[int]) -> dict[int, int]:
        """Storage key -> bytes of tracked storages still alive, minus ``exclude``."""
        alive: dict[int, int] = {}
        for ref, nbytes in self._refs:
            if not ref.expired() and ref.cdata not in exclude:
                alive[ref.cdata] = nbytes
        return alive


@dataclass
class Measurement:
    """Saved bytes of one forward, total and per label, with the storages behind them."""

    tokens: int
    records: dict[int, SavedStorage]
    small_width: int = 0  # storages narrower than this (bf16 elements per token) are small
    live_bytes: int | None = None  # from the live-storage tracker, when run on real tensors
    live_keys: set[int] | None = None

    def bytes(self, label: str | None = None) -> int:
        return sum(r.nbytes for r in self.records.values() if label in (None, r.label))

    def small_bytes(self, label: str | None = None) -> int:
        """Bytes in storages narrower than ``small_width`` bf16 elements per token."""
        return sum(
            r.nbytes
            for r in self.records.values()
            if label in (None, r.label) and r.nbytes < self.small_width * 2 * self.tokens
        )

    def width(self, label: str | None = None) -> float:
        """Retained bytes per token expressed in bf16 elements (bytes / 2 / tokens)."""
        return self.bytes(label) / 2 / self.tokens

    def bulk_width(self, label: str | None = None) -> float:
        return (self.bytes(label) - self.small_bytes(label)) / 2 / self.tokens

    def by_dtype(self, label: str | None = None) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.records.values():
            if label in (None, r.label):
                out[str(r.dtype)] = out.get(str(r.dtype), 0) + r.nbytes
        return out


def measure_forward(
    module: nn.Module,
    inputs: tuple[torch.Tensor, ...],
    tokens: int,
    *,
    labels: dict[nn.Module, str] | None = None,
    track_live: bool = False,
    call: Callable[..., Any] | None = None,
) -> Measurement:
    """Run one forward under the counter (and optionally the live tracker).

    Parameters are excluded. Layer inputs are *not* excluded: a layer that saves its
    input (the residual stream its norm reads) retains it for backward.
    ``labels`` maps sub-modules to a label switched on by a forward pre-hook.
    """
    exclude = storage_keys(p for p in module.parameters())
    counter = SavedTensorCounter(exclude=set(exclude), label="layer")
    handles = []
    for sub, name in (labels or {}).items():

        def hook(_m: nn.Module, _a: Any, _name: str = name) -> None:
            counter.label = _name

        handles.append(sub.register_forward_pre_hook(hook))
    run = call or module
    tracker = LiveStorageTracker() if track_live else None
    try:
        with counter(), tracker if tracker is not None else contextlib.nullcontext():
            out = run(*inputs)
    finally:
        for h in handles:
            h.remove()
    m = Measurement(tokens=tokens, records=dict(counter.records))
    if tracker is not None:
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        out_keys = storage_keys(outs) - set(counter.records)
        counter.release()
        live = tracker.live(exclude | out_keys | storage_keys(inputs))
        m.live_bytes = sum(live.values())
        m.live_keys = set(live)
        # Inputs the layer saved are alive too but were created before the tracker.
        saved_inputs = storage_keys(inputs) & set(counter.records)
        m.live_bytes += sum(counter.records[k].nbytes for k in saved_inputs)
        m.live_keys |= saved_inputs
    counter.release()
    del out
    return m


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


# --------------------------------------------------------------------------- geometry & runs


@dataclass(frozen=True)
class OracleGeometry:
    """Plain shape numbers of one model (the oracle takes numbers, not cpmem objects)."""

    name: str
    hidden: int
    ffn: int
    q_heads: int
    kv_groups: int
    head_dim: int
    gated_attention: bool
    fused_swiglu: bool
    gdn_key_heads: int = 0
    gdn_key_dim: int = 0
    gdn_value_heads: int = 0
    gdn_value_dim: int = 0
    gdn_conv_kernel: int = 0

    def scaled(self, factor: int) -> OracleGeometry:
        """A geometry with every width divided by ``factor`` (head counts kept where possible)."""

        def d(n: int) -> int:
            return max(1, n // factor)

        return OracleGeometry(
            name=f"{self.name}/{factor}",
            hidden=d(self.hidden),
            ffn=d(self.ffn),
            q_heads=self.q_heads,
            kv_groups=self.kv_groups,
            head_dim=d(self.head_dim),
            gated_attention=self.gated_attention,
            fused_swiglu=self.fused_swiglu,
            gdn_key_heads=self.gdn_key_heads,
            gdn_key_dim=d(self.gdn_key_dim),
            gdn_value_heads=self.gdn_value_heads,
            gdn_value_dim=d(self.gdn_value_dim),
            gdn_conv_kernel=self.gdn_conv_kernel,
        )


# The four models' shapes, restated from the measured sources' geometry table.
GEOMETRIES: dict[str, OracleGeometry] = {
    "qwen3.5-27b": OracleGeometry(
        "qwen3.5-27b", 5120, 17408, 24, 4, 256, True, True, 16, 128, 48, 128, 4
    ),
    "qwen3.5-4b": OracleGeometry(
        "qwen3.5-4b", 2560, 9216, 16, 4, 256, True, True, 16, 128, 32, 128, 4
    ),
    "qwen3.5-35b-a3b": OracleGeometry(
        "qwen3.5-35b-a3b", 2048, 512, 16, 2, 256, True, True, 16, 128, 32, 128, 4
    ),
    "qwen3-1.7b": OracleGeometry("qwen3-1.7b", 2048, 6144, 16, 8, 128, False, False),
}


def build_reference_layer(geo: OracleGeometry, kind: str, variant: str = "") -> nn.Module:
    """kind: attention | gdn | mlp; variant picks a non-default implementation."""
    if kind == "attention":
        return AttentionLayer(
            geo.hidden, geo.q_heads, geo.kv_groups, geo.head_dim, geo.gated_attention
        )
    if kind == "gdn":
        return GatedDeltaNetLayer(
            geo.hidden,
            geo.gdn_key_heads,
            geo.gdn_key_dim,
            geo.gdn_value_heads,
            geo.gdn_value_dim,
            geo.gdn_conv_kernel,
            repeat_qk=variant != "no-repeat",
        )
    if kind == "mlp":
        act = variant or ("fused" if geo.fused_swiglu else "unfused")
        return SwiGLUMLP(geo.hidden, geo.ffn, act)
    raise ValueError(kind)


def measure_reference(
    geo: OracleGeometry,
    kind: str,
    seq: int,
    *,
    variant: str = "",
    fake: bool = True,
    track_live: bool = False,
    seed: int = 0,
) -> Measurement:
    """Saved bytes of one reference sub-layer on a (1, seq, hidden) bf16 input."""
    torch.manual_seed(seed)
    mode = _fake_mode() if fake else contextlib.nullcontext()
    with mode:
        layer = build_reference_layer(geo, kind, variant)
        x = torch.randn(1, seq, geo.hidden, dtype=BF16, requires_grad=True)
        m = measure_forward(layer, (x,), seq, track_live=track_live)
    m.small_width = geo.hidden // SMALL_FRACTION
    return m


def _fake_mode() -> FakeTensorMode:
    return FakeTensorMode()


# --------------------------------------------------------------------------- megatron on CPU


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_SHIM_DONE = False


def install_megatron_cpu_shim() -> None:
    """Make megatron-core 0.16 build and run on CPU (facts in oracles/README.md).

    Idempotent and process-wide: torch.cuda helpers become CPU no-ops, causal masks
    are built on CPU, the RNG tracker's fork is a plain context, and the fp8 flag of
    CheckpointWithoutOutput is read as a boolean. Process groups are the caller's
    (see :func:`init_single_process_megatron`).
    """
    global _SHIM_DONE
    if _SHIM_DONE:
        return
    import megatron.core.fusions.fused_softmax as fsm
    import megatron.core.transformer.utils as tutils
    from megatron.core.tensor_parallel import random as mrandom

    cuda = torch.cuda
    cuda.current_device = lambda: "cpu"  # type: ignore[assignment]
    cuda.synchronize = lambda *a, **k: None  # type: ignore[assignment]
    cuda.get_rng_state = lambda *a, **k: torch.get_rng_state()  # type: ignore[assignment]
    cuda.set_rng_state = lambda *a, **k: None  # type: ignore[assignment]
    cuda.manual_seed = lambda *a, **k: None  # type: ignore[assignment]
    cuda.empty_cache = lambda: None  # type: ignore[assignment]
    mrandom._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()
    mrandom._set_cuda_rng_state = lambda *a, **k: None

    def causal_mask(sq: int) -> torch.Tensor:
        return torch.triu(torch.ones(sq, sq, dtype=torch.bool), diagonal=1)

    tutils.get_default_causal_mask = causal_mask
    fsm.get_default_causal_mask = causal_mask

    @contextlib.contextmanager
    def fork(self: Any, name: str = "") -> Iterator[None]:
        yield

    mrandom.CudaRNGStatesTracker.fork = fork
    orig_init = mrandom.CheckpointWithoutOutput.__init__

    def cwo_init(self: Any, fp8: Any = False) -> None:
        orig_init(self, fp8)
        self.fp8 = bool(fp8)

    mrandom.CheckpointWithoutOutput.__init__ = cwo_init
    _SHIM_DONE = True


def init_single_process_megatron() -> None:
    """The CPU shim plus a world-size-1 gloo group with TP = PP = CP = 1."""
    from megatron.core import parallel_state

    install_megatron_cpu_shim()
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", world_size=1, rank=0
        )
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)


def megatron_layer_settings() -> dict[str, Any]:
    """TransformerConfig settings every cpmem megatron layer shares (oracle and native
    driver): bf16 SwiGLU with RMSNorm and qk-norm, no bias, no dropout, and the fusions
    off that have no CPU path (facts in oracles/README.md)."""
    return {
        "gated_linear_unit": True,
        "activation_func": F.silu,
        "normalization": "RMSNorm",
        "qk_layernorm": True,
        "add_bias_linear": False,
        "bf16": True,
        "params_dtype": BF16,
        "pipeline_dtype": BF16,
        "attention_dropout": 0.0,
        "hidden_dropout": 0.0,
        "bias_activation_fusion": False,
        "bias_dropout_fusion": False,
        "masked_softmax_fusion": False,
        "apply_rope_fusion": False,
        "gradient_accumulation_fusion": False,
        "persist_layer_norm": False,
    }


MEGATRON_MODES: dict[str, dict[str, Any]] = {
    "none": {"recompute_granularity": None},
    "selective-core_attn": {
        "recompute_granularity": "selective",
        "recompute_modules": ["core_attn"],
    },
    "selective-mlp": {"recompute_granularity": "selective", "recompute_modules": ["mlp"]},
    "selective-core_attn+mlp": {
        "recompute_granularity": "selective",
        "recompute_modules": ["core_attn", "mlp"],
    },
    "full": {
        "recompute_granularity": "full",
        "recompute_method": "uniform",
        "recompute_num_layers": 1,
    },
}


def _add_lora(linear: nn.Module) -> None:
    """Freeze a megatron linear and add a rank-1 adapter to its output."""
    weight = linear.weight
    n_out, n_in = weight.shape
    linear.lora_a = nn.Parameter(torch.randn(1, n_in, dtype=weight.dtype) * 0.02)
    linear.lora_b = nn.Parameter(torch.randn(n_out, 1, dtype=weight.dtype) * 0.02)
    base = linear.forward

    def forward(x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        out, bias = base(x, *args, **kwargs)
        return out + F.linear(F.linear(x, linear.lora_a), linear.lora_b), bias

    linear.forward = forward


def build_megatron_block(geo: OracleGeometry, mode: str, fused_norm: bool = False) -> nn.Module:
    """A one-layer megatron TransformerBlock (local spec) with rank-1 LoRA, frozen base.

    ``fused_norm`` swaps the layer's torch RMSNorms for the fused-kernel contract
    (input + fp32 rstd saved): torch's CPU rms_norm instead saves an fp32 copy of its
    input, which no GPU kernel does.
    """
    init_single_process_megatron()
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.transformer_block import TransformerBlock
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(
        num_layers=1,
        hidden_size=geo.hidden,
        ffn_hidden_size=geo.ffn,
        num_attention_heads=geo.q_heads,
        num_query_groups=geo.kv_groups,
        kv_channels=geo.head_dim,
        use_cpu_initialization=True,
        **megatron_layer_settings(),
        **MEGATRON_MODES[mode],
    )
    spec = get_gpt_layer_local_spec(qk_layernorm=True, normalization="RMSNorm")
    block = TransformerBlock(config, spec, post_layer_norm=False)
    for p in block.parameters():
        p.requires_grad_(False)
    for m in list(block.modules()):
        if isinstance(m, ColumnParallelLinear | RowParallelLinear):
            _add_lora(m)
    if fused_norm:
        layer, attn = block.layers[0], block.layers[0].self_attention
        for owner, name, width in (
            (layer, "input_layernorm", geo.hidden),
            (layer, "pre_mlp_layernorm", geo.hidden),
            (attn, "q_layernorm", geo.head_dim),
            (attn, "k_layernorm", geo.head_dim),
        ):
            setattr(owner, name, FusedRMSNorm(width, config.layernorm_epsilon))
    block.train()
    return block


def measure_megatron(
    geo: OracleGeometry, mode: str, seq: int, *, fake: bool = True, fused_norm: bool = False
) -> Measurement:
    """Saved bytes of one megatron layer, labelled ``attention`` / ``mlp`` by sub-layer.

    Under full recompute the whole layer is one checkpoint; its saved inputs carry the
    label ``layer``.
    """
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    init_single_process_megatron()
    from megatron.core import parallel_state
    from megatron.core.utils import GlobalMemoryBuffer

    # The attention-score buffer is global and outlives a fake mode: start a fresh one.
    parallel_state._GLOBAL_MEMORY_BUFFER = GlobalMemoryBuffer()
    torch.manual_seed(0)
    with _fake_mode() if fake else contextlib.nullcontext():
        block = build_megatron_block(geo, mode, fused_norm)
        layer = block.layers[0]
        rope = RotaryEmbedding(
            kv_channels=geo.head_dim, rotary_percent=1.0, use_cpu_initialization=True
        )
        x = torch.randn(seq, 1, geo.hidden, dtype=BF16, requires_grad=True)

        def call(hidden: torch.Tensor) -> torch.Tensor:
            return block(hidden, attention_mask=None, rotary_pos_emb=rope(seq))

        labels = {layer.input_layernorm: "attention", layer.pre_mlp_layernorm: "mlp"}
        if mode == "full":
            labels = {}
        m = measure_forward(block, (x,), seq, labels=labels, call=call)
    m.small_width = geo.hidden // SMALL_FRACTION
    return m


def tokens_width(nbytes: int, tokens: int) -> float:
    """bytes -> bf16 elements per token."""
    return nbytes / 2 / tokens


__all__ = [
    "GEOMETRIES",
    "MEGATRON_MODES",
    "SMALL_FRACTION",
    "AttentionLayer",
    "FusedRMSNorm",
    "GatedDeltaNetLayer",
    "LiveStorageTracker",
    "LoRALinear",
    "Measurement",
    "OracleGeometry",
    "SavedTensorCounter",
    "SwiGLUMLP",
    "build_megatron_block",
    "build_reference_layer",
    "init_single_process_megatron",
    "install_megatron_cpu_shim",
    "measure_forward",
    "measure_megatron",
    "measure_reference",
    "megatron_layer_settings",
]
