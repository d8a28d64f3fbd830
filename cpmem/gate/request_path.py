"""The request-path check: every measured cell planned from its request, not its layout.

The recorded-layout check (``coverage``) prices each cell from the layout the runtime
recorded. A user who only has a request (lengths, a shared prefix, TP, CP) gets the
default planner's layout instead; if that layout puts fewer tokens on the busiest rank
than the runtime did, the estimate under-prices. This check plans every measured cell
from its request with the default planner, prices it with the policy under test, and
requires it to cover the measured forward peak, as ``coverage`` does. It reports the
planned against the recorded busiest count of every cell.

The request: the cell's lengths, its settings (TP / SP / CP / EP, recompute, execution,
whether its process was warm), and its shared prefix where the runtime stored the
prefix once (``Request.as_packed``: prefix sharing is the runtime's decision,
docs/layout.md). Elsewhere the sequences are priced unshared, as the runtime packed them.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from cpmem.errors import InputError
from cpmem.gate.estimator import Estimator
from cpmem.golden.cells import MeasuredCell
from cpmem.plan.request import Request
from cpmem.samples.cells import cell_settings, is_measured
from cpmem.step.describe import describe_step
from cpmem.step.step import Step


def cell_request(cell: MeasuredCell) -> Request:
    """The request behind a cell, with the prefix shared only where the runtime shared it
    (``Request.as_packed``, the rule ``cell_step`` applies)."""
    return Request.as_packed(cell.lengths_list, cell.shared_prefix, cell.packed_tokens, cell.tp)


def runtime_prefix(cell: MeasuredCell) -> int:
    """The cell's shared prefix where the runtime stored it once, else 0."""
    return cell.shared_prefix if len(cell_request(cell).trees) < len(cell.lengths_list) else 0


def request_step(cell: MeasuredCell, planner: str | None = None) -> Step:
    """The cell planned from its request with ``planner`` (default: the model's default),
    under the settings it ran with (``cell_settings``: its cold flag included)."""
    settings = cell_settings(cell)
    settings["planner"] = planner
    return describe_step(cell.model, request=cell_request(cell), **settings)


def request_path(
    cells: Sequence[MeasuredCell], est: Estimator, planner: str | None = None
) -> dict[str, Any]:
    """Coverage of every measured cell's forward peak from its planned request (``planner``
    None: the default planner, the one the gate holds to this check)."""
    rows: list[dict[str, Any]] = []
    refused: dict[str, str] = {}
    for c in cells:
        if not is_measured(c):
            continue
        assert c.forward_peak_bytes is not None
        try:
            step = request_step(c, planner)
        except InputError as exc:  # what estimate refuses for this request and planner
            refused[c.cell_id] = str(exc)
            continue
        e = est.price(step).estimate_bytes
        plan = step.plan
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
    failing = [r["cell_id"] for r in rows if not r["covered"]] + list(refused)
    return {
        "passed": not failing,
        "cells": len(rows) + len(refused),
        "refused": refused,
        "cp_cells": len(cp_rows),
        "busiest_matching": len(cp_rows) - len(differ),
        "busiest_differing": differ,
        "min_headroom": min(heads) if heads else None,
        "median_headroom": statistics.median(heads) if heads else None,
        "failing": failing,
        "rows": rows,
    }
