"""FP8's arguments at the door (``fp8_problems``, one of ``rules.rule_problems``' rules):
the recipe (``--fp8-recipe``, default ``delayed``, with its ``--fp8-amax-history-len``,
default 1, under ``delayed``) and ``--fp8-param-gather`` (given or not: without it the
bf16 weights beside Transformer Engine's cached FP8 copies), each
refused with the reason ``cpmem.step.fp8`` gives where cpmem does not price it, so a run
learns them with its other refused flags; what the step decides beyond them (training,
layer kinds, device) is checked where the step is built. ``--fp8-param-gather`` without
``--fp8-format`` builds no FP8 parameter (Megatron-LM's ``fp8_model_init`` runs only under
``--fp8-format``), so it changes nothing.
"""

from __future__ import annotations

from cpmem.megatron.fields import MegatronArgs
from cpmem.megatron.optimizer_rules import OPTIMIZER_KIND
from cpmem.step.fp8 import (
    BESIDE_MUON,
    IN_FSDP,
    PRICED_RECIPES,
    RECIPE_REASONS,
    Fp8,
)

Problem = tuple[str, str]

FP8_ONLY = (
    "--no-fp8-wgrad",
    "--disable-fp8-wgrad",
    "--first-last-layers-bf16",
    "--num-layers-at-start-in-bf16",
    "--num-layers-at-end-in-bf16",
)
"""Flags read only under ``--fp8-format`` (ignored without it) whose memory cpmem does not
price there: the weight gradients in high precision (TE then keeps the linears'
high-precision inputs for them) and layers kept in bf16 (their weights, inputs and
buffers out of FP8)."""


def megatron_fp8(args: MegatronArgs) -> Fp8 | None:
    """The step's FP8 setting for ``args`` (None without ``--fp8-format``)."""
    if args.fp8 is None:
        return None
    if args.fp8_recipe != "delayed":
        return Fp8(args.fp8_recipe, args.fp8_param_gather)
    return Fp8(args.fp8_recipe, args.fp8_param_gather, args.fp8_amax_history_len)


def fp8_problems(args: MegatronArgs) -> list[Problem]:
    if args.fp8 is None:
        return []
    out: list[Problem] = []
    recipe = args.fp8_recipe
    if recipe not in PRICED_RECIPES:
        reason = RECIPE_REASONS.get(recipe, "is not a recipe of the snapshot")
        default = "" if "--fp8-recipe" in args.given else " (Megatron-LM's default)"
        out.append(
            (f"--fp8-recipe {recipe}{default}", "changes memory cpmem does not price: " + reason)
        )
    if args.use_megatron_fsdp:
        out.append(
            (
                f"--fp8-format {args.fp8} with --use-megatron-fsdp",
                "changes memory cpmem does not price: " + IN_FSDP,
            )
        )
    if OPTIMIZER_KIND.get(args.optimizer) == "muon":
        out.append(
            (
                f"--fp8-format {args.fp8} with --optimizer {args.optimizer}",
                "changes memory cpmem does not price: " + BESIDE_MUON,
            )
        )
    given = [f for f in FP8_ONLY if f in args.flag_values]
    if given:
        out.append(
            (
                ", ".join(given),
                "changes memory cpmem does not price under FP8: weight gradients in high "
                "precision (and the inputs kept for them), or layers kept in bf16",
            )
        )
    return out
