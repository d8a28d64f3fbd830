"""Fine-grained activation offloading at the Megatron door
(``--fine-grained-activation-offloading --offload-modules ...``): the modules as
Megatron-LM reads them (``read_modules``, ``offload``), its own checks of them and the
knobs cpmem does not price (``offload_problems``).

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
    """The run's offloading as cpmem's step setting (none without the switch); the
    arguments are assumed to pass ``offload_problems``."""
    if not args.fine_grained_activation_offloading:
        return Offload()
    return Offload(read_modules(args), args.min_offloaded_tensor_size)


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
