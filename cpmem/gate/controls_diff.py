"""What moved between two recordings of the controls: changed, added, removed, as a
dict for JSON and as a Markdown table for a pull request. A control whose static memory
or device budget moved is a changed control like one whose estimate moved; those two
figures' old and new bytes get a table of their own."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cpmem.reports.tables import table

DEVICE_FIGURES = ("static_bytes", "budget_bytes")
"""The whole-device figures whose old and new bytes a changed control reports."""


@dataclass(frozen=True)
class ControlChange:
    control_id: str
    old_bytes: int
    new_bytes: int
    old_per_rank: str
    new_per_rank: str
    other_columns: tuple[str, ...]  # columns besides the estimate that moved
    device_figures: tuple[tuple[str, int, int], ...] = ()
    """Each of ``DEVICE_FIGURES`` that moved: (column, old bytes, new bytes)."""

    @property
    def ratio(self) -> float:
        return self.new_bytes / self.old_bytes if self.old_bytes else float("inf")


@dataclass(frozen=True)
class ControlDiff:
    """Old recorded controls vs freshly computed ones, by control id."""

    total: int
    changed: tuple[ControlChange, ...]
    added: tuple[str, ...]
    removed: tuple[str, ...]
    columns_added: tuple[str, ...] = ()
    """Columns the old recording did not have (first recorded now, not compared)."""

    @property
    def clean(self) -> bool:
        return not (self.changed or self.added or self.removed)

    def summary(self) -> str:
        text = (
            f"controls: {len(self.changed)} changed, {len(self.added)} added, "
            f"{len(self.removed)} removed (of {self.total} now)"
        )
        if self.columns_added:
            text += f"; columns first recorded: {', '.join(self.columns_added)}"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "changed": [
                {
                    "control_id": c.control_id,
                    "old_estimate_bytes": c.old_bytes,
                    "new_estimate_bytes": c.new_bytes,
                    "ratio": c.ratio,
                    "old_per_rank_bytes": c.old_per_rank,
                    "new_per_rank_bytes": c.new_per_rank,
                    "other_columns": list(c.other_columns),
                    "device_figures": [
                        {"column": col, "old_bytes": old, "new_bytes": new}
                        for col, old, new in c.device_figures
                    ],
                }
                for c in self.changed
            ],
            "added": list(self.added),
            "removed": list(self.removed),
            "columns_added": list(self.columns_added),
        }

    def markdown(self, header: str = "") -> str:
        lines = [f"# Controls diff{(' — ' + header) if header else ''}", "", self.summary(), ""]
        if self.changed:
            lines += table(
                ["control", "old bytes", "new bytes", "ratio", "other columns moved"],
                [
                    [
                        f"`{c.control_id}`",
                        f"{c.old_bytes:,}",
                        f"{c.new_bytes:,}",
                        f"{c.ratio:.6f}",
                        ", ".join(c.other_columns) or "-",
                    ]
                    for c in self.changed
                ],
                right=(1, 2, 3),
                style="markdown",
            )
            lines.append("")
        device = [(c, f) for c in self.changed for f in c.device_figures]
        if device:
            lines += [f"## static memory and device budget moved ({len(device)})", ""]
            lines += table(
                ["control", "figure", "old bytes", "new bytes", "change (bytes)"],
                [
                    [f"`{c.control_id}`", col, f"{old:,}", f"{new:,}", f"{new - old:+,}"]
                    for c, (col, old, new) in device
                ],
                right=(2, 3, 4),
                style="markdown",
            )
            lines.append("")
        for label, ids in (("added", self.added), ("removed", self.removed)):
            if ids:
                lines.append(f"## {label} ({len(ids)})")
                lines.append("")
                lines += [f"- `{cid}`" for cid in ids]
                lines.append("")
        return "\n".join(lines)


def compare_controls(
    old: Sequence[Mapping[str, str]],
    new: Sequence[Mapping[str, str]],
    ignore: Sequence[str] = (),
) -> ControlDiff:
    """Every control whose recorded row differs from the recomputed one (every column
    of the recomputed row that the recorded one has is compared, in its order; a column
    the old recording lacks is reported as first recorded, not as a move).

    ``ignore`` names columns not compared (e.g. ``policy`` when another policy's
    values are held against the reference's, for information). Rows are matched by
    policy and control id (by control id alone when ``policy`` is ignored)."""

    def key(r: Mapping[str, str]) -> str:
        cid = r["control_id"]
        return cid if "policy" in ignore or not r.get("policy") else f"{r['policy']} {cid}"

    old_by = {key(r): r for r in old}
    new_keys = {key(r) for r in new}
    changed: list[ControlChange] = []
    added: list[str] = []
    for r in new:
        k = key(r)
        o = old_by.get(k)
        if o is None:
            added.append(k)
            continue
        moved = tuple(c for c in r if c not in ignore and c in o and o[c] != r[c])
        if moved:
            changed.append(
                ControlChange(
                    k,
                    _int_or_zero(o.get("estimate_bytes")),
                    int(r["estimate_bytes"]),
                    o.get("per_rank_bytes", ""),
                    r["per_rank_bytes"],
                    tuple(c for c in moved if c not in ("estimate_bytes", "per_rank_bytes")),
                    tuple(
                        (c, _int_or_zero(o[c]), _int_or_zero(r[c]))
                        for c in DEVICE_FIGURES
                        if c in moved
                    ),
                )
            )
    removed = tuple(key(r) for r in old if key(r) not in new_keys)
    old_columns = {c for r in old for c in r}
    columns_added = tuple(c for c in (new[0] if new else {}) if old and c not in old_columns)
    return ControlDiff(len(new), tuple(changed), tuple(added), removed, columns_added)


def _int_or_zero(text: str | None) -> int:
    try:
        return int(text or "0")
    except ValueError:
        return 0
