"""How a sub-layer's parameters are placed on the ranks, and the counting rules every
layer kind's spec shares (``cpmem.pricing.kinds``).

Parameters are counted the way megatron-core 0.16 builds and shards them: a layer's
linears sharded over TP (``ColumnParallelLinear`` / ``RowParallelLinear``), the routed
experts over EP (and ETP within an expert), norms and routers replicated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from cpmem.model.geometry import ModelGeometry


@dataclass(frozen=True)
class LayerParameters:
    """One sub-layer's parameters by how they are placed: ``sharded`` over TP,
    ``experts`` over EP (all routed experts together), ``replicated`` on every rank."""

    sharded: int
    experts: int
    replicated: int

    def on_rank(self, tp: int, ep: int, etp: int = 1) -> float:
        return self.sharded / tp + self.experts / (ep * etp) + self.replicated


NO_PARAMETERS = LayerParameters(0, 0, 0)


Placement = Literal["sharded", "replicated", "experts"]


@dataclass(frozen=True)
class Linear:
    """One weight matrix of a sub-layer as a Hugging Face checkpoint stores it: ``rows``
    (outputs) x ``cols`` (inputs), ``count`` alike (the routed experts), the part of the
    layer that holds it (``role``: ``cpmem.model.quantization.ROLES``), how megatron-core
    places it (``sharded`` over TP, ``experts`` over EP with ETP within each, or
    ``replicated``) and the dimension TP (ETP) divides: a column-parallel linear's rows,
    a row-parallel one's columns."""

    role: str
    rows: int
    cols: int
    placement: Placement
    split: Literal["rows", "cols"] = "rows"
    count: int = 1


def norm_parameters(geometry: ModelGeometry, width: int) -> int:
    """A norm's parameters over ``width``: RMSNorm's weight, LayerNorm's weight and bias."""
    return 2 * width if geometry.norm == "layernorm" else width


def norm_tensors(geometry: ModelGeometry, width: int) -> list[int]:
    """A norm's tensors over ``width``: RMSNorm's weight; LayerNorm's weight and bias."""
    return [width, width] if geometry.norm == "layernorm" else [width]


def sublayer_norm_parameters(geometry: ModelGeometry) -> int:
    """An attention, MLP or MoE sub-layer's own norms over ``hidden``: its input norm
    where the model has pre-norms, its post-norm where it has post-norms (Gemma's sandwich
    has both, OLMo 2's the post-norm alone)."""
    h = geometry.hidden
    return (norm_parameters(geometry, h) if geometry.pre_norms else 0) + (
        h if geometry.sandwich_norms else 0
    )


def sublayer_norm_tensors(geometry: ModelGeometry) -> tuple[int, ...]:
    """The tensors of ``sublayer_norm_parameters``, in the order they are built."""
    h = geometry.hidden
    pre = norm_tensors(geometry, h) if geometry.pre_norms else []
    return (*pre, *((h,) if geometry.sandwich_norms else ()))


def qk_norm_widths(g: ModelGeometry) -> tuple[int, ...]:
    """The q and k norms' parameters (none without a q/k norm): ``head_dim`` each, or the
    whole projection's ``Q`` and ``KV`` where they span it (OLMo 2's; priced at TP 1
    only, ``ModelGeometry.check_tp``)."""
    if not g.qk_norm:
        return ()
    if g.qk_norm_projection:
        return (*norm_tensors(g, g.q_width), *norm_tensors(g, g.kv_width))
    return (*norm_tensors(g, g.head_dim), *norm_tensors(g, g.head_dim))


def fc1_width(geometry: ModelGeometry, ffn: int) -> int:
    """fc1's output width for an MLP of ``ffn``: gate and up (``2F``) where gated, ``F``
    for a plain GeLU / squared-ReLU MLP."""
    return 2 * ffn if geometry.gated_mlp else ffn
