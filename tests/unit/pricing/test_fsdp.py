"""Megatron FSDP's buffers (``cpmem.pricing.fsdp``), each figure worked out by hand from
megatron_fsdp's ``param_and_grad_buffer.py`` at the snapshot (d98e8a64) and the model.

The GPT case is Megatron-LM's ``gpt3_mcore_te_tp2_zp_z3_resume_fsdp_dtensor``: 12 layers,
hidden 512, 8 heads, ffn 4 x 512 = 2048, LayerNorm, biases, learned positions (1024),
GPT-2's 50257 tokens padded to a multiple of 128 x TP 2 = 256: 50432, tied output, TP 2.
One layer on a TP rank (``named_parameters`` order): linear_proj [512, 256] = 131072 and
its bias 512, the QKV's fused norm 512 + 512, linear_qkv [768, 512] = 393216 and its bias
768, fc1's fused norm 512 + 512, fc1 [1024, 512] = 524288 and its bias 1024, fc2
[512, 1024] = 524288 and its bias 512: 1,577,728 elements.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cpmem.api import describe_megatron, price_step
from cpmem.errors import InputError
from cpmem.megatron.args import read_megatron_args
from cpmem.megatron.describe import megatron_geometry
from cpmem.pricing.fsdp import (
    Bucket,
    FsdpInFlight,
    Sharding,
    backward_in_flight,
    chunk_factor,
    fsdp_buckets,
    fsdp_in_flight,
    fsdp_static,
    in_flight_bytes,
    lay_out,
)
from cpmem.pricing.fsdp_units import Tensor, unit_tensors
from cpmem.step.trainer import Optimizer

ROOT = Path(__file__).resolve().parents[3]
CASE = (
    ROOT / "golden/megatron/cases/gpt/gpt3_mcore_te_tp2_zp_z3_resume_fsdp_dtensor/model_config.yaml"
)
LAYER = 131072 + 512 + 1024 + 393216 + 768 + 1024 + 524288 + 1024 + 524288 + 512
OUTSIDE = 50432 // 2 * 512 + 1024 * 512 + 2 * 512  # word embedding, positions, final norm


@pytest.fixture(scope="module")
def geometry():  # type: ignore[no-untyped-def]
    return megatron_geometry(read_megatron_args(CASE))


def test_a_layer_is_its_tensors_and_its_chunk_is_fc2s_row(geometry) -> None:  # type: ignore[no-untyped-def]
    tensors = unit_tensors(geometry, 0, 2)
    assert LAYER == 1_577_728 and sum(t.numel for t in tensors) == LAYER
    # fc2's row of 2048 / 2 = 1024 is the widest; QKV's and fc1's 512 and linear_proj's 256
    # divide it with their tensors whole chunks; every vector is at most one chunk
    assert chunk_factor(tensors) == 1024


@pytest.mark.parametrize(
    ("dp", "unit", "outside"),
    [
        # ceil(1,577,728 / (4 x 1024)) = 386 -> 1,581,056; the outside bucket's chunk is
        # hidden (512): ceil(13,435,904 / 2048) = 6561 -> 13,436,928
        (4, 1_581_056, 13_436_928),
        # ceil(1,577,728 / 2048) = 771 -> 1,579,008; 13,435,904 is 13,121 x 1024 already
        (2, 1_579_008, 13_435_904),
    ],
)
def test_buckets_end_on_dp_times_their_chunk(geometry, dp, unit, outside) -> None:  # type: ignore[no-untyped-def]
    buckets = fsdp_buckets(geometry, Sharding(2, dp), "optim_grads_params")
    assert OUTSIDE == 13_435_904
    assert [b.size for b in buckets] == [outside] + [unit] * 12
    assert [b.unit for b in buckets] == [False] + [True] * 12
    # no_shard: one bucket of every tensor, no end padding
    (whole,) = fsdp_buckets(geometry, Sharding(2, dp), "no_shard")
    assert whole.size == whole.real == OUTSIDE + 12 * LAYER


def test_a_remnant_shares_a_chunk_and_a_small_tensor_follows_at_the_end() -> None:
    # rows of 12 (24 elements), then two of width 6 (18 and 30): the chunk stays 12 (6
    # divides it); 18 leaves a remnant of 6 at [36, 42) and 30's remnant of 6 completes
    # that chunk, so 30 starts at 42 and ends at 72; at DP 2 the bucket ends on 24: 72
    bucket = lay_out([Tensor(24, 12), Tensor(18, 6), Tensor(30, 6)], 2, True, True)
    assert bucket.spans == ((0, 24), (24, 42), (42, 72)) and bucket.size == 72
    # a row of 4 neither equal to nor dividing 6 (with 8 not a multiple of 6) widens the
    # chunk to lcm(6, 4) = 12; 18 rounds up to 24, the 8-element tensor (under a chunk)
    # does not fit the 6 left and follows at 24; DP 2 pads 32 to 48
    bucket = lay_out([Tensor(18, 6), Tensor(8, 4)], 2, True, True)
    assert chunk_factor([Tensor(18, 6), Tensor(8, 4)]) == 12
    assert bucket.spans == ((0, 18), (24, 32)) and bucket.size == 48
    assert (bucket.shard_real(2, 0), bucket.shard_real(2, 1)) == (18, 8)


BUCKET = Bucket(48, ((0, 18), (24, 32)), True)  # 26 real elements, 24 per shard at DP 2


@pytest.mark.parametrize(
    ("strategy", "weights", "gradients", "main", "stepped"),
    [
        ("no_shard", 26, 48, 48, 26),  # the module's own tensors; whole buffers
        ("optim", 48, 48, 24, 8),  # the main weights' shard: its real 8 on the last rank
        ("optim_grads", 48, 24, 24, 8),
        ("optim_grads_params", 24, 24, 24, 8),
    ],
)
def test_each_strategy_shards_its_buffers(strategy, weights, gradients, main, stepped) -> None:  # type: ignore[no-untyped-def]
    held = fsdp_static([BUCKET], Sharding(1, 2), strategy, 1)
    assert (held.weights, held.gradients, held.main_weights, held.stepped) == (
        weights,
        gradients,
        main,
        stepped,
    )


def test_in_flight_the_prefetch_window_and_the_reduce_queue() -> None:
    # five units of 300M elements: a gather takes the first and prefetches while what it
    # prefetched is under 500M (0, then 300M: three units, 900M); the reduce-scatter queue
    # holds while under 1B (0, 300M, 600M, 900M: all five, 1.5B); the outside bucket's
    # gradients too, its weights gathered between steps already (kept_gathered)
    units = [Bucket(300_000_000, (), True, layer) for layer in range(5)]
    outside = Bucket(1_000, (), False)
    flight = fsdp_in_flight([outside, *units], "optim_grads_params")
    assert (flight.gathered, flight.gradients) == (900_000_000, 1_500_001_000)
    zero2 = fsdp_in_flight([outside, *units], "optim_grads")
    assert (zero2.gathered, zero2.gradients) == (0, 1_500_001_000)
    for unsharded in ("no_shard", "optim"):  # gradients accumulate in the persistent buffer
        assert fsdp_in_flight([outside, *units], unsharded) == type(flight)(0, 0, 0)
    # a unit's expert and other buckets are gathered together (one unit), the prefetch
    # then takes a bucket group (a unit's experts, or its others) at a time: 200M + 100M
    # for layer 0, then layer 1's 200M others (200M < 500M), its 400M experts (600M), stop
    split = [
        Bucket(200_000_000, (), True, 0),
        Bucket(100_000_000, (), True, 0, expert=True),
        Bucket(200_000_000, (), True, 1),
        Bucket(400_000_000, (), True, 1, expert=True),
        Bucket(50_000_000, (), True, 2),
    ]
    assert fsdp_in_flight(split, "optim_grads_params").gathered == 900_000_000
    # an FP8 bucket gathers at 1 B an element, the others at the parameters' 2 B
    fp8 = [Bucket(10, (), True, 0), Bucket(30, (), True, 0, fp8=True)]
    assert fsdp_in_flight(fp8, "optim_grads_params", 2, 4).gathered == 2 * 10 + 30


@pytest.mark.parametrize(
    ("world", "static", "kept", "gathered", "gradients"),
    [
        # DP 4, the last rank: shards 3,359,232 + 12 x 395,264 = 8,102,400 elements;
        # real 13,435,904 - 3 x 3,359,232 + 12 x (1,577,728 - 3 x 395,264) = 8,061,440.
        # bf16 weights 2 x 8,102,400; fp32 gradients 4 x 8,102,400; fp32 main weights
        # 4 x 8,102,400 + Adam's 8 x 8,061,440. The outside bucket kept gathered in bf16:
        # 2 x 13,436,928. In flight: every unit (the prefetch window and the queue hold
        # all 12) gathered in bf16, 2 x 12 x 1,581,056, and every bucket's fp32
        # gradients, 4 x (13,436,928 + 12 x 1,581,056)
        (8, (16_204_800, 32_409_600, 96_901_120), 26_873_856, 37_945_344, 129_638_400),
        # DP 2: shards 6,717,952 + 12 x 789,504 = 16,192,000; real 6,717,952 +
        # 12 x (1,577,728 - 789,504) = 16,176,640; kept 2 x 13,435,904; in flight
        # 2 x 12 x 1,579,008 and 4 x (13,435,904 + 12 x 1,579,008)
        (4, (32_384_000, 64_768_000, 194_181_120), 26_871_808, 37_896_192, 129_536_000),
    ],
)
def test_the_fsdp_case_static_and_in_flight(world, static, kept, gathered, gradients) -> None:  # type: ignore[no-untyped-def]
    step = describe_megatron(CASE, world_size=world, device="h100", rank="last")
    assert step.settings.optimizer.fsdp == "optim_grads_params"
    assert step.settings.optimizer.grad_bytes == 4  # --megatron-fsdp-main-grads-dtype fp32
    est = price_step(step, "tight")
    c = est.static.components
    assert (c["weights"], c["gradient_buffer"], c["optimizer_states"]) == static
    assert "master_gradients" not in c
    assert c["fsdp_kept_gathered"] == kept
    assert in_flight_bytes(step.settings) == FsdpInFlight(gathered, gathered, gradients)
    # the gradients are made after the head's backward, which holds more than the layers'
    # backward with them beside it (the fp32 logits of 4 x 1,024 tokens by 25,216 on the
    # rank, 413 MB, against 130 MB of gradients): the gathered buckets alone are charged
    assert est.forward_backward_components["fsdp_in_flight"] == gathered
    assert est.layers_backward_bytes is not None
    assert est.layers_backward_bytes + gradients <= est.forward_backward_bytes - gathered


def test_the_gradients_are_charged_from_the_layers_backward(tmp_path: Path) -> None:
    # the case at one sample of 256 tokens: its head's backward holds less than the
    # layers' backward with every gradient bucket beside it (the same buckets as above,
    # DP 4: gathered 2 x 12 x 1,581,056, gradients 4 x (13,436,928 + 12 x 1,581,056)), so
    # the figure is the layers' moment with both
    text = CASE.read_text().replace("--micro-batch-size: 4", "--micro-batch-size: 1")
    text = text.replace("--global-batch-size: 32", "--global-batch-size: 8")
    config = tmp_path / "model_config.yaml"
    config.write_text(text.replace("--seq-length: 1024", "--seq-length: 256"))
    est = price_step(describe_megatron(config, world_size=8, rank="last"), "tight")
    gathered, gradients = 37_945_344, 129_638_400
    assert est.layers_backward_bytes is not None
    assert est.forward_backward_bytes == est.layers_backward_bytes + gathered + gradients
    charged = est.forward_backward_components["fsdp_in_flight"]
    assert gathered < charged < gathered + gradients


def test_the_gradient_buckets_wait_for_the_layers_backward() -> None:
    flight = FsdpInFlight(forward_gathered=5, gathered=10, gradients=100)
    # the head's backward (1,000) holds more than the layers' (850) with the gradients
    assert backward_in_flight(flight, 1_000, 850) == 10 + 0
    # the layers' (950) with them hold 1,050: 50 above the backward's figure
    assert backward_in_flight(flight, 1_000, 950) == 10 + 50
    # the layers' moment not priced apart: the whole term at the whole backward
    assert backward_in_flight(flight, 1_000, None) == 10 + 100


def test_bf16_gradients_add_their_fp32_copy(tmp_path: Path) -> None:
    # --megatron-fsdp-main-grads-dtype auto: the parameters' bf16; the optimizer steps an
    # fp32 copy of its 8,061,440 real elements (update_main_grads): 4 x 8,061,440
    text = CASE.read_text().replace("--megatron-fsdp-main-grads-dtype: fp32", "")
    text = text.replace("--megatron-fsdp-grad-comm-dtype: fp32", "")
    config = tmp_path / "model_config.yaml"
    config.write_text(text)
    est = price_step(describe_megatron(config, world_size=8, rank="last"), "tight")
    c = est.static.components
    assert c["gradient_buffer"] == 2 * 8_102_400
    assert c["master_gradients"] == 4 * 8_061_440


def test_megatron_fsdp_refuses_what_it_does_not_lay_out() -> None:
    with pytest.raises(InputError, match=r"fsdp.*Megatron FSDP is priced for --training full"):
        describe_megatron(CASE, world_size=8, training="lora")
    with pytest.raises(InputError, match="Megatron FSDP steps adam or sgd"):
        Optimizer("muon", fsdp="optim")
    with pytest.raises(InputError, match="fsdp='zero3'"):
        Optimizer("adam", fsdp="zero3")


@pytest.mark.parametrize(
    ("device", "gathered"),
    [
        # Hopper: the backward's gather makes each FP8 weight's transpose, 1 B an element
        ("h100", 12 * (2 * 1_572_864 + 2 * 4_864)),
        ("gb200", 12 * (1_572_864 + 2 * 4_864)),  # no transposes
    ],
)
def test_fp8_weights_are_a_uint8_bucket_of_their_own(tmp_path: Path, device, gathered) -> None:  # type: ignore[no-untyped-def]
    # --fp8-param-gather: a layer's four TE linears' weights (131,072 + 393,216 + 524,288
    # + 524,288 = 1,572,864, chunk 1024: 384 x 4,096 at DP 4) are one group, uint8; its
    # norms and biases (4,864, rows of 1: no padding at DP 4) another. The last rank of
    # DP 4: bf16 3,359,232 + 12 x 1,216, uint8 12 x 393,216; fp32 gradients and main
    # weights 3,359,232 + 12 x 394,432 = 8,092,416; Adam on 3,358,208 + 12 x 394,432
    # = 8,091,392; 48 FP8 weights' scale inverses, 512 B each. In flight: every unit
    # gathered (1 B an FP8 element, 2 B the others) and every bucket's fp32 gradients,
    # 4 x (13,436,928 + 12 x 1,577,728) = 129,478,656, made after the head's backward,
    # which holds more than the layers' with them: the gathered buckets alone are charged
    text = CASE.read_text().replace(
        "--bf16: true",
        "--bf16: true\n  --fp8-format: hybrid\n  --fp8-recipe: tensorwise\n  --fp8-param-gather: true",
    )
    config = tmp_path / "model_config.yaml"
    config.write_text(text)
    step = describe_megatron(config, world_size=8, device=device, rank="last")
    est = price_step(step, "tight")
    c = est.static.components
    assert c["weights"] == 2 * (3_359_232 + 12 * 1_216) + 12 * 393_216
    assert (c["gradient_buffer"], c["fp8_scale_inverses"]) == (4 * 8_092_416, 48 * 512)
    assert c["optimizer_states"] == 4 * 8_092_416 + 8 * 8_091_392
    assert "fp8_transposes" not in c and c["fsdp_kept_gathered"] == 2 * 13_436_928
    assert in_flight_bytes(step.settings).gradients == 129_478_656
    assert est.forward_backward_components["fsdp_in_flight"] == gathered


def test_the_double_buffer_keeps_two_units_buckets(tmp_path: Path) -> None:
    # --fsdp-double-buffer: the 12 alike units are served by two buffers per bucket kept
    # between steps (FixedPoolAllocator, pgb:647-745, 2524-2560): a unit is one bucket of
    # 1,581,056 elements at DP 4, gathered in bf16 and its gradients in fp32:
    # 2 x (2 + 4) x 1,581,056. In flight only the outside bucket's fp32 gradients remain,
    # made after the head's backward, which holds more than the layers' with them
    text = CASE.read_text().replace("--bf16: true", "--bf16: true\n  --fsdp-double-buffer: true")
    config = tmp_path / "model_config.yaml"
    config.write_text(text)
    step = describe_megatron(config, world_size=8, device="h100", rank="last")
    assert step.settings.optimizer.fsdp_buffers == "double-buffer"
    est = price_step(step, "tight")
    assert est.static.components["fsdp_double_buffer"] == 2 * 6 * 1_581_056 == 18_972_672
    assert in_flight_bytes(step.settings) == FsdpInFlight(0, 0, 4 * 13_436_928)
    assert est.forward_backward_components["fsdp_in_flight"] == 0
