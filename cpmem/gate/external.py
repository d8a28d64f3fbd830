"""Gating an estimator that is not a cpmem policy (``docs/external-estimators.md``).

Two ways in:

- ``cpmem gate --estimator package.module:function``: the function receives one
  cell's description (``describe``: a plain, JSON-ready dict) and returns its
  forward estimate in bytes (an int), or ``{"forward": int, "forward_backward": int}``;
- ``cpmem gate --estimates file.csv``: columns ``cell_id,estimate_bytes`` and
  optionally ``forward_backward_bytes``, for estimators in other languages, which
  read the descriptions written by ``cpmem golden export`` (JSON lines).

The description (``step_description``) is built from the step cpmem prices
(``cell_step``, the one conversion of a cell; ``row_step``, of a grid row), never from
the recorded row beside it: every field of the step's settings (layout, recompute,
execution flags, the head, adapters and CP comm of a trainer's step, optimizer, device,
pipeline stages) and of its plan, every micro-batch's included, so an external
estimator sees exactly what cpmem prices. It lives here, not in ``cpmem/golden``,
because it needs the model geometry and the plan.

Checks that apply: golden (the data is intact), coverage (forward, and
forward+backward when the estimator gives it), and a headroom report per model and
per recompute mode. Conformance, controls, refusals, power and targets check cpmem
policies and are reported as not applicable.

``describe_row`` describes a simulated grid row with the same keys; the simulated
tier's gate for an external estimator is ``cpmem.gate.external_simulated``.
"""

from __future__ import annotations

import csv
import dataclasses
import importlib
import json
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from cpmem.errors import InputError
from cpmem.gate.checks import coverage_summary, forward_backward_row, golden_check
from cpmem.gate.external_config import hf_config
from cpmem.golden.cells import MeasuredCell, load_cells
from cpmem.golden.files import CELLS_FILE, default_golden_dir
from cpmem.plan.request import Request
from cpmem.reports.tables import pct
from cpmem.samples.cells import cell_step, is_measured
from cpmem.samples.rows import SimRow, row_step, simulated_dir
from cpmem.step.settings import SETTINGS
from cpmem.step.step import Step, StepSettings

__all__ = [
    "ExternalEstimate",
    "describe",
    "describe_row",
    "descriptions",
    "gate_external",
    "hf_config",
    "load_estimator",
    "price_with",
    "read_estimates_csv",
    "step_description",
]

ExternalEstimate = tuple[int, int | None]  # (forward bytes, forward+backward bytes or None)
EstimatorFn = Callable[[dict[str, Any]], Any]

NOT_APPLICABLE = ("conformance", "controls", "refusals", "power", "targets")
NA_REASON = "checks a cpmem pricing policy; not applicable to an external estimator"


def _request_shape(request: Request) -> tuple[list[int], int]:
    """A request's sequence lengths and the prefix every sequence shares (the root
    segment of its one prefix tree; 0 when its sequences share nothing)."""
    trees = request.trees
    shared = trees[0].tokens if len(trees) == 1 and trees[0].children else 0
    return request.sequence_lengths, shared


def _per_rank(counts: Iterable[Sequence[int]]) -> list[int]:
    """Per CP rank, its counts summed over the plan's forward groups."""
    return [sum(col) for col in zip(*counts, strict=True)]


def _plan_keys(step: Step, lengths: Sequence[int], shared_prefix: int) -> dict[str, Any]:
    """One forward's request and plan: the keys a description and each of its
    ``microbatch_plans`` carry."""
    plan, groups = step.plan, step.plan.groups
    if step.request is not None:
        lengths, shared_prefix = _request_shape(step.request)
    return {
        "lengths": list(lengths),
        "shared_prefix": shared_prefix,
        "logical_tokens": plan.logical_tokens,
        "packed_tokens": plan.packed_tokens,
        "real_tokens": sum(g.real_tokens for g in groups),
        "rank_tokens": list(plan.rank_tokens),
        "attention_rank_tokens": _per_rank(g.attention_tokens for g in groups),
        "gdn_rank_tokens": _per_rank(g.gdn_tokens for g in groups),
        "busiest_tokens": plan.busiest_tokens,
        "segments": plan.grad_segments,
        "rank_segments": list(plan.rank_segments),
        "forward_groups": len(groups),
    }


def _runtime_settings(s: StepSettings) -> dict[str, Any]:
    """The runtime's settings other than its name, as plain JSON (its notes are prose)."""
    r = s.runtime
    out: dict[str, Any] = {
        f.name: getattr(r, f.name)
        for f in dataclasses.fields(r)
        if f.name not in ("name", "notes", "env", "backend_spread")
    }
    out["env"] = dict(r.env)
    out["backend_spread"] = list(r.backend_spread)
    return out


def _capability(s: StepSettings) -> list[int | None] | None:
    """The device's compute capability as ``[major, minor]`` (``null`` parts: unknown)."""
    if s.device is None:
        return None
    return [s.device.compute_capability_major, s.device.compute_capability_minor]


def step_description(
    step: Step,
    *,
    cell_id: str,
    model: str,
    lengths: Sequence[int] | None = None,
    shared_prefix: int = 0,
    dtype: str = "bf16",
    recorded: str = "all",
) -> dict[str, Any]:
    """``step`` as an external estimator sees it: every field of its settings and its
    plan, as plain JSON (the keys are listed in docs/external-estimators.md).

    ``lengths`` and ``shared_prefix`` are the request behind a plan the runtime fixed (a
    recorded cell or grid row: the step holds counts, not the request); a step planned
    from a request describes that request, and ``lengths`` given beside it must be its
    lengths. ``dtype`` names the recorded activation dtype and ``recorded`` says which
    CP ranks' counts were recorded (``rank_tokens_recorded``).
    """
    if step.request is not None:
        own, own_prefix = _request_shape(step.request)
        if lengths is not None and (list(lengths) != own or shared_prefix != own_prefix):
            raise InputError(
                "lengths",
                list(lengths),
                f"differ from the step's request ({own}, shared prefix {own_prefix})",
            )
    elif lengths is None:
        raise InputError("lengths", None, "a step with an explicit plan needs its request's")
    s, g = step.settings, step.geometry
    pipe = s.pipeline
    given = list(lengths) if lengths is not None else []
    first = _plan_keys(step, given, shared_prefix)
    if step.microbatches:  # each micro-batch its own request, planned as the step is
        later = [_plan_keys(m, given, shared_prefix) for m in step.microbatch_steps[1:]]
    else:  # the step's request repeated
        later = [dict(first) for _ in range(pipe.microbatches - 1)]
    microbatch_plans = [dict(first), *later]
    # every setting its declaration exports, under its keyword (cpmem.step.settings)
    declared = {name: d.export(step) for name, d in SETTINGS.items() if d.export is not None}
    return {
        "cell_id": cell_id,
        "model": model,
        "config": hf_config(g),
        "dtype": dtype,
        "dtype_bytes": s.dtype_bytes,
        **declared,
        "cold": step.cold,
        "head_kind": step.head.kind,
        "head_chunk": step.head.chunk,
        "output_bytes": step.outputs,
        "runtime_settings": _runtime_settings(s),
        "holds_embedding": s.holds_embedding,
        "full_recompute_method": step.recompute.full_method,
        "full_recompute_layers": step.recompute.full_layers,
        "device_compute_capability": _capability(s),
        "stage_layers": [len(r) for r in pipe.virtual_layers(g.layers)],
        **first,
        "rank_tokens_recorded": recorded,
        "microbatch_plans": microbatch_plans,
    }


def describe(cell: MeasuredCell) -> dict[str, Any]:
    """One cell as an external estimator sees it: ``cell_step``'s description, with the
    harness's head, adapters and CP comm and the cell's recorded layout and counts.

    Never the measured peaks: the estimator must not see the answer.
    """
    step = cell_step(cell)
    return step_description(
        step,
        cell_id=cell.cell_id,
        model=cell.model,
        dtype=cell.dtype,
        lengths=cell.lengths_list,
        shared_prefix=cell.shared_prefix,
        recorded="busiest" if step.plan.layout.cp > 1 else "all",
    )


def describe_row(
    row: SimRow, step: Step | None = None, sim_dir: Path | None = None
) -> dict[str, Any]:
    """One simulated grid row described as a cell is (the same keys), from the step the
    simulator was given (``row_step``: its plan, head, adapters, CP comm and pipeline):
    ``cell_id`` is the row's ``config_id``, ``model`` the grid's model name,
    ``rank_tokens`` every CP rank's count (``rank_tokens_recorded`` ``all``). Never the
    simulated peaks.
    """
    if step is None:
        step = row_step(row, sim_dir if sim_dir is not None else simulated_dir())
    return step_description(
        step,
        cell_id=row.config_id,
        model=row.model,
        dtype="bf16",
        lengths=row.lengths,
        shared_prefix=row.shared_prefix,
        recorded="all",
    )


def descriptions(golden_dir: Path | None = None) -> list[dict[str, Any]]:
    """Every measured cell's description, in ``cells.csv`` order."""
    golden_dir = golden_dir if golden_dir is not None else default_golden_dir()
    return [describe(c) for c in load_cells(golden_dir / CELLS_FILE) if is_measured(c)]


def load_estimator(spec: str) -> EstimatorFn:
    """``package.module:function``; the current directory is importable, as with ``-m``."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise InputError("estimator", spec, "expected package.module:function")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InputError("estimator", spec, f"cannot import {module_name} ({exc})") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise InputError("estimator", spec, f"{module_name} has no function {attr}")
    return fn  # type: ignore[no-any-return]


def _nonneg_int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InputError(where, value, "must be a non-negative integer number of bytes")
    return value


def _result(value: Any, cell_id: str) -> ExternalEstimate:
    if isinstance(value, Mapping):
        if "forward" not in value:
            raise InputError(f"estimate[{cell_id}]", dict(value), "a dict needs 'forward'")
        fwd = _nonneg_int(value["forward"], f"estimate[{cell_id}].forward")
        fb = value.get("forward_backward")
        return fwd, None if fb is None else _nonneg_int(fb, f"estimate[{cell_id}].forward_backward")
    return _nonneg_int(value, f"estimate[{cell_id}]"), None


def price_with(
    fn: EstimatorFn, descs: Iterable[Mapping[str, Any]]
) -> tuple[dict[str, ExternalEstimate], dict[str, str]]:
    """Call ``fn`` on a fresh copy of every description; (estimates, errors raised)."""
    out: dict[str, ExternalEstimate] = {}
    raised: dict[str, str] = {}
    for d in descs:
        cid = str(d["cell_id"])
        try:
            value = fn(json.loads(json.dumps(d)))  # a copy: it may not alter the next cell's
        except Exception as exc:  # the estimator's own failure fails its cell
            raised[cid] = f"{type(exc).__name__}: {exc}"
            continue
        out[cid] = _result(value, cid)
    return out, raised


def read_estimates_csv(path: Path) -> dict[str, ExternalEstimate]:
    """``cell_id,estimate_bytes[,forward_backward_bytes]``; errors name the row."""
    try:
        fh = path.open(newline="", encoding="utf-8")
    except OSError as exc:
        raise InputError("estimates", str(path), f"cannot read ({exc.strerror})") from None
    with fh:
        reader = csv.DictReader(fh)
        fields = reader.fieldnames or []
        if "cell_id" not in fields or "estimate_bytes" not in fields:
            raise InputError(
                "estimates", str(path), f"header {fields} needs cell_id and estimate_bytes"
            )
        out: dict[str, ExternalEstimate] = {}
        for i, row in enumerate(reader, start=2):
            cid = (row.get("cell_id") or "").strip()
            where = f"{path}:{i}"
            if not cid:
                raise InputError(f"{where} cell_id", row.get("cell_id"), "empty")
            if cid in out:
                raise InputError(f"{where} cell_id", cid, "appears twice")
            fwd = _csv_int(row.get("estimate_bytes"), f"{where} estimate_bytes")
            fb_text = (row.get("forward_backward_bytes") or "").strip()
            fb = _csv_int(fb_text, f"{where} forward_backward_bytes") if fb_text else None
            out[cid] = (fwd, fb)
    return out


def _csv_int(text: str | None, where: str) -> int:
    try:
        return _nonneg_int(int((text or "").strip()), where)
    except ValueError:
        raise InputError(where, text, "must be an integer number of bytes") from None


def _headroom_groups(
    rows: Sequence[Mapping[str, Any]], key: Callable[[Mapping[str, Any]], str]
) -> list[dict[str, Any]]:
    priced = [(key(r), r["headroom"]) for r in rows if r["estimate_bytes"] is not None]
    if not priced:
        return []
    frame = pd.DataFrame(priced, columns=["group", "headroom"])
    stats = frame.groupby("group")["headroom"].agg(["size", "min", "median", "max"])
    return [
        {
            "group": str(name),
            "cells": int(g["size"]),
            "min_headroom": float(g["min"]),
            "median_headroom": float(g["median"]),
            "max_headroom": float(g["max"]),
        }
        for name, g in stats.iterrows()
    ]


def gate_external(
    name: str,
    estimates: Mapping[str, ExternalEstimate],
    golden_dir: Path | None = None,
    raised: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The gate's report for an external estimator (JSON-ready)."""
    golden_dir = golden_dir if golden_dir is not None else default_golden_dir()
    cells = load_cells(golden_dir / CELLS_FILE)
    known = {c.cell_id for c in cells}
    unknown = sorted(set(estimates) - known)
    if unknown:
        raise InputError("cell_id", unknown[:5], f"not golden cells ({len(unknown)} unknown)")
    raised = dict(raised or {})
    rows: list[dict[str, Any]] = []
    fb_rows: list[dict[str, Any]] = []
    failing: list[str] = []
    for c in cells:
        if not is_measured(c):
            continue
        assert c.forward_peak_bytes is not None
        peak = c.forward_peak_bytes
        got = estimates.get(c.cell_id)
        e = None if got is None else got[0]
        reason = raised.get(c.cell_id) or ("no estimate" if got is None else None)
        covered = e is not None and e >= peak
        rows.append(
            {
                "cell_id": c.cell_id,
                "model": c.model.split("/")[-1],
                "mode": f"{c.mode}({c.modules})" if c.modules else c.mode,
                "estimate_bytes": e,
                "forward_peak_bytes": peak,
                "headroom": None if e is None else e / peak - 1,
                "rank_samples": c.measured_rank_samples,
                "covered": covered,
                "problem": reason,
            }
        )
        if not covered:
            failing.append(c.cell_id + (f" ({reason})" if reason else ""))
        fb_row = forward_backward_row(c, None if got is None else got[1])
        if fb_row is not None:
            fb_rows.append(fb_row)
            if not fb_row["covered"]:
                failing.append(f"{c.cell_id} (forward+backward)")
    coverage: dict[str, Any] = {
        "passed": not failing and bool(rows),
        "priced": sum(1 for r in rows if r["headroom"] is not None),
        **coverage_summary(rows, fb_rows, failing),
    }
    checks: dict[str, Any] = {
        "golden": golden_check(golden_dir, cells),
        "coverage": coverage,
        "headroom": {
            "passed": True,
            "informational": True,
            "by_model": _headroom_groups(rows, lambda r: str(r["model"])),
            "by_mode": _headroom_groups(rows, lambda r: str(r["mode"])),
            "failing": [],
        },
    }
    for check in NOT_APPLICABLE:
        checks[check] = {"passed": True, "applicable": False, "reason": NA_REASON, "failing": []}
    passed = all(ch["passed"] for ch in checks.values())
    return {
        "estimator": name,
        "golden_dir": str(golden_dir),
        "passed": passed,
        "checks": checks,
        "summary": (
            f"gate {'PASSED' if passed else 'FAILED'} (external estimator {name}): "
            f"{sum(1 for r in rows if r['covered'])}/{len(rows)} cells covered"
            + (
                f", forward+backward {coverage['forward_backward']['covered']}/{len(fb_rows)}"
                if fb_rows
                else ""
            )
            + (
                f"; min headroom {pct(coverage['min_headroom'])}"
                if coverage["min_headroom"] is not None
                else ""
            )
            + ("" if checks["golden"]["passed"] else "; golden layer damaged")
        ),
    }
