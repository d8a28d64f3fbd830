"""The package layout of docs/architecture.md, held by test: arrows only point down.

The rule is the doc's table ("Packages"), read here, not restated: each row names a
package (its first cell), the modules it owns (backticked in the second) and the packages
it imports (the third: a comma list, ``nothing of cpmem`` or ``everything``). Reads every
module of ``cpmem/`` with ``ast`` (imports inside functions and under ``TYPE_CHECKING``
count too) and checks (1) each package imports exactly the packages its row lists (the
top row, ``everything``, any), (2) a row lists only packages of the rows above it, so
arrows point down only, (3) every module is named in its package's row, (4) no import
circle anywhere, between modules or between packages.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CPMEM = REPO / "cpmem"
DOC = REPO / "docs" / "architecture.md"
EVERYTHING = "everything"


def _stage_of_cell(cell: str) -> str:
    """The stage a row's first cell names: ``cpmem/model/`` -> model, ``cpmem/api.py``
    -> api; the row of ``errors.py`` and ``units.py`` is ``base`` (with the package root)."""
    first = re.findall(r"`([^`]+)`", cell)[0]
    name = first.removeprefix("cpmem/").rstrip("/").removesuffix(".py")
    return "base" if name in ("errors", "units") else name


def _table_rows() -> list[tuple[str, str, str]]:
    """The "Packages" table: (stage, owns, may import) per row, in the doc's order."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## Packages", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or cells[0] in ("package", "---"):
            continue
        rows.append((_stage_of_cell(cells[0]), cells[1], cells[2]))
    return rows


ROWS = _table_rows()
ORDER = [stage for stage, _, _ in ROWS]


def _listed(cell: str) -> set[str] | None:
    """A row's "may import" cell as stages; None: ``everything``."""
    if cell == EVERYTHING:
        return None
    if cell == "nothing of cpmem":
        return set()
    names = {name.strip() for name in cell.split(",")}
    unknown = names - set(ORDER)
    assert not unknown, f"docs/architecture.md: {cell!r} names no package row: {unknown}"
    return names


MAY_IMPORT: dict[str, set[str] | None] = {stage: _listed(cell) for stage, _, cell in ROWS}
"""stage -> the stages its row lists ("base" = errors, units, the package root); None:
every stage (the command line at the top)."""


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


def _imported_stages() -> dict[str, dict[str, str]]:
    """stage -> {a stage it imports: one import that shows it ("mod -> dep")}."""
    found: dict[str, dict[str, str]] = {}
    for mod, deps in sorted(GRAPH.items()):
        for dep in sorted(deps):
            if _stage(dep) != _stage(mod):
                found.setdefault(_stage(mod), {}).setdefault(_stage(dep), f"{mod} -> {dep}")
    return found


def test_the_doc_table_has_a_row_per_stage() -> None:
    assert len(ORDER) == len(set(ORDER)), "a package has two rows"
    assert {_stage(m) for m in GRAPH} == set(ORDER)
    assert len(GRAPH) > 40  # the walk found the package


def test_each_package_imports_exactly_what_its_row_lists() -> None:
    imported = _imported_stages()
    unlisted = [
        f"{how} ({dep} is not in {stage}'s row)"
        for stage, deps in imported.items()
        for dep, how in deps.items()
        if MAY_IMPORT[stage] is not None and dep not in MAY_IMPORT[stage]
    ]
    unused = [
        f"{stage}'s row lists {dep}, which none of its modules imports"
        for stage, listed in MAY_IMPORT.items()
        for dep in sorted(listed or ())
        if dep not in imported.get(stage, {})
    ]
    assert unlisted + unused == []


def test_rows_list_only_packages_above_them() -> None:
    wrong = [
        f"{stage} lists {dep}, a row below it"
        for i, (stage, listed) in enumerate(MAY_IMPORT.items())
        for dep in sorted(listed or ())
        if dep not in ORDER[:i]
    ]
    assert wrong == []
    assert list(MAY_IMPORT.values()).count(None) == 1 and MAY_IMPORT[ORDER[-1]] is None


def test_every_module_is_named_in_its_packages_row() -> None:
    named = {
        stage: set(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)/?`", owns)) for stage, owns, _ in ROWS
    }
    missing = [
        mod
        for mod in GRAPH
        if mod.count(".") >= 2  # a package's module (the one-file rows name themselves)
        and not (CPMEM.parent / mod.replace(".", "/") / "__init__.py").exists()  # a package
        and mod.rsplit(".", 1)[1] not in named[_stage(mod)]
    ]
    assert missing == []


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
