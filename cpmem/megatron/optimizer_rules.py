"""The optimizer's arguments: which optimizers cpmem prices, and the combinations of
them Megatron-LM rejects (``optimizer_problems``, one of ``rules.rule_problems``' rules).

- ``--optimizer``: ``adam`` (the default) and ``muon`` are priced, ``dist_muon`` too (the
  deprecated name of ``muon`` with the layer-wise distributed optimizer,
  arguments.py:1727-1733); SGD, Lion, SOAP and adaptive Muon are not.
- Muon under ``--use-distributed-optimizer`` (or ``dist_muon``) is the layer-wise
  distributed optimizer (arguments.py:1735-1737). Both its layouts are priced: the
  default precomputed one (``LayerWiseDistributedOptimizer.compute_full_param_layout``:
  Muon's matrices bin-packed whole into shard-aligned buffers, the rest in the
  distributed optimizer's byte shards, ``cpmem.pricing.layer_wise_layout``) and the legacy
  path, ``--no-use-layer-wise-param-layout`` (every rank's whole, unpadded buffers and
  whole tensors assigned to ranks by size, ``cpmem.pricing.muon``). The precomputed
  layout packs the first stage's matrices bucket by bucket under ``--overlap-grad-reduce``
  (``cpmem.pricing.layer_wise_static``), and is refused where routed experts have biases
  (Megatron-LM asserts, optimizer/__init__.py:918-926).
- Muon with ``--fp16``: Megatron-LM raises (optimizer/__init__.py:774-775).
- ``--num-distributed-optimizer-instances`` above 1: needs the distributed optimizer
  (``DistributedDataParallel`` asserts "Partial DistOpt cannot be used without DistOpt",
  distributed_data_parallel.py:357-360), and the layer-wise one has one instance
  (``LayerWiseDistributedOptimizer`` asserts it, layer_wise_optimizer.py:530-541; its
  legacy path's buffers are not the distributed optimizer's, so the same assert of the
  data-parallel wrapper stops it there).
"""

from __future__ import annotations

from cpmem.megatron.fields import MegatronArgs

Problem = tuple[str, str]

OPTIMIZERS = ("adam", "muon", "dist_muon")
"""``--optimizer`` values priced (``OPTIMIZER_KIND``: the step's optimizer for each)."""
OPTIMIZER_KIND = {"adam": "adam", "muon": "muon", "dist_muon": "muon"}


def layer_wise(args: MegatronArgs) -> bool:
    """Whether the run steps Muon with the layer-wise distributed optimizer."""
    muon = OPTIMIZER_KIND.get(args.optimizer) == "muon"
    return muon and (args.use_distributed_optimizer or args.optimizer == "dist_muon")


def optimizer_problems(args: MegatronArgs) -> list[Problem]:
    out: list[Problem] = []
    if args.optimizer not in OPTIMIZERS:
        out.append(
            (
                f"--optimizer {args.optimizer}",
                f"is not priced (priced: {', '.join(OPTIMIZERS)}; SGD, Lion, SOAP and "
                "adaptive Muon keep states of their own)",
            )
        )
        return out
    muon = OPTIMIZER_KIND[args.optimizer] == "muon"
    if muon and args.fp16:
        out.append(
            (
                f"--optimizer {args.optimizer}, --fp16",
                "Megatron-LM rejects it: emerging optimizer with fp16 is not supported "
                "(optimizer/__init__.py:774-775)",
            )
        )
    if layer_wise(args) and args.use_layer_wise_param_layout:
        named = f"--optimizer {args.optimizer}" + (
            ", --use-distributed-optimizer" if args.use_distributed_optimizer else ""
        )
        if args.num_experts and args.add_bias_linear:
            out.append(
                (
                    f"{named}, --num-experts {args.num_experts} with biases",
                    "Megatron-LM asserts: non-emerging expert-parallel param groups (the routed "
                    "experts' biases) are not yet supported on the layer-wise + "
                    "DistributedOptimizer path (optimizer/__init__.py:917-926); "
                    "--no-use-layer-wise-param-layout or --disable-bias-linear runs",
                )
            )
    instances = args.num_distributed_optimizer_instances
    if isinstance(instances, bool) or instances < 1:
        out.append(
            (f"--num-distributed-optimizer-instances {instances}", "must be a positive integer")
        )
    elif instances > 1 and (layer_wise(args) or not args.use_distributed_optimizer):
        out.append(
            (
                f"--num-distributed-optimizer-instances {instances}",
                "Megatron-LM rejects it: Partial DistOpt cannot be used without DistOpt "
                "(distributed_data_parallel.py:357-360; Muon's layer-wise distributed "
                "optimizer has one instance, layer_wise_optimizer.py:530-541)",
            )
        )
    return out
