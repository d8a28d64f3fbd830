"""The request-path check: every measured cell planned from its request, not its layout.

The recorded-layout check (``coverage``) prices each cell from the layout the runtime
recorded. A user who only has a request (lengths, a shared prefix, TP, CP) gets the
default planner's layout instead; if that layout puts fewer tokens on the busiest rank
than the runtime did, the estimate under-prices. This check plans every measured cell
from its request with the default planner, prices it with the policy under test, and
requires it to cover the measured forward peak, as ``coverage`` does. It reports the
planned against the recorded busiest count of every cell.

The request: the cell's lengths, its TP / SP / CP / EP, and its shared prefix where the
runtime stored the prefix once (prefix sharing is the runtime's decision,
docs/layout.md): where the shared packed row, padded to TP, is the recorded packed
count. Elsewhere the sequences are priced unshared, as the runtime packed them.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from cpmem.api import load_model
from cpmem.gate.estimator import Estimator
from cpmem.gate.samples import cell_routing, is_measured
from cpmem.golden.cells import MeasuredCell
from cpmem.plan.layout import ParallelLayout, round_up
from cpmem.plan.planners import plan_request
from cpmem.plan.request import Request
from cpmem.pricing.inputs import PricingInput
from cpmem.pricing.recompute import Recompute


def runtime_prefix(cell: MeasuredCell) -> int:
    """The cell's shared prefix where the runtime stored it once, else 0."""
    lengths = cell.lengths_list
    if not cell.shared_prefix or len(lengths) < 2:
        return 0
    shared = sum(lengths) - cell.shared_prefix * (len(lengths) - 1)
    return cell.shared_prefix if round_up(shared, cell.tp) == cell.packed_tokens else 0


def cell_request(cell: MeasuredCell) -> Request:
    """The request behind a cell, with the prefix shared only where the runtime shared it."""
    return Request.shared(list(cell.lengths_list), runtime_prefix(cell))


def request_inputs(cell: MeasuredCell, planner: str | None = None) -> PricingInput:
    """The cell planned from its request with ``planner`` (default: the model's default)."""
    geometry = load_model(cell.model)
    layout = ParallelLayout(tp=cell.tp, cp=cell.cp, sp=cell.sequence_parallel, ep=cell.ep)
    return PricingInput(
        geometry=geometry,
        plan=plan_request(cell_request(cell), layout, planner, geometry),
        recompute=Recompute.parse(cell.mode, cell.modules or None),
        compiled=cell.compiled,
        moe_routing=cell_routing(cell),
    )


def request_path(
    cells: Sequence[MeasuredCell], est: Estimator, planner: str | None = None
) -> dict[str, Any]:
    """Coverage of every measured cell's forward peak from its planned request (``planner``
    None: the default planner, the one the gate holds to this check)."""
    rows: list[dict[str, Any]] = []
    for c in cells:
        if not is_measured(c):
            continue
        assert c.forward_peak_bytes is not None
        inputs = request_inputs(c, planner)
        e = est.price(inputs).estimate_bytes
        plan = inputs.plan
        rows.append(
            {
                "cell_id": c.cell_id,
                "cp": c.cp,
                "planner": plan.planner,
                "shared_prefix": runtime_prefix(c),
                "planned_busiest_tokens": plan.busiest_tokens,
                "recorded_busiest_tokens": c.retained_tokens,
                "planned_packed_tokens": plan.packed_tokens,
                "recorded_packed_tokens": c.packed_tokens,
                "estimate_bytes": e,
                "forward_peak_bytes": c.forward_peak_bytes,
                "headroom": e / c.forward_peak_bytes - 1,
                "covered": e >= c.forward_peak_bytes,
            }
        )
    cp_rows = [r for r in rows if r["cp"] > 1]
    differ = [
        r["cell_id"] for r in cp_rows if r["planned_busiest_tokens"] != r["recorded_busiest_tokens"]
    ]
    heads = [r["headroom"] for r in rows]
    failing = [r["cell_id"] for r in rows if not r["covered"]]
    return {
        "passed": not failing,
        "cells": len(rows),
        "cp_cells": len(cp_rows),
        "busiest_matching": len(cp_rows) - len(differ),
        "busiest_differing": differ,
        "min_headroom": min(heads) if heads else None,
        "median_headroom": statistics.median(heads) if heads else None,
        "failing": failing,
        "rows": rows,
    }
