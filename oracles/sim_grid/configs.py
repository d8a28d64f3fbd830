"""Every grid of the simulated grid in generation order (``everything``) and by
configuration id (``by_id``): the dense, MoE, trainer and pipeline grids
(``oracles.sim_grid.grid``), then the model families' (``oracles.sim_grid.families``).
Pure data: no torch, no cpmem.
"""

from __future__ import annotations

from oracles.sim_grid.families import family_balanced_grid, family_ep1_grid, family_grid
from oracles.sim_grid.grid import GridConfig, grid, moe_grid, pipeline_grid, trainer_grid


def by_id() -> dict[str, GridConfig]:
    return {c.config_id: c for c in everything()}


def everything() -> list[GridConfig]:
    """Every grid's configurations in generation order."""
    return (
        grid()
        + moe_grid()
        + trainer_grid()
        + pipeline_grid()
        + family_grid()
        + family_balanced_grid()
        + family_ep1_grid()
    )
