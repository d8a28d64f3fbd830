"""What differs between the runtimes is fields of ``Runtime``: no module of cpmem compares a
runtime's name (``runtime.name == "art"``, ``est.runtime != "megatron-lm"``, a name looked
up in a dict keyed by runtime). Read with ``ast`` over every module, so a comparison
written any way (``==``, ``!=``, ``in``) is found."""

from __future__ import annotations

import ast
from pathlib import Path

from cpmem.step.runtime import RUNTIMES, Runtime

CPMEM = Path(__file__).resolve().parents[2] / "cpmem"


def _is_runtime_name(node: ast.AST) -> bool:
    """``x.runtime.name``, ``runtime.name``, ``x.runtime`` (the estimate's runtime name)."""
    if isinstance(node, ast.Attribute) and node.attr == "name":
        inner = node.value
        return (
            (isinstance(inner, ast.Name) and inner.id in ("runtime", "process"))
            or (isinstance(inner, ast.Attribute) and inner.attr == "runtime")
            or (
                isinstance(inner, ast.Subscript)
                and isinstance(inner.slice, ast.Constant)
                and inner.slice.value == "runtime"
            )
        )
    return isinstance(node, ast.Attribute) and node.attr == "runtime"


def _name_comparisons(tree: ast.AST) -> list[int]:
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        names = [s for s in sides if isinstance(s, ast.Constant) and s.value in RUNTIMES]
        if names or any(_is_runtime_name(s) for s in sides):
            found.append(node.lineno)
    return found


def test_no_module_compares_a_runtimes_name() -> None:
    offending = {
        str(path.relative_to(CPMEM.parent)): lines
        for path in sorted(CPMEM.rglob("*.py"))
        if (lines := _name_comparisons(ast.parse(path.read_text(encoding="utf-8"))))
    }
    assert offending == {}


def test_the_finder_finds_a_planted_comparison() -> None:
    planted = ast.parse(
        'if step.settings.runtime.name == "art":\n    pass\nok = est.runtime != x\n'
    )
    assert _name_comparisons(planted) == [1, 3]
    assert _name_comparisons(ast.parse('if "megatron-lm" in names:\n    pass\n')) == [1]
    assert _name_comparisons(ast.parse('ok = given == arguments["runtime"].name\n')) == [1]
    assert _name_comparisons(ast.parse("if runtime.fitted_margin:\n    pass\n")) == []


def test_the_two_runtimes_differ_in_fields_not_only_in_name() -> None:
    art, megatron = Runtime.art(), Runtime.megatron_lm()
    differing = {
        f
        for f in Runtime.__dataclass_fields__
        if f != "name" and getattr(art, f) != getattr(megatron, f)
    }
    # each default and each pricing difference is its own field (runtime.py)
    assert {
        "default_policy",
        "default_recompute",
        "default_cp_comm",
        "default_backend",
        "default_planner",
        "fuses_swiglu",
        "experts_follow_tp",
        "fitted_margin",
        "keeps_query_copy",
        "published_formula",
        "answers_peak",
        "evidence",
    } <= differing
    assert Runtime.named("megatron-lm") == megatron and Runtime.named("art") == art
