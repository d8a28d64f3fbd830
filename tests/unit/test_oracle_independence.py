"""An oracle checks cpmem from outside, so it imports nothing of cpmem: every module under
``oracles/`` is read with ``ast`` (imports inside functions count too), and only the named
command-line entry points may ask cpmem for a plan (docs/architecture.md)."""

from __future__ import annotations

import ast
from pathlib import Path

ORACLES = Path(__file__).resolve().parents[2] / "oracles"

# The command lines that ask cpmem's default planner for per-rank counts; the workers
# and simulators they drive get plain numbers.
MAY_ASK_CPMEM = {"rank_sim/__main__.py", "sim_grid/__main__.py"}


def cpmem_imports(source: str) -> list[str]:
    """The cpmem modules ``source`` imports, anywhere in it."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] == "cpmem"]
        elif (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and (node.module or "").split(".")[0] == "cpmem"
        ):
            found.append(str(node.module))
    return found


def test_no_oracle_imports_cpmem() -> None:
    files = sorted(ORACLES.rglob("*.py"))
    assert len(files) > 15  # the walk found the oracles
    wrong = {
        str(p.relative_to(ORACLES)): imports
        for p in files
        if (imports := cpmem_imports(p.read_text(encoding="utf-8")))
        and str(p.relative_to(ORACLES)) not in MAY_ASK_CPMEM
    }
    assert wrong == {}


def test_the_entry_points_allowed_to_ask_cpmem_exist_and_do() -> None:
    """The allowance names real files that really import cpmem (no stale exemption)."""
    for name in MAY_ASK_CPMEM:
        assert cpmem_imports((ORACLES / name).read_text(encoding="utf-8")), name


def test_the_check_finds_an_import_anywhere() -> None:
    source = "import os\n\ndef f():\n    from cpmem.api import estimate\n    import cpmem.plan\n"
    assert cpmem_imports(source) == ["cpmem.api", "cpmem.plan"]
    assert cpmem_imports("from . import cpmem\nimport cpmemx\n") == []
