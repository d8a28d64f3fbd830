"""One setting's declaration (``Setting``) and the command line's groups of them
(``GROUP_TITLES``): what ``cpmem.step.settings`` attaches to each keyword of the step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from cpmem.step.step import Step

Group = Literal["source", "activation", "request", "step", "process", "whole", "pipeline", "api"]
GROUP_TITLES: dict[str, str | None] = {
    "step": None,
    "process": "the process and what it trains",
    "whole": "the whole device (static memory and the device's budget)",
    "pipeline": "pipeline parallelism (every stage's schedule priced)",
}
"""The command line's argument groups of the settings (None: the command's own); the
``source`` and ``activation`` settings are built with the model's source flags, the
``request`` ones only by the commands that price one request, ``api`` ones have no flag."""


@dataclass(frozen=True)
class Setting:
    """One setting's declaration beside its type.

    ``default``: the value where it is not given; ``flag``: its command-line flag (None:
    the API's only) and ``help``; ``group``: where the command line shows it
    (``GROUP_TITLES``); ``cli_type``: what argparse parses the text as; ``convert``: the
    keyword's value from the parsed text (a list of integers, whole bytes); ``choices``;
    ``switch``: a flag without a value, setting True (``negation``: the flag setting
    False); ``metavar``; ``export``: the value a step holds for it, as the external
    estimators' description reports it under the keyword (None: the description reports
    it otherwise, ``exported_as`` says how)."""

    default: Any
    flag: str | None
    help: str = ""
    group: Group = "step"
    cli_type: Callable[[str], Any] | None = None
    convert: Callable[[str, Any], Any] | None = None
    choices: tuple[str, ...] | None = None
    switch: bool = False
    negation: str | None = None
    negation_help: str = ""
    metavar: str | None = None
    export: Callable[[Step], Any] | None = None
    exported_as: str = ""
