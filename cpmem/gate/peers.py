"""The peers report's figures (``golden/reports/peers.md``): every peer gated as an
external estimator on both tiers, and cpmem's ``reference`` and ``tight`` policies as
the gate prices them. ``python -m cpmem.gate.peers`` prints the report; ``--write PATH``
writes it, ``--check PATH`` fails when the written one is stale (``nox -s golden``).

What is compared and the Markdown: ``cpmem.reports.peers``. The peers are loaded by
their ``module:function`` names at run time (``load_estimator``): cpmem never imports
an oracle.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from cpmem.gate.external import descriptions, gate_external, load_estimator, price_with
from cpmem.gate.external_simulated import (
    DescribedRow,
    described_rows,
    gate_external_simulated,
)
from cpmem.gate.megatron_report import peers_section
from cpmem.gate.megatron_tier import run_tier
from cpmem.gate.run import coverage_check
from cpmem.gate.simulated import price_rows
from cpmem.golden.files import default_golden_dir
from cpmem.reports.kept import kept_report_cli
from cpmem.reports.peers import AS_PUBLISHED, PEERS, POLICIES, Collected, Point, render
from cpmem.samples.rows import central, simulated_dir

__all__ = ["collect", "main"]


def _points(rows: Sequence[Mapping[str, Any]], key: str, peak: str) -> dict[str, Point]:
    return {
        r[key]: Point(r[key], r["estimate_bytes"], r[peak], r["headroom"], bool(r["covered"]))
        for r in rows
    }


def _peer_points(
    spec: str,
    cells: Sequence[Mapping[str, Any]],
    rows: Sequence[DescribedRow],
    golden_dir: Path,
) -> tuple[dict[str, Point], dict[str, Point], dict[str, str]]:
    """The peer's two gate reports, as points."""
    fn = load_estimator(spec)
    est, raised = price_with(fn, cells)
    m = gate_external(spec, est, golden_dir, raised)
    est, raised = price_with(fn, [d.description for d in rows])
    s = gate_external_simulated(spec, est, golden_dir, raised, rows=rows)
    return (
        _points(m["checks"]["coverage"]["rows"], "cell_id", "forward_peak_bytes"),
        _points(s["checks"]["coverage"]["by_row"], "config_id", "central_bytes"),
        {"measured": m["summary"], "simulated": s["summary"]},
    )


def _policy_points(
    policy: str, rows: Sequence[DescribedRow], golden_dir: Path
) -> tuple[dict[str, Point], dict[str, Point]]:
    """The policy's measured coverage rows (the gate's ``coverage_check``) and its simulated tier's
    forward verdicts (``price_rows``, as ``run_simulated`` judges them)."""
    cov = coverage_check(policy, golden_dir)
    simulated = {
        p.row.config_id: Point(
            p.row.config_id,
            p.got("forward"),
            central(p.row.forward_peak),
            p.headroom("forward"),
            bool(p.covered("forward")),
        )
        for p in price_rows(policy, [d.row for d in rows], simulated_dir(golden_dir))
    }
    return _points(cov["rows"], "cell_id", "forward_peak_bytes"), simulated


def collect(golden_dir: Path | None = None) -> Collected:
    """Run every peer's gates and every policy's, on both tiers."""
    golden_dir = golden_dir if golden_dir is not None else default_golden_dir()
    cells = descriptions(golden_dir)
    rows = described_rows(golden_dir)
    measured: dict[str, Mapping[str, Point]] = {}
    simulated: dict[str, Mapping[str, Point]] = {}
    summaries: dict[str, Mapping[str, str]] = {}
    for peer in (*PEERS, *AS_PUBLISHED):
        measured[peer.name], simulated[peer.name], summaries[peer.name] = _peer_points(
            peer.spec, cells, rows, golden_dir
        )
    for policy in POLICIES:
        measured[policy], simulated[policy] = _policy_points(policy, rows, golden_dir)
    return Collected(
        cells={d["cell_id"]: d for d in cells},
        rows={d.row.config_id: d.description for d in rows},
        families={d.row.config_id: d.family for d in rows},
        measured=measured,
        simulated=simulated,
        summaries=summaries,
        megatron=peers_section(run_tier(golden_dir)),
    )


def main(argv: Sequence[str] | None = None, emit: Callable[[str], None] = print) -> int:
    """``python -m cpmem.gate.peers [--write PATH | --check PATH]``."""
    return kept_report_cli(
        argv, lambda: (render(collect()), True), "python -m cpmem.gate.peers", emit
    )


if __name__ == "__main__":
    raise SystemExit(main())
