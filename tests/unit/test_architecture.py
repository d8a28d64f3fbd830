"""The package layout of docs/architecture.md, held by test: arrows only point down.

Reads every module of ``cpmem/`` with ``ast`` (imports inside functions count too)
and checks (1) each stage imports only the stages below it, (2) no import circle
anywhere, between modules or between packages.
"""

from __future__ import annotations

import ast
from pathlib import Path

CPMEM = Path(__file__).resolve().parents[2] / "cpmem"

# stage -> the stages it may import ("base" = errors, units, the package root)
_CORE = {"base", "model", "plan", "step", "pricing", "megatron"}
_SAMPLES = _CORE | {"golden"}
_CALIBRATION = _SAMPLES | {"samples"}
_REPORTS = _CALIBRATION | {"admission", "api", "calibration"}
_GATE = _REPORTS | {"reports"}
_DIFF = _GATE | {"gate"}
MAY_IMPORT: dict[str, set[str]] = {
    "base": set(),
    "model": {"base"},
    "plan": {"base", "model"},
    "step": {"base", "model", "plan"},
    "pricing": {"base", "model", "plan", "step"},
    "megatron": {"base", "model", "plan", "step"},  # it reads arguments, never prices
    "admission": _CORE,
    "api": _CORE,
    "golden": {"base"},
    "samples": _SAMPLES,
    "calibration": _CALIBRATION,
    "reports": _REPORTS,
    "gate": _GATE,
    "diff": _DIFF,
    "cli_help": {"base", "pricing", "step"},
    "cli_megatron": _REPORTS | {"reports", "cli_help"},
    "cli": _DIFF | {"diff", "cli_help", "cli_megatron"},
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(CPMEM.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _stage(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1 or parts[1] in ("errors", "units"):
        return "base"
    return parts[1]


def _imports(path: Path) -> set[str]:
    """cpmem modules a file imports (``from cpmem.x import y`` counts y if it is a module)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("cpmem"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("cpmem"):
            found.add(node.module)
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                if (CPMEM.parent / sub.replace(".", "/")).with_suffix(".py").exists() or (
                    CPMEM.parent / sub.replace(".", "/") / "__init__.py"
                ).exists():
                    found.add(sub)
    return found


GRAPH = {_module_name(p): _imports(p) for p in sorted(CPMEM.rglob("*.py"))}


def test_every_module_is_in_a_known_stage() -> None:
    assert {_stage(m) for m in GRAPH} <= set(MAY_IMPORT)
    assert len(GRAPH) > 40  # the walk found the package


def test_stages_import_only_the_stages_below_them() -> None:
    wrong = [
        f"{mod} -> {dep}"
        for mod, deps in GRAPH.items()
        for dep in deps
        if _stage(dep) != _stage(mod) and _stage(dep) not in MAY_IMPORT[_stage(mod)]
    ]
    assert wrong == []


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if dep == node or dep not in graph:
                continue
            if state.get(dep) == 1:
                return [*stack[stack.index(dep) :], dep]
            if dep not in state and (found := visit(dep)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_circle_between_modules() -> None:
    # a package's __init__ importing its own modules is how Python loads a package,
    # not a circle; every other edge counts
    edges = {
        mod: {d for d in deps if not (GRAPH.get(d) is not None and mod.startswith(d + "."))}
        for mod, deps in GRAPH.items()
    }
    assert _cycle(edges) is None


def test_no_import_circle_between_stages() -> None:
    stages: dict[str, set[str]] = {}
    for mod, deps in GRAPH.items():
        stages.setdefault(_stage(mod), set()).update(_stage(d) for d in deps)
    assert _cycle(stages) is None


def test_the_cycle_finder_finds_a_planted_circle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
