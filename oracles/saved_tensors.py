"""Saved-tensor oracle: what autograd keeps for backward during one forward of real modules.

Counting rule (see oracles/README.md): every tensor autograd packs for backward is
recorded once per *untyped storage* (views share it, so a saved slice costs its whole
storage), and storages owned by parameters are skipped (frozen base weights and LoRA
factors are not activations). The same counting runs on real tensors and under
``FakeTensorMode``, where real model widths cost no memory.

This module owns the counting (``SavedTensorCounter``, ``LiveStorageTracker``,
``measure_forward``), the models' shapes (``OracleGeometry``, ``GEOMETRIES``) and the
reference layers' runs (``measure_reference``); the layers themselves are
``oracles.reference_layers``, megatron's layer on CPU is ``oracles.megatron_layer``.

Nothing here imports cpmem: the oracle measures modules, it never prices them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from oracles.reference_layers import BF16, AttentionLayer, GatedDeltaNetLayer, SwiGLUMLP

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


def tokens_width(nbytes: int, tokens: int) -> float:
    """bytes -> bf16 elements per token."""
    return nbytes / 2 / tokens


__all__ = [
    "BF16",
    "GEOMETRIES",
    "SMALL_FRACTION",
    "LiveStorageTracker",
    "Measurement",
    "OracleGeometry",
    "SavedTensorCounter",
    "build_reference_layer",
    "measure_forward",
    "measure_reference",
    "storage_key",
    "storage_keys",
    "tokens_width",
]
