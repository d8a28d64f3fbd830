"""Megatron FSDP of an MTP depth (``cpmem.pricing.fsdp_units``, ``cpmem.pricing.fsdp``),
each figure worked out by hand from megatron-core at the snapshot d98e8a64: the depth's
``mtp_model_layer`` is a ``TransformerLayer`` (multi_token_prediction.py:1220-1228), so an
FSDP unit (mcore_fsdp_adapter.py:163-173), after the decoder's; its ``enorm``, ``hnorm``
(:1157-1167), ``eh_proj`` (``2H -> H`` column-parallel, no bias, :1174-1187) and
``final_layernorm`` (:1247-1251) are in no unit, so they join the outside-unit group
(param_and_grad_buffer.py:1787-1830: one group per unit id, ``None`` for them all).

The case is ``test_fsdp_moe``'s proxy (2 layers, a dense one then an MoE one, hidden 512,
EP 2 on 8 GPUs) with ``--mtp-num-layers 1``: its depth's layer is the decoder's last layer
spec, an MoE block.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cpmem.api import describe_megatron, price_step
from cpmem.megatron.args import read_megatron_args
from cpmem.megatron.describe import megatron_geometry
from cpmem.pricing.fsdp import Sharding, fsdp_buckets, fsdp_static
from cpmem.pricing.fsdp_units import outside_tensors, unit_count

ROOT = Path(__file__).resolve().parents[3]
CASE = ROOT / "golden/megatron/cases/moe/deepseek_proxy_fsdp_ep2_fsdp2_ep_overlap/model_config.yaml"
VOCAB = 50_304 * 512  # GPT-2's 50,257 tokens padded to 64, rows of 512
# the depth outside every unit: enorm, hnorm and the final norm (RMSNorm: 512 each) and
# eh_proj [512, 1024] = 524,288 (rows of 1024)
MTP_OUTSIDE = 3 * 512 + 524_288


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    text = CASE.read_text().replace("--delay-wgrad-compute: true", "--mtp-num-layers: 1")
    path = tmp_path_factory.mktemp("proxy_mtp") / "model_config.yaml"
    path.write_text(text)
    return path


def test_the_depth_is_a_unit_and_its_projection_is_outside(config: Path) -> None:
    g = megatron_geometry(read_megatron_args(config))
    assert unit_count(g) == 3
    outside = outside_tensors(g, 1)
    # named_parameters order: embedding, final norm, enorm, hnorm, eh_proj, the depth's
    # final norm, the untied output layer
    assert [t.numel for t in outside] == [VOCAB, 512, 512, 512, 524_288, 512, VOCAB]
    assert outside[4].width == 1024
    buckets = fsdp_buckets(g, Sharding(1, 8, 2, 1, 4), "optim_grads_params")
    # outside: chunk 1024 (eh_proj's row; the vocabulary's 512 divides it, 25,152 chunks
    # each), 524,288 + 2 x 25,755,648 + 4 x 512 = 52,037,632, padded to 8 x 1024:
    # 6,353 x 8,192 = 52,043,776. The depth's unit: test_fsdp_moe's MoE layer's buckets
    sizes = [(b.layer, b.expert, b.size, b.real) for b in buckets]
    assert sizes == [
        (-1, False, 52_043_776, 2 * VOCAB + 512 + MTP_OUTSIDE),
        (0, False, 4_571_136, 4_556_160),
        (1, False, 2_990_080, 2_987_392),
        (1, True, 6_291_456, 6_291_456),
        (2, False, 2_990_080, 2_987_392),
        (2, True, 6_291_456, 6_291_456),
    ]
    # the last rank (DP index 7, expert index 3): 6,505,472 + 571,392 + 2 x 373,760 (of 8)
    # + 2 x 1,572,864 (of 4) = 10,970,112 held; the outside bucket kept gathered whole
    held = fsdp_static(buckets, Sharding(1, 8, 2, 1, 4), "optim_grads_params", 7, 3)
    assert held.weights == 10_970_112
    assert held.kept_gathered == 52_043_776


def test_the_proxy_with_its_depth_prices(config: Path) -> None:
    step = describe_megatron(config, world_size=8, device="h100", rank="last")
    c = price_step(step, "tight").static.components
    # bf16 weights 2 x 10,970,112; the outside bucket kept gathered in bf16, 2 x 52,043,776
    assert c["weights"] == 21_940_224
    assert c["fsdp_kept_gathered"] == 104_087_552
