"""docs/cli.md keeps up with the parser: every flag of every command is in its synopsis.

The flags are read off ``cpmem.cli.build_parser()`` (every subcommand, ``profile record``
included), so a flag added to the parser and not to the synopsis block at the top of
docs/cli.md fails here, naming the flag and the commands that take it. The MoE routing's
default has one name in the parser, the help and the docs (``concentrated``; ``worst``
stays accepted as its other spelling).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path

from cpmem.cli import build_parser
from cpmem.cli_help import HELP
from cpmem.step.routing import WORST, check_routing
from cpmem.step.settings import SETTINGS

ROOT = Path(__file__).resolve().parents[2]
CLI_DOC = ROOT / "docs" / "cli.md"


def _commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*path, name))
    if path:
        yield " ".join(path), parser


def _flags() -> dict[str, list[str]]:
    """Every long flag of every command -> the commands that take it."""
    found: dict[str, list[str]] = {}
    for command, parser in _commands(build_parser()):
        for action in parser._actions:
            for option in action.option_strings:
                if option.startswith("--") and option != "--help":
                    found.setdefault(option, []).append(command)
    return found


def _synopsis() -> str:
    """The first fenced block of docs/cli.md: every command's usage."""
    return CLI_DOC.read_text(encoding="utf-8").split("```", 2)[1]


def _written(flag: str, text: str) -> bool:
    return re.search(re.escape(flag) + r"(?![\w-])", text) is not None


def test_the_parser_has_the_flags_this_reads() -> None:
    flags = _flags()
    assert len(flags) > 50  # the walk reached the subcommands
    assert set(flags["--microbatch-file"]) == {"estimate", "admit", "profile record"}
    assert "capacity" in flags["--first-stage-layers"] and "--peak-bytes" in flags


def test_every_flag_is_in_the_synopsis() -> None:
    synopsis = _synopsis()
    missing = {flag: cmds for flag, cmds in _flags().items() if not _written(flag, synopsis)}
    assert missing == {}


def test_a_flag_is_written_only_as_itself() -> None:
    """A longer flag does not document a shorter one: the match stops at the flag's end."""
    assert _written("--pp", "[--pp N]") and not _written("--pp", "[--pp-size N]")
    assert not _written("--lengths", "--lengths-file F")


def test_the_default_routing_has_one_name() -> None:
    estimate = dict(_commands(build_parser()))["estimate"]
    (routing,) = [a for a in estimate._actions if "--moe-routing" in a.option_strings]
    assert routing.default is None  # absent unless given; the declaration's default applies
    assert SETTINGS["moe_routing"].default == WORST == "concentrated"
    assert check_routing("worst") == WORST  # the other spelling stays accepted
    assert HELP["--moe-routing"].startswith(
        "the rows each rank's experts receive: concentrated (the default"
    )
    texts = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    assert [p.name for p in texts if "--moe-routing worst" in p.read_text(encoding="utf-8")] == []
    assert "--moe-routing concentrated|" in _synopsis()


def test_every_command_formats_its_help() -> None:
    """``--help`` renders for every command: argparse formats each help text with ``%``,
    so a declaration's literal ``%`` (``--ep``'s ``num_experts % EP``) must reach it
    escaped, and the text shows it once."""
    seen = 0
    for command, parser in _commands(build_parser()):
        text = parser.format_help()
        assert text.startswith("usage:"), command
        seen += 1
        if command == "estimate":
            assert "num_experts % EP == 0" in " ".join(text.split())
    assert seen >= 5
