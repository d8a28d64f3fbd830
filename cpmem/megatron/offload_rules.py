"""Activation offloading at the Megatron door: fine-grained
(``--fine-grained-activation-offloading --offload-modules ...``) and whole layers
(``--cpu-offloading-num-layers N``): the setting as Megatron-LM reads it (``read_modules``,
``offload``), its own checks and the knobs cpmem does not price (``offload_problems``,
``layer_offload_problems``).

Whole layers, at the same snapshot: ``--cpu-offloading-num-layers`` is the only flag
(``--cpu-offloading``, ``--cpu-offloading-activations``, ``--cpu-offloading-weights`` and
``--cpu-offloading-double-buffering`` are excluded from the parser, arguments.py:
2078-2084); a positive count turns ``cpu_offloading`` on (arguments.py:1730-1731) with
activations offloaded and weights not (model_parallel_config.py:395-399). Its checks:
transformer_config.py:1602-1617 (fewer layers than the model's, no pipeline stages, no
recompute), 1743-1746 (not beside fine-grained offloading), 1800-1801 (not beside the
paged stash), 2362-2363 (no CUDA graphs but ``full_iteration``). Transformer Engine's
``NVTE_CPU_OFFLOAD_V1=1`` path offloads on another schedule (cpu_offload_v1.py), not
priced.

Sources at the recordings' snapshot (Megatron-LM 4828d651): ``validate_args``
(megatron/training/arguments.py:1715-1720: Transformer Engine only) and
``TransformerConfig.__post_init__`` (megatron/core/transformer/transformer_config.py:
1743-1797: not beside ``--cpu-offloading``, at least one module, the allowed names,
``attn_proj`` with ``core_attn``, no module inside a ``moe`` checkpoint,
``fused_group_mlp`` with the op fuser and alone). The modules are read only where
``--fine-grained-activation-offloading`` is given (transformer_layer.py:1375,
attention.py:384-396, moe/experts.py:244-256).
"""

from __future__ import annotations

from cpmem.megatron.fields import MegatronArgs
from cpmem.megatron.recompute_modules import read_modules as read_words
from cpmem.megatron.recompute_modules import selective, selective_modules
from cpmem.megatron.refused import REJECTED, UNPRICED
from cpmem.step.offload import OFFLOAD_MODULES, Offload
from cpmem.step.recompute import Module

Problem = tuple[str, str]
FLAG = "--fine-grained-activation-offloading"


def read_modules(args: MegatronArgs) -> tuple[str, ...]:
    """The names of ``--offload-modules`` as written (argparse's words, or a YAML list
    whose brackets, quotes and commas are the file's), each once."""
    return tuple(dict.fromkeys(read_words(args.offload_modules or "")))


def offload(args: MegatronArgs) -> Offload:
    """The run's offloading as cpmem's step setting (none without either switch); the
    arguments are assumed to pass ``offload_problems`` and ``layer_offload_problems``."""
    if args.cpu_offloading_num_layers > 0:
        return Offload.whole_layers(args.cpu_offloading_num_layers)
    if not args.fine_grained_activation_offloading:
        return Offload()
    return Offload(read_modules(args), args.min_offloaded_tensor_size)


LAYERS_FLAG = "--cpu-offloading-num-layers"


def layer_offload_problems(args: MegatronArgs) -> list[Problem]:
    """Megatron-LM's checks of whole-layer offloading and what cpmem does not price of
    it, as (flags, reason) pairs; none where it is off (a count of 0 or below)."""
    n = args.cpu_offloading_num_layers
    if n <= 0:
        return []
    given = f"{LAYERS_FLAG} {n}"
    out: list[Problem] = []
    if n >= args.num_layers:
        out.append(
            (
                f"{given} --num-layers {args.num_layers}",
                REJECTED + f"'CPU offloading can be done only for layers less than "
                f"{args.num_layers}' (transformer_config.py:1602-1607)",
            )
        )
    if args.pipeline_model_parallel_size > 1:
        out.append(
            (
                f"{given} --pipeline-model-parallel-size {args.pipeline_model_parallel_size}",
                REJECTED + "'Currently there is no support for Pipeline parallelism with CPU "
                "offloading' (transformer_config.py:1609-1612)",
            )
        )
    if args.recompute_granularity is not None:
        out.append(
            (
                f"{given} --recompute-granularity {args.recompute_granularity}",
                REJECTED + "'CPU offloading does not work when activation recomputation is "
                "enabled' (transformer_config.py:1614-1617)",
            )
        )
    if args.fine_grained_activation_offloading:
        out.append(
            (
                f"{given} {FLAG}",
                REJECTED + "'fine_grained_activation_offloading cannot be enabled with "
                "cpu_offloading' (transformer_config.py:1743-1746)",
            )
        )
    if args.cuda_graph_impl not in ("none", "full_iteration"):
        out.append(
            (
                f"{given} --cuda-graph-impl {args.cuda_graph_impl}",
                REJECTED + "'CUDA graphs not supported with CPU offloading' "
                "(transformer_config.py:2362-2363)",
            )
        )
    if args.fp8 is not None:
        out.append(
            (
                f"{given} --fp8-format {args.fp8}",
                UNPRICED + "the FP8 copies of the saved inputs a layer sends to the host",
            )
        )
    if str(args.env.get("NVTE_CPU_OFFLOAD_V1", "0")).strip() == "1":
        out.append(
            (
                f"{given} NVTE_CPU_OFFLOAD_V1=1",
                UNPRICED + "Transformer Engine's first offloading path, whose offload "
                "groups and reload windows differ (cpu_offload_v1.py)",
            )
        )
    return out


def offload_problems(args: MegatronArgs) -> list[Problem]:
    """Megatron-LM's checks of the offloading and the knobs cpmem does not price, as
    (flags, reason) pairs; none without the switch (the modules are then unread)."""
    if not args.fine_grained_activation_offloading:
        return []
    out: list[Problem] = []
    names = read_modules(args)
    if args.transformer_impl != "transformer_engine":
        out.append(
            (
                f"{FLAG} --transformer-impl {args.transformer_impl}",
                REJECTED + "'Fine-grained activation offloading is only supported with "
                "transformer_engine implementation' (arguments.py:1715-1717)",
            )
        )
    if not names:
        out.append((FLAG, REJECTED + "it needs --offload-modules (transformer_config.py:1747)"))
    invalid = [n for n in names if n not in OFFLOAD_MODULES]
    if invalid:
        out.append(
            (
                f"--offload-modules {' '.join(invalid)}",
                REJECTED + f"invalid choices; allowed: {', '.join(OFFLOAD_MODULES)} "
                "(transformer_config.py:1748-1762)",
            )
        )
    if "attn_proj" in names and "core_attn" not in names:
        out.append(
            (
                "--offload-modules attn_proj",
                REJECTED + "attn_proj cannot be offloaded without core_attn "
                "(transformer_config.py:1763-1768)",
            )
        )
    inside_moe = [n for n in names if n in ("moe_act", "expert_fc1", "fused_group_mlp")]
    moe_checkpoint = selective(args) and Module.MOE in selective_modules(args)
    if inside_moe and moe_checkpoint:
        out.append(
            (
                f"--offload-modules {' '.join(inside_moe)} --recompute-modules moe",
                REJECTED + "cannot offload inside a recomputed MoE layer "
                "(transformer_config.py:1769-1779)",
            )
        )
    if "fused_group_mlp" in names:
        out.append(
            (
                "--offload-modules fused_group_mlp",
                UNPRICED + "the whole fused grouped MLP offloaded, which needs Transformer "
                "Engine's op fuser (transformer_config.py:1790-1797, moe/experts.py:614-631)",
            )
        )
    knobs = (
        (
            args.delta_offload_bytes_across_pp_ranks != 0,
            f"--delta-offload-bytes-across-pp-ranks {args.delta_offload_bytes_across_pp_ranks}",
            "groups kept on the device by bytes per pipeline rank "
            "(fine_grained_activation_offload.py post_warmup_callback)",
        ),
        (
            args.activation_offload_fraction != 1.0,
            f"--activation-offload-fraction {args.activation_offload_fraction}",
            "a share of each chunk's later groups kept on the device "
            "(fine_grained_activation_offload.py post_warmup_callback)",
        ),
        (
            args.delay_offload_until_cuda_graph,
            "--delay-offload-until-cuda-graph",
            "offloads delayed to a CUDA graph's replay (CUDA graphs are refused)",
        ),
    )
    out += [(flags, UNPRICED + what) for asked, flags, what in knobs if asked]
    if args.min_offloaded_tensor_size < 0:
        out.append(
            (
                f"--min-offloaded-tensor-size {args.min_offloaded_tensor_size}",
                REJECTED + "min_offloaded_tensor_size must be non-negative "
                "(transformer_config.py:1780-1782)",
            )
        )
    return out
