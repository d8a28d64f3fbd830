"""A report kept in the repository (golden/reports/): printed, written with ``--write
PATH``, and checked with ``--check PATH``, which fails when the kept copy is stale."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path


def kept_report_cli(
    argv: Sequence[str] | None,
    make_report: Callable[[], tuple[str, bool]],
    prog: str,
    emit: Callable[[str], None] = print,
) -> int:
    """Print the report ``make_report`` returns (its text, and whether what it reports is
    met); ``--write PATH`` writes it, ``--check PATH`` compares it with PATH. Non-zero when
    the report is not met or the checked file is stale."""
    p = argparse.ArgumentParser(prog=prog, description=kept_report_cli.__doc__)
    group = p.add_mutually_exclusive_group()
    group.add_argument("--write", type=Path, metavar="PATH", help="write the report to PATH")
    group.add_argument(
        "--check", type=Path, metavar="PATH", help="fail when PATH differs from the report"
    )
    args = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    text, met = make_report()
    emit(text.rstrip("\n"))
    status = 0 if met else 1
    if args.write is not None:
        args.write.parent.mkdir(parents=True, exist_ok=True)
        args.write.write_text(text, encoding="utf-8")
        emit(f"wrote {args.write}")
    if args.check is not None:
        stored = args.check.read_text(encoding="utf-8") if args.check.is_file() else None
        if stored != text:
            emit(
                f"STALE: {args.check} differs from the report above "
                f"(regenerate: {prog} --write {args.check})"
            )
            status = 1
        else:
            emit(f"{args.check} is up to date")
    return status
