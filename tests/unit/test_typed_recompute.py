"""Pricing asks a recompute setting what it does (``Recompute.checkpoints``,
``keeps_gradients``...) and never compares its mode or modules as text: read with
``ast``, no comparison in ``cpmem/pricing/`` puts a ``.mode`` or ``.modules`` next to a
string (text belongs where a setting is parsed or shown: ``cpmem.step.recompute``)."""

from __future__ import annotations

import ast
from pathlib import Path

PRICING = Path(__file__).resolve().parents[2] / "cpmem" / "pricing"


def text_comparisons(source: str) -> list[int]:
    """Lines where a comparison involves ``.mode`` / ``.modules`` and a string constant."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        attrs = {n.attr for o in operands for n in ast.walk(o) if isinstance(n, ast.Attribute)}
        strings = [
            n
            for o in operands
            for n in ast.walk(o)
            if isinstance(n, ast.Constant) and isinstance(n.value, str)
        ]
        if attrs & {"mode", "modules"} and strings:
            lines.append(node.lineno)
    return lines


def test_pricing_compares_no_recompute_setting_as_text() -> None:
    files = sorted(PRICING.rglob("*.py"))
    assert len(files) > 10
    wrong = {
        str(p.relative_to(PRICING)): found
        for p in files
        if (found := text_comparisons(p.read_text(encoding="utf-8")))
    }
    assert wrong == {}


def test_the_check_finds_text_comparisons() -> None:
    source = (
        "a = rc.mode == 'full'\n"
        "b = 'mlp' in inputs.recompute.modules\n"
        "c = rc.mode in ('full', 'no-grad')\n"
        "d = rc.checkpoints(Module.MLP)\n"
        "e = ffn == 'moe'\n"
    )
    assert text_comparisons(source) == [1, 2, 3]
