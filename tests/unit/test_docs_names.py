"""Every dotted ``cpmem.<...>`` name the docs write in backticks resolves.

README.md and docs/*.md name modules, functions and constants (`cpmem.pricing.cold.COLD_SETUP`,
`python -m cpmem.reports.tight_report`); each such name must be importable as written: the
longest prefix that imports as a module, then attributes for the rest. A doc naming a
package that does not export the object (or a module that moved) fails here with the
document and the name.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
SPAN = re.compile(r"`([^`]+)`")  # an inline span may wrap onto the next line
NAME = re.compile(r"(?<![\w./-])cpmem(?:\.[A-Za-z_]\w*)+")


def dotted_names(text: str) -> list[str]:
    """The dotted ``cpmem.`` names inside inline backtick spans (fenced blocks left out),
    in order, once each."""
    found: dict[str, None] = {}
    for span in SPAN.findall(FENCE.sub("", text)):
        for name in NAME.findall(span):
            found.setdefault(name)
    return list(found)


def resolves(name: str) -> bool:
    """Whether ``name`` is a module, or a module's attribute path."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            obj = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and module_name.startswith(exc.name):
                continue  # this prefix (or a package above it) is not a module
            raise
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


NAMED = [(doc, name) for doc in DOCS for name in dotted_names(doc.read_text(encoding="utf-8"))]


def test_the_docs_name_cpmem_objects() -> None:
    """The collection reads the names the docs write (a reader that found none would pass
    every doc)."""
    names = {name for _, name in NAMED}
    assert {"cpmem.pricing.cold.COLD_SETUP", "cpmem.samples.targets.TIGHT_TARGETS"} <= names
    assert len(names) >= 20


def test_the_resolver_refuses_what_does_not_exist() -> None:
    assert resolves("cpmem.admission.admission.usable_budget")
    assert resolves("cpmem.reports.tight_report")
    assert not resolves("cpmem.admission.no_such_name")
    assert not resolves("cpmem.no_such_module.name")
    assert dotted_names("see `python -m cpmem.gate.simulated --write x` and `cpmem gate`") == [
        "cpmem.gate.simulated"
    ]


@pytest.mark.parametrize(("doc", "name"), NAMED, ids=[f"{d.name}:{n}" for d, n in NAMED])
def test_each_documented_name_resolves(doc: Path, name: str) -> None:
    assert resolves(name), f"{doc.relative_to(ROOT)} names `{name}`, which does not resolve"
