"""cpmem's restatement of Muon's precomputed layer-wise layout
(``cpmem.pricing.layer_wise_layout``) against Megatron-LM's own method at the recordings'
snapshot, run on CPU (``oracles.layer_wise_layout``: the snapshot's
``_compute_per_buffer_param_layout`` read from a git mirror of Megatron-LM; skipped
where none is found). The buffer's elements and every shard's real elements must agree
exactly: on the matrices of real models as cpmem's layer kinds list them, and on random
shapes, shard counts and bucket sizes.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oracles import layer_wise_layout as oracle

if not oracle.available():
    pytest.skip("no git mirror of Megatron-LM at the snapshot", allow_module_level=True)

from cpmem.api import load_model
from cpmem.plan.layout import ParallelLayout
from cpmem.pricing.layer_wise_layout import layer_wise_layout
from cpmem.pricing.weights import stage_tensors


def _agree(shapes: list[tuple[int, int]], shards: int, bucket: int | None) -> None:
    ours = layer_wise_layout(shapes, shards, bucket)
    theirs = oracle.megatron_layout(shapes, shards, bucket)
    assert (ours.numel, ours.shard_elements) == (theirs.numel, theirs.shard_elements)


@pytest.mark.parametrize(
    ("model", "tp", "shards"),
    [
        ("qwen3-1.7b", 1, 8),
        ("qwen3-1.7b", 2, 24),
        ("qwen3.5-4b", 1, 6),  # Gated DeltaNet beside attention
        ("moonlight-16b-a3b", 1, 16),  # latent attention, a router and a shared expert
    ],
)
def test_a_models_dense_matrices_are_laid_out_as_megatron_lays_them(
    model: str, tp: int, shards: int
) -> None:
    g = load_model(model)
    layout = ParallelLayout(tp=tp, sp=tp > 1)
    tensors = stage_tensors(g, layout, range(g.layers), first=True, last=True)
    assert tensors.dense_shapes is not None
    _agree(list(tensors.dense_shapes), shards, None)
    _agree(list(tensors.dense_shapes), shards, 40_000_000)  # Megatron-LM's default bucket


def test_a_models_routed_experts_are_laid_out_as_megatron_lays_them() -> None:
    g = load_model("moonlight-16b-a3b")
    layout = ParallelLayout(ep=8)
    tensors = stage_tensors(g, layout, range(g.layers), first=True, last=True)
    _agree(list(tensors.expert_shapes), 4, None)


shapes = st.lists(st.tuples(st.integers(1, 300), st.integers(1, 300)), min_size=1, max_size=40)


@settings(max_examples=200, deadline=None)
@given(
    shapes=shapes,
    shards=st.integers(1, 12),
    bucket=st.one_of(st.none(), st.integers(1, 200_000)),
)
def test_random_matrices_are_laid_out_as_megatron_lays_them(
    shapes: list[tuple[int, int]], shards: int, bucket: int | None
) -> None:
    _agree(shapes, shards, bucket)
