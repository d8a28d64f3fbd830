"""Torch FSDP2's sharding rule (``cpmem.pricing.torch_fsdp2``: a rank's padded chunk of
``ceil(dim0 / ranks)`` rows and its real rows) held against PyTorch's own ``fully_shard``
(the installed torch), run on the CPU over a fake process group of 3 and of 4 ranks at
the first and the last rank, on every distinct tensor shape of the tiny GPT's units (the
rule tests' 8-layer model, untied; ``tests.unit.megatron_lm.tiny``) and of a model with
dims that do not divide (a 1-row gate, 7 rows, 5 rows). What ``fully_shard`` allocates
is read from its ``FSDPParam``: ``_sharded_param_data`` (the padded chunk the rank keeps)
and the sharded parameter's local tensor (the view the optimizer copies)."""

from __future__ import annotations

import pytest

from cpmem.megatron.args import parse_megatron_args
from cpmem.pricing.fsdp_units import Tensor
from cpmem.pricing.torch_fsdp2 import fsdp2_units, padded_shard, real_shard
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
