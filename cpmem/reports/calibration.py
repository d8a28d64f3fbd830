"""The calibration report: every golden cell, its estimate(s), its peaks, in GiB.

``cpmem report [--policy reference] [--policy tight ...] [--out DIR] [--golden DIR]``
writes ``DIR/report.md`` (one row per cell) and two figures:

- ``estimate_vs_peak.png``: estimate against measured forward peak, one panel per
  model, with the y = x line (points below it are under-estimates);
- ``headroom.png``: estimate / peak - 1 for every measured cell, one bar per
  policy, so several policies compare cell by cell.

Cells are priced exactly as the gate prices them (from what was recorded).
matplotlib is imported only when figures are drawn, so cpmem imports without it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

import cpmem
from cpmem.errors import CpmemError
from cpmem.golden.cells import MeasuredCell, load_cells
from cpmem.golden.files import CELLS_FILE, add_golden_argument, default_golden_dir
from cpmem.model.load import load_model
from cpmem.pricing.registry import policy_names, price
from cpmem.reports.progress import Progress, wanted
from cpmem.reports.tables import pct, table
from cpmem.samples.cells import cell_step
from cpmem.units import GIB, fmt_gib

__all__ = ["CellResult", "collect", "main", "write_report"]

REPORT_FILE = "report.md"
SCATTER_FILE = "estimate_vs_peak.png"
HEADROOM_FILE = "headroom.png"


@dataclass(frozen=True)
class CellResult:
    """One cell and each policy's estimate and priced tokens for it."""

    cell: MeasuredCell
    estimates: dict[str, int]
    priced_tokens: dict[str, int]

    def headroom(self, policy: str) -> float | None:
        peak = self.cell.forward_peak_bytes
        if peak is None or self.cell.refused:
            return None
        return self.estimates[policy] / peak - 1


def collect(
    policies: Sequence[str], golden_dir: Path, progress: Progress | None = None
) -> list[CellResult]:
    """Price every golden cell with every policy."""
    out = []
    cells = sorted(load_cells(golden_dir / CELLS_FILE), key=_order)
    if progress is not None:
        progress.total += len(cells)
    for cell in cells:
        if progress is not None:
            progress.step(note=cell.cell_id)
        step = cell_step(cell)
        ests = {p: price(step, p) for p in policies}
        out.append(
            CellResult(
                cell,
                {p: e.estimate_bytes for p, e in ests.items()},
                {p: e.busiest_tokens for p, e in ests.items()},
            )
        )
    return out


def _short_model(model: str) -> str:
    return model.split("/")[-1]


def _recompute(cell: MeasuredCell) -> str:
    return f"{cell.mode}({cell.modules})" if cell.modules else cell.mode


def _order(cell: MeasuredCell) -> tuple[Any, ...]:
    """Group a model's cells by layout and settings, shortest requests first."""
    return (
        cell.model,
        cell.tp,
        cell.cp,
        _recompute(cell),
        cell.compiled,
        cell.concentrated_routing is False,
        cell.logical_tokens,
        cell.phase,
    )


def cell_label(cell: MeasuredCell) -> str:
    """A short, unique-enough label for figures."""
    phase = "" if cell.phase == "final" else f" [{cell.phase.replace('_negative_control', ' neg')}]"
    moe = load_model(cell.model).is_moe  # routing only matters for MoE
    routing = ""
    if moe and cell.concentrated_routing is not None:
        routing = " concentrated" if cell.concentrated_routing else " balanced"
    return (
        f"{_short_model(cell.model)} tp{cell.tp} cp{cell.cp} {_recompute(cell)} "
        f"{'compiled' if cell.compiled else 'eager'}{routing} {cell.lengths}{phase}"
    )


def render_markdown(results: Sequence[CellResult], policies: Sequence[str], golden: Path) -> str:
    lines = [
        "# cpmem calibration report",
        "",
        f"Policies: {', '.join(policies)}. cpmem {cpmem.__version__}; golden data: "
        f"`{golden}` ({len(results)} cells). All sizes in GiB (2^30 bytes), per GPU rank. "
        "Headroom = estimate / measured forward peak - 1 (negative: the estimate does not "
        "cover the peak). Refused cells never ran, so they have no peak.",
        "",
    ]
    heads = pd.DataFrame({p: [r.headroom(p) for r in results] for p in policies}, dtype=float)
    summary = []
    for p, h in heads.items():  # a policy's headroom over the measured cells (NaN: none)
        h = h.dropna()
        summary.append(
            [
                f"{p}",
                f"{h.size}",
                f"{(h < 0).sum()}",
                *(pct(float(x), signed=True) for x in (h.min(), h.median(), h.max())),
            ]
        )
    lines += table(
        ["policy", "measured cells", "not covered", "min headroom", "median", "max"],
        summary,
        right=range(1, 6),
        style="markdown",
    )
    many = len(policies) > 1
    per_policy = ["priced tokens", "estimate", "headroom"]
    head = [
        "model",
        "TP",
        "CP",
        "recompute",
        "compiled",
        "lengths",
        "phase",
        "packed tokens",
    ]
    if many:
        head += [f"{col} ({p})" for col in per_policy[:2] for p in policies]
    else:
        head += per_policy[:2]
    head += ["forward peak", "fwd+bwd peak"]
    head += [f"headroom ({p})" for p in policies] if many else ["headroom"]
    text_cols = 7  # model .. phase are text; the rest are numbers
    cells = []
    for r in results:
        c = r.cell
        row = [
            _short_model(c.model),
            str(c.tp),
            str(c.cp),
            _recompute(c),
            "yes" if c.compiled else "no",
            c.lengths,
            c.phase,
            f"{c.packed_tokens:,}",
            *(f"{r.priced_tokens[p]:,}" for p in policies),
            *(fmt_gib(r.estimates[p]) for p in policies),
            "refused" if c.refused else fmt_gib(c.forward_peak_bytes),
            "refused" if c.refused else fmt_gib(c.forward_backward_peak_bytes),
            *(pct(r.headroom(p), signed=True) for p in policies),
        ]
        cells.append(row)
    lines += ["", *table(head, cells, right=range(text_cols, len(head)), style="markdown")]
    lines += [
        "",
        f"![estimate vs measured forward peak]({SCATTER_FILE})",
        "",
        f"![headroom per cell]({HEADROOM_FILE})",
        "",
    ]
    return "\n".join(lines)


_COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown")
_MARKERS = ("o", "s", "^", "D", "v")


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_scatter(results: Sequence[CellResult], policies: Sequence[str], path: Path) -> None:
    """Estimate vs measured forward peak, one log-log panel per model, y = x line."""
    plt = _pyplot()
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    measured = [r for r in results if r.headroom(policies[0]) is not None]
    models = sorted({r.cell.model for r in measured})
    cols = 2
    rows = -(-len(models) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(11, 4.8 * rows), squeeze=False)
    for ax, model in zip(axes.flat, models, strict=False):
        cells = [r for r in measured if r.cell.model == model]
        peaks = [(r.cell.forward_peak_bytes or 0) / GIB for r in cells]
        lo = min(peaks)
        hi = max(peaks)
        for i, p in enumerate(policies):
            ests = [r.estimates[p] / GIB for r in cells]
            lo, hi = min(lo, *ests), max(hi, *ests)
            color = _COLORS[i % len(_COLORS)]
            ax.scatter(  # later policies hollow, so coinciding points stay visible
                peaks,
                ests,
                s=30 if i == 0 else 60,
                alpha=0.85,
                facecolors=color if i == 0 else "none",
                edgecolors=color,
                linewidths=1.4,
                marker=_MARKERS[i % len(_MARKERS)],
                label=f"{p} estimate",
            )
        line = [lo / 1.3, hi * 1.3]
        ax.plot(line, line, "k--", lw=1, label="y = x (estimate = peak)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(line)
        ax.set_ylim(line)
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
            axis.set_minor_formatter(NullFormatter())
        ax.set_title(f"{_short_model(model)} ({len(cells)} measured cells)")
        ax.set_xlabel("measured forward peak (GiB, log scale)")
        ax.set_ylabel("estimate (GiB, log scale)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(loc="upper left", fontsize=8)
    for ax in list(axes.flat)[len(models) :]:
        ax.set_visible(False)
    fig.suptitle("Estimate vs measured forward peak per rank (points below y = x are not covered)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_headroom(results: Sequence[CellResult], policies: Sequence[str], path: Path) -> None:
    """Headroom per measured cell, one horizontal bar per policy, labelled by cell."""
    plt = _pyplot()
    measured = [r for r in results if r.headroom(policies[0]) is not None]
    measured.sort(key=lambda r: _order(r.cell))
    n, k = len(measured), len(policies)
    bar = 0.8 / k
    fig, ax = plt.subplots(figsize=(12, max(4.0, 0.26 * n * max(1, k * 0.7) + 1.5)))
    for i, p in enumerate(policies):
        vals = [(r.headroom(p) or 0.0) * 100 for r in measured]
        ys = [j + (i - (k - 1) / 2) * bar for j in range(n)]
        colors = ["tab:red" if v < 0 else _COLORS[i % len(_COLORS)] for v in vals]
        ax.barh(ys, vals, height=bar, color=colors, label=p)
        for y, v in zip(ys, vals, strict=True):
            ax.annotate(
                f"{v:.1f}%",
                (v, y),
                xytext=(3 if v >= 0 else -3, 0),
                textcoords="offset points",
                ha="left" if v >= 0 else "right",
                va="center",
                fontsize=6,
            )
    ax.set_yticks(range(n))
    ax.set_yticklabels([cell_label(r.cell) for r in measured], fontsize=7)
    ax.margins(x=0.08)  # room for the value labels at the ends of the bars
    ax.set_ylim(n - 0.5, -0.5)  # first cell on top, no empty margin
    ax.axvline(0, color="k", lw=1)
    ax.set_xlabel("headroom = estimate / measured forward peak - 1 (%); red: not covered")
    ax.set_title(f"Headroom per measured cell ({n} cells; policies: {', '.join(policies)})")
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


REPORT_EXTRA_HINT = "pip install 'cpmem[report]'"


def require_matplotlib() -> None:
    """Fail with one line naming the extra, before anything is written."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise CpmemError(
            f"the report's figures need matplotlib, which is not installed: {REPORT_EXTRA_HINT}"
        ) from None


def write_report(
    policies: Sequence[str], out: Path, golden_dir: Path, *, progress: bool = False
) -> list[Path]:
    """Write report.md and the figures into ``out``; return the paths written."""
    require_matplotlib()
    with Progress("cpmem report: pricing cells", 0, enabled=progress) as bar:
        results = collect(policies, golden_dir, bar)
        out.mkdir(parents=True, exist_ok=True)
        md = out / REPORT_FILE
        md.write_text(render_markdown(results, policies, golden_dir), encoding="utf-8")
        scatter, headroom = out / SCATTER_FILE, out / HEADROOM_FILE
        bar.label, bar.done, bar.total = "cpmem report: drawing figures", 0, 2
        bar.step(0)
        plot_scatter(results, policies, scatter)
        bar.step()
        plot_headroom(results, policies, headroom)
        bar.step()
    return [md, scatter, headroom]


def main(argv: Sequence[str] | None = None) -> int:
    """``cpmem report``: 0 on success, 2 on a usage error."""
    p = argparse.ArgumentParser(
        prog="cpmem report", description="Write the calibration report (markdown + figures)."
    )
    p.add_argument(
        "--policy",
        action="append",
        default=None,
        help="pricing policy; repeat to compare several (default: reference)",
    )
    p.add_argument("--out", type=Path, default=Path("report"), help="output directory")
    add_golden_argument(p)
    args = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    policies: list[str] = list(dict.fromkeys(args.policy or ["reference"]))
    unknown = [x for x in policies if x not in policy_names()]
    if unknown:
        print(
            f"cpmem report: error: unknown policy {unknown}; choose from {policy_names()}",
            file=sys.stderr,
        )
        return 2
    golden_dir: Path = args.golden if args.golden is not None else default_golden_dir()
    try:
        paths = write_report(policies, args.out, golden_dir, progress=wanted())
    except CpmemError as exc:
        print(f"cpmem report: error: {exc}", file=sys.stderr)
        return 2
    for path in paths:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
