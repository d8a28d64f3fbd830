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


def fc1_width(geometry: ModelGeometry, ffn: int) -> int:
    """fc1's output width for an MLP of ``ffn``: gate and up (``2F``) where gated, ``F``
    for a plain GeLU / squared-ReLU MLP."""
    return 2 * ffn if geometry.gated_mlp else ffn
