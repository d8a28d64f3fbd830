"""The command-line side of the external-estimator gate: its human report,
``cpmem gate [--tier simulated] --estimator / --estimates`` and ``cpmem golden export
[--tier simulated]``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cpmem.errors import CpmemError, InputError
from cpmem.gate.external import (
    NA_REASON,
    NOT_APPLICABLE,
    descriptions,
    gate_external,
    load_estimator,
    price_with,
    read_estimates_csv,
)
from cpmem.gate.external_simulated import gate_external_simulated, row_descriptions
from cpmem.golden.files import add_golden_argument
from cpmem.reports.external_render import render_external_simulated
from cpmem.reports.tables import pct, table

__all__ = ["export_main", "gate_main", "render_external"]


def render_external(report: Mapping[str, Any]) -> str:
    """The human report: checks (with the not-applicable ones), headroom, failures."""
    ch = report["checks"]
    cov, gold = ch["coverage"], ch["golden"]

    rows = [
        ("golden", "PASS" if gold["passed"] else "FAIL", f"{gold['cells']} cells"),
        (
            "coverage",
            "PASS" if cov["passed"] else "FAIL",
            f"{cov['cells']} cells; headroom min {pct(cov['min_headroom'])} / median "
            f"{pct(cov['median_headroom'])} / max {pct(cov['max_headroom'])}",
        ),
    ]
    fbc = cov.get("forward_backward")
    if fbc:
        rows.append(
            ("", "", f"forward+backward {fbc['covered']}/{fbc['cells']} covered, "
             f"headroom min {pct(fbc['min_headroom'])}")
        )  # fmt: skip
    rows += [(name, "n/a", NA_REASON) for name in NOT_APPLICABLE]
    lines = [f"cpmem gate: external estimator {report['estimator']}", ""]
    lines += table(None, rows)
    for title, key in (("model", "by_model"), ("recompute mode", "by_mode")):
        groups = ch["headroom"][key]
        if not groups:
            continue
        lines.append("")
        lines += table(
            [f"headroom per {title}", "cells", "min", "median", "max"],
            [
                [
                    g["group"],
                    f"{g['cells']}",
                    *(pct(g[k]) for k in ("min_headroom", "median_headroom", "max_headroom")),
                ]
                for g in groups
            ],
            right=range(1, 5),
        )
    if cov["failing"]:
        lines += ["", "not covered:"] + [f"  {f}" for f in cov["failing"]]
    if gold["failing"]:
        lines += ["", "golden problems:"] + [f"  {f}" for f in gold["failing"]]
    lines += ["", report["summary"]]
    return "\n".join(lines)


def gate_main(args: argparse.Namespace, golden_dir: Path) -> int:
    """``cpmem gate [--tier simulated] --estimator M:F`` / ``--estimates FILE``: 0 pass,
    1 fail, 2 usage. On the simulated tier the CSV's ``cell_id`` is the row's
    ``config_id``."""
    simulated = getattr(args, "tier", "measured") == "simulated"
    try:
        if args.estimator is not None and args.estimates is not None:
            raise InputError("estimator", args.estimator, "give --estimator or --estimates")
        if getattr(args, "record_controls", False):
            raise InputError(
                "record-controls",
                True,
                "records the reference policy's controls; not with --estimator / --estimates",
            )
        name = args.estimator if args.estimator is not None else str(args.estimates)
        gate = gate_external_simulated if simulated else gate_external
        if args.estimator is not None:
            fn = load_estimator(args.estimator)
            descs = row_descriptions(golden_dir) if simulated else descriptions(golden_dir)
            estimates, raised = price_with(fn, descs)
            report = gate(name, estimates, golden_dir, raised)
        else:
            report = gate(name, read_estimates_csv(args.estimates), golden_dir)
    except CpmemError as exc:
        print(f"cpmem gate: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        text = json.dumps(report, indent=2)
    else:
        text = render_external_simulated(report) if simulated else render_external(report)
    print(text)
    return 0 if report["passed"] else 1


def export_main(argv: Sequence[str] | None = None) -> int:
    """``cpmem golden export [--tier simulated] [--out FILE] [--golden DIR]``:
    descriptions as JSON lines."""
    p = argparse.ArgumentParser(
        prog="cpmem golden export",
        description="Write every measured golden cell's description (one JSON object a "
        "line), the input of an external estimator (docs/external-estimators.md); "
        "with --tier simulated, every simulated grid row's.",
    )
    p.add_argument("--out", type=Path, default=None, help="write to FILE (default: stdout)")
    p.add_argument(
        "--tier",
        choices=("measured", "simulated"),
        default="measured",
        help="measured (default): the measured golden cells; simulated: the grid rows of "
        "golden/simulated/",
    )
    add_golden_argument(p)
    args = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        if args.tier == "simulated":
            descs = row_descriptions(args.golden)
        else:
            descs = descriptions(args.golden)
    except CpmemError as exc:
        print(f"cpmem golden export: error: {exc}", file=sys.stderr)
        return 2
    text = "".join(json.dumps(d, sort_keys=True) + "\n" for d in descs)
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text, encoding="utf-8")
        what = "grid row" if args.tier == "simulated" else "cell"
        print(f"wrote {len(descs)} {what} descriptions to {args.out}", file=sys.stderr)
    return 0
