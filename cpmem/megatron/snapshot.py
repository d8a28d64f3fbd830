"""Every argument of Megatron-LM's ``pretrain_gpt.py`` at the recordings' snapshot.

``data/arguments.tsv`` lists each flag string argparse accepts (``--no-X`` and
``--disable-X`` of one switch are two rows), with its ``dest``, action, type, choices
and default, the ``add_argument`` call that made it, and for the flags
``ArgumentGroupFactory`` generates from a config dataclass (``TransformerConfig``,
``ModelParallelConfig``, ``TrainingConfig``, ...) the dataclass field. Its header names
the repository, the commit and the git blob of every source file it was read from, and
how it was generated.

``is_default`` says whether a value given for a flag is the one argparse would have
stored without it, so the run reads as if the flag were absent.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources

SNAPSHOT_FILE = "arguments.tsv"


@dataclass(frozen=True)
class Argument:
    """One flag string of the snapshot's parser (``data/arguments.tsv``)."""

    flag: str
    dest: str
    action: str  # store, store_true, store_false, boolean_optional
    nargs: str  # "", "+", "*", "0", ...
    type: str  # int, float, str, an enum class or a converter's name; "" for switches
    choices: tuple[object, ...] | None
    default: object
    group: str
    origin: str  # megatron, kitchen (with NVIDIA Kitchen), modelopt (with ModelOpt)
    source: str  # the add_argument call, file:line
    config: str  # Class.field for a flag generated from a config dataclass, else ""
    config_source: str

    @property
    def switch(self) -> bool:
        """A flag that takes no value (store_true / store_false)."""
        return self.action in ("store_true", "store_false")


@dataclass(frozen=True)
class Snapshot:
    commit: str
    files: Mapping[str, str]  # path -> git blob
    arguments: Mapping[str, Argument]  # flag -> argument


def _text() -> str:
    return (resources.files("cpmem.megatron") / "data" / SNAPSHOT_FILE).read_text(encoding="utf-8")


@cache
def snapshot() -> Snapshot:
    """The parsed ``data/arguments.tsv`` (read once)."""
    commit = ""
    files: dict[str, str] = {}
    arguments: dict[str, Argument] = {}
    header: list[str] | None = None
    in_files = False
    for line in _text().splitlines():
        if line.startswith("#"):
            body = line[1:].strip()
            if body.startswith("commit:"):
                commit = body.split(":", 1)[1].strip()
            elif body.startswith("files"):
                in_files = True
            elif in_files and body:
                path, blob = body.split()
                files[path] = blob
            continue
        cells = line.split("\t")
        if header is None:
            header = cells
            continue
        row = dict(zip(header, cells, strict=True))
        arguments[row["flag"]] = Argument(
            flag=row["flag"],
            dest=row["dest"],
            action=row["action"],
            nargs=row["nargs"],
            type=row["type"],
            choices=tuple(json.loads(row["choices"])) if row["choices"] else None,
            default=json.loads(row["default"]),
            group=row["group"],
            origin=row["origin"],
            source=row["source"],
            config=row["config"],
            config_source=row["config_source"],
        )
    return Snapshot(commit=commit, files=files, arguments=arguments)


def arguments() -> Mapping[str, Argument]:
    """Flag -> its argument, every flag string of the snapshot's parser."""
    return snapshot().arguments


def _as_type(kind: str, text: str) -> object:
    if kind == "int":
        return int(text)
    if kind == "float":
        return float(text)
    return text


def is_default(flag: str, value: object) -> bool:
    """Whether ``value`` given for ``flag`` is what argparse stores without the flag.

    A switch given is never its default (``store_true`` stores True over a False
    default). A valued flag's text is converted by the snapshot's type (``int``,
    ``float``, else text; enum flags by member name) and, for ``nargs`` lists, split on
    whitespace; a value that does not convert is not the default."""
    arg = arguments().get(flag)
    if arg is None or arg.switch or arg.action == "boolean_optional" or value is None:
        return False
    if isinstance(value, bool):
        return False
    items = value if isinstance(value, list) else None
    try:
        if arg.nargs in ("+", "*"):
            words = [str(v) for v in items] if items is not None else str(value).split()
            converted: object = [_as_type(arg.type, w) for w in words]
        else:
            converted = _as_type(arg.type, str(value).strip())
    except ValueError:
        return False
    default = arg.default
    if isinstance(default, list) and isinstance(converted, list):
        return [_as_type(arg.type, str(d)) for d in default] == converted
    if isinstance(default, int | float) and isinstance(converted, int | float):
        return float(default) == float(converted)
    return default == converted
