"""The README's first command starts without what it does not use.

Most of a ``cpmem estimate``'s time is the interpreter importing cpmem (the pricing itself
takes milliseconds; ``nox -s bench`` prints both, benchmarks/bench_cli.py). numpy (the
chunked planner's, a dense model's default), the Megatron-LM readers, the config.json
reader, admission and the capacity search with its plot are imported by the commands that
use them; this checks, in a fresh interpreter, that an estimate of a preset hybrid model
loads none of them, so a module-level import added back fails here rather than as a
slower CLI nobody times.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README_ESTIMATE = [
    "estimate", "--model", "qwen3.5-27b", "--lengths", "4096,4096", "--shared-prefix", "1228",
    "--cp", "2",
]  # fmt: skip
"""The README's first command (its ``cpmem`` arguments)."""
NOT_LOADED = (
    "numpy",
    "cpmem.admission",
    "cpmem.megatron",
    "cpmem.model.hf_config",
    "cpmem.reports.capacity_plot",
)


def _loaded_after(argv: list[str]) -> list[str]:
    code = (
        "import contextlib, io, json, sys\n"
        "from cpmem.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    rc = main({argv!r})\n"
        "print(json.dumps([rc, sorted(sys.modules)]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    rc, modules = json.loads(out.stdout)
    assert rc == 0, out.stderr
    return list(modules)


def _under(modules: list[str], package: str) -> list[str]:
    return [m for m in modules if m == package or m.startswith(package + ".")]


def test_the_readme_estimate_loads_none_of_what_it_does_not_use() -> None:
    modules = _loaded_after(README_ESTIMATE)
    assert "cpmem.pricing.reference" in modules  # it did price
    assert {p: _under(modules, p) for p in NOT_LOADED} == {p: [] for p in NOT_LOADED}


def test_a_dense_models_estimate_loads_numpy_where_it_chunks() -> None:
    """The other side: the chunked planner (a dense model's default) still finds numpy."""
    modules = _loaded_after(["estimate", "--model", "qwen3-1.7b", "--lengths", "8192", "--cp", "2"])
    assert "numpy" in modules and "cpmem.plan.chunked" in modules
