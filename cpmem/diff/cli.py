"""``cpmem diff --base REV``: what an estimator change moves, as a Markdown table.

Prices every golden cell (through ``cell_step``, the one conversion), every
control (``control_grid()``) and every row of the registered row sources, with the
estimator at ``REV`` (a temporary git worktree) and at the working tree, for every
policy both know (or ``--policy P``). Both sides are priced the same way: a stable
script in a subprocess with ``PYTHONPATH`` at the checkout (``cpmem.diff.checkout``),
which finds its functions under the stage-package layout and the older flat one.

Reported per policy: cells whose estimate moved (bytes and %), coverage gained or
lost (estimate against the measured forward peak, and forward+backward against its
peak where both sides price it), headroom shift per model and per recompute mode,
admission refusals flipped (the gate's ``refusals`` check), and controls / rows moved;
beside them, every cell, control and row whose static memory or ``h200`` budget moved
(``device_moved``; a side that prices neither says so in its notes and is not compared).

Exit status: 0 when no cell loses coverage, 1 when one does, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from cpmem.diff.checkout import (
    DiffError,
    price_checkout,
    resolve_repo,
    resolve_revision,
    worktree,
)
from cpmem.diff.render import render_markdown
from cpmem.errors import CpmemError
from cpmem.golden.cells import MeasuredCell, load_cells
from cpmem.golden.files import CELLS_FILE
from cpmem.reports.progress import wanted

__all__ = ["ROW_SOURCES", "compare", "main", "render_markdown", "run_diff"]

# Extra row sources priced on both sides, kind -> "module:function". The function
# takes the golden directory and returns (row_id, price) pairs, price(policy) giving
# an Estimate. None exists yet; a generated grid (e.g. golden/simulated/) registers
# here or is passed with --rows KIND=module:function. A side whose checkout lacks the
# source reports it as an error for that kind, never a failure of the diff.
ROW_SOURCES: dict[str, str] = {}

Figures = list[int | None]  # [forward, forward_backward or None]
ACTIVATION_FIGURES = ("forward", "forward_backward")
DEVICE_FIGURES = ("static", "h200_budget")  # the snapshot's ``device`` lists, in order


def _short(model: str) -> str:
    return model.split("/")[-1]


def _mode(cell: MeasuredCell) -> str:
    return f"{cell.mode}({cell.modules})" if cell.modules else cell.mode


def _covered(estimate: int | None, peak: int | None) -> bool | None:
    if peak is None:
        return None
    return estimate is not None and estimate >= peak


def _moved(
    base: Mapping[str, Mapping[str, Figures]],
    head: Mapping[str, Mapping[str, Figures]],
    policy: str,
    names: Sequence[str] = ACTIVATION_FIGURES,
    *,
    priced_both: bool = False,
) -> list[dict[str, Any]]:
    """Every figure of ``names`` that differs; ``priced_both``: only where both sides
    price it (a figure one side lacks is not a move)."""
    out = []
    for rid in sorted(set(base) & set(head)):
        b, h = base[rid].get(policy), head[rid].get(policy)
        if b is None or h is None:
            continue
        for i, figure in enumerate(names):
            if b[i] == h[i] or (priced_both and (b[i] is None or h[i] is None)):
                continue
            bv, hv = b[i], h[i]
            delta = None if bv is None or hv is None else hv - bv
            out.append(
                {
                    "id": rid,
                    "figure": figure,
                    "base_bytes": bv,
                    "head_bytes": hv,
                    "delta_bytes": delta,
                    "delta_ratio": None if delta is None or not bv else delta / bv,
                }
            )
    return out


def _headroom_groups(
    cells: Sequence[MeasuredCell],
    base: Mapping[str, Mapping[str, Figures]],
    head: Mapping[str, Mapping[str, Figures]],
    policy: str,
    key: Callable[[MeasuredCell], str],
) -> list[dict[str, Any]]:
    rows = []
    for c in cells:
        peak = c.forward_peak_bytes
        b, h = base.get(c.cell_id, {}).get(policy), head.get(c.cell_id, {}).get(policy)
        if c.refused or peak is None or b is None or h is None or b[0] is None or h[0] is None:
            continue
        rows.append((key(c), b[0] / peak - 1, h[0] / peak - 1))
    if not rows:
        return []
    frame = pd.DataFrame(rows, columns=["group", "base", "head"])
    stats = frame.groupby("group").agg(
        cells=("base", "size"),
        min_base=("base", "min"),
        min_head=("head", "min"),
        median_base=("base", "median"),
        median_head=("head", "median"),
    )
    return [
        {"group": str(name), "cells": int(g["cells"])}
        | {col: float(g[col]) for col in ("min_base", "min_head", "median_base", "median_head")}
        for name, g in stats.iterrows()
    ]


def compare(
    base: Mapping[str, Any],
    head: Mapping[str, Any],
    cells: Sequence[MeasuredCell],
    policies: Sequence[str],
) -> dict[str, Any]:
    """The differences between two priced checkouts (``price_checkout`` results)."""
    by_id = {c.cell_id: c for c in cells}
    result: dict[str, Any] = {"policies": {}}
    any_lost = False
    for p in policies:
        bc, hc = base["cells"], head["cells"]
        coverage: list[dict[str, Any]] = []
        for cid, c in by_id.items():
            if c.refused:
                continue
            b, h = bc.get(cid, {}).get(p), hc.get(cid, {}).get(p)
            for i, figure, peak in (
                (0, "forward", c.forward_peak_bytes),
                (1, "forward_backward", c.forward_backward_peak_bytes),
            ):
                be = None if b is None else b[i]
                he = None if h is None else h[i]
                if peak is None or be is None:  # no peak, or the base did not price it
                    continue
                was, now = _covered(be, peak), _covered(he, peak)
                if was == now:
                    continue
                coverage.append(
                    {
                        "cell_id": cid,
                        "figure": figure,
                        "peak_bytes": peak,
                        "base_bytes": be,
                        "head_bytes": he,
                        "change": "gained" if now else "lost",
                        "reason": None if he is not None else "not priced by the working tree",
                    }
                )
        lost = [r for r in coverage if r["change"] == "lost"]
        any_lost = any_lost or bool(lost)
        br, hr = base["refusals"].get(p, {}), head["refusals"].get(p, {})
        flipped = []
        for cid in sorted(set(br) & set(hr)):
            if br[cid] == hr[cid]:
                continue
            known = by_id.get(cid)
            recorded = None if known is None else ("refused" if known.refused else "ran")
            expected = {"refused": "refuse", "ran": "fit"}.get(recorded or "")
            flipped.append(
                {
                    "cell_id": cid,
                    "recorded": recorded,
                    "base": br[cid],
                    "head": hr[cid],
                    "now_agrees_with_record": hr[cid] == expected,
                }
            )
        rows_moved = {
            kind: _moved(base["rows"].get(kind, {}), head["rows"].get(kind, {}), p)
            for kind in sorted(set(base["rows"]) | set(head["rows"]))
        }
        bd, hd = base.get("device", {}), head.get("device", {})
        device_moved = {
            kind: _moved(bd.get(kind, {}), hd.get(kind, {}), p, DEVICE_FIGURES, priced_both=True)
            for kind in sorted(set(bd) | set(hd))
        }
        result["policies"][p] = {
            "cells_moved": _moved(bc, hc, p),
            "coverage_lost": lost,
            "coverage_gained": [r for r in coverage if r["change"] == "gained"],
            "headroom_by_model": _headroom_groups(cells, bc, hc, p, lambda c: _short(c.model)),
            "headroom_by_mode": _headroom_groups(cells, bc, hc, p, _mode),
            "refusals_flipped": flipped,
            "rows_moved": rows_moved,
            "rows_total": {
                kind: len(set(base["rows"].get(kind, {})) & set(head["rows"].get(kind, {})))
                for kind in rows_moved
            },
            "device_moved": device_moved,
        }
    result["coverage_lost"] = any_lost
    kinds = sorted(set(base["rows"]) | set(head["rows"]))
    result["rows_added"] = {
        k: sorted(set(head["rows"].get(k, {})) - set(base["rows"].get(k, {}))) for k in kinds
    }
    result["rows_removed"] = {
        k: sorted(set(base["rows"].get(k, {})) - set(head["rows"].get(k, {}))) for k in kinds
    }
    return result


def _notes(priced: Mapping[str, Any]) -> list[str]:
    notes = []
    if priced.get("golden_note"):
        notes.append(str(priced["golden_note"]))
    for cid, err in sorted(priced.get("cell_errors", {}).items()):
        notes.append(f"cell `{cid}` could not be priced: {err}")
    for p, err in sorted(priced.get("refusal_errors", {}).items()):
        notes.append(f"refusals under {p} could not be checked: {err}")
    for kind, err in sorted(priced.get("row_errors", {}).items()):
        notes.append(f"{kind} rows: {err}")
    notes += [str(n) for n in priced.get("device_notes", [])]
    return notes


def run_diff(
    base_rev: str,
    *,
    repo: Path | None = None,
    golden_dir: Path | None = None,
    policies: Sequence[str] | None = None,
    row_sources: Mapping[str, str] | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Price ``base_rev`` and the working tree; the full JSON-ready report."""
    root = resolve_repo(repo)
    commit = resolve_revision(root, base_rev)
    golden = golden_dir if golden_dir is not None else root / "golden"
    cells = load_cells(golden / CELLS_FILE)
    sources = {**ROW_SOURCES, **(row_sources or {})}
    with worktree(root, commit) as checkout:
        base = price_checkout(
            checkout, golden, sources, label=f"pricing {commit[:9]}", progress=progress
        )
    head = price_checkout(root, golden, sources, label="pricing working tree", progress=progress)
    common = [p for p in head["policies"] if p in base["policies"]]
    if policies:
        missing = {
            p: [
                side
                for side, r in (("base", base), ("working tree", head))
                if p not in r["policies"]
            ]
            for p in policies
        }
        unknown = {p: sides for p, sides in missing.items() if sides}
        if unknown:
            raise DiffError(
                "policy not known to both sides: "
                + "; ".join(f"{p} (missing at {', '.join(s)})" for p, s in unknown.items())
            )
        common = list(dict.fromkeys(policies))
    diff = compare(base, head, cells, common)
    diff["policies_only_base"] = [p for p in base["policies"] if p not in head["policies"]]
    diff["policies_only_head"] = [p for p in head["policies"] if p not in base["policies"]]
    return {
        "passed": not diff["coverage_lost"],
        "repo": str(root),
        "golden": str(golden),
        "cells": len(cells),
        "measured": sum(1 for c in cells if not c.refused and c.forward_peak_bytes is not None),
        "row_kinds": sorted(set(base["rows"]) | set(head["rows"])),
        "base": {"rev": base_rev, "revision": commit, "notes": _notes(base)},
        "head": {"rev": "working tree", "notes": _notes(head)},
        "diff": diff,
    }


def _row_source(text: str) -> tuple[str, str]:
    kind, sep, spec = text.partition("=")
    if not sep or ":" not in spec or not kind:
        raise argparse.ArgumentTypeError(f"--rows {text!r}: expected KIND=module:function")
    return kind, spec


def main(argv: Sequence[str] | None = None) -> int:
    """``cpmem diff``: 0 when no cell loses coverage, 1 when one does, 2 on a usage error."""
    p = argparse.ArgumentParser(
        prog="cpmem diff",
        description="What an estimator change moves: every golden cell, control and row "
        "priced at REV and at the working tree (Markdown table; exit 1 when a cell loses "
        "coverage).",
    )
    p.add_argument(
        "--base",
        required=True,
        metavar="REV",
        help="git revision to compare against (e.g. origin/main or a merge base); any "
        "revision with the estimator gate, before or after the stage-package layout",
    )
    p.add_argument(
        "--policy",
        action="append",
        default=None,
        help="compare only this policy; repeat for several (default: every policy both sides know)",
    )
    p.add_argument("--out", type=Path, default=None, help="also write the Markdown to FILE")
    p.add_argument("--json", action="store_true", help="print the full report as JSON")
    p.add_argument(
        "--repo",
        type=Path,
        default=None,
        help="repository whose working tree is priced (default: the checkout cpmem runs from)",
    )
    p.add_argument(
        "--golden",
        type=Path,
        default=None,
        help="golden directory whose cells both sides price (default: REPO/golden)",
    )
    p.add_argument(
        "--rows",
        type=_row_source,
        action="append",
        default=[],
        metavar="KIND=module:function",
        help="an extra row source priced on both sides (a generated grid)",
    )
    args = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        report = run_diff(
            args.base,
            repo=args.repo,
            golden_dir=args.golden,
            policies=args.policy,
            row_sources=dict(args.rows),
            progress=wanted(args.json),
        )
    except CpmemError as exc:
        print(f"cpmem diff: error: {exc}", file=sys.stderr)
        return 2
    text = render_markdown(report)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text, encoding="utf-8")
    if args.json:
        report["markdown"] = text
        print(json.dumps(report, indent=2))
    else:
        print(text, end="")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
