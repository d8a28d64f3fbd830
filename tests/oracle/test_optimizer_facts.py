"""The optimizer's state cpmem prices, held to megatron-core 0.16's own source.

- SGD keeps a momentum buffer: ``OptimizerConfig.sgd_momentum`` defaults to 0.9, so
  ``torch.optim.SGD`` allocates one fp32 buffer per parameter at its first step
  (``MOMENT_BYTES["sgd"]``, 4 B); Adam two (``exp_avg``, ``exp_avg_sq``: 8 B).
- Muon keeps one buffer per matrix it steps: ``muon_init_state_fn`` makes
  ``state[p]['momentum_buffer'] = torch.zeros_like(p.data)`` and nothing else
  (``megatron/core/optimizer/muon.py:208-212``; ``p`` the fp32 master under bf16), 4 B
  (``MOMENT_BYTES["muon"]``, ``cpmem.pricing.muon.MUON_STATE_BYTES``).
- The distributed optimizer shards over the data-parallel x context-parallel group
  (``intra_dp_cp`` in ``megatron/core/optimizer/__init__.py``), which
  ``cpmem.pricing.optimizer_state.optimizer_shards`` restates; with N optimizer instances over
  DP x CP / N consecutive ranks of it (``parallel_state.py:833-840``).
"""

from __future__ import annotations

import inspect

import pytest

pytest.importorskip("megatron.core")

import megatron.core.optimizer as optimizer
from megatron.core.optimizer.optimizer_config import OptimizerConfig

from cpmem.plan.layout import ParallelLayout
from cpmem.pricing.muon import MUON_STATE_BYTES
from cpmem.pricing.optimizer_state import MOMENT_BYTES, optimizer_shards


def test_sgd_keeps_megatrons_default_momentum_and_adam_two_moments() -> None:
    assert OptimizerConfig().sgd_momentum > 0
    fp32 = 4
    assert {"adam": 2 * fp32, "sgd": fp32, "muon": fp32, "none": 0} == MOMENT_BYTES


def test_muon_keeps_one_momentum_buffer_per_matrix() -> None:
    from megatron.core.optimizer import muon

    source = inspect.getsource(muon.get_megatron_muon_optimizer)
    init = source[source.index("def muon_init_state_fn") : source.index("def adam_init_state_fn")]
    assert "opt.state[p]['momentum_buffer'] = torch.zeros_like(p.data)" in init
    assert init.count("opt.state[p][") == 1  # one state tensor, the parameter's size
    assert MOMENT_BYTES["muon"] == MUON_STATE_BYTES == 4


def test_instances_split_the_dp_x_cp_group() -> None:
    from megatron.core import parallel_state

    source = inspect.getsource(parallel_state.initialize_model_parallel)
    assert (
        "(data_parallel_size * context_parallel_size) // num_distributed_optimizer_instances"
        in (" ".join(source.split()).replace("( ", "(").replace(" )", ")"))
    )
    assert optimizer_shards(ParallelLayout(cp=2, dp=4), 2) == 4


def test_the_distributed_optimizer_shards_over_dp_x_cp() -> None:
    source = inspect.getsource(optimizer)
    assert "intra_dp_cp" in source  # the group megatron-core builds its optimizer over
    assert optimizer_shards(ParallelLayout(cp=2, dp=4)) == 8
    assert optimizer_shards(ParallelLayout(tp=4, dp=2)) == 2  # TP ranks hold other shards
