"""Validation against every golden cell the simulator can express, and its report.

For each measured cell (dense, hybrid and MoE; refused cells are listed as skipped)
the recorded layout is read from ``golden/cells.csv``: the packed row is the prefix
tree the cell records (shared prefix stored once when ``packed_tokens`` says it was,
padding as 1-token roots), CP ranks own contiguous runs of it with the busiest rank
holding ``retained_tokens``, and the busiest rank is simulated. Only the documented cold
kernel set-up (about 58 MiB, golden/README.md) is added before comparing with the
measured peaks; nothing is fitted.
"""

from __future__ import annotations

import csv
import hashlib
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from oracles.rank_sim import SIM_VERSION
from oracles.rank_sim.geometry import MODEL_IDS, SimModel, get_model
from oracles.rank_sim.layout import RankLayout, rank_pieces, row_segments
from oracles.rank_sim.recompute import Recompute
from oracles.rank_sim.runner import RankResult, simulate_rank

REPO = Path(__file__).resolve().parents[2]
CELLS = REPO / "golden" / "cells.csv"
REPORT = REPO / "golden" / "reports" / "rank_sim_validation.md"
COLD_BYTES = 58 * 2**20  # golden/README.md: "cold kernel set-up, about 58 MiB"
GIB = 2**30
TARGET_TOKENS = 2048
FWD_TARGET, FB_TARGET = 0.03, 0.05


@dataclass(frozen=True)
class Cell:
    cell_id: str
    model_id: str
    tp: int
    cp: int
    sp: bool
    compiled: bool
    mode: str
    modules: str
    lengths: tuple[int, ...]
    shared_prefix: int
    logical: int
    packed: int
    retained: int | None
    forward_peak: int
    forward_backward_peak: int
    ep: int = 1
    routing: str = "concentrated"  # MoE cells: the recorded concentrated_routing

    @property
    def key(self) -> tuple[object, ...]:
        """Cells that differ only in estimator phase ran the same step."""
        return (self.model_id, self.tp, self.cp, self.sp, self.compiled, self.mode,
                self.modules, self.lengths, self.shared_prefix, self.packed, self.retained,
                self.ep, self.routing)  # fmt: skip


def read_cells(path: Path = CELLS) -> tuple[list[Cell], list[tuple[str, str]]]:
    """Expressible measured cells, and (cell_id, reason) for the rest."""
    cells, skipped = [], []
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            if not row["forward_peak_bytes"]:
                skipped.append((row["cell_id"], "refused: no measured peak"))
                continue
            if row["model"] not in MODEL_IDS:
                skipped.append((row["cell_id"], f"unknown model {row['model']}"))
                continue
            cells.append(
                Cell(
                    row["cell_id"],
                    row["model"],
                    int(row["tp"]),
                    int(row["cp"]),
                    row["sequence_parallel"] == "True",
                    row["compiled"] == "True",
                    row["mode"],
                    row["modules"],
                    tuple(int(x) for x in row["lengths"].split("+")),
                    int(row["shared_prefix"] or 0),
                    int(row["logical_tokens"]),
                    int(row["packed_tokens"]),
                    int(row["retained_tokens"]) if row["retained_tokens"] else None,
                    int(row["forward_peak_bytes"]),
                    int(row["forward_backward_peak_bytes"]),
                    int(row["ep"] or 1),
                    "balanced" if row["concentrated_routing"] == "False" else "concentrated",
                )
            )
    return cells, skipped


def segments(cell: Cell) -> list[tuple[int, int | None]]:
    return row_segments(cell.lengths, cell.shared_prefix, cell.packed)


def cell_layout(cell: Cell) -> RankLayout:
    """The busiest rank of the recorded layout (CP: contiguous runs, rank 0 the busiest)."""
    segs = segments(cell)
    if cell.cp == 1:
        counts: tuple[int, ...] = (cell.packed,)
    else:
        busiest = cell.retained or -(-cell.packed // cell.cp)
        rest = cell.packed - busiest
        others = cell.cp - 1
        counts = (busiest, *(rest // others + (r < rest % others) for r in range(others)))
    pieces = rank_pieces(segs, 0, counts[0])
    return RankLayout(cell.tp, cell.cp, 0, counts, counts, pieces, cell.logical, cell.sp)


def cell_model(cell: Cell, layers: int | None = None) -> SimModel:
    model = get_model(cell.model_id)
    return model.truncated(layers) if layers else model


def simulate_cell(cell: Cell, layers: int | None = None) -> RankResult:
    rc = Recompute.parse(cell.mode, cell.modules or None)
    model = cell_model(cell, layers)
    moe = {"ep": cell.ep, "routing": cell.routing} if model.moe else {}
    return simulate_rank(model, cell_layout(cell), rc, compiled=cell.compiled, **moe)


def inputs_digest() -> str:
    """sha256 over golden/cells.csv and the simulator's sources: the report is stale
    when any of them changes."""
    h = hashlib.sha256(CELLS.read_bytes())
    for path in sorted(Path(__file__).parent.glob("*.py")):
        if path.name != "__main__.py":
            h.update(path.name.encode() + path.read_bytes())
    return h.hexdigest()


def _ratio(sim: int, measured: int) -> float:
    return (sim + COLD_BYTES) / measured


def _fmt(x: float) -> str:
    return f"{x:.3f}"


def report(
    rows: list[tuple[Cell, RankResult]], skipped: Iterable[tuple[str, str]], seconds: float
) -> str:
    lines = [
        "# Rank simulator vs measured cells",
        "",
        f"Generated by `python -m oracles.rank_sim.validate --write` (simulator {SIM_VERSION}).",
        f"inputs-sha256: {inputs_digest()}",
        "",
        "Each row simulates the busiest rank of the cell's recorded layout (all layers, fake",
        "tensors, fake process group) and adds only the documented cold kernel set-up",
        f"({COLD_BYTES // 2**20} MiB). Ratio = (sim + cold) / measured. Targets on cells with",
        f">= {TARGET_TOKENS} logical tokens: forward within {FWD_TARGET:.0%}, forward+backward",
        f"within {FB_TARGET:.0%}. GDN kernel: the saved-tensor oracle's stand-in on every row",
        "(fla-core is not importable here). Nothing is fitted.",
        "",
        "| cell | tp | cp | mode | compiled | rank tokens | fwd measured GiB | fwd sim GiB | fwd ratio |"
        " fb measured GiB | fb sim GiB | fb ratio | in target |",
        "| --- | --: | --: | --- | --- | --: | --: | --: | --: | --: | --: | --: | --- |",
    ]
    for cell, r in rows:
        fr, br = (
            _ratio(r.forward_peak_bytes, cell.forward_peak),
            _ratio(r.forward_backward_peak_bytes, cell.forward_backward_peak),
        )
        target = (
            "n/a (< 2048 tokens)"
            if cell.logical < TARGET_TOKENS
            else ("yes" if abs(fr - 1) <= FWD_TARGET and abs(br - 1) <= FB_TARGET else "**no**")
        )
        mode = cell.mode + (f":{cell.modules}" if cell.modules else "")
        if r.expert_rows:  # MoE rows only: the dense rows' text is unchanged
            mode += f" (ep{cell.ep}, {cell.routing})"
        lines.append(
            f"| {cell.cell_id} | {cell.tp} | {cell.cp} | {mode} | {cell.compiled} | {r.tokens} | "
            f"{cell.forward_peak / GIB:.3f} | {(r.forward_peak_bytes + COLD_BYTES) / GIB:.3f} | {_fmt(fr)} | "
            f"{cell.forward_backward_peak / GIB:.3f} | "
            f"{(r.forward_backward_peak_bytes + COLD_BYTES) / GIB:.3f} | {_fmt(br)} | {target} |"
        )
    lines += ["", "## Summary (cells with >= 2048 logical tokens)", ""]
    lines += ["| group | cells | fwd median | fwd worst | fb median | fb worst | in target |"]
    lines += ["| --- | --: | --: | --: | --: | --: | --: |"]
    big = [(c, r) for c, r in rows if c.logical >= TARGET_TOKENS]
    # "all" and the mode groups are the dense/hybrid cells; MoE cells group by routing
    groups: dict[str, list[tuple[Cell, RankResult]]] = {
        "all": [(c, r) for c, r in big if not r.expert_rows]
    }
    for c, r in big:
        groups.setdefault(f"model {c.model_id}", []).append((c, r))
        name = f"{c.mode}{':' + c.modules if c.modules else ''}"
        if r.expert_rows:
            groups.setdefault(f"MoE {name} {c.routing}", []).append((c, r))
        else:
            groups.setdefault(f"mode {name}", []).append((c, r))
    groups = {k: v for k, v in groups.items() if v}
    for name, members in groups.items():
        frs = [_ratio(r.forward_peak_bytes, c.forward_peak) for c, r in members]
        brs = [_ratio(r.forward_backward_peak_bytes, c.forward_backward_peak) for c, r in members]
        ok = sum(
            abs(a - 1) <= FWD_TARGET and abs(b - 1) <= FB_TARGET
            for a, b in zip(frs, brs, strict=True)
        )
        lines.append(
            f"| {name} | {len(members)} | {_fmt(statistics.median(frs))} | "
            f"{_fmt(max(frs, key=lambda x: abs(x - 1)))} | {_fmt(statistics.median(brs))} | "
            f"{_fmt(max(brs, key=lambda x: abs(x - 1)))} | {ok}/{len(members)} |"
        )
    lines += ["", "## Cells outside the targets (>= 2048 logical tokens)", ""]
    for c, r in big:
        fr = _ratio(r.forward_peak_bytes, c.forward_peak)
        br = _ratio(r.forward_backward_peak_bytes, c.forward_backward_peak)
        if abs(fr - 1) > FWD_TARGET or abs(br - 1) > FB_TARGET:
            lines.append(f"- {c.cell_id}: forward {fr - 1:+.1%}, forward+backward {br - 1:+.1%}")
    lines += [
        "",
        "What each miss is believed to be, and what is not modelled: oracles/rank_sim/README.md.",
    ]
    lines += moe_repetitions([(c, r) for c, r in rows if r.expert_rows])
    lines += ["", "## Not simulated", ""]
    lines += [f"- {cid}: {why}" for cid, why in skipped]
    lines += ["", f"Simulation time: {seconds:.0f} s on this machine.", ""]
    return "\n".join(lines)


def moe_repetitions(rows: list[tuple[Cell, RankResult]], path: Path = CELLS) -> list[str]:
    """MoE cells: the two measured repetitions side by side. Every MoE cell's first
    repetition leaves memory behind that the second finds in its baseline (baseline max
    minus min, about first minus repeat peak); dense cells show that only once per
    process (the ~64 MiB cold set-up of their first cell). The warm ratio compares the
    simulation without any cold set-up with the second repetition's forward peak."""
    if not rows:
        return []
    with path.open(newline="") as fh:
        rec = {r["cell_id"]: r for r in csv.DictReader(fh)}
    lines = [
        "",
        "## MoE cells: first and repeated forward",
        "",
        "| cell | first - repeat fwd MiB | baseline max - min MiB | repeat fwd GiB |"
        " sim (no cold) GiB | warm ratio |",
        "| --- | --: | --: | --: | --: | --: |",
    ]
    for cell, r in rows:
        row = rec[cell.cell_id]
        first, repeat = int(row["first_forward_peak_bytes"]), int(row["repeat_forward_peak_bytes"])
        spread = int(row["baseline_max_bytes"]) - int(row["baseline_min_bytes"])
        lines.append(
            f"| {cell.cell_id} | {(first - repeat) / 2**20:.0f} | {spread / 2**20:.0f} | "
            f"{repeat / GIB:.3f} | {r.forward_peak_bytes / GIB:.3f} | "
            f"{_fmt(r.forward_peak_bytes / repeat)} |"
        )
    return lines
