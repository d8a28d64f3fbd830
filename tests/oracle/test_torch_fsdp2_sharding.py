"""Torch FSDP2's sharding rule (``cpmem.pricing.torch_fsdp2``: a rank's padded chunk of
``ceil(dim0 / ranks)`` rows and its real rows) held against PyTorch's own ``fully_shard``
(the installed torch), run on the CPU over a fake process group of 3 and of 4 ranks at
the first and the last rank, on every distinct tensor shape of the tiny GPT's units (the
rule tests' 8-layer model, untied; ``tests.unit.megatron_lm.tiny``) and of a model with
dims that do not divide (a 1-row gate, 7 rows, 5 rows). What ``fully_shard`` allocates
is read from its ``FSDPParam``: ``_sharded_param_data`` (the padded chunk the rank keeps)
and the sharded parameter's local tensor (the view the optimizer copies)."""

from __future__ import annotations

from typing import Any

import pytest

from cpmem.megatron.args import parse_megatron_args
from cpmem.pricing.fsdp_units import Tensor
from cpmem.pricing.torch_fsdp2 import (
    Units,
    fsdp2_in_flight,
    fsdp2_units,
    gathered,
    padded_shard,
    real_shard,
)
from oracles.rank_sim.runner import release_groups
from tests.unit.megatron_lm.tiny import FLAGS, step_of

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
fake_pg = pytest.importorskip("torch.testing._internal.distributed.fake_pg")
fsdp = pytest.importorskip("torch.distributed.fsdp")

FSDP2 = {
    **FLAGS,
    "--bf16": True,
    "--use-torch-fsdp2": True,
    "--no-gradient-accumulation-fusion": True,
    "--untie-embeddings-and-output-weights": True,
}
ODD = [Tensor(512, 512), Tensor(7 * 3, 3), Tensor(5)]


def _shapes() -> list[Tensor]:
    g = step_of(parse_megatron_args(FSDP2), world_size=4).geometry
    return sorted(set(fsdp2_units(g, 1).tensors()) | set(ODD), key=lambda t: (t.numel, t.width))


def _sharded(tensors: list[Tensor], ranks: int, rank: int) -> list[tuple[int, int]]:
    """(padded, real) elements ``fully_shard`` gives ``rank`` of ``ranks`` per tensor."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp._fully_shard._fsdp_state import _get_module_fsdp_state

    # another oracle test in this worker may have left its world (a one-rank gloo group, or
    # megatron's model-parallel groups) initialised: tear it down as the rank simulator's
    # runner does; the tests that need it initialise it again
    release_groups()
    dist.init_process_group("fake", rank=rank, world_size=ranks, store=fake_pg.FakeStore())
    try:
        mesh = init_device_mesh("cpu", (ranks,))
        module = torch.nn.Module()
        module.params = torch.nn.ParameterList(
            torch.nn.Parameter(
                torch.empty(t.numel // t.width, t.width, device="meta", dtype=torch.bfloat16)
            )
            for t in tensors
        )
        fsdp.fully_shard(module, mesh=mesh)
        group = _get_module_fsdp_state(module)._fsdp_param_group
        return [
            (p._sharded_param_data.numel(), p.sharded_param.to_local().numel())
            for p in group.fsdp_params
        ]
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("ranks", [3, 4])
def test_the_chunks_are_fully_shards(ranks: int) -> None:
    tensors = _shapes()
    for rank in (0, ranks - 1):
        expected = [(padded_shard(t, ranks), real_shard(t, ranks, rank)) for t in tensors]
        assert _sharded(tensors, ranks, rank) == expected


H, V, F, LAYERS = 64, 1000, 200, 3
"""The toy GPT the in-flight check runs: a 1000-row table, three layers of a 200-wide
MLP, a final norm and an untied output, none of whose rows divide by 3 (the padding
``fully_shard`` adds is in every buffer)."""


def _toy_units() -> Units:
    layer = (Tensor(F * H, H), Tensor(F), Tensor(H * F, F), Tensor(H))
    return Units(
        ((Tensor(V * H, H),), *([layer] * LAYERS), (Tensor(V * H, H),)),
        (Tensor(H), Tensor(H)),
    )


def _measured_in_flight(ranks: int) -> tuple[int, int]:
    """The most bytes of gathered weights, gathered gradients, all-gather and
    reduce-scatter buffers ``FSDPMemTracker`` records at any unit's forward and backward
    hooks (and its peaks), over one forward and backward of the toy in bf16 on ``ranks``
    fake ranks, every unit resharded after its forward as Megatron-LM asks."""
    from torch.distributed._tools.fsdp2_mem_tracker import (
        FSDPMemTracker,
        _FSDPModState,
        _FSDPRefType,
    )
    from torch.distributed.device_mesh import init_device_mesh

    class Layer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.fc2 = torch.nn.Linear(H, F), torch.nn.Linear(F, H)

        def forward(self, x: Any) -> Any:
            return x + self.fc2(torch.relu(self.fc1(x)))

    class Toy(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = torch.nn.Embedding(V, H)
            self.layers = torch.nn.ModuleList(Layer() for _ in range(LAYERS))
            self.norm = torch.nn.LayerNorm(H)
            self.out = torch.nn.Linear(H, V, bias=False)

        def forward(self, tokens: Any) -> Any:
            x = self.emb(tokens)
            for layer in self.layers:
                x = layer(x)
            return self.out(self.norm(x)).float().sum()

    dist.init_process_group("fake", rank=0, world_size=ranks, store=fake_pg.FakeStore())
    try:
        mesh = init_device_mesh("cpu", (ranks,))
        model = Toy().to(torch.bfloat16)
        for unit in (model.emb, *model.layers, model.out, model):
            fsdp.fully_shard(unit, mesh=mesh, reshard_after_forward=True)
        tokens = torch.zeros(1, 1, dtype=torch.long)
        tracker = FSDPMemTracker(model)
        tracker.track_inputs((tokens,))
        with tracker:
            model(tokens).backward()
        kinds = {
            _FSDPRefType.UNSHARDED_PARAM,
            _FSDPRefType.UNSHARDED_GRAD,
            _FSDPRefType.ALL_GATHER,
            _FSDPRefType.REDUCE_SCATTER,
        }
        forward = backward = 0
        for stats in tracker.memory_tracking.values():
            for state, snapshots in stats.snapshots.items():
                held = max(
                    sum(v for k, v in snap[torch.device("cpu")].items() if k in kinds)
                    for snap in snapshots
                )
                if state.name.endswith("_FW"):
                    forward = max(forward, held)
                else:
                    assert state.name.endswith("_BW"), state
                    backward = max(backward, held)
        assert _FSDPModState.PEAK_BW in next(iter(tracker.memory_tracking.values())).snapshots
        return forward, backward
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("ranks", [3, 4])
def test_the_in_flight_bound_holds_fully_shards_buffers(ranks: int) -> None:
    """The bound (``fsdp2_in_flight``, bf16) covers what ``fully_shard`` holds at each
    recorded moment, and is reached within the root's few hundred bytes: the forward's
    worst is a unit's flat buffer beside its copy, the backward's a layer's weights and
    gradients with the unit before it gathered ahead and the reduce-scatter input kept."""
    forward, backward = _measured_in_flight(ranks)
    bound = fsdp2_in_flight(_toy_units(), ranks)
    root = gathered(_toy_units().root, ranks)
    assert forward <= 2 * bound.forward <= forward + 2 * root
    assert backward <= 2 * bound.backward <= backward + 2 * 3 * root
