"""The human report of an external estimator on the simulated tier
(``cpmem gate --tier simulated --estimator M:F``; ``cpmem.gate.external_simulated``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cpmem.reports.tables import pct, table

__all__ = ["render_external_simulated"]

LISTED = 25  # rows named under "not covered"; the JSON report has them all

GROUP_TITLES = (
    ("model", "by_model"),
    ("family", "by_family"),
    ("CP", "by_cp"),
    ("recompute mode", "by_mode"),
)


def _range(c: Mapping[str, Any]) -> str:
    return (
        f"headroom min {pct(c['min_headroom'])} / median {pct(c['median_headroom'])} / "
        f"max {pct(c['max_headroom'])}"
    )


def render_external_simulated(report: Mapping[str, Any]) -> str:
    """Checks (with the not-applicable ones), headroom per group, rows not covered."""
    ch = report["checks"]
    cov, data = ch["coverage"], ch["data"]
    rows = [
        ("data", "PASS" if data["passed"] else "FAIL", f"{report['rows']} grid rows"),
        (
            "coverage",
            "PASS" if cov["passed"] else "FAIL",
            f"{cov['covered']}/{cov['rows']} rows; {_range(cov)}",
        ),
    ]
    fbc = cov.get("forward_backward")
    if fbc:
        rows.append(("", "", f"forward+backward {fbc['covered']}/{fbc['rows']}; {_range(fbc)}"))
    na = [(name, "n/a", ch[name]["reason"]) for name in ch if ch[name].get("applicable") is False]
    lines = [
        f"cpmem gate: external estimator {report['estimator']}, simulated tier "
        f"({report['simulated_dir']})",
        "",
        *table(None, [*rows, *na]),
        "",
        "coverage: estimate >= (simulated peak + cold set-up) / (1 - the simulator's worst "
        "under-estimate for the model's family); headroom: estimate / (simulated peak + "
        "cold set-up) - 1",
    ]
    for title, key in GROUP_TITLES:
        groups = ch["headroom"][key]
        if not groups:
            continue
        lines.append("")
        lines += table(
            [f"headroom per {title}", "rows", "covered", "min", "median", "max"],
            [
                [
                    g["group"],
                    f"{g['rows']}",
                    f"{g['covered']}",
                    *(pct(g[k]) for k in ("min_headroom", "median_headroom", "max_headroom")),
                ]
                for g in groups
            ],
            right=range(1, 6),
        )
    failing = cov["failing"]
    if failing:
        lines += ["", f"not covered ({len(failing)}):"] + [f"  {f}" for f in failing[:LISTED]]
        if len(failing) > LISTED:
            lines.append(f"  ... and {len(failing) - LISTED} more (--json lists them all)")
    if data["problems"]:
        lines += ["", "simulated data problems:"] + [f"  {p}" for p in data["problems"]]
    lines += ["", report["summary"]]
    return "\n".join(lines)
