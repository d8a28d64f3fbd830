"""The command line: ``python -m gpu_tests.driver ...`` (or ``python gpu_tests/driver ...``).

Why numbers are read as text: a bad value must exit 2 with ``error: FIELD=VALUE:
reason`` naming the field, never with a traceback. ``--worker`` (alone) is the
internal entry of a worker rank (see run.py).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cpmem.errors import CpmemError

from .run import run_cell, worker_main
from .spec import DEVICES, ENGINES, HEAD_CES, HEADS, MODES, MODULE_SETS, int_field, spec_from_args


def build_parser() -> argparse.ArgumentParser:
    """The CLI. Numbers are read as text so that errors can name the field and value."""
    p = argparse.ArgumentParser(
        prog="python -m gpu_tests.driver",
        description="Measure native per-rank activation peaks of one cell and write golden rows.",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="cpmem preset name or recorded Hugging Face id")
    src.add_argument("--config", help="path to a Hugging Face config.json")
    p.add_argument("--layers", default=None, help="keep only the first N decoder layers")
    p.add_argument("--lengths", required=True, help="sequence lengths, e.g. 2048+2048")
    p.add_argument("--shared-prefix", default="0", help="tokens all sequences share")
    p.add_argument("--tp", default="1", help="tensor-parallel size")
    p.add_argument("--cp", default="1", help="context-parallel size")
    sp = p.add_mutually_exclusive_group()
    sp.add_argument("--sp", dest="sp", action="store_true", default=None, help="SP on")
    sp.add_argument("--no-sp", dest="sp", action="store_false", help="SP off")
    p.add_argument("--recompute", default="selective", help=f"one of {list(MODES)}")
    p.add_argument("--modules", default=None, help=f"selective modules: {list(MODULE_SETS)}")
    p.add_argument("--engine", default="auto", help=f"one of {list(ENGINES)}")
    p.add_argument("--device", default="auto", help=f"one of {list(DEVICES)}")
    p.add_argument("--seed", default="1234", help="random seed of weights and inputs")
    p.add_argument("--source-commit", default=None, help="git revision if .git is absent")
    p.add_argument("--out", default=None, help="directory for rows.csv and summary.json")
    p.add_argument(
        "--memory-history",
        default=None,
        metavar="FILE",
        help="CUDA: record one extra, unmeasured step of rank 0 as a memory-history snapshot"
        " (a bare file name goes into --out; analyse with python -m gpu_tests.driver.history)",
    )
    p.add_argument(
        "--head",
        default="hidden",
        help=f"what the forward ends with: {list(HEADS)} (hidden: the harness's hidden states)",
    )
    p.add_argument(
        "--head-ce",
        default="auto",
        help=f"the logits head's cross entropy: {list(HEAD_CES)} (auto: megatron if importable)",
    )
    p.add_argument("--lora-rank", default="1", help="LoRA rank of every adapter (harness: 1)")
    p.add_argument(
        "--lora-dropout", default="0", help="dropout on each adapter's input before A (harness: 0)"
    )
    p.add_argument("--timeout", default="900", help="seconds before worker ranks are killed")
    return p


def comparison_line(summary: dict[str, Any]) -> str:
    """One human line: measured forward peak vs cpmem's estimate."""
    agg, est = summary["aggregate"], summary["estimate"]["estimate_bytes"]
    gib = 2**30
    tag = summary["row"]["cell_id"]
    if agg["forward_peak_bytes"] is None:
        return (
            f"{tag}: estimate {est / gib:.3f} GiB; no CUDA peak (CPU run); finite={agg['finite']}"
        )
    peak = agg["forward_peak_bytes"]
    verdict = "covered" if est >= peak else "NOT COVERED"
    return (
        f"{tag}: forward peak {peak / gib:.3f} GiB, fwd+bwd {agg['forward_backward_peak_bytes'] / gib:.3f}"
        f" GiB, estimate {est / gib:.3f} GiB ({peak / est:.3f} of it, {verdict}); "
        f"finite={agg['finite']}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry: exit 2 with ``error: FIELD=VALUE: reason`` on bad input, no traceback."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv == ["--worker"]:
        return worker_main()
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        spec = spec_from_args(args)
        timeout = int_field("timeout", args.timeout, 1)
    except CpmemError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else None
    summary = run_cell(spec, out, timeout)
    print(comparison_line(summary))
    for note in summary["notes"]:
        print(f"note: {note}")
    if out is not None:
        print(f"wrote {out / 'rows.csv'} and {out / 'summary.json'}")
    return 0 if summary["aggregate"]["finite"] else 1
