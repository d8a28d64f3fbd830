"""The command line of the second measured runtime: ``cpmem estimate|admit|capacity
--megatron-args FILE`` (``cpmem.megatron``).

``cpmem.cli`` adds these flags to the three commands and hands a command here when
``--megatron-args`` is given, with the command's parser defaults: a flag whose value is
not its default belongs to the LoRA step's description and is refused by name.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from cpmem.api import describe_megatron
from cpmem.cli_help import HELP
from cpmem.errors import InputError, require_bytes
from cpmem.megatron.admission import admit_megatron, megatron_capacity
from cpmem.megatron.estimate import price_megatron
from cpmem.megatron.run import MegatronRun
from cpmem.reports.cli_render import render_megatron_estimate
from cpmem.units import GIB, fmt_gib


def add_megatron_args(p: argparse.ArgumentParser) -> None:
    """The flags of a Megatron-LM run priced from ``--megatron-args`` (``cpmem.megatron``)."""
    group = p.add_argument_group("a Megatron-LM run (with --megatron-args FILE)")
    group.add_argument("--world-size", type=int, help=HELP["--world-size"])
    group.add_argument("--rank", default="last", help=HELP["--rank"])
    group.add_argument("--attention-backend", help=HELP["--attention-backend"])


MEGATRON_FLAGS = frozenset(
    {"megatron_args", "world_size", "rank", "attention_backend", "device", "json", "budget_gib"}
)
"""The flags a ``--megatron-args`` command reads; any other flag given is refused."""


def _megatron_run(args: argparse.Namespace, defaults: dict[str, Any]) -> MegatronRun:
    """The run ``--megatron-args`` describes; a LoRA step's flag given with it (one whose
    value is not the command's ``defaults``) is refused."""
    given = sorted(
        k
        for k, v in vars(args).items()
        if k not in MEGATRON_FLAGS and k in defaults and v != defaults[k] and k != "handler"
    )
    if given:
        flags = ", ".join("--" + k.replace("_", "-") for k in given)
        verb = "does" if len(given) == 1 else "do"
        raise InputError(
            "megatron_args",
            args.megatron_args,
            f"describes the whole run; {flags} {verb} not apply to it (the layout, recompute "
            "and dtype come from Megatron-LM's arguments)",
        )
    if args.world_size is None:
        raise InputError("world_size", None, "give --world-size N with --megatron-args")
    return describe_megatron(
        args.megatron_args,
        world_size=args.world_size,
        rank=args.rank,
        device=args.device or "h100",
        attention_backend=args.attention_backend,
    )


def estimate(args: argparse.Namespace, defaults: dict[str, Any]) -> int:
    est = price_megatron(_megatron_run(args, defaults))
    if args.json:
        print(json.dumps(est.to_dict(), indent=2))
    else:
        print(render_megatron_estimate(est))
    return 0


def admit(args: argparse.Namespace, defaults: dict[str, Any]) -> int:
    run = _megatron_run(args, defaults)
    budget = (
        None if args.budget_gib is None else int(require_bytes("budget_gib", args.budget_gib * GIB))
    )
    decision = admit_megatron(run, budget)
    if args.json:
        print(json.dumps(decision.to_dict(), indent=2))
    else:
        print(
            f"{decision.action.upper()}: peak {fmt_gib(decision.estimate.peak_bytes)} GiB on rank "
            f"{run.stage_rank(decision.estimate.stage)}, budget {fmt_gib(decision.budget_bytes)} "
            f"GiB ({decision.budget_source})"
        )
        if decision.suggestion:
            print(f"  suggestion: {decision.suggestion}")
    return 0 if decision.action == "fit" else 3


def capacity(args: argparse.Namespace, defaults: dict[str, Any]) -> int:
    run = _megatron_run(args, defaults)
    found = megatron_capacity(run)
    if args.json:
        print(json.dumps(found.to_dict(), indent=2))
    elif found.seq_length is None:
        print(f"no --seq-length fits {fmt_gib(found.budget_bytes)} GiB ({run.device.name})")
    else:
        assert found.estimate is not None
        print(
            f"longest --seq-length: {found.seq_length} (peak "
            f"{fmt_gib(found.estimate.peak_bytes)} GiB of {fmt_gib(found.budget_bytes)} GiB on "
            f"{run.device.name}; bounded by {found.limit})"
        )
    return 0
