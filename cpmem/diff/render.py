"""The Markdown of ``cpmem diff``: a summary line per policy, then what moved: the
activation figures, then the static memory and the ``h200`` budget beside them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cpmem.reports.tables import pct, table
from cpmem.units import fmt_gib

SHOWN_ROWS = 25  # per table of moved controls / rows in the Markdown; JSON has all


def _bytes(n: int | None) -> str:
    return "-" if n is None else f"{n:+,}"


def _moved_table(rows: Sequence[Mapping[str, Any]], limit: int | None = None) -> list[str]:
    shown = sorted(rows, key=lambda r: -abs(r["delta_ratio"] or 0.0))
    shown = shown if limit is None else shown[:limit]
    lines = table(
        ["id", "figure", "base GiB", "working tree GiB", "change (bytes)", "change"],
        [
            [
                f"`{r['id']}`",
                r["figure"],
                fmt_gib(r["base_bytes"]),
                fmt_gib(r["head_bytes"]),
                _bytes(r["delta_bytes"]),
                pct(r["delta_ratio"], signed=True, digits=2),
            ]
            for r in shown
        ],
        right=range(2, 6),
        style="markdown",
    )
    if limit is not None and len(rows) > limit:
        lines.append(f"\n... and {len(rows) - limit} more (largest relative changes shown).")
    return lines


def _headroom_table(title: str, groups: Sequence[Mapping[str, Any]]) -> list[str]:
    headers = [title, "cells", "min base", "min working tree", "shift"]
    headers += ["median base", "median working tree", "shift"]
    rows = [
        [
            f"{g['group']}",
            f"{g['cells']}",
            pct(g["min_base"]),
            pct(g["min_head"]),
            pct(g["min_head"] - g["min_base"], signed=True, suffix=" pp"),
            pct(g["median_base"]),
            pct(g["median_head"]),
            pct(g["median_head"] - g["median_base"], signed=True, suffix=" pp"),
        ]
        for g in groups
    ]
    return [
        f"#### Headroom per {title}",
        "",
        *table(headers, rows, right=range(1, 8), style="markdown"),
    ]


def render_markdown(report: Mapping[str, Any]) -> str:
    """The job-summary table: per policy, what moved between base and working tree."""
    d = report["diff"]
    base = report["base"]
    lines = [
        f"## cpmem diff: `{base['revision'][:12]}` ({base['rev']}) -> working tree",
        "",
        f"Golden: `{report['golden']}`, {report['cells']} cells ({report['measured']} "
        f"measured). Policies: {', '.join(d['policies'])}.",
    ]
    for side in ("base", "head"):
        notes = report[side].get("notes") or []
        lines += [f"- {side}: {n}" for n in notes]
    lines += [
        "",
        "**Coverage lost** on at least one cell: the diff fails."
        if d["coverage_lost"]
        else "No cell loses coverage.",
        "",
    ]
    headers = ["policy", "cells moved", "coverage lost", "coverage gained", "refusals flipped"]
    headers += [f"{k}s moved" for k in report["row_kinds"]]
    headers.append("static or budget moved")
    summary = []
    for p, pd in d["policies"].items():
        moved_cells = len({r["id"] for r in pd["cells_moved"]})
        device = pd.get("device_moved", {})
        moved_device = len({(k, r["id"]) for k, rows in device.items() for r in rows})
        summary.append(
            [
                f"{p}",
                f"{moved_cells} of {report['cells']}",
                f"{len(pd['coverage_lost'])}",
                f"{len(pd['coverage_gained'])}",
                f"{len(pd['refusals_flipped'])}",
                *(
                    f"{len({r['id'] for r in pd['rows_moved'].get(k, [])})} "
                    f"of {pd['rows_total'].get(k, 0)}"
                    for k in report["row_kinds"]
                ),
                f"{moved_device}",
            ]
        )
    lines += table(headers, summary, right=range(1, len(headers)), style="markdown")
    for kind in report["row_kinds"]:
        added, removed = d["rows_added"].get(kind, []), d["rows_removed"].get(kind, [])
        if added or removed:
            lines += [
                "",
                f"{kind.capitalize()}s only one side has (not compared): {len(added)} added "
                f"in the working tree, {len(removed)} removed.",
            ]
    for p, pd in d["policies"].items():
        lines += ["", f"### policy `{p}`", ""]
        changed = (
            pd["cells_moved"]
            or pd["coverage_lost"]
            or pd["refusals_flipped"]
            or any(pd["rows_moved"].values())
            or any(pd.get("device_moved", {}).values())
        )
        if not changed:
            lines.append("Nothing moved.")
            continue
        for word in ("lost", "gained"):
            rows = pd[f"coverage_{word}"]
            if not rows:
                continue
            lines += [f"#### Coverage {word}", ""]
            lines += table(
                ["cell", "figure", "measured peak GiB", "base GiB", "working tree GiB"],
                [
                    [
                        f"`{r['cell_id']}`",
                        r["figure"],
                        fmt_gib(r["peak_bytes"]),
                        fmt_gib(r["base_bytes"]),
                        fmt_gib(r["head_bytes"]),
                    ]
                    for r in rows
                ],
                right=(2, 3, 4),
                style="markdown",
            )
            lines.append("")
        if pd["cells_moved"]:
            lines += ["#### Cells whose estimate moved", "", *_moved_table(pd["cells_moved"]), ""]
            lines += [*_headroom_table("model", pd["headroom_by_model"]), ""]
            lines += [*_headroom_table("recompute mode", pd["headroom_by_mode"]), ""]
        if pd["refusals_flipped"]:
            lines += ["#### Admission refusals flipped", ""]
            lines += table(
                ["cell", "recorded", "base", "working tree", "agrees with the record now"],
                [
                    [
                        f"`{r['cell_id']}`",
                        f"{r['recorded']}",
                        f"{r['base']}",
                        f"{r['head']}",
                        "yes" if r["now_agrees_with_record"] else "no",
                    ]
                    for r in pd["refusals_flipped"]
                ],
                style="markdown",
            )
            lines.append("")
        for kind, rows in pd["rows_moved"].items():
            if rows:
                lines += [f"#### {kind.capitalize()}s moved", ""]
                lines += [*_moved_table(rows, SHOWN_ROWS), ""]
        for kind, rows in pd.get("device_moved", {}).items():
            if rows:
                lines += [f"#### Static memory and h200 budget moved: {kind}s", ""]
                lines += [*_moved_table(rows, SHOWN_ROWS), ""]
    return "\n".join(lines).rstrip() + "\n"
