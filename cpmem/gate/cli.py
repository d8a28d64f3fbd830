"""``cpmem gate [--policy reference] [--json] [--record-controls] [--golden DIR]``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cpmem.errors import CpmemError
from cpmem.gate.controls_file import controls_dir, record_controls
from cpmem.gate.external_cli import gate_main as gate_external_main
from cpmem.gate.run import run_gate
from cpmem.golden.files import add_golden_argument, default_golden_dir
from cpmem.pricing.registry import policy_names
from cpmem.reports.gate_render import render


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="cpmem gate", description="Check a pricing policy against the golden measurements."
    )
    p.add_argument("--policy", default="reference", help="pricing policy (default: reference)")
    p.add_argument("--json", action="store_true", help="print the full report as JSON")
    p.add_argument(
        "--tier",
        choices=("measured", "simulated"),
        default="measured",
        help="measured (default): the golden measurements; simulated: the rank simulator's "
        "grid in golden/simulated/ (cpmem.gate.simulated; with --estimator / --estimates, "
        "cpmem.gate.external_simulated)",
    )
    p.add_argument(
        "--record-controls",
        action="store_true",
        help="re-record golden/controls with the reference policy (prints and writes a diff "
        "report to golden/controls/last_diff.md), then run the gate",
    )
    add_golden_argument(p)
    ext = p.add_argument_group(
        "an estimator that is not a cpmem policy (docs/external-estimators.md)"
    )
    ext.add_argument(
        "--estimator",
        metavar="package.module:function",
        help="gate this function: it gets one cell's (or, with --tier simulated, one grid "
        "row's) description (a dict) and returns bytes",
    )
    ext.add_argument(
        "--estimates",
        type=Path,
        metavar="FILE.csv",
        help="gate these estimates: cell_id,estimate_bytes[,forward_backward_bytes] (on "
        "the simulated tier cell_id is the row's config_id)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``cpmem gate``: 0 when every check passes, 1 when one fails, 2 on a usage error."""
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    golden_dir: Path = args.golden if args.golden is not None else default_golden_dir()
    if args.estimator is not None or args.estimates is not None:
        return gate_external_main(args, golden_dir)
    if args.policy not in policy_names():
        print(
            f"cpmem gate: error: unknown policy {args.policy!r}; choose one of {policy_names()}",
            file=sys.stderr,
        )
        return 2
    if args.tier == "simulated":
        return _simulated_main(args, golden_dir)
    recorded: dict[str, Any] | None = None
    try:
        if args.record_controls:
            diff = record_controls(golden_dir, overwrite=True)
            text = (controls_dir(golden_dir) / "last_diff.md").read_text(encoding="utf-8")
            recorded = {**diff.to_dict(), "markdown": text}
            if not args.json:
                print(text)
                print(
                    f"wrote {controls_dir(golden_dir)} (controls, metadata, last_diff.md) "
                    "and regenerated the golden manifest"
                )
                print()
        report = run_gate(args.policy, golden_dir)
    except CpmemError as exc:
        print(f"cpmem gate: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        if recorded is not None:
            report["recorded_controls"] = recorded
        print(json.dumps(report, indent=2))
    else:
        print(render(report))
    return 0 if report["passed"] else 1


def _simulated_main(args: argparse.Namespace, golden_dir: Path) -> int:
    """``cpmem gate --tier simulated``: the policy against golden/simulated/."""
    from cpmem.gate.simulated import run_simulated
    from cpmem.reports.simulated_render import render as render_simulated

    if args.record_controls:
        print("cpmem gate: error: --record-controls is for the measured tier", file=sys.stderr)
        return 2
    try:
        report = run_simulated(args.policy, golden_dir)
    except CpmemError as exc:
        print(f"cpmem gate: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2) if args.json else render_simulated(report))
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
