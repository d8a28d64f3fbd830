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


def run(args: argparse.Namespace) -> dict[str, Any]:
    from oracles.rank_sim.runner import simulate_rank

    if args.config:
        model: SimModel = load_config(args.config)
    elif args.model:
        model = get_model(args.model)
    else:
        raise SimInputError("model", None, "give --model or --config")
    if args.layers:
        model = model.truncated(args.layers)
    model.check_tp(args.tp)
    model.check_ep(args.ep, args.tp * max(args.cp, 1))
    check_routing(args.routing)
    moe = {"ep": args.ep, "routing": args.routing} if model.moe else {}
    head = HeadSpec.parse(args.head)
    adapters = AdapterSpec.parse(args.lora_rank, args.lora_dropout, args.lora_targets)
    check_cp_comm(args.cp_comm, model, args.tp, max(args.cp, 1))
    step = {"head": head.label, **adapters.as_dict(), "cp_comm": args.cp_comm}
    step_kw = {"head": head, "lora_rank": adapters.rank, "lora_dropout": adapters.dropout,
               "lora_targets": adapters.targets, "cp_comm": args.cp_comm}  # fmt: skip
    rc = Recompute.parse(args.recompute, args.modules)
    lengths = _ints("lengths", args.lengths)
    explicit = _ints("rank_tokens", args.rank_tokens)
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
    ranks = [args.rank] if args.rank is not None else list(range(args.cp))
    results = []
    for r in ranks:
        layout = contiguous_layout(
            segs, tuple(counts["attention_tokens"]), tuple(counts["gdn_tokens"]), tp=args.tp,
            rank=r, logical_tokens=counts["logical_tokens"], sp=not args.no_sp,
        )  # fmt: skip
        res = simulate_rank(model, layout, rc, compiled=args.compiled, **moe, **step_kw)
        results.append(res.as_dict())
    busiest = max(results, key=lambda x: x["forward_backward_peak_bytes"])["rank"]
    return {
        "model": model.name,
        "recompute": rc.label,
        "compiled": args.compiled,
        "step": step,
        "layout": {
            "tp": args.tp,
            "cp": args.cp,
            "sequence_parallel": args.tp > 1 and not args.no_sp,
            **moe,
            "source": source,
            **counts,
        },
        "ranks": results,
        "busiest_rank": busiest,
        "provenance": {
            "torch": _version("torch"),
            "megatron-core": _version("megatron-core"),
            "fla": _version("fla-core"),
            "gdn_kernel": K.GDN_KERNEL,
            "simulator": SIM_VERSION,
            "cold_setup_added": False,
        },
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m oracles.rank_sim", description=__doc__)
    ap.add_argument("--model", help="preset name or recorded id (e.g. qwen3.5-27b)")
    ap.add_argument("--config", help="a Hugging Face config.json")
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
        "--cp-comm",
        default="all_gather",
        help=f"CP attention communication: {' | '.join(CP_COMMS)} (default all_gather)",
    )
    ap.add_argument("--rank", type=int, default=None, help="simulate this CP rank only")
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
    lay = out["layout"]
    st = out["step"]
    print(
        f"{out['model']}  {out['recompute']}  tp={lay['tp']} cp={lay['cp']}  layout from {lay['source']}:"
    )
    print(
        f"  head {st['head']}, LoRA rank {st['lora_rank']} dropout {st['lora_dropout']} on "
        f"{'+'.join(st['lora_targets'])}, cp_comm {st['cp_comm']}"
    )
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
