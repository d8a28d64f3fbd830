"""One block-scaled FP8 tensor's bytes (``cpmem.pricing.fp8_blockwise``), each term counted
by hand from Transformer Engine b9d690e0: ``csrc/quantizer.cpp:966-1020``
(``Float8BlockQuantizer::create_tensor``: ``uint8`` data per usage, the columnwise one
transposed, and fp32 scales, ``:981``) and ``:1323-1375`` (``get_scale_shape``), with
128-element blocks (``:1332``); weights in 128 x 128 blocks, activations in 1 x 128
(``common/recipe/__init__.py:425-427``)."""

from __future__ import annotations

import pytest

from cpmem.errors import InputError
from cpmem.pricing.fp8_blockwise import blockwise_bytes, scale_shape
from cpmem.pricing.mxfp8 import BlockScaledBytes


def test_a_llama_qkv_weight_in_128_by_128_blocks() -> None:
    # [6144, 4096] weight, 2D blocks:
    # rowwise scales [ceil(6144/128), roundup(ceil(4096/128), 4)] = [48, 32] fp32 = 6,144 B;
    # columnwise [ceil(4096/128), roundup(ceil(6144/128), 4)] = [32, 48] fp32 = 6,144 B;
    # data 6144 * 4096 = 25,165,824 B per usage (the columnwise copy is the transpose).
    got = blockwise_bytes(6144, 4096, dims=2, rowwise=True, columnwise=True)
    assert got == BlockScaledBytes(25_165_824, 6_144, 25_165_824, 6_144)


def test_an_activation_in_1_by_128_blocks() -> None:
    # [8192 tokens, 4096] input, 1D blocks:
    # rowwise scales [ceil(4096/128), roundup(8192, 4)] = [32, 8192] fp32 = 1,048,576 B;
    # columnwise [ceil(8192/128), roundup(4096, 4)] = [64, 4096] fp32 = 1,048,576 B.
    got = blockwise_bytes(8192, 4096, dims=1, rowwise=False, columnwise=True)
    assert got == BlockScaledBytes(0, 0, 33_554_432, 1_048_576)
    assert scale_shape(8192, 4096, dims=1, columnwise=False) == (32, 8192)


def test_ragged_shapes_round_up() -> None:
    # [130, 6]: 2D rowwise [ceil(130/128), roundup(ceil(6/128), 4)] = [2, 4];
    # 2D columnwise [ceil(6/128), roundup(2, 4)] = [1, 4];
    # 1D rowwise [ceil(6/128), roundup(130, 4)] = [1, 132];
    # 1D columnwise [ceil(130/128), roundup(6, 4)] = [2, 8].
    assert scale_shape(130, 6, dims=2, columnwise=False) == (2, 4)
    assert scale_shape(130, 6, dims=2, columnwise=True) == (1, 4)
    assert scale_shape(130, 6, dims=1, columnwise=False) == (1, 132)
    assert scale_shape(130, 6, dims=1, columnwise=True) == (2, 8)


@pytest.mark.parametrize(("rows", "cols", "dims", "named"), [(0, 6, 1, "rows"), (4, 4, 3, "dims")])
def test_a_shape_te_cannot_build_names_the_field(
    rows: int, cols: int, dims: int, named: str
) -> None:
    with pytest.raises(InputError) as err:
        blockwise_bytes(rows, cols, dims=dims, rowwise=True, columnwise=False)
    assert err.value.field == "blockwise shape"
    assert f"{named}=" in err.value.reason
