"""Every golden cell and control, under every policy, prices exactly as it did before
the package was split into stages (issue 9: the move must not change behaviour).

``data/estimates_before_layout.csv`` was written by the pre-move code (commit
"Snapshot every golden cell's and control's estimate...") and is never regenerated:
a deliberate change to a policy's figures deletes or updates rows here in the same
commit, with the reason in its message.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from cpmem.gate.controls import control_grid
from cpmem.gate.samples import cell_inputs
from cpmem.golden.cells import load_cells
from cpmem.pricing.estimate import Estimate
from cpmem.pricing.registry import policy_names, price

SNAPSHOT = Path(__file__).resolve().parent / "data" / "estimates_before_layout.csv"


def _snapshot() -> dict[tuple[str, str, str], dict[str, str]]:
    with SNAPSHOT.open(newline="", encoding="utf-8") as fh:
        return {(r["kind"], r["id"], r["policy"]): r for r in csv.DictReader(fh)}


def _row(est: Estimate) -> dict[str, str]:
    return {
        "estimate_bytes": str(est.estimate_bytes),
        "forward_backward_bytes": str(est.forward_backward_bytes or ""),
        "busiest_rank": str(est.busiest_rank),
        "busiest_tokens": str(est.busiest_tokens),
        "per_rank_bytes": "+".join(map(str, est.per_rank_bytes)),
        "components": json.dumps(est.components, sort_keys=True, separators=(",", ":")),
    }


SNAP = _snapshot()


def test_snapshot_covers_every_cell_control_and_policy() -> None:
    policies = policy_names()
    assert {p for (_, _, p) in SNAP} == set(policies)
    cells = {c.cell_id for c in load_cells()}
    controls = {r.control_id for r in control_grid()}
    assert {i for (k, i, _) in SNAP if k == "cell"} == cells
    # controls added to the grid after the move are pinned by golden/controls alone
    snapped = {i for (k, i, _) in SNAP if k == "control"}
    assert snapped <= controls and len(snapped) == 702
    assert len(SNAP) == (len(cells) + len(snapped)) * len(policies)


@pytest.mark.parametrize("policy", policy_names())
def test_every_golden_cell_prices_as_before(policy: str) -> None:
    changed = []
    for cell in load_cells():
        want = SNAP["cell", cell.cell_id, policy]
        got = _row(price(cell_inputs(cell), policy))
        if any(got[k] != want[k] for k in got):
            changed.append(cell.cell_id)
    assert changed == []


@pytest.mark.parametrize("policy", policy_names())
def test_every_control_prices_as_before(policy: str) -> None:
    changed = []
    for req in control_grid():
        if ("control", req.control_id, policy) not in SNAP:
            continue
        want = SNAP["control", req.control_id, policy]
        got = _row(req.price(policy))
        if any(got[k] != want[k] for k in got):
            changed.append(req.control_id)
    assert changed == []
