"""cpmem's static weights against the parameters the rank simulator builds.

The simulator (oracles/rank_sim) builds every layer of a model with megatron-core's
parallel linears on a fake TP group, its LoRA adapters and its output layer, under fake
tensors; counting their elements is an independent count of what cpmem.pricing.weights
and cpmem.pricing.static compute from the geometry.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from torch._subclasses.fake_tensor import FakeTensorMode

from cpmem.model.presets import get_preset
from cpmem.plan.layout import ParallelLayout
from cpmem.pricing.static import adapter_parameters
from cpmem.pricing.weights import WEIGHT_BYTES, rank_weights
from cpmem.step.trainer import Adapter
from oracles.rank_sim.adapters import AdapterSpec
from oracles.rank_sim.geometry import get_model
from oracles.rank_sim.head import Head, HeadSpec
from oracles.rank_sim.layers import RankContext, _config, build_layers
from oracles.rank_sim.layout import GdnPiece, RankLayout
from oracles.rank_sim.recompute import Recompute
from oracles.rank_sim.runner import init_groups, release_groups

warnings.filterwarnings("ignore")
ADAPTER_NAMES = ("lora_a", "lora_b", "fc1_a", "fc1_b", "fc2_a", "fc2_b")


def simulated_parameters(name: str, tp: int, ep: int, rank: int) -> dict[str, Any]:
    """Elements of the simulator's frozen layers, adapters and output layer on one rank."""
    model = get_model(name)
    layout = RankLayout(tp, 1, 0, (64,), (64,), (GdnPiece(64),), 64, True)
    group = init_groups(tp, 1, 0, 0)
    try:
        with FakeTensorMode(allow_non_fake_inputs=True):
            ctx = RankContext(
                model, layout, Recompute.parse("selective", "core_attn"), False, group,
                ep=ep, adapters=AdapterSpec.parse(rank, 0.0, "all"),
            )  # fmt: skip
            named = list(build_layers(ctx).named_parameters())
            head = Head(ctx, _config(model, layout), HeadSpec.parse("logits"))
            output = sum(p.numel() for p in head.parameters())
    finally:
        release_groups()
    return {
        "base": sum(p.numel() for n, p in named if not n.endswith(ADAPTER_NAMES)),
        "adapters": sum(p.numel() for n, p in named if n.endswith(ADAPTER_NAMES)),
        "output": output,
    }


@pytest.mark.parametrize(
    ("name", "tp", "ep"),
    [
        ("qwen3-1.7b", 1, 1),
        ("qwen3-1.7b", 2, 1),
        ("qwen3.5-4b", 2, 1),
        ("qwen3.5-27b", 4, 1),
        ("qwen3.5-35b-a3b", 4, 4),
    ],
)
def test_weights_and_adapters_are_the_simulators_parameters(name: str, tp: int, ep: int) -> None:
    sim = simulated_parameters(name, tp, ep, rank=16)
    geometry, layout = get_preset(name), ParallelLayout(tp=tp, sp=tp > 1, ep=ep)
    weights = rank_weights(geometry, layout)
    assert weights.layers == sim["base"] * WEIGHT_BYTES
    assert adapter_parameters(geometry, Adapter(16), layout) == sim["adapters"]
    # the simulator's output layer carries the final norm
    assert (weights.embedding + weights.final_norm) == sim["output"] * WEIGHT_BYTES
