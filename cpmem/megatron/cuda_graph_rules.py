"""CUDA graphs' arguments at the door (``cuda_graph_door_problems``, one of
``rules.rule_problems``' rules): ``--cuda-graph-impl`` with ``--cuda-graph-modules`` (or
the deprecated ``--cuda-graph-scope``, ``--enable-cuda-graph``, ``--external-cuda-graph``)
read into the step's ``cuda_graphs`` setting (``megatron_cuda_graphs``) as megatron-core's
``TransformerConfig.__post_init__`` normalises them (transformer_config.py:2698-2739 at
the snapshot). The rules that read the model (its MoE and dense layers) are the step's
(``cpmem.step.cuda_graphs``), so both doors give them.
"""

from __future__ import annotations

from cpmem.megatron.fields import MegatronArgs
from cpmem.megatron.recompute_modules import read_modules, selective
from cpmem.step.cuda_graphs import IMPL_REASONS, CudaGraphs

Problem = tuple[str, str]


def graph_impl(args: MegatronArgs) -> str:
    """``--cuda-graph-impl``, or what the deprecated switches set it to:
    ``--enable-cuda-graph`` local, ``--external-cuda-graph`` transformer_engine
    (transformer_config.py:2706-2714)."""
    if args.enable_cuda_graph:
        return "local"
    if args.external_cuda_graph:
        return "transformer_engine"
    return args.cuda_graph_impl


def graph_modules(args: MegatronArgs) -> tuple[str, ...]:
    """``--cuda-graph-modules``, or the deprecated ``--cuda-graph-scope`` moved into it
    (transformer_config.py:2716-2739; ``full`` is the whole layer, no module)."""
    text = args.cuda_graph_modules or args.cuda_graph_scope_deprecated or ""
    return tuple(m for m in read_modules(text) if m != "full")


def megatron_cuda_graphs(args: MegatronArgs) -> CudaGraphs | None:
    """The step's CUDA-graph setting for ``args`` (None where the run captures none)."""
    impl = graph_impl(args)
    if impl == "none":
        return None
    return CudaGraphs(impl, graph_modules(args))


def cuda_graph_door_problems(args: MegatronArgs) -> list[Problem]:
    """What Megatron-LM rejects among the graphs' arguments, or cpmem does not price."""
    impl = graph_impl(args)
    out: list[Problem] = []
    switches = [f for f in ("--enable-cuda-graph", "--external-cuda-graph") if f in args.given]
    if switches and "--cuda-graph-impl" in args.given:
        out.append(
            (
                ", ".join(switches) + " with --cuda-graph-impl",
                "Megatron-LM rejects it: 'Do not use enable_cuda_graph or external_cuda_graph "
                "with cuda_graph_impl.' (transformer_config.py:2698-2701)",
            )
        )
    if args.cuda_graph_scope_deprecated and args.cuda_graph_modules:
        out.append(
            (
                "--cuda-graph-scope with --cuda-graph-modules",
                "Megatron-LM rejects it: 'cuda_graph_scope and cuda_graph_modules cannot be "
                "set together.' (transformer_config.py:2716-2721)",
            )
        )
    if impl == "none":
        return out
    if impl in IMPL_REASONS:
        out.append(
            (
                f"--cuda-graph-impl {impl}",
                "changes memory cpmem does not price: " + IMPL_REASONS[impl],
            )
        )
    if args.recompute_granularity == "full" and impl != "full_iteration":
        out.append(
            (
                f"--cuda-graph-impl {impl} with --recompute-granularity full",
                "Megatron-LM rejects it: 'full recompute is only supported with full "
                "iteration CUDA graph.' (transformer_config.py:2854-2858)",
            )
        )
    recomputed = read_modules(args.recompute_modules or "")
    moe_recomputed = "moe" in recomputed or args.moe_layer_recompute
    if (
        impl == "transformer_engine"
        and selective(args)
        and moe_recomputed
        and "moe_router" in graph_modules(args)
    ):
        out.append(
            (
                "--recompute-modules moe with --cuda-graph-modules moe_router",
                "Megatron-LM rejects it: 'moe recompute is not supported with moe_router CUDA "
                "graph with: --cuda-graph-impl transformer_engine.' "
                "(transformer_config.py:2862-2869)",
            )
        )
    return out
