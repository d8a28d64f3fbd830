"""A quantized checkpoint's frozen base held as stored: the bytes of its quantized linears
on one rank, values and scales (``cpmem.model.quantization``).

A linear of a converted role (``Quantization.converted``) is held as ``value_bits`` per
value and one ``scale_bytes`` scale per ``block`` of its ``[rows, cols]`` matrix on the
rank: TP (ETP for a routed expert) divides the rows of a column-parallel linear and the
columns of a row-parallel one, and a rank holds the scales of the blocks its slice spans
(``ceil(rows / block_rows) x ceil(cols / block_cols)`` of its slice). So DeepSeek-V3's
expert ``down_proj`` (7,168 x 2,048, fp8 with 128 x 128 blocks) is 14,680,064 value bytes
and 56 x 16 = 896 fp32 scales (3,584 B); gpt-oss-20b's expert ``down_proj`` (2,880 x 2,880,
mxfp4) is 4,147,200 value bytes and 2,880 x 90 = 259,200 one-byte scales.

Every other weight (embedding, output layer, norms, router, biases, a kept role's
linears, the MTP depths' ``eh_proj``) stays in the step's dtype (``cpmem.pricing.weights``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

from cpmem.model.geometry import ModelGeometry
from cpmem.model.quantization import Quantization
from cpmem.pricing.kinds import mixer_spec, mlp_spec
from cpmem.pricing.layer_parameters import Linear


@dataclass(frozen=True)
class Stored:
    """The converted linears of some layers on one rank: their ``elements`` (priced in the
    step's dtype elsewhere) and the ``bytes`` they take as stored (values and scales)."""

    elements: int = 0
    values: int = 0
    scales: int = 0

    @property
    def bytes(self) -> int:
        return self.values + self.scales

    def __add__(self, other: Stored) -> Stored:
        return Stored(
            self.elements + other.elements, self.values + other.values, self.scales + other.scales
        )


def linear_stored(linear: Linear, q: Quantization, tp: int, ep: int, etp: int) -> Stored:
    """One linear's slice on a rank (every local expert's, for routed experts), as stored."""
    count = linear.count
    if linear.placement == "experts":
        count, shards = linear.count // ep, etp
    else:
        shards = tp if linear.placement == "sharded" else 1
    rows, cols = linear.rows, linear.cols
    if linear.split == "rows":
        rows //= shards
    else:
        cols //= shards
    block_rows, block_cols = q.block
    elements = count * rows * cols
    blocks = count * -(-rows // block_rows) * -(-cols // block_cols)
    return Stored(elements, -(-elements * q.value_bits // 8), blocks * q.scale_bytes)


def layers_stored(
    geometry: ModelGeometry, q: Quantization, tp: int, ep: int, etp: int, held: Iterable[int]
) -> Stored:
    """The converted linears of the ``held`` layers on one rank."""
    total = Stored()
    for i in held:
        total += _layer_stored(geometry, q, geometry.mixers[i], geometry.mlps[i], tp, ep, etp)
    return total


def mtp_stored(geometry: ModelGeometry, q: Quantization, tp: int, ep: int, etp: int) -> Stored:
    """One MTP depth's converted linears on one rank (its layers'; ``eh_proj`` stays in the
    step's dtype)."""
    total = Stored()
    for mixer, mlp in zip(geometry.mtp_mixers, geometry.mtp_mlps, strict=True):
        total += _layer_stored(geometry, q, mixer, mlp, tp, ep, etp)
    return total


@lru_cache(maxsize=256)
def _layer_stored(
    geometry: ModelGeometry, q: Quantization, mixer: str, mlp: str, tp: int, ep: int, etp: int
) -> Stored:
    total = Stored()
    for linear in (*mixer_spec(mixer).linears(geometry), *mlp_spec(mlp).linears(geometry)):
        if q.converts(linear.role):
            total += linear_stored(linear, q, tp, ep, etp)
    return total
