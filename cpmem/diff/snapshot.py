"""One checkout's prices for ``cpmem diff``: every golden cell, control and registered
row, under every policy that checkout knows, as JSON.

``cpmem diff`` runs this file as a script (``python .../snapshot.py ROOT ...``) with
``PYTHONPATH`` at the checkout it prices, so the ``cpmem`` it imports is that checkout's,
whichever revision it is. It therefore finds what it calls by name (``LAYOUTS``): in the
current layout every cell is priced through the step description (``cell_step``, built by
``describe_step``); the one earlier layout it knows, the stage packages before the step
description, had ``cell_inputs``. An older revision is refused with a message naming what
was missing.

Beside each estimate's activation figures it records the whole device's (``device``): the
static memory the checkout attaches to the Estimate and what the checkout's budget rule
leaves the activations on its ``h200`` preset. A checkout without them (no static memory,
no budget rule or preset) records None there and says so (``device_notes``).
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

LAYOUTS: tuple[dict[str, str], ...] = (
    {  # the step description (cpmem.step) and the suite's packages
        "load_cells": "cpmem.golden.cells",
        "cell_step": "cpmem.samples.cells",
        "refusals": "cpmem.gate.checks",
        "control_grid": "cpmem.gate.controls",
        "price": "cpmem.pricing.registry",
        "policy_names": "cpmem.pricing.registry",
    },
    {  # the stage packages before the step description
        "load_cells": "cpmem.golden.cells",
        "cell_inputs": "cpmem.gate.samples",
        "refusals": "cpmem.gate.checks",
        "control_grid": "cpmem.gate.controls",
        "price": "cpmem.pricing.registry",
        "policy_names": "cpmem.pricing.registry",
    },
)


BUDGET_DEVICE = "h200"
"""The device preset whose budget is priced on both sides (the gate's controls' too)."""


def find_layout(root: Path) -> dict[str, Callable[..., Any]]:
    """The functions of the first layout the imported cpmem has, the cell conversion
    under the one name ``cell``; SystemExit naming what is missing otherwise."""
    tried = []
    for layout in LAYOUTS:
        found: dict[str, Callable[..., Any]] = {}
        for name, module in layout.items():
            try:
                fn = getattr(_own_module(root, module), name)
            except (ImportError, AttributeError) as exc:
                tried.append(f"{module}.{name} ({exc})")
                break
            found["cell" if name in ("cell_step", "cell_inputs") else name] = fn
        else:
            return found
    wanted = " or ".join(f"{layout_cell(layout)}" for layout in LAYOUTS)
    sys.exit(
        f"cpmem diff: {root}: not a cpmem layout this diff knows (it needs {wanted}); "
        "tried " + "; ".join(tried)
    )


def _own_module(root: Path, name: str) -> Any:
    """``name`` imported from the checkout at ``root``, never from elsewhere: an editable
    install of another checkout would otherwise supply the modules this one lacks."""
    module = importlib.import_module(name)
    path = Path(getattr(module, "__file__", "") or "").resolve()
    if not path.is_relative_to((root / "cpmem").resolve()):
        raise ImportError(f"{name} is not in {root} (found at {path})")
    return module


def layout_cell(layout: dict[str, str]) -> str:
    """The cell conversion a layout names, as ``module.function``."""
    name = next(n for n in layout if n in ("cell_step", "cell_inputs"))
    return f"{layout[name]}.{name}"


def _rows(source: Callable[[Path], Any], golden_dir: Path) -> list[tuple[str, Any]]:
    return list(source(golden_dir))


def figures(est: Any) -> list[int | None]:
    return [est.estimate_bytes, getattr(est, "forward_backward_bytes", None)]


Budget = Callable[[Any], int | None]


def budget_rule(root: Path, notes: list[str]) -> Budget | None:
    """The checkout's budget of its ``BUDGET_DEVICE`` preset over a static memory, or
    None; why there is none, or the first error of the rule, goes to ``notes`` (a failing
    budget never costs a cell or row its activation figures)."""
    try:
        rule = _own_module(root, "cpmem.pricing.device_budget").device_budget
        device = _own_module(root, "cpmem.step.device").DEVICES[BUDGET_DEVICE]
    except (ImportError, AttributeError, KeyError) as exc:
        notes.append(
            f"the {BUDGET_DEVICE} budget is not priced there ({type(exc).__name__}: {exc})"
        )
        return None

    def budget(static: Any) -> int | None:
        try:
            return int(rule(device, static).budget_bytes)
        except Exception as exc:
            if not notes:
                notes.append(f"the {BUDGET_DEVICE} budget failed: {type(exc).__name__}: {exc}")
            return None

    return budget


def device_figures(est: Any, budget: Budget | None) -> list[int | None]:
    """[static bytes, the preset's budget]; None where the checkout prices neither."""
    static = getattr(est, "static", None)
    if static is None:
        return [None, None]
    return [int(static.total), None if budget is None else budget(static)]


class Ticker:
    """``label  done/total`` on stderr every 25 items, when asked."""

    def __init__(self, label: str, total: int, show: bool) -> None:
        self.label, self.total, self.show, self.done = label, total, show, 0

    def tick(self) -> None:
        self.done += 1
        if self.show and (self.done % 25 == 0 or self.done == self.total):
            sys.stderr.write(f"\r{self.label}  {self.done}/{self.total}")
            sys.stderr.flush()

    def close(self) -> None:
        if self.show:
            sys.stderr.write("\r" + " " * (len(self.label) + 24) + "\r")


def snapshot(
    root: Path, golden_dir: Path, row_sources: dict[str, str], label: str, show: bool
) -> dict[str, Any]:
    """Price everything the checkout at ``root`` knows how to price."""
    fn = find_layout(root)
    policies = list(fn["policy_names"]())
    out: dict[str, Any] = {
        "root": str(root),
        "policies": policies,
        "golden": str(golden_dir),
        "golden_note": None,
        "cells": {},
        "cell_errors": {},
        "refusals": {},
        "refusal_errors": {},
        "rows": {},
        "row_errors": {},
        "device": {"cell": {}},
        "device_notes": [],
    }
    budget = budget_rule(root, out["device_notes"])
    try:
        cells = fn["load_cells"](golden_dir / "cells.csv")
    except Exception as exc:  # an older loader that cannot read today's golden layer
        own = root / "golden"
        out["golden_note"] = f"could not read {golden_dir} ({exc}); priced {own} instead"
        out["golden"] = str(own)
        cells = fn["load_cells"](own / "cells.csv")
    grids: list[tuple[str, list[tuple[str, Any]]]] = []
    sources: list[tuple[str, Callable[[], list[tuple[str, Any]]]]] = [
        ("control", lambda: [(r.control_id, r.price) for r in fn["control_grid"]()])
    ]
    for kind, spec in row_sources.items():
        mod_name, _, fn_name = spec.partition(":")
        try:
            source = getattr(importlib.import_module(mod_name), fn_name)  # any package
        except (ImportError, AttributeError) as exc:
            out["row_errors"][kind] = f"{spec}: {exc}"
            continue
        sources.append((kind, partial(_rows, source, golden_dir)))
    for kind, make in sources:
        try:
            grids.append((kind, make()))
        except Exception as exc:
            out["row_errors"][kind] = f"{type(exc).__name__}: {exc}"
    ticker = Ticker(label, len(cells) + sum(len(rows) for _, rows in grids), show)
    steps = {}
    for cell in cells:
        ticker.tick()
        try:
            step = fn["cell"](cell)
            ests = {p: fn["price"](step, p) for p in policies}
            out["cells"][cell.cell_id] = {p: figures(e) for p, e in ests.items()}
            out["device"]["cell"][cell.cell_id] = {
                p: device_figures(e, budget) for p, e in ests.items()
            }
            steps[cell.cell_id] = step
        except Exception as exc:
            out["cell_errors"][cell.cell_id] = f"{type(exc).__name__}: {exc}"
    priced = [c for c in cells if c.cell_id in steps]
    for p in policies:
        try:
            rows = fn["refusals"](priced, steps, p)["rows"]
            out["refusals"][p] = {r["cell_id"]: r["decision"] for r in rows}
        except Exception as exc:
            out["refusal_errors"][p] = f"{type(exc).__name__}: {exc}"
    for kind, grid in grids:
        got = out["rows"].setdefault(kind, {})
        dev = out["device"].setdefault(kind, {})
        for row_id, pricer in grid:
            ticker.tick()
            try:
                ests = {p: pricer(p) for p in policies}
                got[row_id] = {p: figures(e) for p, e in ests.items()}
                dev[row_id] = {p: device_figures(e, budget) for p, e in ests.items()}
            except Exception as exc:
                out["row_errors"].setdefault(kind, f"{row_id}: {type(exc).__name__}: {exc}")
    ticker.close()
    device = [f for by_id in out["device"].values() for fs in by_id.values() for f in fs.values()]
    if device and all(f[0] is None for f in device):
        out["device_notes"].insert(0, "static memory is not priced there (no Estimate.static)")
    return out


def main(argv: list[str]) -> int:
    """``snapshot.py ROOT GOLDEN OUT ROW_SOURCES_JSON LABEL SHOW``: write the JSON."""
    root, golden_dir, out_path = Path(argv[0]), Path(argv[1]), Path(argv[2])
    row_sources, label, show = json.loads(argv[3]), argv[4], argv[5] == "1"
    sys.path[0] = str(root)  # this file's folder is not a package root; the checkout is
    import cpmem

    if Path(cpmem.__file__).resolve().parent != (root / "cpmem").resolve():
        sys.exit(f"cpmem diff: imported cpmem from {cpmem.__file__}, not from {root}")
    result = snapshot(root, golden_dir, row_sources, label, show)
    result["cpmem_file"] = cpmem.__file__
    out_path.write_text(json.dumps(result), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
