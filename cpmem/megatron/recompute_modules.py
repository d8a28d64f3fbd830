"""``--recompute-modules`` (and the deprecated ``--moe-layer-recompute``) as Megatron-LM
reads them: the list (``read_modules``), megatron-core's own checks of it with the
modules cpmem does not price (``module_problems``), and the selective recompute it
makes (``selective_modules``).

Sources at the recordings' snapshot (``megatron/core/transformer/transformer_config.py``):
the modules and their defaults (560-582: ``core_attn`` when none is given, 1940-1941),
the choices (1944-1962), what each needs (1964-1998), FP8's delayed recipe (2000-2006),
``--moe-layer-recompute`` adding ``moe`` and making the granularity selective
(2012-2025), the EP all-to-all overlap's refusal of ``moe`` (3031-3032). The modules are
read only under ``--recompute-granularity selective``; under ``full`` or none megatron
leaves them unread (transformer_layer.py:473, attention.py:392-395, moe_layer.py:247-254,
experts.py:269-272, multi_latent_attention.py:171-174).
"""

from __future__ import annotations

from cpmem.megatron.fields import MegatronArgs
from cpmem.megatron.refused import UNPRICED
from cpmem.step.recompute import Module

MEGATRON_MODULES = (
    "core_attn",
    "moe_act",
    "layernorm",
    "mla_up_proj",
    "mlp",
    "moe",
    "shared_experts",
    "gdn_norm_out",
    "gdp_in_proj",
    "gdp_qkv",
    "mhc",
)
"""megatron-core's ``allowed_modules`` (transformer_config.py:1944-1957)."""

UNPRICED_MODULES: dict[str, str] = {
    "gdn_norm_out": "Gated DeltaNet's output norm and its all-to-all discarded and rebuilt",
    "gdp_in_proj": "GatedDeltaProduct's input projection discarded and rebuilt",
    "gdp_qkv": "GatedDeltaProduct's convolution and QKV preparation discarded and rebuilt",
    "mhc": "hyper-connections' intermediate activations discarded and rebuilt",
}
"""Modules megatron-core accepts that cpmem does not price, each with what it changes."""

DEFAULT_MODULES = ("core_attn",)
"""transformer_config.py:1940-1941: the modules where ``--recompute-modules`` is not
given."""


def read_modules(text: str) -> tuple[str, ...]:
    """The module names of ``--recompute-modules`` as written: argparse's space-separated
    words (``nargs='+'``), or a YAML value such as ``"[layernorm mla_up_proj]"`` whose
    brackets, quotes and commas are the file's, not the names'."""
    for mark in "[]'\",":
        text = text.replace(mark, " ")
    return tuple(text.split())


def _modules(args: MegatronArgs) -> list[str]:
    """The modules megatron-core ends with: the given ones (or ``core_attn``), with
    ``moe`` added under ``--moe-layer-recompute`` (transformer_config.py:2024-2025)."""
    given = read_modules(args.recompute_modules) if args.recompute_modules else ()
    names = list(given or DEFAULT_MODULES)
    if args.moe_layer_recompute and "moe" not in names:
        names.append("moe")
    return names


def selective(args: MegatronArgs) -> bool:
    """Whether the run recomputes selectively: ``--recompute-granularity selective``, or
    ``--moe-layer-recompute`` without a granularity (transformer_config.py:2022)."""
    granularity = args.recompute_granularity
    return granularity == "selective" or (args.moe_layer_recompute and granularity is None)


def selective_modules(args: MegatronArgs) -> tuple[Module, ...]:
    """The checkpointed modules of a selective recompute, as cpmem's ``Module``; the
    arguments are assumed to pass ``module_problems``."""
    return tuple(Module(name) for name in dict.fromkeys(_modules(args)))


def module_problems(args: MegatronArgs) -> list[tuple[str, str]]:
    """megatron-core's checks of the modules, and those cpmem does not price, as (flags,
    reason) pairs; none where the granularity leaves the modules unread."""
    out: list[tuple[str, str]] = []
    if args.moe_layer_recompute and args.recompute_granularity == "full":
        out.append(
            (
                "--moe-layer-recompute --recompute-granularity full",
                "Do not set --moe-layer-recompute with full recompute granularity "
                "(transformer_config.py:2019-2021)",
            )
        )
    if not selective(args):
        return out
    names = _modules(args)
    flag = "--recompute-modules"
    invalid = [n for n in names if n not in MEGATRON_MODULES]
    if invalid:
        out.append(
            (
                f"{flag} {' '.join(invalid)}",
                f"Invalid choices for recompute_modules; allowed: {', '.join(MEGATRON_MODULES)} "
                "(transformer_config.py:1944-1962)",
            )
        )
    for name in names:
        if name in UNPRICED_MODULES:
            out.append(
                (
                    f"{flag} {name}",
                    UNPRICED + UNPRICED_MODULES[name],
                )
            )
    needs = (
        (
            "moe_act",
            args.moe_grouped_gemm,
            "moe_act in recompute_modules is only supported with moe_grouped_gemm "
            "(transformer_config.py:1964-1967)",
        ),
        (
            "mla_up_proj",
            args.multi_latent_attention,
            "mla_up_proj in recompute_modules is only supported with multi_latent_attention "
            "(transformer_config.py:1969-1973)",
        ),
        (
            "moe",
            not args.overlap_moe_expert_parallel_comm,
            "disable moe in recompute_modules when enabling overlap_moe_expert_parallel_comm "
            "(transformer_config.py:3031-3032)",
        ),
    )
    out += [(f"{flag} {name}", why) for name, ok, why in needs if name in names and not ok]
    overlap = args.flag_values.get("--moe-shared-expert-overlap") is True
    if "shared_experts" in names and args.moe_shared_expert_intermediate_size and overlap:
        out.append(
            (
                f"{flag} shared_experts --moe-shared-expert-overlap",
                "shared_experts recompute cannot work with --moe-shared-expert-overlap "
                "(transformer_config.py:1991-1998)",
            )
        )
    fp8 = args.flag_values.get("--fp8-format")
    recipe = args.flag_values.get("--fp8-recipe", "delayed")
    if fp8 and recipe == "delayed" and {"moe_act", "layernorm"} & set(names):
        out.append(
            (
                f"{flag} {' '.join(n for n in names if n in ('moe_act', 'layernorm'))}",
                "Delayed scaling does not support moe_act and layernorm recompute for fp8 "
                "(transformer_config.py:2000-2006)",
            )
        )
    return out
