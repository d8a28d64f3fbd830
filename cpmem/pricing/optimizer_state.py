"""How the optimizer's states are sized and sharded: the fp32 master copy and gradient
copy per trained element, the moments per optimizer, and the ranks the distributed
optimizer shards a dense or a routed expert's state over (``cpmem.pricing.static`` lays
them out in megatron-core's buffers)."""

from __future__ import annotations

from cpmem.plan.layout import ParallelLayout
from cpmem.pricing.muon import MUON_STATE_BYTES
from cpmem.step.step import StepSettings
from cpmem.step.trainer import Optimizer

MASTER_BYTES = 4
"""The fp32 master copy of a 2-byte (bf16, fp16) trainable parameter (``master_bytes``)."""
MOMENT_BYTES = {"adam": 8, "sgd": 4, "muon": MUON_STATE_BYTES, "none": 0}
"""The optimizer's fp32 moments per trainable parameter: Adam's two, SGD's momentum
(Megatron-LM, docs "Distributed Optimizer": master + moments = 12 B for Adam), Muon's
momentum of a matrix (the vectors Muon leaves to Adam: ``cpmem.pricing.muon``)."""


def master_bytes(param_bytes: int, opt: Optimizer) -> int:
    """The optimizer's fp32 master copy per trained element: 4 B of 2-byte (bf16, fp16)
    parameters, none of fp32 ones. megatron-core 0.16.1 copies a 2-byte parameter
    (``Float16OptimizerWithFloat16Params``: ``param.detach().clone().float()``,
    optimizer.py:672-674; the distributed optimizer's shard, distrib_optimizer.py:395-399)
    and steps an fp32 one itself: without ``--fp16`` / ``--bf16`` the ``FP32Optimizer``
    (optimizer/__init__.py:419, 463-465), and under the distributed optimizer a view of
    the parameter's shard (distrib_optimizer.py:419-424)."""
    trains = opt.kind != "none"
    return MASTER_BYTES if trains and param_bytes < MASTER_BYTES else 0


def master_gradient_bytes(opt: Optimizer) -> int:
    """The fp32 copy per trained element the optimizer makes of a 2-byte ``main_grad``
    (``main_grad.float()``, optimizer.py:759; ``shard_model_grad.float()``,
    distrib_optimizer.py:2419), kept until the next ``zero_grad``; none of an fp32 one
    (``float()`` returns the buffer itself)."""
    trains = opt.kind != "none"
    return MASTER_BYTES if trains and opt.grad_bytes < MASTER_BYTES else 0


def expert_shards(settings: StepSettings) -> int:
    """The ranks the distributed optimizer shards a routed expert's state over: the
    expert data-parallel group, world / (ETP x EP x PP) (megatron's expert
    ``RankGenerator`` folds CP into it; ``intra_expt_dp_group``), divided among the
    optimizer's instances (parallel_state.py: ``intra_partial_expert_data_parallel_size``)."""
    layout = settings.layout
    edp = max(1, settings.world_size // (layout.etp * layout.ep * settings.pipeline.pp))
    return max(1, edp // settings.optimizer.instances)


def optimizer_shards(layout: ParallelLayout, instances: int = 1) -> int:
    """The ranks megatron's distributed optimizer shards a parameter's state over: its
    data-parallel x context-parallel group, since CP ranks hold the same parameters as
    data-parallel ones, divided among the optimizer's ``instances``
    (``--num-distributed-optimizer-instances``: each instance's ``intra_dp_cp_group``
    holds DP x CP / N consecutive ranks of the group, parallel_state.py; its gradients
    are reduce-scattered within the instance and all-reduced across instances in place,
    param_and_grad_buffer.py)."""
    return layout.dp * layout.cp // instances


def sharded_states(states: int, shards: int, opt: Optimizer) -> int:
    """``states`` elements on one rank: a shard of ``shards`` under the distributed
    optimizer (rounded up), all of them without it."""
    return -(-states // shards) if opt.distributed else states
