"""The Markdown of ``cpmem diff``: a summary line per policy, then what moved."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cpmem.units import GIB

SHOWN_ROWS = 25  # per table of moved controls / rows in the Markdown; JSON has all


def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / GIB:.3f}"


def _bytes(n: int | None) -> str:
    return "-" if n is None else f"{n:+,}"


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:+.2f}%"


def _pct(x: float) -> str:
    return f"{x * 100:.1f}%"


def _pp(x: float) -> str:
    return f"{x * 100:+.1f} pp"


def _moved_table(rows: Sequence[Mapping[str, Any]], limit: int | None = None) -> list[str]:
    shown = sorted(rows, key=lambda r: -abs(r["delta_ratio"] or 0.0))
    shown = shown if limit is None else shown[:limit]
    lines = [
        "| id | figure | base GiB | working tree GiB | change (bytes) | change |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for r in shown:
        lines.append(
            f"| `{r['id']}` | {r['figure']} | {_gib(r['base_bytes'])} | "
            f"{_gib(r['head_bytes'])} | {_bytes(r['delta_bytes'])} | {_ratio(r['delta_ratio'])} |"
        )
    if limit is not None and len(rows) > limit:
        lines.append(f"\n... and {len(rows) - limit} more (largest relative changes shown).")
    return lines


def _headroom_table(title: str, groups: Sequence[Mapping[str, Any]]) -> list[str]:
    lines = [
        f"#### Headroom per {title}",
        "",
        f"| {title} | cells | min base | min working tree | shift | median base "
        "| median working tree | shift |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for g in groups:
        lines.append(
            f"| {g['group']} | {g['cells']} | {_pct(g['min_base'])} | {_pct(g['min_head'])} | "
            f"{_pp(g['min_head'] - g['min_base'])} | {_pct(g['median_base'])} | "
            f"{_pct(g['median_head'])} | {_pp(g['median_head'] - g['median_base'])} |"
        )
    return lines


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
        "| policy | cells moved | coverage lost | coverage gained | refusals flipped | "
        + " | ".join(f"{k}s moved" for k in report["row_kinds"])
        + (" |" if report["row_kinds"] else "|"),
        "| --- | ---: | ---: | ---: | ---: |" + " ---: |" * len(report["row_kinds"]),
    ]
    for p, pd in d["policies"].items():
        moved_cells = len({r["id"] for r in pd["cells_moved"]})
        rows = [
            f"{len({r['id'] for r in pd['rows_moved'].get(k, [])})} of {pd['rows_total'].get(k, 0)}"
            for k in report["row_kinds"]
        ]
        lines.append(
            f"| {p} | {moved_cells} of {report['cells']} | {len(pd['coverage_lost'])} | "
            f"{len(pd['coverage_gained'])} | {len(pd['refusals_flipped'])} | "
            + " | ".join(rows)
            + (" |" if rows else "|")
        )
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
        )
        if not changed:
            lines.append("Nothing moved.")
            continue
        for word in ("lost", "gained"):
            rows = pd[f"coverage_{word}"]
            if not rows:
                continue
            lines += [
                f"#### Coverage {word}",
                "",
                "| cell | figure | measured peak GiB | base GiB | working tree GiB |",
                "| --- | --- | ---: | ---: | ---: |",
            ]
            for r in rows:
                lines.append(
                    f"| `{r['cell_id']}` | {r['figure']} | {_gib(r['peak_bytes'])} | "
                    f"{_gib(r['base_bytes'])} | {_gib(r['head_bytes'])} |"
                )
            lines.append("")
        if pd["cells_moved"]:
            lines += ["#### Cells whose estimate moved", "", *_moved_table(pd["cells_moved"]), ""]
            lines += [*_headroom_table("model", pd["headroom_by_model"]), ""]
            lines += [*_headroom_table("recompute mode", pd["headroom_by_mode"]), ""]
        if pd["refusals_flipped"]:
            lines += [
                "#### Admission refusals flipped",
                "",
                "| cell | recorded | base | working tree | agrees with the record now |",
                "| --- | --- | --- | --- | --- |",
            ]
            for r in pd["refusals_flipped"]:
                lines.append(
                    f"| `{r['cell_id']}` | {r['recorded']} | {r['base']} | {r['head']} | "
                    f"{'yes' if r['now_agrees_with_record'] else 'no'} |"
                )
            lines.append("")
        for kind, rows in pd["rows_moved"].items():
            if rows:
                lines += [f"#### {kind.capitalize()}s moved", ""]
                lines += [*_moved_table(rows, SHOWN_ROWS), ""]
    return "\n".join(lines).rstrip() + "\n"
