"""The optimizer's state cpmem prices, held to megatron-core 0.16's own source.

- SGD keeps a momentum buffer: ``OptimizerConfig.sgd_momentum`` defaults to 0.9, so
  ``torch.optim.SGD`` allocates one fp32 buffer per parameter at its first step
  (``MOMENT_BYTES["sgd"]``, 4 B); Adam two (``exp_avg``, ``exp_avg_sq``: 8 B).
- The distributed optimizer shards over the data-parallel x context-parallel group
  (``intra_dp_cp`` in ``megatron/core/optimizer/__init__.py``), which
  ``cpmem.pricing.static.optimizer_shards`` restates.
"""

from __future__ import annotations

import inspect

import pytest

pytest.importorskip("megatron.core")

import megatron.core.optimizer as optimizer
from megatron.core.optimizer.optimizer_config import OptimizerConfig

from cpmem.plan.layout import ParallelLayout
from cpmem.pricing.static import MOMENT_BYTES, optimizer_shards


def test_sgd_keeps_megatrons_default_momentum_and_adam_two_moments() -> None:
    assert OptimizerConfig().sgd_momentum > 0
    fp32 = 4
    assert {"adam": 2 * fp32, "sgd": fp32, "none": 0} == MOMENT_BYTES


def test_the_distributed_optimizer_shards_over_dp_x_cp() -> None:
    source = inspect.getsource(optimizer)
    assert "intra_dp_cp" in source  # the group megatron-core builds its optimizer over
    assert optimizer_shards(ParallelLayout(cp=2, dp=4)) == 8
    assert optimizer_shards(ParallelLayout(tp=4, dp=2)) == 2  # TP ranks hold other shards
