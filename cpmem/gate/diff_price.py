"""Pricing one checkout's estimator for ``cpmem diff``: a git worktree of a revision,
and a small, stable script run in a subprocess with ``PYTHONPATH`` at that checkout.

The script is written to a temporary file from ``PRICE_SCRIPT`` (never imported by
cpmem), so it is the same text whichever revision it prices. It finds what it needs
under every module layout cpmem has had:

- stage packages (``cpmem.gate.samples``, ``cpmem.gate.checks``, ``cpmem.golden.cells``,
  ``cpmem.gate.controls``, ``cpmem.pricing.registry``), the current layout;
- the first stage-package commit (``cpmem.gate.gate``, ``cpmem.golden.golden``);
- the flat pre-layout modules (``cpmem.gate``, ``cpmem.golden``, ``cpmem.controls``,
  ``cpmem.pricing``).

Revisions before the estimator gate existed (no ``cell_inputs`` anywhere) are
refused with a message naming what was missing; one without the control grid or
the refusals check is priced without them, and the report notes it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from cpmem.errors import CpmemError


class DiffError(CpmemError):
    """A revision, repository or checkout that cannot be priced."""


PRICE_SCRIPT = r'''
"""cpmem diff: price every golden cell, control and row of ONE checkout (stable script)."""
import importlib
import json
import os
import sys
from pathlib import Path

root, golden_dir, out_path = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
row_sources = json.loads(sys.argv[4])  # {kind: "module:function"}
label = sys.argv[5]
show_progress = sys.argv[6] == "1"
sys.path.insert(0, str(root))

import cpmem  # noqa: E402

if Path(cpmem.__file__).resolve().parent != (root / "cpmem").resolve():
    sys.exit(f"cpmem diff: imported cpmem from {cpmem.__file__}, not from {root}")


def first(name, *modules, required=True):
    tried = []
    for mod in modules:
        try:
            found = importlib.import_module(mod)
        except ImportError as exc:
            tried.append(f"{mod} ({exc})")
            continue
        if hasattr(found, name):
            return getattr(found, name)
        tried.append(f"{mod} (no {name})")
    if not required:
        return None
    sys.exit(f"cpmem diff: {root}: cannot find {name}; tried " + "; ".join(tried))


load_cells = first("load_cells", "cpmem.golden.cells", "cpmem.golden.golden", "cpmem.golden")
cell_inputs = first("cell_inputs", "cpmem.gate.samples", "cpmem.gate.gate", "cpmem.gate")
refusals = first("refusals", "cpmem.gate.checks", "cpmem.gate.gate", "cpmem.gate", required=False)
control_grid = first("control_grid", "cpmem.gate.controls", "cpmem.controls", required=False)
price = first("price", "cpmem.pricing.registry", "cpmem.pricing")
policy_names = first("policy_names", "cpmem.pricing.registry", "cpmem.pricing")

policies = list(policy_names())
out = {
    "root": str(root),
    "cpmem_file": cpmem.__file__,
    "policies": policies,
    "golden": str(golden_dir),
    "golden_note": None,
    "cells": {},
    "cell_errors": {},
    "refusals": {},
    "refusal_errors": {},
    "rows": {},
    "row_errors": {},
}
try:
    cells = load_cells(golden_dir / "cells.csv")
except Exception as exc:  # an older loader that cannot read today's golden layer
    own = root / "golden"
    out["golden_note"] = f"could not read {golden_dir} ({exc}); priced {own} instead"
    out["golden"] = str(own)
    cells = load_cells(own / "cells.csv")

sources = []
if control_grid is not None:
    sources.append(("control", lambda: [(r.control_id, r.price) for r in control_grid()]))
else:
    out["row_errors"]["control"] = "this revision has no control grid"
for kind, spec in row_sources.items():
    mod_name, _, fn_name = spec.partition(":")
    try:
        fn = getattr(importlib.import_module(mod_name), fn_name)
    except (ImportError, AttributeError) as exc:
        out["row_errors"][kind] = f"{spec}: {exc}"
        continue
    sources.append((kind, lambda fn=fn: list(fn(golden_dir))))
grids = []
for kind, make in sources:
    try:
        grids.append((kind, make()))
    except Exception as exc:
        out["row_errors"][kind] = f"{type(exc).__name__}: {exc}"

total = len(cells) + sum(len(rows) for _, rows in grids)
done = 0


def tick():
    global done
    done += 1
    if show_progress and (done % 25 == 0 or done == total):
        sys.stderr.write(f"\r{label}  {done}/{total}")
        sys.stderr.flush()


def figures(est):
    return [est.estimate_bytes, getattr(est, "forward_backward_bytes", None)]


inputs = {}
for cell in cells:
    tick()
    try:
        inp = cell_inputs(cell)
        out["cells"][cell.cell_id] = {p: figures(price(inp, p)) for p in policies}
        inputs[cell.cell_id] = inp
    except Exception as exc:
        out["cell_errors"][cell.cell_id] = f"{type(exc).__name__}: {exc}"
priced = [c for c in cells if c.cell_id in inputs]
for p in policies if refusals is not None else ():
    try:
        rows = refusals(priced, inputs, p)["rows"]
        out["refusals"][p] = {r["cell_id"]: r["decision"] for r in rows}
    except Exception as exc:
        out["refusal_errors"][p] = f"{type(exc).__name__}: {exc}"
if refusals is None:
    out["refusal_errors"]["all policies"] = "this revision has no refusals check"
for kind, rows in grids:
    got = out["rows"].setdefault(kind, {})
    for row_id, pricer in rows:
        tick()
        try:
            got[row_id] = {p: figures(pricer(p)) for p in policies}
        except Exception as exc:
            out["row_errors"].setdefault(kind, f"{row_id}: {type(exc).__name__}: {exc}")
if show_progress:
    sys.stderr.write("\r" + " " * (len(label) + 24) + "\r")
out_path.write_text(json.dumps(out), encoding="utf-8")
'''


def _git(repo: Path, *args: str) -> str:
    try:
        done = subprocess.run(
            ["git", "-C", str(repo), *args], capture_output=True, text=True, check=False
        )
    except OSError as exc:
        raise DiffError(f"cannot run git: {exc}") from None
    if done.returncode != 0:
        raise DiffError(f"git {' '.join(args)} in {repo}: {done.stderr.strip()}")
    return done.stdout.strip()


def resolve_repo(repo: Path | None) -> Path:
    """The repository whose working tree is priced (default: the checkout cpmem runs from,
    else the one around the current directory)."""
    if repo is not None:
        return Path(_git(repo, "rev-parse", "--show-toplevel"))
    here = Path(__file__).resolve().parents[2]
    if (here / ".git").exists():
        return here
    return Path(_git(Path.cwd(), "rev-parse", "--show-toplevel"))


def resolve_revision(repo: Path, rev: str) -> str:
    """The full commit id of ``rev``; a DiffError naming it when git cannot find it."""
    return _git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")


@contextmanager
def worktree(repo: Path, commit: str) -> Iterator[Path]:
    """A temporary, detached ``git worktree`` of ``commit``, removed afterwards."""
    tmp = Path(tempfile.mkdtemp(prefix="cpmem-diff-"))
    path = tmp / "base"
    _git(repo, "worktree", "add", "--detach", "--quiet", str(path), commit)
    try:
        yield path
    finally:
        try:
            _git(repo, "worktree", "remove", "--force", str(path))
        except DiffError:
            shutil.rmtree(path, ignore_errors=True)
            subprocess.run(["git", "-C", str(repo), "worktree", "prune"], check=False)
        shutil.rmtree(tmp, ignore_errors=True)


def price_checkout(
    root: Path,
    golden_dir: Path,
    row_sources: Mapping[str, str] | None = None,
    *,
    label: str = "pricing",
    progress: bool = False,
) -> dict[str, Any]:
    """Run ``PRICE_SCRIPT`` against the cpmem at ``root``; its JSON result."""
    with tempfile.TemporaryDirectory(prefix="cpmem-price-") as tmp:
        script, out = Path(tmp) / "price_checkout.py", Path(tmp) / "priced.json"
        script.write_text(PRICE_SCRIPT, encoding="utf-8")
        env = {
            **os.environ,
            "PYTHONPATH": str(root),
            "CPMEM_GOLDEN_DIR": str(golden_dir),
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        cmd = [
            sys.executable,
            str(script),
            str(root),
            str(golden_dir),
            str(out),
            json.dumps(dict(row_sources or {})),
            label,
            "1" if progress else "0",
        ]
        done = subprocess.run(
            cmd, env=env, stdout=subprocess.PIPE, stderr=None if progress else subprocess.PIPE
        )
        if done.returncode != 0 or not out.is_file():
            err = (done.stderr or b"").decode("utf-8", "replace").strip().splitlines()
            tail = "\n  ".join(err[-8:]) if err else f"exit status {done.returncode}"
            raise DiffError(f"pricing the cpmem at {root} failed:\n  {tail}")
        result: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
        return result
