"""The trainer check's table: measured peaks next to cpmem's price of the same step.

``python -m gpu_tests.driver.trainer_table CELLS_DIR`` reads every ``<cell>/summary.json``
under CELLS_DIR (one driver run each; trainer_check.sh names them ``<model>-<term>``, the
harness cell of each model ``<model>-base``) and prints one line per cell:

- ``fwd``, ``f+b``: the measured forward and forward+backward peaks (GiB), less the GDN
  fallback's extra saved bytes where GDN ran on the pure-torch fallback (what fla's
  kernel would have kept; ``*`` marks those cells; the raw figures are in the notes);
- ``ref``: cpmem's reference estimate (forward); ``t-fwd``, ``t-f+b``: the tight
  policy's forward and forward+backward estimates, all for the cell's step (head, LoRA
  rank, dropout);
- ``fwd/t``, ``f+b/t``: measured over tight (above 1: the estimate does not cover it);
- ``dfwd`` / ``dt-fwd`` and ``df+b`` / ``dt-f+b`` (MiB): the cell's measured and priced
  increments over its model's ``-base`` cell, i.e. the new term measured vs priced.

Not imported by the package (it runs as a module). On CPU (DRY_RUN) the measured
columns are ``-`` and the priced ones are still shown.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

GIB = 2**30
MIB = 2**20
BASE = "base"


def cell_figures(summary: dict[str, Any]) -> dict[str, Any]:
    """The table's figures of one summary (bytes; None where not measured)."""
    agg = summary["aggregate"]
    fallback = agg.get("gdn_fallback_saved_bytes") is not None
    less = "_less_gdn_fallback" if fallback else ""
    tight = summary.get("estimate_tight") or {}
    return {
        "fwd": agg.get(f"forward_peak{less}_bytes"),
        "fb": agg.get(f"forward_backward_peak{less}_bytes"),
        "raw_fwd": agg["forward_peak_bytes"],
        "raw_fb": agg["forward_backward_peak_bytes"],
        "fallback": fallback,
        "ref": summary["estimate"]["estimate_bytes"],
        "t_fwd": tight.get("estimate_bytes"),
        "t_fb": tight.get("forward_backward_bytes"),
        "finite": agg["finite"],
        "step": (summary.get("trainer") or {}).get("trainer_step", ""),
        "engine": summary["spec"]["engine"],
    }


def _gib(v: int | None) -> str:
    return f"{v / GIB:7.3f}" if v is not None else "      -"


def _ratio(a: int | None, b: int | None) -> str:
    return f"{a / b:6.3f}" if a is not None and b else "     -"


def _delta(v: int | None, base: int | None) -> str:
    return f"{(v - base) / MIB:+8.0f}" if v is not None and base is not None else "       -"


def table(cells_dir: Path) -> str:
    """The table's text for every ``<cell>/summary.json`` under ``cells_dir``."""
    figures: dict[str, dict[str, Any]] = {}
    for f in sorted(cells_dir.glob("*/summary.json")):
        figures[f.parent.name] = cell_figures(json.loads(f.read_text(encoding="utf-8")))
    head = (
        f"{'cell':24s} {'fwd':>7s} {'f+b':>7s} {'ref':>7s} {'t-fwd':>7s} {'t-f+b':>7s}"
        f" {'fwd/t':>6s} {'f+b/t':>6s} {'dfwd':>8s} {'dt-fwd':>8s} {'df+b':>8s} {'dt-f+b':>8s}"
    )
    lines = [
        "GiB (d*: MiB over the model's -base cell); t = cpmem tight, ref = reference;"
        " * = GDN fallback, figures less its extra saved bytes",
        head,
    ]
    for name, c in figures.items():
        model = name.rsplit("-", 1)[0] if "-" in name else name
        base = figures.get(f"{model}-{BASE}")
        b = base or {}
        mark = "*" if c["fallback"] else " "
        lines.append(
            f"{name[:23]:23s}{mark} {_gib(c['fwd'])} {_gib(c['fb'])} {_gib(c['ref'])}"
            f" {_gib(c['t_fwd'])} {_gib(c['t_fb'])} {_ratio(c['fwd'], c['t_fwd'])}"
            f" {_ratio(c['fb'], c['t_fb'])} {_delta(c['fwd'], b.get('fwd'))}"
            f" {_delta(c['t_fwd'], b.get('t_fwd'))} {_delta(c['fb'], b.get('fb'))}"
            f" {_delta(c['t_fb'], b.get('t_fb'))}"
        )
    lines.append("")
    for name, c in figures.items():
        raw = (
            f"; raw fwd {_gib(c['raw_fwd']).strip()} f+b {_gib(c['raw_fb']).strip()} GiB"
            if c["fallback"] and c["raw_fwd"] is not None
            else ""
        )
        lines.append(
            f"{name}: {c['engine']} engine, {c['step'] or 'harness'}, finite={c['finite']}{raw}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not Path(args[0]).is_dir():
        print("usage: python -m gpu_tests.driver.trainer_table CELLS_DIR", file=sys.stderr)
        return 2
    print(table(Path(args[0])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
