"""Native measurement driver: real forward/backward peaks of rank-1 LoRA fine-tunes.

Why it exists: cpmem's estimates must be checked against memory that a real model
allocates, measured the way the golden sources were (incremental allocated bytes
above the pre-forward baseline, maxima over every rank and two repetitions).

One invocation measures one cell: a model (cpmem preset or config.json, random bf16
weights, optionally truncated to its first ``--layers`` layers), a request
(``--lengths``, ``--shared-prefix``), a layout (``--tp``, ``--cp``, ``--sp``) and a
recompute setting. Two engines build the model:

- ``megatron``: megatron-core's GPTModel with the local (no Transformer Engine) layer
  spec; attention-only models, CP = 1. Runs on CUDA, and on CPU through a small shim
  for this driver's own tests.
- ``torch``: this file's own decoder (attention with optional output gate, Gated
  DeltaNet, SwiGLU MLP). Context parallelism: each rank computes its own queries
  against the keys/values it all-gathers from every rank (NCCL on several GPUs, or
  gloo with every process sharing one GPU). Hybrid models always use it.

Every CP rank owns a contiguous run of the packed row whose length is the token count
cpmem's default planner gives that rank, so the driver measures the layout cpmem
prices. Rows follow the golden schema (``golden/schema.json``); the driver never
writes to ``golden/`` (``cpmem.golden.golden.append_rows`` does). On CPU no memory figure is
meaningful: peaks are left empty and the row is marked ``device=cpu``.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime
import gc
import hashlib
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from cpmem.api import estimate as cpmem_estimate
from cpmem.api import load_model
from cpmem.errors import CpmemError, InputError
from cpmem.model.geometry import ModelGeometry
from cpmem.plan.layout import ParallelLayout
from cpmem.plan.plan import Plan
from cpmem.plan.planners import plan_request
from cpmem.plan.request import Request
from cpmem.pricing.recompute import Recompute

DRIVER_PATH = Path(__file__).resolve()
REPO_ROOT = DRIVER_PATH.parent.parent
SOURCE_REPOSITORY = "cpmem"
SOURCE_PATH = "gpu_tests/driver.py"
CAMPAIGN = "native"
PHASE = "native"
APPENDED_BY = "cpmem golden append"
REPETITIONS = 2
ENGINES = ("auto", "megatron", "torch")
DEVICES = ("auto", "cuda", "cpu")
MODES = ("selective", "none", "full")
# Selective-recompute module sets the golden schema accepts.
MODULE_SETS = ("core_attn", "core_attn+mlp")
GDN_CHUNK = 64

# The golden schema's columns, in order (golden/schema.json; tests check they agree).
GOLDEN_COLUMNS: tuple[str, ...] = (
    "cell_id", "source_file", "source_row", "source_repository", "source_path",
    "source_commit", "campaign", "phase", "estimator_source_sha", "driver_sha256", "model",
    "layers", "gdn_layers", "tp", "cp", "ep", "etp", "sequence_parallel", "compiled",
    "concentrated_routing", "mode", "modules", "lengths", "shared_prefix", "logical_tokens",
    "packed_tokens", "retained_tokens", "grad_segments", "selected_max_depth",
    "memory_minimal", "measured_rank_samples", "refused_rank_samples",
    "recorded_estimate_bytes", "recorded_old_estimate_bytes", "available_bytes",
    "forward_peak_bytes", "first_forward_peak_bytes", "repeat_forward_peak_bytes",
    "retained_max_bytes", "forward_backward_peak_bytes", "baseline_min_bytes",
    "baseline_max_bytes", "finite", "recorded_covers_forward", "unit", "device", "dtype",
    "imported_by",
)  # fmt: skip

BYTE_COLUMNS: tuple[str, ...] = tuple(c for c in GOLDEN_COLUMNS if c.endswith("_bytes"))


# --------------------------------------------------------------------------------------
# The cell: arguments, validation, geometry, plan and estimate
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CellSpec:
    """Everything one measurement depends on (picklable, JSON-able)."""

    model: str | None
    config: str | None
    layers: int | None
    lengths: tuple[int, ...]
    shared_prefix: int
    tp: int = 1
    cp: int = 1
    sp: bool = False
    recompute: str = "selective"
    modules: str = "core_attn"
    engine: str = "auto"
    device: str = "auto"
    seed: int = 1234
    source_commit: str | None = None

    @property
    def world(self) -> int:
        return self.tp * self.cp


def parse_lengths(text: str) -> tuple[int, ...]:
    """``2048+2048`` or ``2048,2048``: positive integers, else InputError naming the field."""
    parts = [p.strip() for p in str(text).replace(",", "+").split("+")]
    out: list[int] = []
    for p in parts:
        if not p.isdigit() or int(p) < 1:
            raise InputError("lengths", text, "must be positive integers joined by '+' or ','")
        out.append(int(p))
    return tuple(out)


def _int_field(name: str, text: str, minimum: int) -> int:
    try:
        value = int(str(text).strip())
    except ValueError:
        raise InputError(name, text, "must be an integer") from None
    if value < minimum:
        raise InputError(name, text, f"must be >= {minimum}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The CLI. Numbers are read as text so that errors can name the field and value."""
    p = argparse.ArgumentParser(
        prog="gpu_tests/driver.py",
        description="Measure native per-rank activation peaks of one cell and write golden rows.",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="cpmem preset name or recorded Hugging Face id")
    src.add_argument("--config", help="path to a Hugging Face config.json")
    p.add_argument("--layers", default=None, help="keep only the first N decoder layers")
    p.add_argument("--lengths", required=True, help="sequence lengths, e.g. 2048+2048")
    p.add_argument("--shared-prefix", default="0", help="tokens all sequences share")
    p.add_argument("--tp", default="1", help="tensor-parallel size")
    p.add_argument("--cp", default="1", help="context-parallel size")
    sp = p.add_mutually_exclusive_group()
    sp.add_argument("--sp", dest="sp", action="store_true", default=None, help="SP on")
    sp.add_argument("--no-sp", dest="sp", action="store_false", help="SP off")
    p.add_argument("--recompute", default="selective", help=f"one of {list(MODES)}")
    p.add_argument("--modules", default=None, help=f"selective modules: {list(MODULE_SETS)}")
    p.add_argument("--engine", default="auto", help=f"one of {list(ENGINES)}")
    p.add_argument("--device", default="auto", help=f"one of {list(DEVICES)}")
    p.add_argument("--seed", default="1234", help="random seed of weights and inputs")
    p.add_argument("--source-commit", default=None, help="git revision if .git is absent")
    p.add_argument("--out", default=None, help="directory for rows.csv and summary.json")
    p.add_argument("--timeout", default="900", help="seconds before worker ranks are killed")
    return p


def spec_from_args(args: argparse.Namespace) -> CellSpec:
    """Validate the parsed arguments into a CellSpec; InputError names the bad field."""
    lengths = parse_lengths(args.lengths)
    prefix = _int_field("shared_prefix", args.shared_prefix, 0)
    tp = _int_field("tp", args.tp, 1)
    cp = _int_field("cp", args.cp, 1)
    layers = None if args.layers is None else _int_field("layers", args.layers, 1)
    seed = _int_field("seed", args.seed, 0)
    if args.recompute not in MODES:
        raise InputError("recompute", args.recompute, f"must be one of {list(MODES)}")
    modules = (
        args.modules
        if args.modules is not None
        else ("core_attn" if args.recompute == "selective" else "")
    )
    if args.recompute != "selective":
        if modules:
            raise InputError(
                "modules",
                modules,
                f"only selective recompute takes modules (recompute={args.recompute})",
            )
    elif modules not in MODULE_SETS:
        raise InputError("modules", modules, f"must be one of {list(MODULE_SETS)}")
    if args.engine not in ENGINES:
        raise InputError("engine", args.engine, f"must be one of {list(ENGINES)}")
    if args.device not in DEVICES:
        raise InputError("device", args.device, f"must be one of {list(DEVICES)}")
    commit = args.source_commit
    if commit is not None and not _is_hex(commit, 40):
        raise InputError("source_commit", commit, "must be a 40-hex git revision")
    spec = CellSpec(
        model=args.model,
        config=args.config,
        layers=layers,
        lengths=lengths,
        shared_prefix=prefix,
        tp=tp,
        cp=cp,
        sp=(tp > 1) if args.sp is None else bool(args.sp),
        recompute=args.recompute,
        modules=modules,
        engine=args.engine,
        device=args.device,
        seed=seed,
        source_commit=commit,
    )
    return validate_spec(spec)


def validate_spec(spec: CellSpec) -> CellSpec:
    """Cross-field checks against the model and the request; resolves ``engine=auto``."""
    geometry = cell_geometry(spec)
    Request.shared(list(spec.lengths), spec.shared_prefix)  # raises on a bad prefix
    geometry.check_tp(spec.tp)
    if geometry.is_moe:
        raise InputError("model", geometry.name, "MoE models are not measured by this driver")
    engine = spec.engine
    if engine == "auto":
        engine = "megatron" if (spec.cp == 1 and not geometry.is_hybrid) else "torch"
    if engine == "megatron":
        if spec.cp != 1:
            raise InputError("cp", spec.cp, "the megatron engine runs CP = 1 only (use torch)")
        if geometry.is_hybrid:
            raise InputError("engine", "megatron", f"{geometry.name} has GDN layers; use torch")
    if engine == "torch" and spec.tp != 1:
        raise InputError("tp", spec.tp, "the torch engine runs TP = 1 only (use megatron)")
    return replace(spec, engine=engine)


def cell_geometry(spec: CellSpec) -> ModelGeometry:
    """The model geometry, truncated to the first ``layers`` layers if asked."""
    geometry = load_model(spec.model, config=spec.config)
    if spec.layers is not None:
        if spec.layers > geometry.layers:
            raise InputError("layers", spec.layers, f"exceeds the model's {geometry.layers} layers")
        geometry = replace(
            geometry, mixers=geometry.mixers[: spec.layers], mlps=geometry.mlps[: spec.layers]
        )
    return geometry


def recorded_model_name(spec: CellSpec, geometry: ModelGeometry) -> str:
    """The Hugging Face id for presets (as the sources record it), else the config's name."""
    return geometry.aliases[0] if (spec.model and geometry.aliases) else geometry.name


def cell_plan(spec: CellSpec, geometry: ModelGeometry) -> Plan:
    """cpmem's default plan for the request: the token counts each rank will own."""
    layout = ParallelLayout(tp=spec.tp, cp=spec.cp, sp=spec.sp)
    request = Request.shared(list(spec.lengths), spec.shared_prefix)
    return plan_request(request, layout, None, geometry)


def cell_estimate(spec: CellSpec, geometry: ModelGeometry, plan: Plan) -> Any:
    """cpmem's reference estimate for exactly the plan the driver measures."""
    return cpmem_estimate(
        geometry,
        plan=plan,
        recompute=spec.recompute,
        modules=spec.modules or None,
    )


def _is_hex(text: str, n: int) -> bool:
    return len(text) == n and all(c in "0123456789abcdef" for c in text)


# --------------------------------------------------------------------------------------
# Packed-row layout: segments, per-rank ownership, key ranges, positions
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SegmentSpan:
    """A segment of the packed row: global start, tokens, parent and sequence offset."""

    start: int
    tokens: int
    parent: int | None
    offset: int  # tokens above it on its root-to-leaf path (rope position of its first token)

    @property
    def stop(self) -> int:
        return self.start + self.tokens


@dataclass(frozen=True)
class Piece:
    """The part of one segment that one rank owns: global [start, stop)."""

    segment: int
    start: int
    stop: int


@dataclass(frozen=True)
class RowLayout:
    """The packed row (pre-order segments, padding last) cut into contiguous rank runs."""

    segments: tuple[SegmentSpan, ...]
    rank_tokens: tuple[int, ...]

    @classmethod
    def from_plan(cls, request: Request, rank_tokens: Sequence[int]) -> RowLayout:
        spans: list[SegmentSpan] = []

        def visit(seg: Any, parent: int | None, offset: int) -> None:
            start = spans[-1].stop if spans else 0
            spans.append(SegmentSpan(start, seg.tokens, parent, offset))
            me = len(spans) - 1
            for child in seg.children:
                visit(child, me, offset + seg.tokens)

        for tree in request.trees:
            visit(tree, None, 0)
        extra = sum(rank_tokens) - spans[-1].stop
        if extra > 0:  # planner padding: a separate root that attends only to itself
            spans.append(SegmentSpan(spans[-1].stop, extra, None, 0))
        elif extra < 0:
            raise InputError("rank_tokens", list(rank_tokens), "hold fewer tokens than the row")
        return cls(tuple(spans), tuple(rank_tokens))

    @property
    def total(self) -> int:
        return self.segments[-1].stop

    def rank_range(self, rank: int) -> tuple[int, int]:
        lo = sum(self.rank_tokens[:rank])
        return lo, lo + self.rank_tokens[rank]

    def pieces(self, rank: int) -> list[Piece]:
        lo, hi = self.rank_range(rank)
        return [
            Piece(i, max(s.start, lo), min(s.stop, hi))
            for i, s in enumerate(self.segments)
            if max(s.start, lo) < min(s.stop, hi)
        ]

    def key_ranges(self, piece: Piece) -> list[tuple[int, int]]:
        """Global key ranges a piece's queries see: its ancestors, then its own head."""
        chain: list[tuple[int, int]] = []
        parent = self.segments[piece.segment].parent
        while parent is not None:
            s = self.segments[parent]
            chain.append((s.start, s.stop))
            parent = s.parent
        ranges = [*reversed(chain), (self.segments[piece.segment].start, piece.stop)]
        merged: list[tuple[int, int]] = []
        for a, b in ranges:  # contiguous ranges become one slice (a view, no copy)
            if merged and merged[-1][1] == a:
                merged[-1] = (merged[-1][0], b)
            else:
                merged.append((a, b))
        return merged

    def positions(self, rank: int) -> list[int]:
        """Rope position of every token the rank owns (position within its sequence)."""
        out: list[int] = []
        for p in self.pieces(rank):
            s = self.segments[p.segment]
            out.extend(range(s.offset + p.start - s.start, s.offset + p.stop - s.start))
        return out

    def owner_of_end(self, position: int, segment: int) -> tuple[int, int] | None:
        """(rank, index among that rank's pieces) of the piece of ``segment`` ending at
        ``position``; the GDN state there is that piece's final state."""
        for rank in range(len(self.rank_tokens)):
            for i, p in enumerate(self.pieces(rank)):
                if p.segment == segment and p.stop == position:
                    return rank, i
        return None


# --------------------------------------------------------------------------------------
# Torch pieces shared by both engines: LoRA, collectives, the GDN kernels
# --------------------------------------------------------------------------------------


def _torch() -> Any:
    import torch

    return torch


class _Dist:
    """The process group and how to move tensors through it (CPU staging under gloo)."""

    def __init__(self, rank: int, world: int, device: Any) -> None:
        torch = _torch()
        self.rank, self.world, self.device = rank, world, device
        self.active = world > 1 and torch.distributed.is_initialized()
        self.stage = self.active and torch.distributed.get_backend() == "gloo"

    def _out(self, t: Any) -> Any:
        return t.cpu() if self.stage else t

    def all_gather_rows(self, local: Any, counts: Sequence[int]) -> Any:
        """Rows of every rank concatenated in rank order (uneven counts padded in transit)."""
        torch = _torch()
        width = max(counts)
        buf = local.new_zeros((width, *local.shape[1:]))
        buf[: local.shape[0]] = local
        buf = self._out(buf)
        parts = [torch.empty_like(buf) for _ in range(self.world)]
        torch.distributed.all_gather(parts, buf)
        return torch.cat([p[:n] for p, n in zip(parts, counts, strict=True)]).to(self.device)

    def all_reduce(self, t: Any) -> Any:
        torch = _torch()
        staged = self._out(t.contiguous().clone())
        torch.distributed.all_reduce(staged)
        return staged.to(self.device)

    def broadcast(self, t: Any, src: int) -> Any:
        torch = _torch()
        staged = self._out(t.contiguous())
        torch.distributed.broadcast(staged, src)
        return staged.to(self.device)


def gather_tokens(local: Any, counts: Sequence[int], dist: _Dist) -> Any:
    """Differentiable all-gather along tokens: backward sums every rank's gradient and
    keeps this rank's slice (what a reduce-scatter would give)."""
    torch = _torch()

    class _Gather(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any) -> Any:
            return dist.all_gather_rows(x, counts)

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            full = dist.all_reduce(grad)
            lo = sum(counts[: dist.rank])
            return full[lo : lo + counts[dist.rank]]

    return _Gather.apply(local)


def make_lora_linear(n_in: int, n_out: int, device: Any, dtype: Any) -> Any:
    """A frozen bf16 linear with a trainable rank-1 adapter (random A and B, as measured)."""
    torch = _torch()
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


def have_fla() -> bool:
    """Whether flash-linear-attention's fused chunked gated-delta-rule kernel is importable."""
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule  # noqa: F401
    except Exception:
        return False
    return True


def gdn_reference_recurrent(
    q: Any, k: Any, v: Any, g: Any, beta: Any, state: Any
) -> tuple[Any, Any]:
    """Token-by-token gated delta rule (fp32), the definition the chunked form must match.

    Shapes: q, k [T, H, dk] (already L2-normalised and scaled), v [T, H, dv], g and beta
    [T, H], state [H, dk, dv]. S_t = a_t S + k_t (beta_t (v_t - a_t S^T k_t))^T; o_t = S_t^T q_t.
    """
    torch = _torch()
    s = state.float()
    outs = []
    for t in range(q.shape[0]):
        s = s * torch.exp(g[t].float())[:, None, None]
        kt, vt = k[t].float(), v[t].float()
        u = beta[t].float()[:, None] * (vt - torch.einsum("hkv,hk->hv", s, kt))
        s = s + kt[:, :, None] * u[:, None, :]
        outs.append(torch.einsum("hkv,hk->hv", s, q[t].float()))
    return torch.stack(outs), s


def gdn_chunked_torch(
    q: Any, k: Any, v: Any, g: Any, beta: Any, state: Any, chunk: int = GDN_CHUNK
) -> tuple[Any, Any]:
    """Pure-torch chunked gated delta rule (fp32), the fallback when fla is missing.

    Per chunk with start state S0, cumulative log-decay G and Gamma_ti = exp(G_t - G_i):
    U = A^-1 diag(beta)(V - diag(e^G) K S0) with A = I + diag(beta)(strict_tril(KK^T) * Gamma);
    O = diag(e^G) Q S0 + (tril(QK^T) * Gamma) U; S = e^{G_C} S0 + (K * e^{G_C - G})^T U.
    It saves more for backward than the fused kernel (every chunk's S0, Gamma, A, U, in
    fp32); the driver reports those bytes separately instead of passing them off as fla's.
    """
    torch = _torch()
    s = state.float()
    outs = []
    for a in range(0, q.shape[0], chunk):
        qc = q[a : a + chunk].float().transpose(0, 1)  # [H, C, dk]
        kc = k[a : a + chunk].float().transpose(0, 1)
        vc = v[a : a + chunk].float().transpose(0, 1)  # [H, C, dv]
        bc = beta[a : a + chunk].float().transpose(0, 1)  # [H, C]
        gc_ = torch.cumsum(g[a : a + chunk].float().transpose(0, 1), dim=-1)
        c = qc.shape[1]
        lower = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
        diff = (gc_[:, :, None] - gc_[:, None, :]).masked_fill(~lower, float("-inf"))
        gamma = torch.exp(diff)
        strict = lower.logical_and(~torch.eye(c, dtype=torch.bool, device=q.device))
        kk = (kc @ kc.transpose(-1, -2)) * gamma * strict
        amat = torch.eye(c, device=q.device) + bc[:, :, None] * kk
        decay = torch.exp(gc_)[:, :, None]
        rhs = bc[:, :, None] * (vc - decay * (kc @ s))
        u = torch.linalg.solve_triangular(amat, rhs, upper=False, unitriangular=True)
        out = decay * (qc @ s) + ((qc @ kc.transpose(-1, -2)) * gamma) @ u
        tail = torch.exp(gc_[:, -1:] - gc_)[:, :, None]
        s = torch.exp(gc_[:, -1])[:, None, None] * s + (kc * tail).transpose(-1, -2) @ u
        outs.append(out.transpose(0, 1))
    return torch.cat(outs), s


def gdn_kernel(q: Any, k: Any, v: Any, g: Any, beta: Any, state: Any) -> tuple[Any, Any]:
    """fla's fused kernel where installed (it L2-normalises and scales q, k itself), else
    the pure-torch chunked fallback on explicitly normalised inputs."""
    torch = _torch()
    if q.is_cuda and have_fla():
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule

        o, final = chunk_gated_delta_rule(
            q[None], k[None], v[None], g[None].float(), beta[None],
            initial_state=state[None].float(), output_final_state=True,
            use_qk_l2norm_in_kernel=True,
        )  # fmt: skip
        return o[0], final[0]
    f = torch.nn.functional
    qn = f.normalize(q.float(), dim=-1) * q.shape[-1] ** -0.5
    kn = f.normalize(k.float(), dim=-1)
    o, final = gdn_chunked_torch(qn, kn, v, g, beta, state)
    return o.to(v.dtype), final


# --------------------------------------------------------------------------------------
# The torch engine
# --------------------------------------------------------------------------------------


@dataclass
class RankContext:
    """What every layer of one rank needs: ownership, positions, collectives, recompute."""

    layout: RowLayout
    rank: int
    dist: _Dist
    recompute: Recompute
    positions: Any = None
    gdn_saved_bytes: list[int] = field(default_factory=list)
    count_gdn_saved: bool = False


def _rope(x: Any, positions: Any, theta: float = 1e6) -> Any:
    """Rotary embedding (half-split) on [T, H, D] at the given positions."""
    torch = _torch()
    d = x.shape[-1]
    inv = theta ** (-torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    ang = positions.float()[:, None] * inv[None, :]
    cos, sin = torch.cos(ang)[:, None, :].to(x.dtype), torch.sin(ang)[:, None, :].to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def _checkpoint(fn: Callable[..., Any], *args: Any) -> Any:
    torch = _torch()
    return torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False)


def build_torch_model(geometry: ModelGeometry, ctx: RankContext, device: Any) -> Any:
    """Embedding + decoder layers (no final norm, no LM head) with rank-1 LoRA everywhere."""
    torch = _torch()
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

        def mix(self, q: Any, k: Any, v: Any, gl: Any, beta: Any) -> Any:
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
                with _count_saved(ctx.gdn_saved_bytes):
                    o = self.mix(q, k, v, gl, beta)
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


@contextlib.contextmanager
def _count_saved(sink: list[int]) -> Iterator[None]:
    """Add the bytes autograd saves inside the block (each storage once, no parameters)."""
    torch = _torch()
    seen: set[int] = set()
    total = [0]

    def pack(t: Any) -> Any:
        st = t.untyped_storage()
        key = st.data_ptr()
        if not isinstance(t, torch.nn.Parameter) and key not in seen:
            seen.add(key)
            total[0] += st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield
    sink.append(total[0])


# --------------------------------------------------------------------------------------
# The megatron engine
# --------------------------------------------------------------------------------------


def _oracle_module() -> Any:
    """``oracles.saved_tensors``: the megatron CPU shim and layer settings live there."""
    if str(REPO_ROOT) not in sys.path:  # run as a script, only gpu_tests/ is on the path
        sys.path.insert(0, str(REPO_ROOT))
    import oracles.saved_tensors

    return oracles.saved_tensors


def install_megatron_cpu_shim() -> None:
    """Let megatron-core 0.16 build and run on CPU, for this driver's CPU tests only
    (never used when CUDA is present): the saved-tensor oracle's shim, reused."""
    _oracle_module().install_megatron_cpu_shim()


def _megatron_lora(linear: Any, sp: bool) -> None:
    """Freeze a megatron parallel linear and add a rank-1 adapter that follows its sharding.

    Column-parallel: A replicated, B sharded on outputs; the rank-1 activation is gathered
    over the sequence under SP. Row-parallel: A sharded on inputs, its rank-1 partial sums
    reduced (scattered over the sequence under SP), B replicated. Replicated adapter grads
    are not synchronised across TP (no optimizer step is taken).
    """
    torch = _torch()
    from megatron.core.tensor_parallel import mappings
    from megatron.core.tensor_parallel.layers import RowParallelLinear

    weight = linear.weight
    n_out, n_in = weight.shape
    dev, dt = weight.device, weight.dtype
    linear.lora_a = torch.nn.Parameter(torch.randn(1, n_in, device=dev, dtype=dt) * 0.02)
    linear.lora_b = torch.nn.Parameter(torch.randn(n_out, 1, device=dev, dtype=dt) * 0.02)
    row = isinstance(linear, RowParallelLinear)
    base = linear.forward
    f = torch.nn.functional

    def forward(x: Any, *args: Any, **kwargs: Any) -> Any:
        out, bias = base(x, *args, **kwargs)
        mid = f.linear(x, linear.lora_a)
        if row:
            mid = (
                mappings.reduce_scatter_to_sequence_parallel_region(mid)
                if sp
                else mappings.reduce_from_tensor_model_parallel_region(mid)
            )
        elif sp:
            mid = mappings.gather_from_sequence_parallel_region(mid)
        else:
            mid = mappings.copy_to_tensor_model_parallel_region(mid)
        return out + f.linear(mid, linear.lora_b), bias

    linear.forward = forward


def build_megatron_model(spec: CellSpec, geometry: ModelGeometry, device: Any, seq: int) -> Any:
    """GPTModel (local spec, pre_process on, post_process off: it returns hidden states)."""
    torch = _torch()
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.transformer_config import TransformerConfig

    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(spec.tp, 1)
    on_cpu = device.type == "cpu"
    if not on_cpu:
        tensor_parallel.model_parallel_cuda_manual_seed(spec.seed)
    recompute: dict[str, Any] = {"recompute_granularity": None}
    if spec.recompute == "selective":
        recompute = {
            "recompute_granularity": "selective",
            "recompute_modules": spec.modules.split("+"),
        }
    elif spec.recompute == "full":
        recompute = {
            "recompute_granularity": "full",
            "recompute_method": "uniform",
            "recompute_num_layers": 1,
        }
    config = TransformerConfig(
        num_layers=geometry.layers,
        hidden_size=geometry.hidden,
        ffn_hidden_size=geometry.ffn,
        num_attention_heads=geometry.q_heads,
        num_query_groups=geometry.kv_groups,
        kv_channels=geometry.head_dim,
        attention_output_gate=geometry.attention_output_gate,
        tensor_model_parallel_size=spec.tp,
        sequence_parallel=spec.sp and spec.tp > 1,
        use_cpu_initialization=on_cpu,
        **_oracle_module().megatron_layer_settings(),
        **recompute,
    )
    layer_spec = get_gpt_layer_local_spec(qk_layernorm=True, normalization="RMSNorm")
    model = GPTModel(
        config=config,
        transformer_layer_spec=layer_spec,
        vocab_size=geometry.vocab,
        max_sequence_length=max(seq, 1) * 2,
        pre_process=True,
        post_process=False,
        position_embedding_type="rope",
        rotary_base=1_000_000,
    ).to(device=device, dtype=torch.bfloat16)
    for p in model.parameters():
        p.requires_grad_(False)
    for m in list(model.modules()):
        if isinstance(m, ColumnParallelLinear | RowParallelLinear):
            _megatron_lora(m, spec.sp and spec.tp > 1)
    if spec.recompute == "full":
        # megatron's full recompute is reentrant: its input must require grad
        model.embedding.register_forward_hook(lambda _m, _a, out: out.detach().requires_grad_(True))
    model.train()
    return model


# --------------------------------------------------------------------------------------
# Measuring one rank
# --------------------------------------------------------------------------------------


@dataclass
class RankSample:
    """One rank, one repetition. Byte figures are None where not measured (CPU)."""

    rank: int
    repetition: int
    baseline_bytes: int | None
    available_bytes: int | None
    forward_peak_bytes: int | None
    retained_bytes: int | None
    forward_backward_peak_bytes: int | None
    loss: float
    loss_finite: bool
    adapter_params: int
    adapter_grads_present: int
    adapter_grads_finite: bool
    adapter_grads_nonzero: int
    gdn_fallback_saved_bytes: int | None = None


def measure_step(
    forward: Callable[[], Any], adapters: Sequence[Any], device: Any, rank: int, rep: int
) -> RankSample:
    """One forward + MSE-on-hidden backward; CUDA peaks relative to the pre-forward baseline."""
    torch = _torch()
    for p in adapters:
        p.grad = None
    gc.collect()
    cuda = device.type == "cuda"
    base = avail = fwd = kept = fwbw = None
    if cuda:
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        avail = torch.cuda.mem_get_info(device)[0]
        torch.cuda.reset_peak_memory_stats(device)
    hidden = forward()
    if cuda:
        torch.cuda.synchronize(device)
        fwd = torch.cuda.max_memory_allocated(device) - base
        kept = torch.cuda.memory_allocated(device) - base
    loss = hidden.float().pow(2).mean()
    loss.backward()
    if cuda:
        torch.cuda.synchronize(device)
        fwbw = torch.cuda.max_memory_allocated(device) - base
    value = float(loss.detach())
    grads = [p.grad for p in adapters]
    present = [gr for gr in grads if gr is not None]
    sample = RankSample(
        rank=rank,
        repetition=rep,
        baseline_bytes=base,
        available_bytes=avail,
        forward_peak_bytes=fwd,
        retained_bytes=kept,
        forward_backward_peak_bytes=fwbw,
        loss=value,
        loss_finite=math.isfinite(value),
        adapter_params=len(adapters),
        adapter_grads_present=len(present),
        adapter_grads_finite=all(bool(torch.isfinite(gr).all()) for gr in present),
        adapter_grads_nonzero=sum(1 for gr in present if bool(gr.abs().sum() > 0)),
    )
    del hidden, loss
    return sample


def _pick_device(spec: CellSpec, local_rank: int) -> Any:
    torch = _torch()
    want = spec.device
    if want == "auto":
        want = "cuda" if torch.cuda.is_available() else "cpu"
    if want == "cuda":
        if not torch.cuda.is_available():
            raise InputError("device", "cuda", "no CUDA device is visible")
        # more ranks than GPUs: every rank shares one GPU (gloo between them)
        index = local_rank if torch.cuda.device_count() >= spec.world else 0
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


def run_rank(spec: CellSpec, rank: int = 0, world: int = 1, local_rank: int = 0) -> dict[str, Any]:
    """Build the model on this rank and measure REPETITIONS steps; returns its samples."""
    torch = _torch()
    device = _pick_device(spec, local_rank)
    geometry = cell_geometry(spec)
    plan = cell_plan(spec, geometry)
    request = Request.shared(list(spec.lengths), spec.shared_prefix)
    torch.manual_seed(spec.seed)
    dist = torch.distributed
    needs_group = world > 1 or spec.engine == "megatron"
    if needs_group and not dist.is_initialized():
        if world == 1:
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", str(_free_port()))
        shared_gpu = device.type == "cuda" and torch.cuda.device_count() < world
        backend = "nccl" if device.type == "cuda" and not shared_gpu else "gloo"
        dist.init_process_group(backend, rank=rank, world_size=world)
    notes: list[str] = []
    kernel = None
    if spec.engine == "megatron":
        if device.type == "cpu":
            install_megatron_cpu_shim()
        rows = plan.rank_tokens[0]
        layout = RowLayout.from_plan(request, [rows])
        model = build_megatron_model(spec, geometry, device, rows)
        ids = torch.randint(0, geometry.vocab, (1, rows), device=device)
        pos = torch.tensor([layout.positions(0)], device=device)

        def forward() -> Any:
            return model(ids, pos, attention_mask=None)

        notes.append(
            "megatron local spec: one packed row under a plain causal mask (shapes as "
            "packed; no per-sequence mask), unfused score-materialising attention"
        )
        gdn_counts: list[int] = []
    else:
        layout = RowLayout.from_plan(request, plan.groups[0].attention_tokens)
        ctx = RankContext(
            layout,
            rank,
            _Dist(rank, world, device),
            Recompute.parse(spec.recompute, spec.modules or None),
        )
        ctx.positions = torch.tensor(layout.positions(rank), device=device)
        fused = device.type == "cuda" and have_fla()
        ctx.count_gdn_saved = geometry.is_hybrid and not fused
        kernel = None if not geometry.is_hybrid else ("fla" if fused else "torch-fallback")
        model = build_torch_model(geometry, ctx, device)
        lo, hi = layout.rank_range(rank)
        gen = torch.Generator().manual_seed(spec.seed)
        ids = torch.randint(0, geometry.vocab, (layout.total,), generator=gen)[lo:hi].to(device)

        def forward() -> Any:
            from torch.utils.checkpoint import set_checkpoint_early_stop

            # every rank must replay the same collectives when a checkpoint recomputes
            with set_checkpoint_early_stop(False):
                return model(ids)

        gdn_counts = ctx.gdn_saved_bytes
        if kernel == "torch-fallback":
            notes.append(
                "GDN ran on the pure-torch chunked fallback (fla not installed or no CUDA): "
                "peaks include its extra saved fp32 chunk tensors; gdn_fallback_saved_bytes "
                "is what autograd saved inside it, measured per rank"
            )
        if world > 1 and geometry.is_hybrid:
            notes.append(
                "cross-rank GDN states are passed forward exactly but detached (their "
                "gradient is not sent back); no saved tensor or activation shape changes"
            )
    adapters = [p for n, p in model.named_parameters() if "lora_" in n]
    samples = []
    for rep in range(REPETITIONS):
        gdn_counts.clear()
        s = measure_step(forward, adapters, device, rank, rep)
        if kernel == "torch-fallback":
            s.gdn_fallback_saved_bytes = sum(gdn_counts)
        samples.append(asdict(s))
    result = {
        "rank": rank,
        "device": device.type,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "engine": spec.engine,
        "gdn_kernel": kernel,
        "backend": dist.get_backend() if dist.is_initialized() else None,
        "rank_tokens": layout.rank_tokens[rank] if spec.engine == "torch" else layout.total,
        "samples": samples,
        "notes": notes,
    }
    if dist.is_initialized() and world > 1:
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, result)
        return {"ranks": gathered}
    return {"ranks": [result]}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --------------------------------------------------------------------------------------
# Provenance, aggregation, rows
# --------------------------------------------------------------------------------------


def driver_sha256() -> str:
    return hashlib.sha256(DRIVER_PATH.read_bytes()).hexdigest()


def git_revision() -> tuple[str | None, bool | None]:
    """(HEAD revision, whether cpmem/ or gpu_tests/ differ from it); None where no git."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True,
            check=True, timeout=10,
        ).stdout.strip()  # fmt: skip
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "cpmem", "gpu_tests"], cwd=REPO_ROOT,
            capture_output=True, text=True, check=True, timeout=10,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None, None
    return (head if _is_hex(head, 40) else None), bool(dirty)


def provenance(spec: CellSpec) -> dict[str, Any]:
    """Who measured what with which code: recorded in summary.json next to the rows."""
    try:
        torch = _torch()
    except ImportError:  # row formatting is tested where torch is not installed
        torch = None
    commit, dirty = git_revision()
    commit = spec.source_commit or os.environ.get("CPMEM_SOURCE_COMMIT") or commit
    cuda = torch is not None and torch.cuda.is_available()
    return {
        "campaign": CAMPAIGN,
        "source_repository": SOURCE_REPOSITORY,
        "source_path": SOURCE_PATH,
        "git_revision": commit,
        "git_dirty": dirty,
        "driver_sha256": driver_sha256(),
        "torch_version": torch.__version__ if torch is not None else None,
        "cuda_version": torch.version.cuda if torch is not None else None,
        "device_name": torch.cuda.get_device_name(0) if cuda else "cpu",
        "python": sys.version.split()[0],
        "date_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "fla_installed": have_fla(),
    }


def _max(values: Sequence[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return max(known) if len(known) == len(values) and known else None


def _min(values: Sequence[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return min(known) if len(known) == len(values) and known else None


def aggregate(ranks: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Maxima over every rank and both repetitions, as the sources define them."""
    samples = [s for r in ranks for s in r["samples"]]
    first = [s for s in samples if s["repetition"] == 0]
    repeat = [s for s in samples if s["repetition"] > 0]
    measured = all(s["forward_peak_bytes"] is not None for s in samples)
    finite = all(
        s["loss_finite"]
        and s["adapter_grads_finite"]
        and s["adapter_grads_present"] == s["adapter_params"]
        for s in samples
    )
    return {
        "measured": measured,
        "rank_samples": len(samples),
        "forward_peak_bytes": _max([s["forward_peak_bytes"] for s in samples]),
        "first_forward_peak_bytes": _max([s["forward_peak_bytes"] for s in first]),
        "repeat_forward_peak_bytes": _max([s["forward_peak_bytes"] for s in repeat]),
        "retained_max_bytes": _max([s["retained_bytes"] for s in samples]),
        "forward_backward_peak_bytes": _max([s["forward_backward_peak_bytes"] for s in samples]),
        "baseline_min_bytes": _min([s["baseline_bytes"] for s in samples]),
        "baseline_max_bytes": _max([s["baseline_bytes"] for s in samples]),
        "available_bytes": _min([s["available_bytes"] for s in samples]),
        "finite": finite,
        "gdn_fallback_saved_bytes": _max(
            [s.get("gdn_fallback_saved_bytes") for s in samples]
        ) if any(s.get("gdn_fallback_saved_bytes") is not None for s in samples) else None,
    }  # fmt: skip


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "True" if value else "False"
    return str(value)


def cell_tag(spec: CellSpec, geometry: ModelGeometry) -> str:
    """A readable id fragment: model, layers, layout, recompute, request."""
    short = recorded_model_name(spec, geometry).split("/")[-1].lower()
    layout = f"tp{spec.tp}cp{spec.cp}{'sp' if spec.sp and spec.tp > 1 else ''}"
    rc = spec.recompute + (f"-{spec.modules}" if spec.modules else "")
    req = "+".join(str(n) for n in spec.lengths) + f"p{spec.shared_prefix}"
    tag = f"{short}-L{geometry.layers}:{layout}:{rc}:{req}:{spec.engine}"
    return "".join(c if c.isalnum() or c in "_.+:/-" else "-" for c in tag)


def build_row(
    spec: CellSpec,
    geometry: ModelGeometry,
    plan: Plan,
    estimate_bytes: int,
    agg: dict[str, Any],
    prov: dict[str, Any],
    device_name: str,
    run_id: str,
) -> dict[str, str]:
    """One golden-schema row. Peaks only where measured on CUDA; nothing is filled in."""
    measured = agg["measured"]
    peak = agg["forward_peak_bytes"]
    commit = prov["git_revision"] or ""
    row: dict[str, Any] = {
        "cell_id": f"native:{cell_tag(spec, geometry)}:{run_id}",
        "source_file": f"native-{run_id}.csv",
        "source_row": 1,
        "source_repository": SOURCE_REPOSITORY,
        "source_path": SOURCE_PATH,
        "source_commit": commit,
        "campaign": CAMPAIGN,
        "phase": PHASE,
        "estimator_source_sha": commit,
        "driver_sha256": prov["driver_sha256"],
        "model": recorded_model_name(spec, geometry),
        "layers": geometry.layers,
        "gdn_layers": geometry.gdn_layers,
        "tp": spec.tp,
        "cp": spec.cp,
        "ep": 1,
        "etp": 1,
        "sequence_parallel": spec.sp and spec.tp > 1,
        "compiled": False,
        "concentrated_routing": None,
        "mode": spec.recompute,
        "modules": spec.modules,
        "lengths": "+".join(str(n) for n in spec.lengths),
        "shared_prefix": spec.shared_prefix,
        "logical_tokens": plan.logical_tokens,
        "packed_tokens": plan.packed_tokens,
        "retained_tokens": plan.busiest_tokens,
        "grad_segments": plan.grad_segments,
        "selected_max_depth": None,
        "memory_minimal": None,
        "measured_rank_samples": agg["rank_samples"] if measured else 0,
        "refused_rank_samples": 0,
        "recorded_estimate_bytes": estimate_bytes,
        "recorded_old_estimate_bytes": None,
        "available_bytes": agg["available_bytes"],
        "forward_peak_bytes": peak,
        "first_forward_peak_bytes": agg["first_forward_peak_bytes"],
        "repeat_forward_peak_bytes": agg["repeat_forward_peak_bytes"],
        "retained_max_bytes": agg["retained_max_bytes"],
        "forward_backward_peak_bytes": agg["forward_backward_peak_bytes"],
        "baseline_min_bytes": agg["baseline_min_bytes"],
        "baseline_max_bytes": agg["baseline_max_bytes"],
        "finite": agg["finite"],
        "recorded_covers_forward": (estimate_bytes >= peak) if peak is not None else None,
        "unit": "bytes",
        "device": device_name,
        "dtype": "bf16",
        "imported_by": APPENDED_BY,
    }
    assert tuple(row) == GOLDEN_COLUMNS
    return {k: _text(v) for k, v in row.items()}


def write_rows(path: Path, rows: Sequence[dict[str, str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(GOLDEN_COLUMNS), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def finish(spec: CellSpec, ranks: Sequence[dict[str, Any]], out: Path | None) -> dict[str, Any]:
    """Aggregate, price with cpmem, build the row, write rows.csv + summary.json."""
    geometry = cell_geometry(spec)
    plan = cell_plan(spec, geometry)
    est = cell_estimate(spec, geometry, plan)
    agg = aggregate(ranks)
    prov = provenance(spec)
    device_name = ranks[0]["device_name"]
    stamp = prov["date_utc"].replace("-", "").replace(":", "")
    run_id = f"{stamp}-{prov['driver_sha256'][:8]}"
    row = build_row(spec, geometry, plan, est.estimate_bytes, agg, prov, device_name, run_id)
    notes = sorted({n for r in ranks for n in r["notes"]})
    if not agg["measured"]:
        notes.append("no CUDA: memory figures are not meaningful on CPU and were left empty")
    if not prov["git_revision"]:
        notes.append("source_commit unknown: pass --source-commit (append_rows will refuse)")
    peak = agg["forward_peak_bytes"]
    summary = {
        "row": row,
        "spec": asdict(spec),
        "provenance": prov,
        "plan": {
            "planner": plan.planner,
            "rank_tokens": list(plan.rank_tokens),
            "busiest_tokens": plan.busiest_tokens,
            "packed_tokens": plan.packed_tokens,
        },
        "estimate": est.to_dict(),
        "aggregate": agg,
        "forward_peak_over_estimate": (peak / est.estimate_bytes) if peak is not None else None,
        "ranks": list(ranks),
        "notes": notes,
    }
    if out is not None:
        write_rows(out / "rows.csv", [row])
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def run_cell(spec: CellSpec, out: Path | None = None, timeout: float = 900) -> dict[str, Any]:
    """Measure one cell: inline for one rank, else one worker process per rank."""
    if spec.world == 1:
        ranks = run_rank(spec)["ranks"]
        return finish(spec, ranks, out)
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "ranks.json"
        port = str(_free_port())
        procs = []
        for rank in range(spec.world):
            env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank),
                       WORLD_SIZE=str(spec.world), MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                       CPMEM_DRIVER_SPEC=json.dumps(asdict(spec)),
                       CPMEM_DRIVER_RESULT=str(result))  # fmt: skip
            procs.append(subprocess.Popen([sys.executable, str(DRIVER_PATH), "--worker"], env=env))
        try:
            codes = [p.wait(timeout=timeout) for p in procs]
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise RuntimeError(f"worker ranks ran past {timeout} s and were killed") from None
        if any(codes) or not result.exists():
            raise RuntimeError(f"worker ranks failed with exit codes {codes}")
        ranks = json.loads(result.read_text())
    return finish(spec, ranks, out)


def _worker_main() -> int:
    """One rank under our launcher or torchrun (RANK / WORLD_SIZE set in the environment)."""
    spec_json = os.environ.get("CPMEM_DRIVER_SPEC")
    if spec_json is None:
        raise SystemExit("--worker needs CPMEM_DRIVER_SPEC")
    raw = json.loads(spec_json)
    raw["lengths"] = tuple(raw["lengths"])
    spec = CellSpec(**raw)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    ranks = run_rank(spec, rank, world, int(os.environ.get("LOCAL_RANK", rank)))["ranks"]
    if rank == 0:
        Path(os.environ["CPMEM_DRIVER_RESULT"]).write_text(json.dumps(ranks))
    torch = _torch()
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    return 0


def comparison_line(summary: dict[str, Any]) -> str:
    """One human line: measured forward peak vs cpmem's estimate."""
    agg, est = summary["aggregate"], summary["estimate"]["estimate_bytes"]
    gib = 2**30
    tag = summary["row"]["cell_id"]
    if agg["forward_peak_bytes"] is None:
        return (
            f"{tag}: estimate {est / gib:.3f} GiB; no CUDA peak (CPU run); finite={agg['finite']}"
        )
    peak = agg["forward_peak_bytes"]
    verdict = "covered" if est >= peak else "NOT COVERED"
    return (
        f"{tag}: forward peak {peak / gib:.3f} GiB, fwd+bwd {agg['forward_backward_peak_bytes'] / gib:.3f}"
        f" GiB, estimate {est / gib:.3f} GiB ({peak / est:.3f} of it, {verdict}); "
        f"finite={agg['finite']}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry: exit 2 with ``error: FIELD=VALUE: reason`` on bad input, no traceback."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv == ["--worker"]:
        return _worker_main()
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        spec = spec_from_args(args)
        timeout = _int_field("timeout", args.timeout, 1)
    except CpmemError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else None
    summary = run_cell(spec, out, timeout)
    print(comparison_line(summary))
    for note in summary["notes"]:
        print(f"note: {note}")
    if out is not None:
        print(f"wrote {out / 'rows.csv'} and {out / 'summary.json'}")
    return 0 if summary["aggregate"]["finite"] else 1


if __name__ == "__main__":
    sys.exit(main())
