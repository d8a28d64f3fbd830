"""One FP8 block-scaled tensor's bytes (the ``blockwise`` recipe, TE's
``Float8BlockScaling``) as Transformer Engine b9d690e0 allocates it, the per-tensor count
that recipe's pricing is built from.

``Float8BlockQuantizer::create_tensor`` (``csrc/quantizer.cpp:966-1020``) allocates, for
each usage asked for, a ``uint8`` data tensor (rowwise: the tensor's shape; columnwise: its
transpose, the last dimension first, the same number of elements) and an fp32 scale
tensor. The recipe scales weights in 128 x 128 blocks and activations and gradients in
1 x 128 blocks (``common/recipe/__init__.py:425-427``: ``w_block_scaling_dim = 2``,
``x_`` and ``grad_block_scaling_dim = 1``). With ``rows`` the product of the leading
dimensions and ``cols`` the last one, the scale shapes (``get_scale_shape``,
``quantizer.cpp:1323-1375``) are:

- 2D (128 x 128): rowwise ``[ceil(rows/128), roundup(ceil(cols/128), 4)]``, columnwise
  ``[ceil(cols/128), roundup(ceil(rows/128), 4)]``;
- 1D (1 x 128): rowwise ``[ceil(cols/128), roundup(rows, 4)]``, columnwise
  ``[ceil(rows/128), roundup(cols, 4)]``.

Each allocation is its own; whole-block rounding of the caching allocator is the caller's.
"""

from __future__ import annotations

from cpmem.errors import InputError
from cpmem.pricing.mxfp8 import BlockScaledBytes

BLOCK = 128
"""``kBlockLen`` (``quantizer.cpp:1332``)."""
PAD = 4
SCALE_BYTES = 4
"""Each scale is fp32 (``quantizer.cpp:981``, ``torch::kFloat32``)."""


def _ceil(n: int, m: int) -> int:
    return -(-n // m)


def scale_shape(rows: int, cols: int, *, dims: int, columnwise: bool) -> tuple[int, int]:
    """The scale-inverse shape of a ``[rows, cols]`` tensor for one usage, with blocks of
    ``dims`` dimensions (2: 128 x 128; 1: 1 x 128)."""
    if dims == 2:
        if columnwise:
            return _ceil(cols, BLOCK), _ceil(_ceil(rows, BLOCK), PAD) * PAD
        return _ceil(rows, BLOCK), _ceil(_ceil(cols, BLOCK), PAD) * PAD
    if columnwise:
        return _ceil(rows, BLOCK), _ceil(cols, PAD) * PAD
    return _ceil(cols, BLOCK), _ceil(rows, PAD) * PAD


def blockwise_bytes(
    rows: int, cols: int, *, dims: int, rowwise: bool, columnwise: bool
) -> BlockScaledBytes:
    """The bytes of a block-scaled FP8 tensor of ``rows`` x ``cols`` elements keeping the
    usages asked for, its scales in blocks of ``dims`` dimensions (1 or 2)."""
    problems = [
        f"{name}={value}: must be a positive whole number"
        for name, value in (("rows", rows), ("cols", cols))
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0
    ]
    if dims not in (1, 2):
        problems.append(f"dims={dims}: TE scales in 1 x 128 (1) or 128 x 128 (2) blocks")
    if problems:
        raise InputError("blockwise shape", (rows, cols, dims), "; ".join(problems))
    row = scale_shape(rows, cols, dims=dims, columnwise=False)
    col = scale_shape(rows, cols, dims=dims, columnwise=True)
    return BlockScaledBytes(
        rowwise_data=rows * cols if rowwise else 0,
        rowwise_scales=row[0] * row[1] * SCALE_BYTES if rowwise else 0,
        columnwise_data=rows * cols if columnwise else 0,
        columnwise_scales=col[0] * col[1] * SCALE_BYTES if columnwise else 0,
    )
