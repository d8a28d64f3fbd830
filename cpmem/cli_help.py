"""The help text of every ``cpmem`` flag, in one place (a test requires each option of
``estimate``, ``admit`` and ``models`` to have one), and the step settings' flags as
their declaration gives them (``cpmem.step.settings``): ``add_setting_args`` builds them,
``given_settings`` reads the ones a command line gave, a default typed explicitly
included (every setting flag is absent, None, unless given)."""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping
from typing import Any

from cpmem.pricing.registry import policy_names
from cpmem.step.setting import GROUP_TITLES
from cpmem.step.settings import SETTINGS

SETTING_HELP: dict[str, str] = {
    flag: text
    for s in SETTINGS.values()
    for flag, text in ((s.flag, s.help), (s.negation, s.negation_help))
    if flag is not None
}
"""Every setting flag's help, from its declaration."""

HELP: dict[str, str] = {
    **SETTING_HELP,
    "--model": "preset name or recorded Hugging Face id (see `cpmem models`)",
    "--megatron-args": "a Megatron-LM GPT training run: a functional test's model_config.yaml "
    "(its MODEL_ARGS and ENV_VARS) or a text file of pretrain_gpt.py flags, read into the same "
    "step as --model/--config (full-parameter training, Megatron-LM's runtime) and priced by "
    "--policy tight unless named; every other flag given overrides the arguments' setting "
    "(--lora-rank N: a LoRA run on that model); with --world-size and --device (default h100) "
    "(docs/megatron-runtime.md)",
    "--world-size": "the GPUs the run uses: DP = world / (TP x PP x CP), after any "
    "--tp/--pp/--cp given; with --megatron-args it replaces a launch script's torchrun world "
    "(--nproc_per_node x --nnodes) and is required where there is none; with --model or "
    "--config in place of --dp (a --dp that contradicts it is refused; capacity, which "
    "searches layouts, takes --dp)",
    "--vocab-size": "with --megatron-args: the tokenizer's vocabulary before padding, "
    "replacing the arguments' --vocab-size (where cpmem cannot read the tokenizer's size)",
    "--lengths": "sequence lengths of the request, comma-separated, e.g. 4096,4096",
    "--shared-prefix": "tokens every sequence shares at its start, stored once (default 0; "
    "two or more sequences share one)",
    "--logical-tokens": "explicit plan: sum of the sequence lengths",
    "--packed-tokens": "explicit plan: tokens after prefix sharing and TP padding",
    "--rank-tokens": "explicit plan: model tokens per CP rank, e.g. 4096,2868 (one per rank)",
    "--busiest-tokens": "explicit plan: model tokens on the busiest CP rank only",
    "--segments": "explicit plan: gradient-enabled prefix-tree segments (prefix + completions)",
    "--json": "print one JSON object instead of the table",
    "--peak-bytes": "profile record: the measured activation peak of the step's busiest rank "
    "(its peak allocated bytes in the forward less those allocated before it)",
    "--budget-gib": "the device's usable bytes per rank, in GiB: static memory and activations "
    "together, as --device weighs them (beside --device the smaller decides)",
    "--free-bytes": "a running process's free device bytes per rank (with the two flags below: "
    "what it has left once its static memory is allocated, free + reusable reserved - a 3%% "
    "reserve of the device total, for the activations alone)",
    "--reusable-reserved-bytes": "bytes the caching allocator holds and can reuse",
    "--microbatch-lengths": "every micro-batch's sequence lengths: "
    "'4096,4096;2048;8192' (instead of --lengths)",
    "--microbatch-file": "a JSON list of the micro-batches' requests: [[4096, 4096], "
    '{"lengths": [2048, 2048], "shared_prefix": 512}]',
    "--figure": "admit on the forward peak or the whole step (forward_backward; policies "
    "that price it, e.g. tight)",
    "--layouts": "capacity: the TP x CP layouts to search, comma-separated TPxCP, e.g. "
    "1x1,2x1,1x2 (default: every TP x CP <= 8 of sizes 1, 2, 4, 8 the model's heads allow)",
    "--pack": "capacity: how many equal sequences the pack holds (default 2)",
    "capacity --figure": "capacity: fit the forward peak (default) or the whole step "
    "(forward_backward; policies that price it, e.g. tight)",
    "capacity --device": "a device preset (a100-80gb, h100, h200, b200, mi300x), or give "
    "--device-total-bytes; one is required: capacity fits what it leaves once each "
    "layout's static memory is allocated",
    "--plot": "capacity: also write a PNG of memory per rank against sequence length, one "
    "curve per layout, with the device's line (needs the report extra: matplotlib)",
}


def policy_help() -> str:
    """The policy list comes from the registry, so a new policy shows up here."""
    return (
        f"pricing policy: {', '.join(policy_names())} (default: the runtime's, reference for "
        "--runtime art and tight for megatron-lm; docs/pricing.md)"
    )


def add_setting_args(
    p: argparse.ArgumentParser,
    groups: Iterable[str],
    help_for: Mapping[str, str] | None = None,
) -> None:
    """The flags of the settings in ``groups`` (``Setting.group``), in declaration order,
    under their group's title; ``help_for`` replaces a flag's help for one command. Each
    is stored under its keyword and is None unless given; a flag and its negation are
    mutually exclusive."""
    wanted = set(groups)
    titled: dict[str, Any] = {}
    for name, s in SETTINGS.items():
        if s.flag is None or s.group not in wanted:
            continue
        title = GROUP_TITLES.get(s.group)
        if title is None:
            where: Any = p
        else:
            if title not in titled:
                titled[title] = p.add_argument_group(title)
            where = titled[title]
        # argparse formats help with %: a literal % in a declaration's text is escaped
        help_text = (help_for or {}).get(s.flag, s.help).replace("%", "%%")
        if s.negation is not None:
            pair = where.add_mutually_exclusive_group()
            pair.add_argument(
                s.flag, dest=name, action="store_const", const=True, default=None, help=help_text
            )
            pair.add_argument(
                s.negation,
                dest=name,
                action="store_const",
                const=False,
                help=s.negation_help and s.negation_help.replace("%", "%%"),
            )
        elif s.switch:
            where.add_argument(
                s.flag, dest=name, action="store_const", const=True, default=None, help=help_text
            )
        else:
            where.add_argument(
                s.flag,
                dest=name,
                type=s.cli_type,
                choices=s.choices,
                metavar=s.metavar,
                default=None,
                help=help_text,
            )


def given_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The settings a command line gave (each flag's keyword and its value, converted as
    its declaration says), and no other: a default typed explicitly is given."""
    out: dict[str, Any] = {}
    for name, s in SETTINGS.items():
        value = getattr(args, name, None)
        if value is not None:
            out[name] = s.convert(name, value) if s.convert is not None else value
    return out
