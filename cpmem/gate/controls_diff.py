"""What moved between two recordings of the controls: changed, added, removed, as a
dict for JSON and as a Markdown table for a pull request."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ControlChange:
    control_id: str
    old_bytes: int
    new_bytes: int
    old_per_rank: str
    new_per_rank: str
    other_columns: tuple[str, ...]  # columns besides the estimate that moved

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

    @property
    def clean(self) -> bool:
        return not (self.changed or self.added or self.removed)

    def summary(self) -> str:
        return (
            f"controls: {len(self.changed)} changed, {len(self.added)} added, "
            f"{len(self.removed)} removed (of {self.total} now)"
        )

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
                }
                for c in self.changed
            ],
            "added": list(self.added),
            "removed": list(self.removed),
        }

    def markdown(self, header: str = "") -> str:
        lines = [f"# Controls diff{(' — ' + header) if header else ''}", "", self.summary(), ""]
        if self.changed:
            lines += [
                "| control | old bytes | new bytes | ratio | other columns moved |",
                "| --- | ---: | ---: | ---: | --- |",
            ]
            lines += [
                f"| `{c.control_id}` | {c.old_bytes:,} | {c.new_bytes:,} | {c.ratio:.6f} | "
                f"{', '.join(c.other_columns) or '-'} |"
                for c in self.changed
            ]
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
    of the recomputed row is compared, in its order).

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
        moved = tuple(c for c in r if c not in ignore and o.get(c) != r[c])
        if moved:
            changed.append(
                ControlChange(
                    k,
                    _int_or_zero(o.get("estimate_bytes")),
                    int(r["estimate_bytes"]),
                    o.get("per_rank_bytes", ""),
                    r["per_rank_bytes"],
                    tuple(c for c in moved if c not in ("estimate_bytes", "per_rank_bytes")),
                )
            )
    removed = tuple(key(r) for r in old if key(r) not in new_keys)
    return ControlDiff(len(new), tuple(changed), tuple(added), removed)


def _int_or_zero(text: str | None) -> int:
    try:
        return int(text or "0")
    except ValueError:
        return 0
