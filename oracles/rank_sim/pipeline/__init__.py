"""Pipeline stages: one stage of one rank running megatron's schedule over M micro-batches
(``stage.py``; the schedule in ``schedule.py``, what a run reports in ``result.py``;
README.md "Pipeline stages").

A subpackage, not a top-level module: the single-rank validation report's freshness
digest (``validation.inputs_digest``) covers the top-level modules it runs, and nothing
here feeds that report.
"""

from oracles.rank_sim.pipeline.result import StageOp, StagePeak, StageResult
from oracles.rank_sim.pipeline.schedule import (
    Schedule,
    check_pipeline,
    stage_layer_counts,
    stage_schedule,
)
from oracles.rank_sim.pipeline.stage import simulate_stage

__all__ = [
    "Schedule",
    "StageOp",
    "StagePeak",
    "StageResult",
    "check_pipeline",
    "simulate_stage",
    "stage_layer_counts",
    "stage_schedule",
]
