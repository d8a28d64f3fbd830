"""The rank simulator's validation lays each golden cell out itself (an oracle imports
nothing of cpmem): its busiest rank's counts (``validation.cell_layout``) and its packed
row's prefix (``layout.row_segments``: stored once or not) must be the ones cpmem's step
description gives the same cell (``cpmem.samples.cells.cell_step``, whose prefix rule is
``Request.as_packed``), or the simulator would validate a different step than cpmem
prices."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from cpmem.golden.cells import load_cells
from cpmem.samples.cells import cell_step
from oracles.rank_sim.validation import cell_layout, read_cells, segments

SIM_CELLS, _ = read_cells()
CPMEM_CELLS = {c.cell_id: c for c in load_cells()}


def test_every_expressible_cell_is_compared() -> None:
    assert len(SIM_CELLS) >= 60
    assert {c.cell_id for c in SIM_CELLS} <= set(CPMEM_CELLS)


@pytest.mark.parametrize("cell", SIM_CELLS, ids=lambda c: c.cell_id)
def test_the_simulator_lays_the_cell_out_as_cpmem_does(cell: object) -> None:
    step = cell_step(CPMEM_CELLS[cell.cell_id])  # type: ignore[attr-defined]
    layout = cell_layout(cell)  # type: ignore[arg-type]
    # the simulated rank (rank 0) is the busiest, at the token count cpmem prices (a TP
    # rank's share padded to TP: the simulator lays out the padded row)
    tp = step.plan.layout.tp
    assert -(-layout.attention_tokens[0] // tp) * tp == step.plan.busiest_tokens
    assert layout.logical_tokens == step.plan.logical_tokens
    # the prefix stored once: one root segment with the completions as its children
    rows = segments(cell)  # type: ignore[arg-type]
    sim_shared = any(parent is not None for _, parent in rows)
    assert sim_shared == (step.plan.grad_segments > len(cell.lengths))  # type: ignore[attr-defined]
