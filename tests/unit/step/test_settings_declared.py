"""The step's settings are declared once (``cpmem.step.settings``): the command line's
flags, the API's keywords and defaults, "which flags were given" and the external
estimators' description all come from ``SettingsArguments`` and its ``Setting``s."""

from __future__ import annotations

import argparse

import pytest

from cpmem.api import describe_step
from cpmem.cli import build_parser
from cpmem.cli_help import HELP, given_settings
from cpmem.gate.external import step_description
from cpmem.step.describe import describe_settings
from cpmem.step.settings import DEFAULTS, SETTINGS, SettingsArguments


def _options(command: str) -> dict[str, argparse.Action]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {o: a for a in sub.choices[command]._actions for o in a.option_strings}


def test_every_setting_is_declared_once_with_its_help_and_its_description() -> None:
    assert list(SETTINGS) == list(SettingsArguments.__annotations__)
    for name, s in SETTINGS.items():
        assert (s.flag is None) == (s.group == "api"), name
        if s.flag is not None:
            assert s.help and HELP[s.flag] == s.help, name
        assert (s.export is None) != (s.exported_as == ""), name  # reported one way
    flags = [f for s in SETTINGS.values() for f in (s.flag, s.negation) if f]
    assert len(flags) == len(set(flags))


@pytest.mark.parametrize("command", ["estimate", "admit", "capacity"])
def test_the_commands_flags_are_the_declarations(command: str) -> None:
    options = _options(command)
    for name, s in SETTINGS.items():
        if s.flag is None or (command == "capacity" and s.group == "request"):
            assert s.flag not in options or s.flag is None, (command, name)
            continue
        action = options[s.flag]
        assert action.dest == name and action.default is None, (command, name)
        if s.choices:
            assert tuple(action.choices or ()) == s.choices


def test_the_flags_given_are_exactly_the_ones_typed() -> None:
    parser = build_parser()
    args = parser.parse_args(["estimate", "--model", "qwen3-1.7b", "--lengths", "4096"])
    assert given_settings(args) == {}
    typed = parser.parse_args(
        [
            "estimate",
            "--model",
            "qwen3-1.7b",
            "--lengths",
            "4096",
            "--lora-rank",
            "1",  # cpmem's default, typed: given
            "--no-sp",
            "--stage-layers",
            "14,14",
            "--device-total-bytes",
            "8e10",
        ]
    )
    assert given_settings(typed) == {
        "lora_rank": 1,
        "sp": False,
        "stage_layers": [14, 14],
        "device_total_bytes": 80_000_000_000,
    }


def test_the_apis_defaults_are_the_declarations() -> None:
    assert describe_settings("qwen3-1.7b") == describe_settings("qwen3-1.7b", **DEFAULTS)  # type: ignore[arg-type]


def test_the_external_description_reports_every_exported_setting() -> None:
    step = describe_step("qwen3-1.7b", [4096, 2048], tp=2, cp=2, lora_rank=16, dp=2)
    desc = step_description(step, cell_id="x", model="qwen3-1.7b")
    exported = {n: s.export(step) for n, s in SETTINGS.items() if s.export is not None}
    assert {k: desc[k] for k in exported} == exported
    assert (desc["tp"], desc["cp"], desc["lora_rank"], desc["dp"]) == (2, 2, 16, 2)
    for name, s in SETTINGS.items():
        if s.export is None:  # a key it names, where it names one, is in the description
            key = s.exported_as.partition(":")[0].partition(" ")[0]
            assert key in desc or key == "not", (name, key)
