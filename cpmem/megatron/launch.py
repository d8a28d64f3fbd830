"""A Megatron-LM run as its launch script or command line starts it: the
``pretrain_*.py`` arguments and the world size ``torchrun`` gives it.

A launch script (``cpmem.megatron.shell`` reads it, nothing is run) or a pasted command
line is read for the one command that runs a ``pretrain_*.py`` (``torchrun ...``,
``python -m torch.distributed.run ...``, ``python pretrain_gpt.py ...``, behind any
wrapper such as ``uv run`` or ``nsys profile``; a job script that hands the command to
``sbatch``/``srun`` as a string is read from the variable holding it). The words after
the script are its
arguments (``Launch.flags``); the launcher's own before it are read, not refused:
``--nproc_per_node`` (``--nproc-per-node``) x ``--nnodes`` is the world size
(torchrun's defaults: one process per node, one node, ``torch/distributed/run.py``);
``--node_rank``, ``--master_addr``, ``--rdzv_*`` and the rest change nothing priced. A
``python pretrain_gpt.py`` with no launcher says nothing of its world: the caller gives
it. What the script exports, and the variables assigned before the command, are the
run's environment.

A flag whose value the script leaves to its caller (``$2``, an unset variable, a
command's output) is kept with what it was built from (``Launch.unknown``): the reader
(``cpmem.megatron.args``) refuses it by name where the flag is priced, and reads it as
absent where the flag changes nothing priced (a data path, a checkpoint directory).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from cpmem.megatron.rules import Problem
from cpmem.megatron.shell import Command, read_script
from cpmem.megatron.shell_words import Word

TRAINING_SCRIPTS = ("pretrain_gpt.py", "pretrain_hybrid.py", "pretrain_mamba.py")
"""The training scripts whose parser is the snapshot's (``pretrain_gpt.py``'s
``add_megatron_arguments``; ``pretrain_hybrid.py`` builds the same parser with the same
``args_defaults``, pretrain_hybrid.py:526-527, and ``pretrain_mamba.py`` runs
``pretrain_hybrid.py``, pretrain_mamba.py:11-19)."""

SCRIPT_WORD = re.compile(r"pretrain_\w*\.py\b")
LAUNCHERS = ("torchrun", "torch.distributed.run", "torch.distributed.launch")
NPROC = ("--nproc_per_node", "--nproc-per-node")
NNODES = ("--nnodes",)


@dataclass(frozen=True)
class Launch:
    """What a launch script or command line gives a run."""

    flags: dict[str, str | None]  # flag -> its value (None: a switch), as written
    unknown: dict[str, tuple[str, ...]]  # flag -> what its value is built from, unset
    env: dict[str, str]  # known values only; env_unknown names the others
    world_size: int | None
    world_reason: str  # why there is no world size, where there is none
    script: str
    problems: list[Problem] = field(default_factory=list)
    env_unknown: dict[str, tuple[str, ...]] = field(default_factory=dict)


SHELL_SIGNS = re.compile(
    r"^#!|pretrain_\w*\.py|torchrun|torch\.distributed|^\s*(export\s+)?[A-Za-z_]\w*\+?=",
    re.MULTILINE,
)


def is_script(text: str) -> bool:
    """Whether ``text`` is a launch script or command line (it assigns a variable or runs
    a training script or launcher) rather than a flags file (whose first word, comments
    aside, is a ``--flag``)."""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            if stripped.startswith("--"):
                return False
            break
    return SHELL_SIGNS.search(text) is not None


NOT_LAUNCHERS = frozenset(
    {"echo", "printf", "cat", "ls", "test", "[", "[[", "mkdir", "cp", "mv", "rm", "grep", "sed"}
)
"""Commands that name a script without running it (a message, a file check)."""


def _is_training(cmd: Command) -> bool:
    if not cmd.words or cmd.words[0].text in NOT_LAUNCHERS:
        return False
    return _script_index(cmd.words) is not None or any(w.text in LAUNCHERS for w in cmd.words)


def _script_index(words: tuple[Word, ...]) -> int | None:
    for k, w in enumerate(words):
        if w.text.endswith(".py") and PurePosixPath(w.text).name.startswith("pretrain_"):
            return k
    return None


def _flags(
    words: tuple[Word, ...],
) -> tuple[dict[str, str | None], dict[str, tuple[str, ...]], list[Problem]]:
    """``--flag value...`` words as flag -> value (several values joined by a blank; a
    switch: None), the unknowns each value is built from, and the stray words."""
    flags: dict[str, str | None] = {}
    unknown: dict[str, tuple[str, ...]] = {}
    problems: list[Problem] = []
    k = 0
    while k < len(words):
        w = words[k]
        if not w.text.startswith("--"):
            problems.append((w.text, "is not a --flag (a value with no flag before it)"))
            k += 1
            continue
        name, eq, inline = w.text.partition("=")
        names = list(w.unset)
        if eq:
            flags[name], k = inline, k + 1
        else:
            j = k + 1
            while j < len(words) and not words[j].text.startswith("--"):
                names += words[j].unset
                j += 1
            flags[name] = " ".join(x.text for x in words[k + 1 : j]) if j > k + 1 else None
            k = j
        if names:
            unknown[name] = tuple(dict.fromkeys(names))
        else:
            unknown.pop(name, None)
    return flags, unknown, problems


def _int(flag: str, value: str | None, unset: tuple[str, ...], default: int) -> int | str:
    """A launcher count: an integer, or why it is not one."""
    if unset:
        return f"{flag} is left to the script's caller ({'; '.join(unset)})"
    if value is None:
        return default
    if flag == "--nnodes" and re.fullmatch(r"\d+:\d+", value):
        low, high = value.split(":")
        if low == high:
            return int(low)
        return f"--nnodes {value} is an elastic range (the world is known when it runs)"
    if re.fullmatch(r"\d+", value) and int(value) > 0:
        return int(value)
    return f"{flag} {value} is not a count of processes"


def _world(launcher: tuple[Word, ...]) -> tuple[int | None, str]:
    """The world size ``torchrun``'s flags give, or why they give none."""
    if not any(w.text in LAUNCHERS for w in launcher):
        shown = " ".join(w.text for w in launcher) or "the script"
        return None, f"{shown} runs it with no torchrun launcher, which would give the world size"
    start = next(k for k, w in enumerate(launcher) if w.text in LAUNCHERS) + 1
    flags, unknown, _ = _flags(launcher[start:])
    counts = []
    for names, default in ((NPROC, 1), (NNODES, 1)):
        flag = next((n for n in names if n in flags), names[0])
        counts.append(_int(flag, flags.get(flag), unknown.get(flag, ()), default))
    reasons = [c for c in counts if isinstance(c, str)]
    if reasons:
        return None, "; ".join(reasons)
    nproc, nnodes = counts
    assert isinstance(nproc, int) and isinstance(nnodes, int)
    return nproc * nnodes, ""


def _held_command(values: dict[str, tuple[Word, ...]]) -> str:
    """The one variable's text that holds a ``pretrain_*.py`` command line, where a script
    starts its run through a scheduler (``srun ... bash -c "${TRAINING_CMD}"`` inside an
    ``sbatch`` here-document, which is not read): bash runs that text as a script."""
    held = [
        ws[0].text
        for ws in values.values()
        if len(ws) == 1 and SCRIPT_WORD.search(ws[0].text) and "\n" in ws[0].text
    ]
    return held[-1] if len(held) == 1 else ""


def read_launch(text: str, name: str = "script.sh") -> Launch:
    """The run ``text`` (a launch script or a command line) starts."""
    try:
        state = read_script(text, name)
    except SyntaxError as exc:
        return Launch({}, {}, {}, None, "", "", [(name, f"is not a script cpmem can read: {exc}")])
    problems: list[Problem] = list(state.problems)
    runs = [c for c in state.commands if _is_training(c)]
    held = "" if runs else _held_command(state.values)
    if held:  # the command a job script hands sbatch/srun (``bash -c "$CMD"``)
        try:
            inner = read_script(held, name)
        except SyntaxError as exc:
            problems.append((name, f"holds a command cpmem cannot read: {exc}"))
        else:
            problems += inner.problems
            runs = [c for c in inner.commands if _is_training(c)]
    if not runs:
        problems.append(
            (
                name,
                "runs no pretrain_*.py (a torchrun or python line that starts Megatron-LM's "
                "training): give its arguments in a flags file or a model_config.yaml",
            )
        )
        return Launch({}, {}, {}, None, "", "", problems)
    distinct = list(dict.fromkeys((c.words, c.env) for c in runs))
    if len(distinct) > 1:
        lines = ", ".join(str(c.line) for c in runs)
        problems.append((name, f"runs {len(distinct)} different training commands (lines {lines})"))
    run = runs[-1]
    index = _script_index(run.words)
    if index is None:
        problems.append(
            (
                " ".join(w.text for w in run.words[:6]),
                f"line {run.line}: names no pretrain_*.py script cpmem can read",
            )
        )
        return Launch({}, {}, {}, None, "", "", problems)
    script = PurePosixPath(run.words[index].text).name
    if script not in TRAINING_SCRIPTS:
        problems.append(
            (
                script,
                f"is not a training script cpmem prices (its parser is {TRAINING_SCRIPTS[0]}'s: "
                f"{', '.join(TRAINING_SCRIPTS)})",
            )
        )
    flags, unknown, strays = _flags(run.words[index + 1 :])
    problems += strays
    if run.unset:
        for flag in flags:
            unknown[flag] = tuple(dict.fromkeys(unknown.get(flag, ()) + run.unset))
    world, reason = _world(run.words[:index])
    words = {n: state.values[n][0] for n in sorted(state.exported) if state.values.get(n)}
    words.update(dict(run.env))
    env = {n: w.text for n, w in words.items() if not w.unset}
    env_unknown = {n: w.unset for n, w in words.items() if w.unset}
    return Launch(flags, unknown, env, world, reason, script, problems, env_unknown)
