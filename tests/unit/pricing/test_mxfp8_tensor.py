"""One MXFP8 tensor's bytes (``cpmem.pricing.mxfp8``), each term counted by hand from
Transformer Engine b9d690e0's allocation: ``csrc/quantizer.cpp:1383-1417``
(``MXFP8Quantizer::create_tensor``: a ``uint8`` data tensor of the tensor's shape and a
``uint8`` scale tensor per usage) and ``:1710-1739`` (``get_scale_shape``: rowwise
``[roundup(rows, 128), roundup(cols / 32, 4)]``, columnwise
``[roundup(rows / 32, 4), roundup(cols, 128)]``), with 32 elements per scale
(``quantizer.cpp:128``)."""

from __future__ import annotations

import pytest

from cpmem.errors import InputError
from cpmem.pricing.mxfp8 import BlockScaledBytes, mxfp8_bytes, scale_shape


def test_a_llama_qkv_weight_keeps_both_copies_and_their_scales() -> None:
    # Llama 3 8B's QKV projection, TP 1: [4096 + 2 * 8 * 128, 4096] = [6144, 4096].
    # data: 6144 * 4096 = 25,165,824 B per usage;
    # rowwise scales: [roundup(6144, 128), roundup(4096 / 32, 4)] = [6144, 128] = 786,432 B;
    # columnwise scales: [roundup(6144 / 32, 4), roundup(4096, 128)] = [192, 4096] = 786,432 B.
    got = mxfp8_bytes(6144, 4096, rowwise=True, columnwise=True)
    assert got == BlockScaledBytes(25_165_824, 786_432, 25_165_824, 786_432)
    assert got.total == 51_904_512


def test_the_scale_tensor_is_padded_to_128_by_4() -> None:
    # [32, 32]: one rowwise scale per row (32 x 1) padded to [128, 4] = 512 B, and one
    # columnwise scale per column (1 x 32) padded to [4, 128] = 512 B: 16 times the 32 scales.
    assert scale_shape(32, 32, columnwise=False) == (128, 4)
    assert scale_shape(32, 32, columnwise=True) == (4, 128)
    # [96, 160]: rowwise [roundup(96, 128), roundup(5, 4)] = [128, 8] = 1,024 B;
    # columnwise [roundup(3, 4), roundup(160, 128)] = [4, 256] = 1,024 B.
    assert mxfp8_bytes(96, 160, rowwise=True, columnwise=False) == BlockScaledBytes(
        15_360, 1_024, 0, 0
    )
    assert mxfp8_bytes(96, 160, rowwise=False, columnwise=True) == BlockScaledBytes(
        0, 0, 15_360, 1_024
    )


def test_a_usage_not_kept_allocates_nothing() -> None:
    got = mxfp8_bytes(6144, 4096, rowwise=False, columnwise=True)
    assert got.allocations == (25_165_824, 786_432)


@pytest.mark.parametrize(("rows", "cols"), [(48, 4096), (6144, 100), (0, 32)])
def test_a_shape_te_refuses_names_the_dimension(rows: int, cols: int) -> None:
    # quantizer.cpp:1395-1397: both flattened dimensions must be multiples of 32
    with pytest.raises(InputError) as err:
        mxfp8_bytes(rows, cols, rowwise=True, columnwise=True)
    assert err.value.field == "mxfp8 shape"
    bad = "rows" if rows % 32 or rows <= 0 else "cols"
    assert f"{bad}=" in err.value.reason
