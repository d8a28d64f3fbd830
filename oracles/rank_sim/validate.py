"""``python -m oracles.rank_sim.validate [--write | --check] [--only SUBSTR]``: simulate
every expressible golden cell and write (or check the freshness of) the report."""

from __future__ import annotations

import argparse
import sys
import time
import warnings

from oracles.rank_sim.runner import RankResult
from oracles.rank_sim.validation import (
    REPORT,
    Cell,
    inputs_digest,
    read_cells,
    report,
    simulate_cell,
)


def run(only: str = "") -> str:
    cells, skipped = read_cells()
    started = time.perf_counter()
    done: dict[tuple[object, ...], RankResult] = {}
    rows: list[tuple[Cell, RankResult]] = []
    for cell in cells:
        if only and only not in cell.cell_id:
            continue
        if cell.key not in done:
            done[cell.key] = simulate_cell(cell)
            print(f"{cell.cell_id}: {done[cell.key].seconds:.1f} s", file=sys.stderr)
        rows.append((cell, done[cell.key]))
    return report(rows, skipped, time.perf_counter() - started)


def is_stale() -> bool:
    if not REPORT.exists():
        return True
    return f"inputs-sha256: {inputs_digest()}" not in REPORT.read_text()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m oracles.rank_sim.validate")
    ap.add_argument("--write", action="store_true", help=f"rewrite {REPORT}")
    ap.add_argument("--check", action="store_true", help="fail when the kept report is stale")
    ap.add_argument("--only", default="", help="cells whose id contains this")
    args = ap.parse_args(argv)
    if args.check:
        if is_stale():
            print(f"{REPORT} is stale: regenerate with --write", file=sys.stderr)
            return 1
        print(f"{REPORT} is current")
        return 0
    warnings.filterwarnings("ignore")
    text = run(args.only)
    if args.write:
        REPORT.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
