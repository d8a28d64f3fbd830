"""``--delay-wgrad-compute``'s weight-gradient store (``cpmem.pricing.delayed_wgrad``) on
Megatron-LM's ``deepseek_proxy_fsdp_ep2_fsdp2_ep_overlap`` (``test_fsdp_moe`` reads its
shapes), each figure worked out by hand from the layers' linears.

Output gradients per token at TP 1 (every linear whole): latent attention's q_down 256,
q_up 8 x 192 = 1,536, kv_down 128 + 64 = 192, kv_up 8 x (128 + 128) = 2,048 and
linear_proj 512: 4,544; with the MoE layer's shared expert (fc1 2 x 1,024, fc2 512) the
``attn`` node holds 7,104. The dense layer's ``mlp`` node: fc1 2 x 2,048 + fc2 512 =
4,608. A routed expert's row: fc1 2 x 1,024 + fc2 512 = 2,560, at 8 rows per token
(top-4 of 4 local experts, from both EP ranks' tokens) in the worst case and 4 x 2 / 2 =
4 balanced: 20,480 and 10,240. The rank's 4 x 1,024 = 4,096 tokens in bf16.
"""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction
from pathlib import Path

import pytest

from cpmem.api import describe_megatron, price_step
from cpmem.errors import InputError
from cpmem.megatron.args import read_megatron_args
from cpmem.megatron.describe import megatron_geometry
from cpmem.pricing.delayed_wgrad import attn_node_width, delayed_wgrad_bytes, mlp_node_width
from cpmem.step.step import Step

ROOT = Path(__file__).resolve().parents[3]
CASE = ROOT / "golden/megatron/cases/moe/deepseek_proxy_fsdp_ep2_fsdp2_ep_overlap/model_config.yaml"
TOKENS = 4 * 1024


def _step(tmp_path: Path, routing: str, delay: bool = True) -> Step:
    text = CASE.read_text()
    if not delay:
        text = text.replace("--delay-wgrad-compute: true", "")
    config = tmp_path / f"{routing}{delay}.yaml"
    config.write_text(text)
    step = describe_megatron(config, world_size=8, device="h100", rank="last")
    return replace(step, settings=replace(step.settings, moe_routing=routing))


@pytest.mark.parametrize(
    ("routing", "width"), [("concentrated", 8 * 2_560), ("balanced", 4 * 2_560)]
)
def test_the_widest_node_is_held_through_a_layers_backward(
    tmp_path: Path, routing: str, width: int
) -> None:
    step = _step(tmp_path, routing)
    assert step.settings.runtime.delay_wgrad
    # the experts' node is wider than either attn node (4,544; 7,104) and the dense MLP
    assert delayed_wgrad_bytes(step, TOKENS) == TOKENS * 2 * width


def test_the_nodes_output_gradients() -> None:
    g = megatron_geometry(read_megatron_args(CASE))
    assert attn_node_width(g, 1, 1, moe=False) == 4_544
    assert attn_node_width(g, 1, 1, moe=True) == 7_104
    assert mlp_node_width(g, 1, 1, False, Fraction(0), 1) == 4_608
    assert mlp_node_width(g, 1, 1, True, Fraction(8), 1) == 20_480
    # TP 2 under SP: the down projections on the sequence shard (256 / 2, 192 / 2), the
    # column-parallel ones split (1,536 / 2, 2,048 / 2, the shared fc1 2,048 / 2, the
    # dense fc1 4,096 / 2), the row-parallel ones whole (512, gathered)
    assert attn_node_width(g, 2, 2, moe=True) == 128 + 768 + 96 + 1_024 + 512 + 1_024 + 512
    assert mlp_node_width(g, 2, 2, False, Fraction(0), 1) == 2_048 + 512


def test_the_store_is_priced_at_the_layers_backward(tmp_path: Path) -> None:
    delayed = price_step(_step(tmp_path, "concentrated"), "tight")
    plain = price_step(_step(tmp_path, "concentrated", delay=False), "tight")
    assert delayed.layers_backward_bytes is not None and plain.layers_backward_bytes is not None
    assert delayed.layers_backward_bytes - plain.layers_backward_bytes == TOKENS * 2 * 20_480
    # one micro-batch: the head's backward holds more than the layers' with the store and
    # FSDP's gradient buckets, so the figure does not move
    assert delayed.forward_backward_bytes == plain.forward_backward_bytes


def test_several_micro_batches_at_pp1_are_refused(tmp_path: Path) -> None:
    # 64 / (4 x DP 8) = 2 micro-batches: the combined schedule runs the second's forward
    # beside the first's backward, which PP 1's one-at-a-time pricing does not hold
    config = tmp_path / "model_config.yaml"
    config.write_text(
        CASE.read_text().replace("--global-batch-size: 32", "--global-batch-size: 64")
    )
    with pytest.raises(InputError) as err:
        describe_megatron(config, world_size=8, device="h100", rank="last")
    assert err.value.value == (
        "--delay-wgrad-compute with 2 micro-batches at --pipeline-model-parallel-size 1"
    )
    assert "weight-gradient store" in err.value.reason
