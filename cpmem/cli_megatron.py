"""``cpmem estimate|admit|capacity --megatron-args FILE``: a Megatron-LM run read from its
own arguments into the one step description (``cpmem.api.describe_megatron``), then
priced, admitted or searched as every step is.

``cpmem.cli`` hands a command here when ``--megatron-args`` is given: every setting flag
the user gave (``given_settings``, a default typed explicitly included) is passed over the
arguments' settings as ``describe_step``'s keyword (``--lora-rank 16`` prices a
LoRA run on that model; ``--recompute full`` another recompute; ``--policy reference``
ART's published formula, which names the runtime as an option it does not price).
``cpmem.cli`` builds its parser with ``add_megatron_args`` for every command, so the
Megatron-LM readers and the admission search are imported by the commands that use them,
not with this module.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from cpmem.api import MEGATRON_POLICY, describe_megatron
from cpmem.cli_help import HELP, given_settings
from cpmem.errors import InputError
from cpmem.pricing.registry import backend_spread, price
from cpmem.reports.cli_render import render_capacity, render_megatron_estimate
from cpmem.step.settings import DEFAULTS, SETTINGS
from cpmem.step.step import Step
from cpmem.units import fmt_gib


def add_megatron_args(p: argparse.ArgumentParser) -> None:
    """The flags of a Megatron-LM run priced from ``--megatron-args`` (``cpmem.megatron``)."""
    group = p.add_argument_group("a Megatron-LM run (with --megatron-args FILE)")
    group.add_argument("--world-size", type=int, help=HELP["--world-size"])
    group.add_argument("--vocab-size", type=int, help=HELP["--vocab-size"])


DOOR_SETTINGS = frozenset({"rank", "device", "attention_backend", "container"})
"""The settings a ``--megatron-args`` command reads itself (``_run_keywords``): how the run
is answered and which kernels it picks; every other setting given is an override of the
run's step, exactly the ones given (``given_settings``: a value typed equal to cpmem's
default is an override too)."""

NOT_OVERRIDES = frozenset({"layouts", "pack", "plot", "free_bytes", "reusable_reserved_bytes"})
"""Flags of the commands that describe no step setting (capacity's search, a runtime's
budget figures): refused with ``--megatron-args`` by name."""

REQUEST_FLAGS = (
    "lengths",
    "microbatch_lengths",
    "microbatch_file",
    "shared_prefix",
    "logical_tokens",
    "packed_tokens",
    "rank_tokens",
    "busiest_tokens",
    "segments",
)
"""A request's flags and an explicit plan's: a Megatron-LM run's request is its
arguments' own."""


def _overrides(args: argparse.Namespace, defaults: dict[str, Any]) -> dict[str, Any]:
    """``describe_step``'s keywords for the settings the user gave over the run's; the
    commands' other flags given (``defaults``: their values when not given) are refused
    where they describe no step setting or a request."""
    others = {
        k for k, v in vars(args).items() if k in defaults and k not in SETTINGS and v != defaults[k]
    }
    refused = sorted(k for k in others if k in NOT_OVERRIDES)
    if refused:
        flags = ", ".join("--" + k.replace("_", "-") for k in refused)
        raise InputError("megatron_args", args.megatron_args, f"does not take {flags}")
    for name in REQUEST_FLAGS:
        if name in others:
            raise InputError(
                name,
                getattr(args, name),
                "a Megatron-LM run's request is --micro-batch-size sequences of --seq-length "
                "tokens each micro-batch (its arguments)",
            )
    return {k: v for k, v in given_settings(args).items() if k not in DOOR_SETTINGS}


def _run_keywords(args: argparse.Namespace) -> dict[str, Any]:
    """``megatron_run_with``'s keywords from the command line (an H100 where no device is
    given: it chooses the step's kernels; no ``--world-size``: the launch's torchrun
    world, else the run is refused asking for it)."""
    return {
        "world_size": args.world_size,
        "vocab_size": args.vocab_size,
        "rank": args.rank or "busiest",
        "device": args.device or "h100",
        "attention_backend": args.attention_backend,
        "container": args.container or DEFAULTS["container"],
    }


def _step(args: argparse.Namespace, defaults: dict[str, Any]) -> Step:
    return describe_megatron(
        args.megatron_args, **_run_keywords(args), **_overrides(args, defaults)
    )


def warn(warnings: Sequence[str]) -> None:
    """Legal but suspicious input, one ``cpmem: warning:`` line each on stderr."""
    for w in warnings:
        print(f"cpmem: warning: {w}", file=sys.stderr)


def _policy(args: argparse.Namespace, defaults: dict[str, Any]) -> str:
    """The policy asked for, else ``tight`` (``cpmem.api.MEGATRON_POLICY``)."""
    return str(args.policy) if args.policy != defaults.get("policy") else MEGATRON_POLICY


def estimate(args: argparse.Namespace, defaults: dict[str, Any]) -> int:
    step = _step(args, defaults)
    policy = _policy(args, defaults)
    est = price(step, policy)
    spread = backend_spread(step, policy)
    from cpmem.megatron.args import read_megatron_args
    from cpmem.megatron.describe import layout_flags

    ignored = read_megatron_args(
        args.megatron_args,
        vocab_size=args.vocab_size,
        world_size=args.world_size,
        replace_flags=layout_flags(_overrides(args, defaults)),
    ).ignored
    if args.json:
        out = est.to_dict()
        out.update(megatron_fields(step, spread, ignored))
        print(json.dumps(out, indent=2))
    else:
        warn(step.warnings)
        print(render_megatron_estimate(est, step, spread, ignored))
    return 0


def megatron_fields(step: Step, spread: dict[str, int], ignored: tuple[str, ...]) -> dict[str, Any]:
    """What a Megatron-LM run's JSON adds to the estimate's: the run's world, its DP and
    micro-batches per step (derived from the world and the global batch), the backend
    spread, the arguments read and changing nothing, and the step's warnings
    (legal but suspicious input, empty when none)."""
    return {
        "world_size": step.settings.world_size,
        "dp": step.settings.layout.dp,
        "microbatches": step.settings.pipeline.microbatches,
        "backend_spread_peak_bytes": dict(spread),
        "ignored_args": list(ignored),
        "warnings": list(step.warnings),
    }


def admit(args: argparse.Namespace, defaults: dict[str, Any]) -> int:
    """The run admitted on its forward+backward figure with its static memory, against
    ``--budget-gib`` (the device's usable bytes), ``--device``, or the smaller of the two
    (``cpmem.admission.budget``); the H100 assumed where no device is given only chooses
    the step's kernels, so a budget alone decides."""
    from cpmem.admission.admission import admit_step
    from cpmem.admission.budget import gib_budget

    step = _step(args, defaults)
    usable = None if args.budget_gib is None else gib_budget("budget-gib", args.budget_gib)
    decision = admit_step(
        step,
        usable_bytes=usable,
        use_device=args.device is not None or usable is None,
        policy=_policy(args, defaults),
        figure="forward_backward",
    )
    code = 0 if decision.action != "refuse" else 3
    if args.json:
        print(json.dumps({**decision.to_dict(), "warnings": list(step.warnings)}, indent=2))
        return code
    warn(step.warnings)
    stage = decision.estimate.device_stage("forward_backward")
    print(
        f"{decision.action.upper()}: required {fmt_gib(decision.required_bytes)} GiB "
        f"(the peak of {step.settings.rank} rank, stage {stage} of "
        f"{step.settings.pipeline.pp}), usable {fmt_gib(decision.available_bytes)} GiB"
    )
    if decision.suggestion:
        print(f"  suggestion: {decision.suggestion}")
    from cpmem.reports.admit_render import budget_line

    print("  " + budget_line(decision))
    return code


def capacity_command(args: argparse.Namespace, defaults: dict[str, Any]) -> int:
    """The longest sequence of ``--micro-batch-size`` sequences that fits the device, the
    run's other arguments unchanged (``cpmem.admission.capacity`` at its TP x CP, the
    layout flags given beside the arguments written into them as for ``estimate``)."""
    from cpmem.admission.capacity import capacity
    from cpmem.megatron.describe import megatron_run_with

    step = _step(args, defaults)  # the run's own step: its checks and warnings
    overrides = _overrides(args, defaults)
    run, rest = megatron_run_with(args.megatron_args, overrides, **_run_keywords(args))
    settings: dict[str, Any] = {
        k: v for k, v in run.arguments.items() if k not in ("lengths", "tp", "cp")
    }
    settings.update(rest, training=step.settings.training)
    found = capacity(
        run.geometry,
        layouts=[(run.arguments["tp"], run.arguments["cp"])],
        pack=run.args.micro_batch_size,
        policy=_policy(args, defaults),
        figure="forward_backward",
        **settings,
    )
    if args.json:
        print(json.dumps({**found.to_dict(), "warnings": list(step.warnings)}, indent=2))
    else:
        warn(step.warnings)
        print(render_capacity(found))
    return 0
