"""``python -m oracles.rank_sim``: simulate the ranks of one request and print peaks.

The only module of the simulator that may import cpmem: given lengths without
``--rank-tokens``, it asks cpmem's default planner (through ``cpmem.api``) for the
per-rank counts, and prints the layout it used with the result.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from dataclasses import replace
from importlib import metadata
from typing import Any

from oracles.rank_sim import SIM_VERSION
from oracles.rank_sim import kernels as K
from oracles.rank_sim.adapters import GROUPS, TARGETS, AdapterSpec
from oracles.rank_sim.cp_comm import CP_COMMS, check_cp_comm
from oracles.rank_sim.geometry import SimInputError, SimModel, get_model, load_config
from oracles.rank_sim.head import HEADS, HeadSpec
from oracles.rank_sim.layout import contiguous_layout, row_segments
from oracles.rank_sim.moe import ROUTINGS, check_routing
from oracles.rank_sim.recompute import Recompute

GIB = 2**30


def _ints(field: str, text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        values = [int(x) for x in text.replace("+", ",").split(",") if x.strip()]
    except ValueError:
        raise SimInputError(field, text, "expected comma-separated integers") from None
    if not values or any(v < 1 for v in values):
        raise SimInputError(field, text, "expected positive integers")
    return values


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def cpmem_counts(args: argparse.Namespace, lengths: list[int]) -> tuple[dict[str, Any], str]:
    """Per-rank counts from cpmem's default planner (lazy import; cpmem may be moving)."""
    if args.megatron_args:
        raise SimInputError("rank_tokens", None, "give --rank-tokens with --megatron-args")
    try:
        from cpmem import api
    except Exception as exc:
        raise SimInputError(
            "rank_tokens", None, f"cpmem not importable ({exc}); pass --rank-tokens"
        ) from None
    describe: Any = getattr(api, "describe_step", None)
    if describe is None:
        raise SimInputError(
            "rank_tokens", None, "cpmem.api has no describe_step here; pass --rank-tokens"
        )
    try:
        model = None if args.config else args.model
        sp = args.tp > 1 and not args.no_sp
        plan = describe(
            model,
            lengths,
            shared_prefix=args.shared_prefix,
            config=args.config,
            tp=args.tp,
            cp=args.cp,
            sp=sp,
            ep=args.ep,
        ).plan
    except Exception as exc:
        raise SimInputError("request", lengths, f"cpmem refused it: {exc}") from None
    if len(plan.groups) != 1:
        raise SimInputError(
            "lengths", lengths, f"cpmem planned {len(plan.groups)} forwards; pass --rank-tokens"
        )
    g = plan.groups[0]
    counts = {
        "attention_tokens": list(g.attention_tokens),
        "gdn_tokens": list(g.gdn_tokens),
        "packed_tokens": g.packed_tokens,
        "logical_tokens": g.logical_tokens,
    }
    return counts, f"cpmem default planner ({plan.planner})"


def request_counts(
    args: argparse.Namespace, lengths: list[int] | None, explicit: list[int] | None
) -> tuple[dict[str, Any], str, list[tuple[int, int | None]]]:
    """One request's per-CP-rank counts (``--rank-tokens``, else cpmem's default planner
    for ``lengths``), where they came from, and its row's segments."""
    if args.cp < 1:
        raise SimInputError("cp", args.cp, "must be >= 1")
    if lengths is not None and args.cp > sum(lengths):
        raise SimInputError("cp", args.cp, f"larger than the {sum(lengths)} tokens")
    if not 0 <= args.shared_prefix < min(lengths or [args.shared_prefix + 1]):
        raise SimInputError("shared_prefix", args.shared_prefix, "must be below every length")
    counts: dict[str, Any]
    if explicit is not None:
        if len(explicit) != args.cp:
            raise SimInputError("rank_tokens", explicit, f"needs one count per CP rank ({args.cp})")
        total = sum(explicit)
        counts = {"attention_tokens": explicit, "gdn_tokens": explicit, "packed_tokens": total,
                  "logical_tokens": sum(lengths) if lengths else total}  # fmt: skip
        source = "--rank-tokens"
        if lengths is not None and total < sum(lengths) - args.shared_prefix * (len(lengths) - 1):
            raise SimInputError("rank_tokens", explicit, "hold fewer than the row's tokens")
    elif lengths is not None:
        counts, source = cpmem_counts(args, lengths)
    else:
        raise SimInputError("lengths", None, "give --lengths or --rank-tokens")
    segs: list[tuple[int, int | None]] = (
        row_segments(lengths, args.shared_prefix, counts["packed_tokens"])
        if lengths is not None
        else [(n, None) for n in counts["gdn_tokens"]]
    )
    # each rank's count is padded to TP on its own, so the ranks together may hold more
    # than the packed row: the extra are padding tokens (1-token roots) at the row's end
    segs += [(1, None)] * max(0, sum(counts["gdn_tokens"]) - sum(t for t, _ in segs))
    return counts, source, segs


def run(args: argparse.Namespace) -> dict[str, Any]:
    from oracles.rank_sim.runner import simulate_rank

    if sum(bool(x) for x in (args.config, args.model, args.megatron_args)) > 1:
        raise SimInputError("model", None, "give one of --model, --config, --megatron-args")
    if args.config:
        model: SimModel = load_config(args.config)
    elif args.megatron_args:
        from oracles.rank_sim.hybrid import load_megatron_args

        model = load_megatron_args(args.megatron_args)
    elif args.model:
        model = get_model(args.model)
    else:
        raise SimInputError("model", None, "give --model, --config or --megatron-args")
    if args.layers:
        model = model.truncated(args.layers)
    model.check_tp(args.tp)
    model.check_ep(args.ep, args.tp * max(args.cp, 1))
    check_routing(args.routing)
    moe = {"ep": args.ep, "routing": args.routing} if model.moe else {}
    head = HeadSpec.parse(args.head)
    adapters = AdapterSpec.parse(
        args.lora_rank, args.lora_dropout, args.lora_targets, args.training,
        not args.no_gradient_accumulation_fusion,
    )  # fmt: skip
    check_cp_comm(args.cp_comm, model, args.tp, max(args.cp, 1))
    step = {"head": head.label, **adapters.as_dict(), "cp_comm": args.cp_comm}
    step_kw = {"head": head, "lora_rank": adapters.rank, "lora_dropout": adapters.dropout,
               "lora_targets": adapters.targets, "cp_comm": args.cp_comm}  # fmt: skip
    rc = Recompute.parse(args.recompute, args.modules)
    if _pipeline_mode(args):
        if args.mtp_depths == 0:  # asked for none: the pattern's depths are not run
            model = replace(model, mtp_depths=0, mtp_shared=False)
        _check_stage_step(args, model, adapters)
        return run_stages(args, model, rc, moe, step, step_kw)
    depths = model.mtp_depths if args.mtp_depths is None else args.mtp_depths
    shared = args.mtp_shared or model.mtp_shared
    step_kw.update(training=adapters.training, wgrad_fusion=adapters.wgrad_fusion,
                   mtp_depths=depths, mtp_shared=shared)  # fmt: skip
    if depths:
        step.update(mtp_depths=depths, mtp_shared=shared)
    lengths = _ints("lengths", args.lengths)
    explicit = _ints("rank_tokens", args.rank_tokens)
    counts, source, segs = request_counts(args, lengths, explicit)
    ranks = [args.rank] if args.rank is not None else list(range(args.cp))
    results = []
    for r in ranks:
        layout = contiguous_layout(
            segs, tuple(counts["attention_tokens"]), tuple(counts["gdn_tokens"]), tp=args.tp,
            rank=r, logical_tokens=counts["logical_tokens"], sp=not args.no_sp,
        )  # fmt: skip
        res = simulate_rank(
            model, layout, rc, compiled=args.compiled, micro_batch=args.micro_batch,
            **moe, **step_kw,
        )  # fmt: skip
        results.append(res.as_dict())
    busiest = max(results, key=lambda x: x["forward_backward_peak_bytes"])["rank"]
    return {
        **_header(model, rc, args, step),
        "layout": {**_layout(args, moe), "source": source, **counts},
        "ranks": results,
        "busiest_rank": busiest,
        "provenance": _provenance(),
    }


def _check_stage_step(args: argparse.Namespace, model: SimModel, adapters: AdapterSpec) -> None:
    """Pipeline stages simulate LoRA steps without MTP (pipeline/stage.py)."""
    if adapters.full:
        raise SimInputError("training", "full", "pipeline stages simulate LoRA steps only")
    if args.mtp_depths or args.mtp_shared or (args.mtp_depths is None and model.mtp_depths):
        raise SimInputError(
            "mtp_depths", args.mtp_depths or model.mtp_depths, "pipeline stages run no MTP"
        )


def _step_line(st: dict[str, Any]) -> str:
    """The step's summary line: what trains, the head, CP comm, MTP."""
    if st.get("training") == "full":
        fusion = "on" if st["gradient_accumulation_fusion"] else "off"
        trains = f"full-parameter training (gradient accumulation fusion {fusion})"
    else:
        trains = (
            f"LoRA rank {st['lora_rank']} dropout {st['lora_dropout']} on "
            f"{'+'.join(st['lora_targets'])}"
        )
    mtp = f", {st['mtp_depths']} MTP depth(s)" if st.get("mtp_depths") else ""
    return f"  head {st['head']}, {trains}, cp_comm {st['cp_comm']}{mtp}"


def _header(model: Any, rc: Any, args: argparse.Namespace, step: Any) -> dict[str, Any]:
    """What every simulation's JSON opens with: the model, recompute, mode and step."""
    return {"model": model.name, "recompute": rc.label, "compiled": args.compiled, "step": step}


def _layout(args: argparse.Namespace, moe: dict[str, Any]) -> dict[str, Any]:
    """The TP x CP layout the simulation ran, with its MoE routing where it has one."""
    return {
        "tp": args.tp,
        "cp": args.cp,
        "sequence_parallel": args.tp > 1 and not args.no_sp,
        **moe,
    }


def _provenance() -> dict[str, Any]:
    return {
        "torch": _version("torch"),
        "megatron-core": _version("megatron-core"),
        "fla": _version("fla-core"),
        "gdn_kernel": K.GDN_KERNEL,
        "simulator": SIM_VERSION,
        "cold_setup_added": False,
    }


PIPELINE_FLAGS = ("pp", "stage", "vpp", "microbatches", "microbatch_lengths",
                  "microbatch_rank_tokens", "stage_layers", "microbatch_group_size")  # fmt: skip


def _pipeline_mode(args: argparse.Namespace) -> bool:
    return args.keep_pipeline_outputs or any(getattr(args, f) is not None for f in PIPELINE_FLAGS)


def _microbatch_requests(
    args: argparse.Namespace,
) -> list[tuple[dict[str, Any], str, list[tuple[int, int | None]]]]:
    """Each micro-batch's counts, laid out as one request is: ``--microbatch-lengths``
    (one sequence each, cpmem's default planner), ``--microbatch-rank-tokens`` (explicit
    per-CP-rank counts, micro-batches separated by ``;``), or the one request of
    ``--lengths`` / ``--rank-tokens`` repeated ``--microbatches`` times."""
    per_lengths = _ints("microbatch_lengths", args.microbatch_lengths)
    per_ranks = (
        [_ints("microbatch_rank_tokens", part) for part in args.microbatch_rank_tokens.split(";")]
        if args.microbatch_rank_tokens is not None
        else None
    )
    given = [n for n, v in (("--microbatch-lengths", per_lengths),
                            ("--microbatch-rank-tokens", per_ranks)) if v is not None]  # fmt: skip
    if len(given) > 1 or (given and (args.lengths or args.rank_tokens)):
        raise SimInputError(
            "microbatches", None, "give one of --microbatch-lengths, --microbatch-rank-tokens, "
            "or --lengths / --rank-tokens (repeated --microbatches times)",
        )  # fmt: skip
    if given and args.shared_prefix:
        raise SimInputError(
            "shared_prefix", args.shared_prefix, "applies to --lengths only (one request)"
        )
    if per_lengths is not None:
        requests = [request_counts(args, [n], None) for n in per_lengths]
    elif per_ranks is not None:
        requests = [request_counts(args, None, counts) for counts in per_ranks]
    else:
        one = request_counts(
            args, _ints("lengths", args.lengths), _ints("rank_tokens", args.rank_tokens)
        )
        m = 1 if args.microbatches is None else args.microbatches
        if m < 1:
            raise SimInputError("microbatches", m, "must be >= 1")
        return [one] * m
    if args.microbatches is not None and args.microbatches != len(requests):
        raise SimInputError(
            "microbatches", args.microbatches, f"but {len(requests)} micro-batches were given"
        )
    return requests


def run_stages(
    args: argparse.Namespace,
    model: SimModel,
    rc: Recompute,
    moe: dict[str, Any],
    step: dict[str, Any],
    step_kw: dict[str, Any],
) -> dict[str, Any]:
    """Pipeline stages (oracles/rank_sim/pipeline/stage.py): every stage (or ``--stage``) of every
    CP rank (or ``--rank``), each running megatron's schedule over the micro-batches."""
    from oracles.rank_sim.pipeline import check_pipeline, simulate_stage, stage_layer_counts

    pp = 1 if args.pp is None else args.pp
    vpp = 1 if args.vpp is None else args.vpp
    stage_layers = _ints("stage_layers", args.stage_layers)
    if args.micro_batch != 1:
        raise SimInputError("micro_batch", args.micro_batch, "pipeline stages run packed rows (1)")
    segments = list(model.pipeline_segments)
    if stage_layers is None and segments:  # a hybrid pattern's '|' segments fix the stages
        if len(segments) % pp:
            raise SimInputError("pp", pp, f"does not divide the pattern's {len(segments)} segments")
        stage_layers, vpp = segments, (vpp if args.vpp is not None else len(segments) // pp)
    requests = _microbatch_requests(args)
    chunks, group = check_pipeline(
        pp, 0 if args.stage is None else args.stage, vpp, len(requests), args.microbatch_group_size
    )
    counts_per_stage = stage_layer_counts(model, pp, chunks, stage_layers)
    stages = [args.stage] if args.stage is not None else list(range(pp))
    ranks = [args.rank] if args.rank is not None else list(range(args.cp))
    results = []
    for r in ranks:
        layouts = [
            contiguous_layout(
                segs,
                tuple(c["attention_tokens"]),
                tuple(c["gdn_tokens"]),
                tp=args.tp,
                rank=r,
                logical_tokens=c["logical_tokens"],
                sp=not args.no_sp,
            )
            for c, _, segs in requests
        ]
        for s in stages:
            res = simulate_stage(
                model, layouts, rc, pp=pp, stage=s, vpp=vpp, stage_layers=counts_per_stage,
                microbatch_group_size=group, deallocate_outputs=not args.keep_pipeline_outputs,
                compiled=args.compiled, **moe, **step_kw,
            )  # fmt: skip
            results.append(res.as_dict(ops=not args.no_ops))
    busiest = max(results, key=lambda x: x["forward_backward_peak_bytes"])
    schedule = results[0]["schedule"]
    return {
        **_header(model, rc, args, step),
        "layout": {
            **_layout(args, moe),
            "microbatches": [{"source": source, **c} for c, source, _ in requests],
        },
        "pipeline": {
            "pp": pp,
            "vpp": chunks,
            "microbatches": len(requests),
            "microbatch_group_size": group,
            "stage_layers": list(counts_per_stage),
            "schedule": schedule,
            "deallocate_outputs": not args.keep_pipeline_outputs,
            "order_from": "megatron.core.pipeline_parallel.schedules "
            "(get_pp_rank_microbatches, get_schedule_table)",
        },
        "stages": results,
        "busiest": {
            "stage": busiest["stage"],
            "rank": busiest["rank"],
            "forward_backward_peak_bytes": busiest["forward_backward_peak_bytes"],
        },
        "provenance": _provenance(),
    }


def _print_stages(out: dict[str, Any]) -> None:
    pl, st = out["pipeline"], out["step"]
    print(
        f"{out['model']}  {out['recompute']}  tp={out['layout']['tp']} cp={out['layout']['cp']}"
        f"  pp={pl['pp']} vpp={pl['vpp']} {pl['schedule']}, {pl['microbatches']} micro-batches,"
        f" layers per virtual stage {pl['stage_layers']}"
    )
    print(_step_line(st))
    for r in out["stages"]:
        fw, fb = r["forward_peak"], r["forward_backward_peak"]
        print(
            f"  stage {r['stage']} rank {r['rank']}: forward {r['forward_peak_bytes'] / GIB:.3f} GiB"
            f" ({fw['in_flight_chunks']} in flight, forward of mb {fw['microbatch']} chunk"
            f" {fw['chunk']})  forward+backward {r['forward_backward_peak_bytes'] / GIB:.3f} GiB"
            f" ({fb['kind']} of mb {fb['microbatch']} chunk {fb['chunk']})  ({r['seconds']} s)"
        )
    b = out["busiest"]
    print(
        f"  busiest: stage {b['stage']} rank {b['rank']}; parameters and cold kernel set-up "
        "(~58 MiB) not included"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m oracles.rank_sim", description=__doc__)
    ap.add_argument("--model", help="preset name or recorded id (e.g. qwen3.5-27b)")
    ap.add_argument("--config", help="a Hugging Face config.json")
    ap.add_argument(
        "--megatron-args",
        help="a hybrid model from Megatron-LM arguments: a model_config.yaml (MODEL_ARGS), "
        "a JSON object of flags, or a text of --flag value words (hybrid.py)",
    )
    ap.add_argument("--lengths", help="sequence lengths, comma-separated")
    ap.add_argument("--shared-prefix", type=int, default=0)
    ap.add_argument("--rank-tokens", help="explicit per-CP-rank token counts (TP padding included)")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--cp", type=int, default=1)
    ap.add_argument("--no-sp", action="store_true", help="TP without sequence parallel")
    ap.add_argument("--recompute", default="selective", help="none | selective | full | no-grad")
    ap.add_argument(
        "--modules", default=None, help="selective modules: core_attn, mlp, moe, joined by +"
    )
    ap.add_argument(
        "--compiled", action="store_true", help="torch.compile'd saved set (fused elementwise)"
    )
    ap.add_argument("--ep", type=int, default=1, help="expert parallel size (MoE models)")
    ap.add_argument(
        "--routing", default="concentrated", help=f"MoE routing: {' | '.join(ROUTINGS)}"
    )
    ap.add_argument(
        "--head",
        default="hidden",
        help=f"LM head and loss: {' | '.join(HEADS)} (default hidden: the calibration harness)",
    )
    ap.add_argument("--lora-rank", type=int, default=1, help="LoRA rank R (default 1)")
    ap.add_argument(
        "--lora-dropout", type=float, default=0.0, help="LoRA dropout in [0, 1) (default 0)"
    )
    ap.add_argument(
        "--lora-targets",
        default="all",
        help=f"projections with adapters, joined by , or +: {', '.join(TARGETS)} or the "
        f"groups {', '.join(GROUPS)} (default all)",
    )
    ap.add_argument(
        "--training",
        default="lora",
        help="lora (adapters on a frozen base, default) | full (every weight trains, "
        "Megatron-LM's step; training.py)",
    )
    ap.add_argument(
        "--no-gradient-accumulation-fusion",
        action="store_true",
        help="full training: a bf16 weight gradient per weight instead of accumulating into "
        "main_grad in the GEMM (Megatron-LM's flag)",
    )
    ap.add_argument(
        "--mtp-depths",
        type=int,
        default=None,
        help="multi-token prediction depths after the last layer (mtp.py; needs --head logits "
        "or fused; default: the model's own, a hybrid pattern's '/' parts)",
    )
    ap.add_argument(
        "--mtp-shared",
        action="store_true",
        help="one MTP layer run for every depth (Megatron-LM's --mtp-use-repeated-layer)",
    )
    ap.add_argument(
        "--cp-comm",
        default="all_gather",
        help=f"CP attention communication: {' | '.join(CP_COMMS)} (default all_gather)",
    )
    ap.add_argument("--rank", type=int, default=None, help="simulate this CP rank only")
    ap.add_argument(
        "--micro-batch",
        type=int,
        default=1,
        help="rows of megatron's [s, b, h] the rank's tokens form (Mamba layers; default 1: "
        "one packed row)",
    )
    pipe = ap.add_argument_group(
        "pipeline stages", "any of these runs pipeline stages (oracles/rank_sim/pipeline/stage.py)"
    )
    pipe.add_argument("--pp", type=int, default=None, help="pipeline stages (default 1)")
    pipe.add_argument("--stage", type=int, default=None, help="simulate this stage only")
    pipe.add_argument("--vpp", type=int, default=None, help="model chunks per stage (default 1)")
    pipe.add_argument(
        "--microbatches", type=int, default=None, help="micro-batches (default 1, or as listed)"
    )
    pipe.add_argument(
        "--microbatch-lengths",
        default=None,
        help="one sequence length per micro-batch, each laid out as --lengths (cpmem's planner)",
    )
    pipe.add_argument(
        "--microbatch-rank-tokens",
        default=None,
        help="explicit per-CP-rank counts per micro-batch, micro-batches separated by ';'",
    )
    pipe.add_argument(
        "--stage-layers",
        default=None,
        help="layers per virtual stage (chunk c of stage s is virtual stage c*pp+s); default even",
    )
    pipe.add_argument(
        "--microbatch-group-size",
        type=int,
        default=None,
        help="megatron's microbatch_group_size_per_vp_stage (default pp)",
    )
    pipe.add_argument(
        "--keep-pipeline-outputs",
        action="store_true",
        help="keep sent outputs' storage (megatron's deallocate_pipeline_outputs off)",
    )
    pipe.add_argument("--no-ops", action="store_true", help="leave the per-op list out of JSON")
    ap.add_argument("--layers", type=int, default=None, help="first N layers only")
    ap.add_argument(
        "--gdn-kernel",
        default=None,
        help="GDN kernel: auto (fla-core's own where it imports, else the stand-in; the "
        f"default, or ${K.GDN_KERNEL_ENV}), fla, stand-in",
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    try:
        if args.gdn_kernel is not None:
            K.select_gdn_kernel(args.gdn_kernel)
        if args.rank is not None and not 0 <= args.rank < max(args.cp, 1):
            raise SimInputError("rank", args.rank, f"outside 0..{args.cp - 1}")
        out = run(args)
    except SimInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    if "stages" in out:
        _print_stages(out)
        return 0
    lay = out["layout"]
    st = out["step"]
    print(
        f"{out['model']}  {out['recompute']}  tp={lay['tp']} cp={lay['cp']}  layout from {lay['source']}:"
    )
    print(_step_line(st))
    print(f"  attention tokens {lay['attention_tokens']}, GDN tokens {lay['gdn_tokens']}")
    for r in out["ranks"]:
        print(
            f"  rank {r['rank']}: {r['tokens']} tokens  forward {r['forward_peak_bytes'] / GIB:.3f} GiB"
            f"  forward+backward {r['forward_backward_peak_bytes'] / GIB:.3f} GiB"
            f"  retained {r['retained_bytes'] / GIB:.3f} GiB  ({r['seconds']} s)"
        )
    print(f"  busiest rank {out['busiest_rank']}; cold kernel set-up (~58 MiB) not included")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
