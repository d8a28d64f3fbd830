"""One MXFP8 tensor's bytes as Transformer Engine allocates it (b9d690e0), the per-tensor
count the ``mxfp8`` recipe's pricing is built from.

``MXFP8Quantizer::create_tensor`` (``csrc/quantizer.cpp:1383-1417``) allocates, for each
usage it is asked for (rowwise, columnwise or both), a ``uint8`` data tensor of the
tensor's own shape (1 B per element: the columnwise copy is not a transpose, it keeps the
shape, ``tensor/mxfp8_tensor.py:142-144``) and a ``uint8`` scale-inverse tensor (one e8m0
byte per 32 elements along the scaled direction). The scale tensor is padded
(``MXFP8Quantizer::get_scale_shape``, ``quantizer.cpp:1710-1739``; the same in Python,
``tensor/mxfp8_tensor.py:103-139``), with ``rows`` the product of the leading dimensions
and ``cols`` the last one:

- rowwise: ``[roundup(rows, 128), roundup(cols / 32, 4)]``;
- columnwise: ``[roundup(rows / 32, 4), roundup(cols, 128)]``.

Both dimensions must be multiples of 32 (``quantizer.cpp:1395-1397``); a shape that is
not cannot be an MXFP8 tensor (``InputError``). Each of the (up to four) tensors is its
own allocation; whole-block rounding of the caching allocator is the caller's.
"""

from __future__ import annotations

from dataclasses import dataclass

from cpmem.errors import InputError

BLOCK = 32
"""Elements per e8m0 scale, ``MXFP8_BLOCK_SIZE`` (``csrc/quantizer.cpp:128``, Python
``constants.py:111``)."""
ROW_PAD = 128
COL_PAD = 4
"""The scale tensor's padding: its dimension along the unscaled direction to a multiple of
``ROW_PAD``, along the scaled one to a multiple of ``COL_PAD`` (``quantizer.cpp:1729-1736``)."""


def _roundup(n: int, m: int) -> int:
    return -(-n // m) * m


@dataclass(frozen=True)
class BlockScaledBytes:
    """A block-scaled FP8 tensor's allocations in bytes (MXFP8 here, blockwise in
    ``cpmem.pricing.fp8_blockwise``): each usage's data and scale inverse (0 for
    a usage not kept)."""

    rowwise_data: int
    rowwise_scales: int
    columnwise_data: int
    columnwise_scales: int

    @property
    def total(self) -> int:
        return (
            self.rowwise_data + self.rowwise_scales + self.columnwise_data + self.columnwise_scales
        )

    @property
    def allocations(self) -> tuple[int, ...]:
        """Each tensor allocated, in bytes (none for a usage not kept)."""
        sizes = (
            self.rowwise_data,
            self.rowwise_scales,
            self.columnwise_data,
            self.columnwise_scales,
        )
        return tuple(n for n in sizes if n)


def scale_shape(rows: int, cols: int, *, columnwise: bool) -> tuple[int, int]:
    """The padded scale-inverse shape of a ``[rows, cols]`` tensor for one usage."""
    if columnwise:
        return _roundup(rows // BLOCK, COL_PAD), _roundup(cols, ROW_PAD)
    return _roundup(rows, ROW_PAD), _roundup(cols // BLOCK, COL_PAD)


def mxfp8_bytes(rows: int, cols: int, *, rowwise: bool, columnwise: bool) -> BlockScaledBytes:
    """The bytes of an MXFP8 tensor of ``rows`` x ``cols`` elements (``rows``: the product
    of the leading dimensions) keeping the usages asked for."""
    problems = [
        f"{name}={value}: must be a positive multiple of {BLOCK}"
        for name, value in (("rows", rows), ("cols", cols))
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0 or value % BLOCK
    ]
    if problems:
        raise InputError("mxfp8 shape", (rows, cols), "; ".join(problems))
    data = rows * cols
    row = scale_shape(rows, cols, columnwise=False)
    col = scale_shape(rows, cols, columnwise=True)
    return BlockScaledBytes(
        rowwise_data=data if rowwise else 0,
        rowwise_scales=row[0] * row[1] if rowwise else 0,
        columnwise_data=data if columnwise else 0,
        columnwise_scales=col[0] * col[1] if columnwise else 0,
    )
