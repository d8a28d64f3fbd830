"""Megatron FSDP's units of latent-attention and MoE layers (``cpmem.pricing.fsdp_units``,
``cpmem.pricing.fsdp``), each figure worked out by hand from megatron_fsdp's
``param_and_grad_buffer.py`` (pgb) at the snapshot d98e8a64 and the model.

The case is Megatron-LM's ``deepseek_proxy_fsdp_ep2_fsdp2_ep_overlap`` (H100, 8 GPUs, bf16,
TP 1, EP 2: the expert data-parallel group 8 / 2 = 4), read without its
``--delay-wgrad-compute``: 2 layers (a dense one, then an MoE one), hidden 512, 8 heads,
latent attention with ``q_lora_rank`` 256, ``kv_lora_rank`` 128, ``qk_head_dim`` 128 +
rope 64, ``v_head_dim`` 128, RMSNorm, no biases, ffn 2048 (SwiGLU), 8 experts of 1024,
a shared expert of 1024 (no gate), GPT-2's 50257 tokens padded to 64: 50304, untied.

Latent attention on a rank (multi_latent_attention.py:500-630, the TE spec's own input
norm): input norm 512, linear_proj [512, 8 x 128] = 524,288 (rows of 1024), q_down
[256, 512] = 131,072, q_up's norm 256 and weight [8 x 192, 256] = 393,216, kv_down
[128 + 64, 512] = 98,304, kv_up's norm 128 and weight [8 x 256, 128] = 262,144: 1,409,920.
The dense MLP: fc1's norm 512, fc1 [4096, 512] = 2,097,152, fc2 [512, 2048] = 1,048,576.
The MoE block: its norm 512, the router [8, 512] = 4,096, 4 local experts' fc1 [2048, 512]
= 1,048,576 and fc2 [512, 1024] = 524,288 each (``.experts.``: their own bucket), the
shared expert's fc1 [2048, 512] = 1,048,576 and fc2 [512, 1024] = 524,288.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cpmem.api import describe_megatron, price_step
from cpmem.megatron.args import read_megatron_args
from cpmem.megatron.describe import megatron_geometry
from cpmem.model.presets import PRESETS
from cpmem.pricing.fsdp import (
    Sharding,
    double_buffer_bytes,
    fsdp_buckets,
    fsdp_in_flight,
    fsdp_static,
    pooled_layers,
)
from cpmem.pricing.fsdp_units import unit_tensors
from cpmem.pricing.kinds import mixer_spec, mlp_spec

ROOT = Path(__file__).resolve().parents[3]
CASE = ROOT / "golden/megatron/cases/moe/deepseek_proxy_fsdp_ep2_fsdp2_ep_overlap/model_config.yaml"
LATENT = 512 + 524_288 + 131_072 + 256 + 393_216 + 98_304 + 128 + 262_144
DENSE = 512 + 2_097_152 + 1_048_576
MOE_OTHERS = 512 + 4_096 + 1_048_576 + 524_288
EXPERTS = 4 * (1_048_576 + 524_288)
OUTSIDE = 2 * 50_304 * 512 + 512  # word embedding, output layer, final norm


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    text = CASE.read_text().replace("--delay-wgrad-compute: true", "")
    path = tmp_path_factory.mktemp("proxy") / "model_config.yaml"
    path.write_text(text)
    return path


def test_a_unit_is_its_layers_tensors(config: Path) -> None:
    g = megatron_geometry(read_megatron_args(config))
    assert LATENT == 1_409_920
    dense, moe = unit_tensors(g, 0, 1, 2), unit_tensors(g, 1, 1, 2)
    assert sum(t.numel for t in dense) == LATENT + DENSE
    assert sum(t.numel for t in moe if not t.expert) == LATENT + MOE_OTHERS
    assert sum(t.numel for t in moe if t.expert) == EXPERTS == 6_291_456
    # linear_proj's row is its 8 x 128 inputs; kv_up's its 128 latent inputs
    assert [t.width for t in dense[:2]] == [1, 1024] and moe[7].width == 128


def test_experts_are_a_bucket_of_their_own_over_the_expert_group(config: Path) -> None:
    g = megatron_geometry(read_megatron_args(config))
    buckets = fsdp_buckets(g, Sharding(1, 8, 2, 1, 4), "optim_grads_params")
    # the outside bucket: chunk 512 (rows of hidden), 51,511,808 padded to 8 x 512:
    # 12,577 x 4,096 = 51,515,392. Layer 0: chunk fc2's 2048 (every tensor a whole number
    # of them), 4,556,160 to 8 x 2048: 279 x 16,384 = 4,571,136. Layer 1's others: chunk
    # 1024, 2,987,392 to 8 x 1024: 365 x 8,192 = 2,990,080. Its experts: chunk 1024,
    # 6,291,456 on 4 x 1024: 1,536 x 4,096 exactly
    assert OUTSIDE == 51_511_808 and LATENT + DENSE == 4_556_160
    assert LATENT + MOE_OTHERS == 2_987_392
    sizes = [(b.layer, b.expert, b.size, b.real) for b in buckets]
    assert sizes == [
        (-1, False, 51_515_392, OUTSIDE),
        (0, False, 4_571_136, 4_556_160),
        (1, False, 2_990_080, 2_987_392),
        (1, True, 6_291_456, 6_291_456),
    ]
    # the last rank: its DP index 7 and expert index 3. Shards: 6,439,424 + 571,392 +
    # 373,760 (of 8) + 1,572,864 (of 4) = 8,957,440. Real: 51,511,808 - 7 x 6,439,424,
    # 4,556,160 - 7 x 571,392, 2,987,392 - 7 x 373,760, 1,572,864 = 8,936,192
    held = fsdp_static(buckets, Sharding(1, 8, 2, 1, 4), "optim_grads_params", 7, 3)
    assert (held.weights, held.stepped) == (8_957_440, 8_936_192)
    assert held.kept_gathered == 51_515_392


def test_the_proxy_priced_on_its_last_rank(config: Path) -> None:
    step = describe_megatron(config, world_size=8, device="h100", rank="last")
    c = price_step(step, "tight").static.components
    # bf16 weights 2 x 8,957,440; fp32 gradients (--megatron-fsdp-main-grads-dtype fp32)
    # 4 x 8,957,440; fp32 main weights 4 x 8,957,440 + Adam's 8 x 8,936,192; the outside
    # bucket kept gathered in bf16, 2 x 51,515,392
    assert (c["weights"], c["gradient_buffer"]) == (17_914_880, 35_829_760)
    assert c["optimizer_states"] == 35_829_760 + 71_489_536
    assert c["fsdp_kept_gathered"] == 103_030_784


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_deepseek_v3s_units_hold_its_layers_parameters(tp: int) -> None:
    # the units' tensors are the layer kinds' (trained_tensors, expert_tensors), at
    # DeepSeek-V3's scale and EP 8
    g = PRESETS["deepseek-v3"]
    moe = g.mlps.index("moe")
    for layer in (0, moe):
        tensors = unit_tensors(g, layer, tp, 8)
        kinds = [mixer_spec(g.mixers[layer]), mlp_spec(g.mlps[layer])]
        trained = [k.trained_tensors(g, tp) for k in kinds]
        dense = sum(sum(t.weights + t.norms + t.biases + t.extra) for t in trained)
        assert sum(t.numel for t in tensors if not t.expert) == dense
        experts = mlp_spec(g.mlps[layer]).expert_tensors(g, 8, 1)
        assert sum(t.numel for t in tensors if t.expert) == sum(experts)


def test_an_expert_bucket_is_padded_to_its_own_group(config: Path) -> None:
    # at 40 ranks and EP 8 (the expert data-parallel group 5): one local expert,
    # 1,048,576 + 524,288 = 1,572,864 elements, 1,536 chunks of 1024, padded to a
    # multiple of 5 chunks: 1,540 x 1024 = 1,576,960 (to 40 it would be 1,560 chunks)
    g = megatron_geometry(read_megatron_args(config))
    buckets = fsdp_buckets(g, Sharding(1, 40, 8, 1, 5), "optim_grads_params")
    (experts,) = [b for b in buckets if b.expert]
    assert (experts.real, experts.size) == (1_572_864, 1_576_960)
    held = fsdp_static([experts], Sharding(1, 40, 8, 1, 5), "optim_grads_params", 0, 4)
    assert held.weights == 1_576_960 // 5 == 315_392


def test_the_double_buffer_serves_the_largest_set_of_alike_units(config: Path) -> None:
    # a dense unit and an MoE unit: two sets of one; the first found serves (pgb:680-688)
    g = megatron_geometry(read_megatron_args(config))
    buckets = fsdp_buckets(g, Sharding(1, 8, 2, 1, 4), "optim_grads_params")
    assert pooled_layers(buckets) == {0}
    # two buffers of layer 0's bucket: its 4,571,136 elements in bf16 and fp32
    assert double_buffer_bytes(buckets, "optim_grads_params", 2, 4) == 2 * 6 * 4_571_136
    # the MoE unit stays in flight: its two buckets gathered, 2 x (2,990,080 + 6,291,456)
    flight = fsdp_in_flight(buckets, "optim_grads_params", 2, 4, pooled=frozenset({0}))
    assert flight.gathered == 2 * (2_990_080 + 6_291_456)


def test_fp8_experts_are_a_uint8_bucket_over_the_expert_group(config: Path) -> None:
    # --fp8-param-gather: each unit's TE linears' weights are a group of their own (uint8),
    # the routed experts' too. Layer 0: latent attention's 5 projections (131,072 +
    # 393,216 + 98,304 + 262,144 + 524,288 = 1,409,024) and fc1, fc2 (3,145,728): 4,554,752,
    # chunk fc2's 2048, 278 x (8 x 2048) exactly; its norms (512 + 256 + 128 + 512 = 1,408,
    # rows of 1) to 8. Layer 1: its norms and router (512 + 256 + 128 + 512 + 4,096 =
    # 5,504: chunk the router's 512, the 256 and 128 norms after it) to 2 x 4,096 = 8,192;
    # latent attention and the shared expert (1,409,024 + 1,572,864 = 2,981,888, chunk
    # 1024, 364 x 8,192 exactly); the 4 local experts (6,291,456 on 4 x 1024, exactly)
    text = CASE.read_text().replace("--delay-wgrad-compute: true", "")
    fp8 = "  --fp8-format: hybrid\n  --fp8-recipe: tensorwise\n  --fp8-param-gather: true\n"
    path = config.parent / "fp8.yaml"
    path.write_text(text.replace("  --bf16: true\n", "  --bf16: true\n" + fp8))
    g = megatron_geometry(read_megatron_args(path))
    sharding = Sharding(1, 8, 2, 1, 4, fp8=True)
    buckets = fsdp_buckets(g, sharding, "optim_grads_params")
    sizes = [(b.layer, b.expert, b.fp8, b.size, b.real) for b in buckets]
    assert sizes == [
        (-1, False, False, 51_515_392, OUTSIDE),
        (0, False, False, 1_408, 1_408),
        (0, False, True, 4_554_752, 4_554_752),
        (1, False, False, 8_192, 5_504),
        (1, False, True, 2_981_888, 2_981_888),
        (1, True, True, 6_291_456, 6_291_456),
    ]
    # the last rank (DP index 7, expert index 3): uint8 4,554,752 / 8 + 2,981,888 / 8 +
    # 6,291,456 / 4 = 2,514,944; bf16 6,439,424 + 176 + 1,024 = 6,440,624; 22 FP8 weights
    # (5 + 5 latent projections, fc1, fc2, the shared expert's two, 4 experts' two each)
    # of its gradient shard and stepped elements, the FP8 buckets' (no padding in them)
    held = fsdp_static(buckets, sharding, "optim_grads_params", 7, 3)
    assert (held.fp8_gradients, held.fp8_stepped) == (2_514_944, 2_514_944)
    c = price_step(describe_megatron(path, world_size=8, device="h100", rank="last"), "tight")
    static = c.static.components  # type: ignore[union-attr]
    assert static["weights"] == 2 * 6_440_624 + 2_514_944
    assert static["gradient_buffer"] == 4 * (6_440_624 + 2_514_944)
    assert static["fp8_scale_inverses"] == 22 * 512
