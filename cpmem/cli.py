"""The ``cpmem`` command: estimate, admit, capacity, models (and the golden/gate/report tools).

One module for the parser and its commands: every command builds its step from the same
arguments (``_step_arguments``), so they stay together; the Megatron-LM door
(``cli_megatron``), the help texts (``cli_help``) and the rendering
(``reports.cli_render``) live apart. What one command needs and ``estimate`` does not
(admission, the capacity search and its plot, the profile store) is imported by that
command: the CLI's start-up is most of an estimate's time (benchmarks/bench_cli.py)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cpmem import cli_megatron
from cpmem.api import describe_step, price_step, record_profile
from cpmem.cli_help import HELP, add_setting_args, given_settings, policy_help
from cpmem.errors import CpmemError, InputError
from cpmem.plan.layout import data_parallel
from cpmem.plan.request import Request
from cpmem.pricing.estimate import Estimate
from cpmem.pricing.registry import policy_names
from cpmem.reports.cli_render import (
    model_rows,
    render_capacity,
    render_estimate,
    render_models,
)
from cpmem.step.profiles import ProfileStore
from cpmem.step.settings import DEFAULTS
from cpmem.step.values import parse_int_list, whole_bytes
from cpmem.units import fmt_gib

Handler = Callable[[argparse.Namespace], int]


def _add_model_args(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help=HELP["--model"])
    src.add_argument("--config", dest="config", help=HELP["--config"])
    src.add_argument("--megatron-args", help=HELP["--megatron-args"])
    add_setting_args(p, ("activation",))


def _defaults(command: str) -> dict[str, Any]:
    """Every flag's default value for ``command`` (as a ``--megatron-args`` run parses)."""
    return vars(build_parser().parse_args([command, "--megatron-args", "-"]))


def _add_settings_args(p: argparse.ArgumentParser, device_help: str = "--device") -> None:
    """The step settings every pricing command takes, from their declaration
    (``cpmem.step.settings``: the groups but the model's source and the request's own),
    and the policy; ``estimate`` and ``admit`` through ``_add_request_args``, ``capacity``
    through ``_add_capacity_args``; ``given_settings`` reads the ones given."""
    p.add_argument("--policy", default=None, help=policy_help())
    add_setting_args(p, ("step", "process", "whole", "pipeline"), {"--device": HELP[device_help]})


def _add_request_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lengths", help=HELP["--lengths"])
    p.add_argument("--shared-prefix", type=int, default=0, help=HELP["--shared-prefix"])
    add_setting_args(p, ("request",))
    _add_settings_args(p)
    mbs = p.add_mutually_exclusive_group()
    mbs.add_argument("--microbatch-lengths", help=HELP["--microbatch-lengths"])
    mbs.add_argument("--microbatch-file", help=HELP["--microbatch-file"])
    ex = p.add_argument_group("explicit plan (a runtime that knows its layout)")
    ex.add_argument("--logical-tokens", type=int, help=HELP["--logical-tokens"])
    ex.add_argument("--packed-tokens", type=int, help=HELP["--packed-tokens"])
    ex.add_argument("--rank-tokens", help=HELP["--rank-tokens"])
    ex.add_argument("--busiest-tokens", type=int, help=HELP["--busiest-tokens"])
    ex.add_argument("--segments", type=int, help=HELP["--segments"])
    p.add_argument("--json", action="store_true", help=HELP["--json"])


def _step_arguments(args: argparse.Namespace) -> dict[str, Any]:
    """``describe_step``'s arguments from the command line: ``estimate`` and ``admit``
    pass the same ones, so they price the same step."""
    lengths = None if args.lengths is None else parse_int_list("lengths", args.lengths)
    rank_tokens = (
        None if args.rank_tokens is None else parse_int_list("rank_tokens", args.rank_tokens)
    )
    given = given_settings(args)
    arguments = {
        "model": args.model,
        **given,
        "lengths": lengths,
        "shared_prefix": args.shared_prefix,
        "logical_tokens": args.logical_tokens,
        "packed_tokens": args.packed_tokens,
        "rank_tokens": rank_tokens,
        "busiest_tokens": args.busiest_tokens,
        "segments": args.segments,
        **_microbatch_arguments(args),
    }
    if getattr(args, "vocab_size", None) is not None:
        raise InputError(
            "vocab_size",
            args.vocab_size,
            "is read with --megatron-args (a Megatron-LM run's tokenizer); --model and "
            "--config give their own vocabulary",
        )
    world = getattr(args, "world_size", None)  # profile record has no --world-size
    if world is not None:
        tp, cp, pp = (given.get(k, DEFAULTS[k]) for k in ("tp", "cp", "pp"))
        arguments["dp"] = data_parallel(world, tp, cp, pp, given.get("dp"))
    return arguments


def _microbatch_arguments(args: argparse.Namespace) -> dict[str, Any]:
    """``--microbatches M`` (one request repeated), or every micro-batch's request:
    ``--microbatch-lengths "4096,4096;2048;8192"`` or ``--microbatch-file F`` (a JSON list
    of length lists or of ``{"lengths": [...], "shared_prefix": n}``)."""
    given: list[Any] | None = None
    if args.microbatch_lengths is not None:
        given = [
            parse_int_list("microbatch_lengths", part)
            for part in args.microbatch_lengths.split(";")
        ]
    elif args.microbatch_file is not None:
        given = _microbatch_file(args.microbatch_file)
    out: dict[str, Any] = {}
    if given is not None:
        if args.lengths is not None:
            raise InputError(
                "microbatch_lengths", "+lengths", "give the micro-batches or --lengths, not both"
            )
        out["microbatch_requests"] = given
    return out


def _microbatch_file(path: str) -> list[Any]:
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError("microbatch_file", path, f"cannot be read as JSON ({exc})") from exc
    if not isinstance(raw, list) or not raw:
        raise InputError("microbatch_file", path, "must hold a non-empty JSON list")
    out: list[Any] = []
    for i, item in enumerate(raw):
        if isinstance(item, dict):
            lengths, prefix = item.get("lengths"), item.get("shared_prefix", 0)
        else:
            lengths, prefix = item, 0
        if not isinstance(lengths, list) or not all(isinstance(n, int) for n in lengths):
            raise InputError(f"microbatch_file[{i}]", item, "needs a list of integer lengths")
        if not isinstance(prefix, int):
            raise InputError(f"microbatch_file[{i}].shared_prefix", prefix, "must be an integer")
        out.append(Request.shared(lengths, prefix))
    return out


_warn = cli_megatron.warn


def _warn_ignored(est: Estimate) -> None:
    """One line naming every option the policy did not price, with why."""
    if est.ignored_options:
        _warn([f"policy {est.policy} ignores " + "; ".join(est.ignored_options)])


def cmd_estimate(args: argparse.Namespace) -> int:
    if args.megatron_args is not None:
        return cli_megatron.estimate(args, _defaults("estimate"))
    step = describe_step(**_step_arguments(args))
    est = price_step(step, args.policy)
    _warn(step.warnings)
    if not args.json:
        _warn_ignored(est)
    if args.json:
        out = est.to_dict()
        out["rank_tokens"] = list(step.plan.rank_tokens)
        out["warnings"] = list(step.warnings)
        print(json.dumps(out, indent=2))
    else:
        print(render_estimate(est, step.plan))
        harness = _harness_figure(args, est)
        if harness is not None:
            print(harness)
    return 0


def _harness_figure(args: argparse.Namespace, est: Estimate) -> str | None:
    """The same request as the calibration harness's step (what golden/ measured: the
    hidden states returned, rank-1 adapters, the first step of its process), one line
    beside a trainer's figure; None where the step is the harness's already, or where
    golden/ measured no step of the model (not a measured preset's shapes, or not ART's
    runtime)."""
    if est.facts.measured_model is None or est.facts.evidence != "art_cells":
        return None
    arguments = _step_arguments(args)
    harness = {"head": "hidden", "step": "first", "lora_rank": 1, "lora_dropout": 0.0}
    if all({**DEFAULTS, **arguments}.get(k) == v for k, v in harness.items()):
        return None
    arguments.update(harness, lora_targets="all")
    try:
        other = price_step(describe_step(**arguments), args.policy)
    except InputError:  # a request only the trainer's step can run: no harness line
        return None
    return (
        f"the harness's step (--head hidden --step first --lora-rank 1, what golden/ "
        f"measured): {fmt_gib(other.estimate_bytes)} GiB; this step: "
        f"{fmt_gib(est.estimate_bytes)} GiB"
    )


def _admit_budget(args: argparse.Namespace, arguments: dict[str, Any]) -> dict[str, Any]:
    """``admit_step``'s budget keywords from the command line (``cpmem.admission.budget``):
    ``--budget-gib`` (the device's usable bytes, static memory and activations together;
    beside ``--device`` the smaller decides), or the runtime's free and reserved bytes
    with the device's total (what the running process has left for the activations);
    none: the device's (``--device`` / ``--device-total-bytes``)."""
    runtime = (args.free_bytes, args.reusable_reserved_bytes)
    if any(v is not None for v in runtime):
        if any(v is None for v in runtime) or args.device_total_bytes is None:
            raise InputError(
                "budget",
                None,
                "give all of --free-bytes, --reusable-reserved-bytes, --device-total-bytes",
            )
        if args.budget_gib is not None or args.device is not None:
            raise InputError(
                "free_bytes",
                args.free_bytes,
                "the runtime's figures are what its process has left after its static "
                "memory; give them or --budget-gib / --device, not both",
            )
        arguments["device_total_bytes"] = None  # the runtime's figures, not a device's
        from cpmem.admission.admission import usable_budget

        return {"budget_bytes": usable_budget(*runtime, args.device_total_bytes)}
    if args.budget_gib is not None:
        from cpmem.admission.budget import gib_budget

        return {"usable_bytes": gib_budget("budget-gib", args.budget_gib)}
    if args.device is None and args.device_total_bytes is None:
        raise InputError(
            "budget",
            None,
            "give --budget-gib, --device NAME (or --device-total-bytes N), or the runtime's "
            "--free-bytes, --reusable-reserved-bytes and --device-total-bytes",
        )
    return {}


def cmd_admit(args: argparse.Namespace) -> int:
    if args.megatron_args is not None:
        return cli_megatron.admit(args, _defaults("admit"))
    from cpmem.admission.admission import admit_step

    arguments = _step_arguments(args)
    budget = _admit_budget(args, arguments)
    step = describe_step(**arguments)
    _warn(step.warnings)
    decision = admit_step(step, policy=args.policy, figure=args.figure, **budget)
    if args.json:
        print(json.dumps({**decision.to_dict(), "warnings": list(step.warnings)}, indent=2))
    else:
        _warn_ignored(decision.estimate)
        from cpmem.reports.admit_render import render_admit

        print("\n".join(render_admit(decision)))
    return 0 if decision.action != "refuse" else 3


def _add_capacity_args(p: argparse.ArgumentParser) -> None:
    """``capacity``'s flags: the layouts and pack it searches, and the step settings
    ``estimate`` takes (the same flags and defaults), less the request and the layout."""
    p.add_argument("--layouts", help=HELP["--layouts"])
    p.add_argument("--pack", type=int, default=None, help=HELP["--pack"])
    p.add_argument(
        "--figure",
        choices=("forward", "forward_backward"),
        default="forward",
        help=HELP["capacity --figure"],
    )
    p.add_argument("--plot", help=HELP["--plot"])
    _add_settings_args(p, device_help="capacity --device")
    p.add_argument("--json", action="store_true", help=HELP["--json"])


def cmd_capacity(args: argparse.Namespace) -> int:
    if args.megatron_args is not None:
        return cli_megatron.capacity_command(args, _defaults("capacity"))
    if args.world_size is not None:
        raise InputError(
            "world_size",
            args.world_size,
            "capacity searches layouts of other TP x CP, each its own DP of a world: give "
            "--dp (the data-parallel ranks) with --model or --config",
        )
    from cpmem.admission.capacity import DEFAULT_PACK, capacity
    from cpmem.reports.capacity_plot import check_plot_path, require_matplotlib, write_capacity_plot

    plot = None
    if args.plot is not None:  # checked before the search runs
        require_matplotlib()
        plot = check_plot_path(args.plot)
    found = capacity(
        args.model,
        layouts=args.layouts,
        pack=DEFAULT_PACK if args.pack is None else args.pack,
        policy=args.policy,
        figure=args.figure,
        **given_settings(args),
    )
    written = None if plot is None else write_capacity_plot(found, plot)
    if args.json:
        out = found.to_dict()
        out["plot"] = None if written is None else str(written)
        out["warnings"] = []  # no request is given: the search flags its own lengths
        print(json.dumps(out, indent=2))
    else:
        print(render_capacity(found))
        if written is not None:
            print(f"plot: {written}")
    return 0


def cmd_profile_record(args: argparse.Namespace) -> int:
    """``cpmem profile record --profiles FILE --peak-bytes N`` and the step's flags."""
    if args.megatron_args is not None:
        raise InputError(
            "megatron_args",
            args.megatron_args,
            "learned profiles floor the LoRA estimator's steps; a Megatron-LM run has none",
        )
    if args.profiles is None:
        raise InputError("profiles", None, "name the store to record into (--profiles FILE)")
    arguments = _step_arguments(args)
    path = arguments.pop("profiles")
    peak = whole_bytes("peak_bytes", args.peak_bytes)
    assert peak is not None

    signature, tokens = record_profile(path, peak, **arguments)
    floor = ProfileStore.load(path).floor(signature, tokens)
    out = {"profiles": path, "key": signature.key, "peak_bytes": peak, "tokens": tokens}
    out["floor_bytes"] = floor
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"recorded {signature.key}: {peak:,} B at {tokens:,} tokens into {path}")
        print(f"  the store's floor for this step at {tokens:,} tokens: {floor:,} B")
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    rows = model_rows()
    print(json.dumps(rows, indent=2) if args.json else render_models(rows))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cpmem",
        description="Per-rank activation memory of LoRA fine-tuning under TP/SP/CP.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("estimate", help="price one request: per-rank bytes and breakdown")
    _add_model_args(p)
    _add_request_args(p)
    cli_megatron.add_megatron_args(p)
    p.set_defaults(handler=cmd_estimate)

    p = sub.add_parser("admit", help="fit, split or refuse a request against a budget")
    _add_model_args(p)
    _add_request_args(p)
    cli_megatron.add_megatron_args(p)
    p.add_argument("--budget-gib", type=float, help=HELP["--budget-gib"])
    p.add_argument("--free-bytes", type=float, help=HELP["--free-bytes"])
    p.add_argument("--reusable-reserved-bytes", type=float, help=HELP["--reusable-reserved-bytes"])
    p.add_argument(
        "--figure",
        choices=("forward", "forward_backward"),
        default="forward",
        help=HELP["--figure"],
    )
    p.set_defaults(handler=cmd_admit)

    p = sub.add_parser(
        "capacity",
        help="the longest sequence and the largest pack that fit a device, per TP x CP layout",
    )
    _add_model_args(p)
    _add_capacity_args(p)
    cli_megatron.add_megatron_args(p)
    p.set_defaults(handler=cmd_capacity)

    p = sub.add_parser("profile", help="learned-profile floors: record a measured peak")
    actions = p.add_subparsers(dest="action", required=True)
    rec = actions.add_parser(
        "record",
        help="record a measured activation peak for a step into a --profiles store",
    )
    _add_model_args(rec)
    _add_request_args(rec)
    rec.add_argument("--peak-bytes", type=float, required=True, help=HELP["--peak-bytes"])
    rec.set_defaults(handler=cmd_profile_record)

    p = sub.add_parser("models", help="list the built-in model geometries")
    p.add_argument("--json", action="store_true", help=HELP["--json"])
    p.set_defaults(handler=cmd_models)

    for name, (help_text, register) in _extra_commands().items():
        p = sub.add_parser(name, help=help_text, add_help=False)
        p.set_defaults(handler=register)
    return parser


def _extra_commands() -> dict[str, tuple[str, Handler]]:
    """Tools in their own modules, each taking the rest of the command line."""
    return {
        "golden": ("import / verify / export the golden measurement layer", _golden),
        "gate": ("check an estimator policy against the golden layer", _forward("cpmem.gate.cli")),
        "diff": ("what an estimator change moves, vs a git revision", _forward("cpmem.diff.cli")),
        "report": (
            "write the calibration report (markdown + figures)",
            _forward("cpmem.reports.calibration"),
        ),
    }


def _golden(args: argparse.Namespace) -> int:
    """``golden export`` describes cells with model geometry, so it lives in the gate."""
    if args.rest[:1] == ["export"]:
        from cpmem.gate.external_cli import export_main

        return export_main(args.rest[1:])
    return _forward("cpmem.golden.cli")(args)


def _forward(module: str) -> Handler:
    def run(args: argparse.Namespace) -> int:
        import importlib

        importlib.import_module("cpmem.golden")  # one line naming the extra where it is missing
        mod = importlib.import_module(module)
        main: Callable[[list[str]], int] = mod.main
        return main(args.rest)

    return run


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if argv and argv[0] in _extra_commands():
        args = argparse.Namespace(handler=_extra_commands()[argv[0]][1], rest=argv[1:])
    else:
        args = parser.parse_args(argv)
    policy = getattr(args, "policy", None)
    try:
        if policy is not None and policy not in policy_names():
            raise InputError("policy", policy, f"unknown policy; choose one of {policy_names()}")
        handler: Handler = args.handler
        return handler(args)
    except CpmemError as exc:
        print(f"cpmem: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `cpmem estimate --json | head`
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
