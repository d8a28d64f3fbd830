"""The layer-wise distributed optimizer's precomputed layout (``cpmem.pricing.
layer_wise_layout``), each expected value worked by hand from megatron-core's algorithm at
NVIDIA/Megatron-LM d98e8a64 (``LayerWiseDistributedOptimizer._compute_per_buffer_param_
layout``, layer_wise_optimizer.py:196-445; ``param_layout.py``: ``pad_param_start`` rounds
up to 64, ``bucket_end_divisor`` is ``lcm(dp, 128)``). The steps are written beside each
case; none is computed by the code under test.
"""

from __future__ import annotations

import pytest

from cpmem.pricing.layer_wise_layout import layer_wise_layout, ns_cost, shard_divisor


def test_newton_schulz_cost_is_the_long_side_times_the_short_squared() -> None:
    # _ns_compute_cost: big * small * small
    assert ns_cost((128, 64)) == 128 * 64 * 64
    assert ns_cost((64, 128)) == 128 * 64 * 64


def test_shard_divisor() -> None:
    # lcm(64, lcm(dp, 128) // dp): dp 2 -> lcm(64, 64) = 64; dp 1 -> lcm(64, 128) = 128;
    # dp 256 -> lcm(256, 128) // 256 = 1 -> 64; dp 3 -> 384 // 3 = 128 -> 128
    assert [shard_divisor(n) for n in (1, 2, 3, 256)] == [128, 64, 128, 64]


def test_lpt_balances_by_cost_in_one_bucket() -> None:
    # forward A (128, 64), B (64, 64), C (256, 64), D (64, 64); reversed D C B A; sorted by
    # cost descending (stable): C 1048576, A 524288, D 262144, B 262144. 32768 elements,
    # cap 32768 / 2 x 1.3 = 21299.2. C -> shard 0 (loads tie: the lowest); A: shard 0
    # would reach 24576 > cap -> shard 1; D: both fit, shard 1's load is lower -> 1;
    # B: both fit, shard 1 (786432) < shard 0 (1048576) -> 1. Shards 16384 | 16384,
    # rounded to 64: no padding, buffer 32768.
    layout = layer_wise_layout([(128, 64), (64, 64), (256, 64), (64, 64)], 2)
    assert layout.numel == 32768
    assert layout.shard_elements == (16384, 16384)


def test_a_shard_starts_on_64_and_ends_on_the_divisor() -> None:
    # forward X (100, 10) cost 10000, Y (30, 10), Z (30, 10) cost 3000 each; sorted X, Z, Y.
    # 1600 elements, cap 1040. X -> shard 0 (1000). Z: shard 0 at pad(1000) = 1024 + 300
    # > cap -> shard 1 (300). Y: shard 1 at pad(300) = 320 + 300 = 620 -> shard 1.
    # Fullest shard 1000 -> 1024 (divisor 64), buffer 2 x 1024.
    layout = layer_wise_layout([(100, 10), (30, 10), (30, 10)], 2)
    assert layout.numel == 2048
    assert layout.shard_elements == (1000, 600)


def test_no_shard_under_the_cap_falls_back_to_the_emptiest() -> None:
    # three (100, 10): 3000 elements, cap 1950. 1st -> shard 0; 2nd: shard 0 at 1024 + 1000
    # > cap -> shard 1; 3rd: neither fits (2024 > 1950) -> fewest elements, a tie -> shard 0
    # at 2024. Fullest 2024 -> 2048, buffer 4096.
    layout = layer_wise_layout([(100, 10)] * 3, 2)
    assert layout.numel == 4096
    assert layout.shard_elements == (2000, 1000)


def test_one_rank_holds_every_matrix_in_one_shard() -> None:
    # dp 1: every matrix to shard 0, each start rounded to 64: 1000 -> 1024 + 300 = 1324,
    # rounded to the divisor 128 -> 1408
    layout = layer_wise_layout([(100, 10), (30, 10)], 1)
    assert layout.numel == 1408
    assert layout.shard_elements == (1300,)


def test_buckets_close_at_the_soft_minimum_when_the_next_would_grow_them() -> None:
    # four (20, 50) (1000 each), 2 shards, bucket_size 1500. Walk S R Q P (reversed):
    # S placed (loads 1000 | 0); R: threshold max(1500, int(2 x 1000 x 0.9) = 1800), chunk
    # 1000 < 1800 -> placed (1000 | 1000); Q: chunk 2000 >= 1800 and pad(1000) + 1000 =
    # 2024 > pad_to(1000, 64) = 1024 -> bucket [S, R] closes; Q, P make the second.
    # Each bucket: one matrix per shard, 1000 -> 1024 each: 2 x 2048.
    layout = layer_wise_layout([(20, 50)] * 4, 2, bucket_size=1500)
    assert layout.numel == 4096
    assert layout.shard_elements == (2000, 2000)


def test_the_soft_minimum_has_a_floor() -> None:
    # forward [E (40, 10), F (40, 10), G (64, 10)], 2 shards, bucket_size 600. Walk G
    # (640), F, E: F's threshold is max(600, int(2 x 640 x 0.9) = 1152) > 640, E's too
    # (1040): one bucket. Sorted by cost G 6400, F 4000, E 4000; cap 1440 / 2 x 1.3 = 936:
    # G -> 0; F: shard 0 at 640 + 400 = 1040 > 936 -> 1; E: shard 1 at 448 + 400 = 848 -> 1.
    # Fullest 848 -> 896: 2 x 896.
    layout = layer_wise_layout([(40, 10), (40, 10), (64, 10)], 2, bucket_size=600)
    assert layout.numel == 1792
    assert layout.shard_elements == (640, 800)


def test_costs_carry_over_between_buckets() -> None:
    # forward [K4 (10, 50), K3 (10, 90), K2 (10, 90), K1 (20, 50)], 2 shards, bucket_size
    # 100; walk K1 K2 K3 K4. K1 placed (1000 | 0), K2 (1000 | 900), chunk 1900 >= max(100,
    # int(2 x 1000 x 0.9) = 1800); K3: pad(900) + 900 = 1860 > pad_to(1000, 64) = 1024 ->
    # bucket [K1, K2] closes; K4: 900 < int(2 x 900 x 0.9) = 1620 -> bucket [K3, K4].
    # Bucket 1: costs K1 50 x 20^2 = 20000, K2 90 x 10^2 = 9000; cap 1235: K1 -> 0; K2:
    # shard 0 at 1024 + 900 > cap -> 1; fullest 1000 -> 1024: 2048.
    # Bucket 2: cap 1400 / 2 x 1.3 = 910; K3 (9000) fits both, loads carried (20000 |
    # 9000) -> shard 1 (reset loads would give shard 0); K4: shard 1 at 960 + 500 > 910
    # -> 0. Fullest 900 -> 960: 1920. Rank 0 steps 1000 + 500, rank 1 900 + 900.
    layout = layer_wise_layout([(10, 50), (10, 90), (10, 90), (20, 50)], 2, bucket_size=100)
    assert layout.numel == 2048 + 1920
    assert layout.shard_elements == (1500, 1800)
    # with 1 shard the floor is int(shards x largest x 0.9): forward [E, F, G] as above,
    # walk G F E. F: 640 >= int(640 x 0.9) = 576 and pad(640) + 400 > pad_to(640, 128) =
    # 640 -> [G] closes (640); E: 400 >= int(400 x 0.9) = 360 and 448 + 400 > pad_to(400,
    # 128) = 512 -> [F] closes (512); [E] (512). Three buckets.
    single = layer_wise_layout([(40, 10), (40, 10), (64, 10)], 1, bucket_size=100)
    assert single.numel == 640 + 512 + 512
    assert single.shard_elements == (1440,)


def test_a_group_of_no_ranks_is_an_error() -> None:
    with pytest.raises(ValueError, match="shards"):
        layer_wise_layout([(2, 2)], 0)


def test_ddps_bucket_is_40m_elements_or_1m_per_rank() -> None:
    # dist_utils.py:316: max(40000000, 1000000 * dp_cp.size())
    from cpmem.pricing.layer_wise_static import grad_bucket_size

    assert [grad_bucket_size(n) for n in (1, 40, 64)] == [40_000_000, 40_000_000, 64_000_000]
