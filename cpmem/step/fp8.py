"""FP8 training as Transformer Engine runs it under Megatron-LM: the recipe and whether the
parameters are gathered (and kept) in FP8, the step setting ``fp8`` (``RECIPE[:param-gather]``).

Sources: Megatron-LM 4828d651 (``--fp8-recipe`` choices ``tensorwise``, ``delayed``,
``mxfp8``, ``blockwise``, ``custom``, default ``delayed``, transformer_config.py:594) and
the Transformer Engine it builds, b9d690e0. The format (``--fp8-format`` e4m3 or hybrid)
changes no byte: both keep 1 B per element.

Priced: ``tensorwise`` (current scaling) with ``param-gather`` (``--fp8-param-gather``),
on full training of attention and dense-MLP layers under Transformer Engine's modules, on
a device of compute capability 9 or later, with bf16 or fp16 parameters and nothing
recomputed. What it changes is priced where each term lives: the weights in the
``uint8`` parameter buffer, their transposes and scale inverses
(``cpmem.pricing.static``), the TE linears' saved inputs (the layer kinds' tight widths,
``cpmem.pricing.kinds.fp8``). Everything else is refused by name (``fp8_problems``).
"""

from __future__ import annotations

from dataclasses import dataclass

from cpmem.errors import InputError

PRICED_RECIPES = ("tensorwise",)
RECIPE_REASONS = {
    "delayed": "its amax histories and scales (per module, per quantizer, and the global "
    "reduction buffers) are not counted from source",
    "mxfp8": "its per-32-element block scales and the columnwise copies it keeps are not "
    "counted from source",
    "blockwise": "its 128-element block scales and the columnwise copies it keeps are not "
    "counted from source",
    "custom": "a user's quantizer factory keeps what it builds",
}
"""Why each recipe cpmem does not price is refused."""
WITHOUT_PARAM_GATHER = (
    "FP8 without --fp8-param-gather keeps Transformer Engine's cached FP8 copies of the bf16 "
    "weights (module/base.py:712-722, _fp8_workspaces), not priced: give it with param-gather"
)


@dataclass(frozen=True)
class Fp8:
    """FP8 training: its ``recipe`` and whether the parameters are FP8 tensors gathered as
    such (``param_gather``)."""

    recipe: str
    param_gather: bool = False

    @property
    def label(self) -> str:
        return self.recipe + (":param-gather" if self.param_gather else "")

    @classmethod
    def parse(cls, value: str | Fp8 | None) -> Fp8 | None:
        """``RECIPE`` or ``RECIPE:param-gather``; None, ``""`` and ``none``: bf16 training."""
        if value is None or isinstance(value, Fp8):
            return value
        if not isinstance(value, str):
            raise InputError("fp8", value, "must be RECIPE or RECIPE:param-gather")
        text = value.strip().lower()
        if text in ("", "none"):
            return None
        recipe, _, rest = text.partition(":")
        if rest not in ("", "param-gather"):
            raise InputError("fp8", value, "must be RECIPE or RECIPE:param-gather")
        return cls(recipe, rest == "param-gather")


def fp8_problems(
    fp8: Fp8,
    *,
    training: str,
    kinds: tuple[str, ...],
    transformer_te: bool,
    compute_capability: int,
    dtype_bytes: int,
    recompute_none: bool,
    fsdp: bool = False,
    muon: bool = False,
) -> list[str]:
    """Why ``fp8`` is not priced for this step, every reason (none: priced)."""
    out: list[str] = []
    if fp8.recipe in RECIPE_REASONS:
        out.append(f"recipe {fp8.recipe}: {RECIPE_REASONS[fp8.recipe]}")
    elif fp8.recipe not in PRICED_RECIPES:
        known = [*PRICED_RECIPES, *RECIPE_REASONS]
        out.append(f"recipe {fp8.recipe!r} is not one of Megatron-LM's {known}")
    if not fp8.param_gather:
        out.append(WITHOUT_PARAM_GATHER)
    if training != "full":
        out.append("priced for full training (--training full) only")
    other = [k for k in kinds if k not in ("attention", "dense")]
    if other:
        out.append(f"priced for attention and dense-MLP layers only, not {other}")
    if not transformer_te:
        out.append("Transformer Engine's modules run FP8 (--transformer-impl local does not)")
    if compute_capability < 9:
        out.append("Transformer Engine's FP8 GEMMs need compute capability 8.9 or later")
    if dtype_bytes != 2:
        out.append("priced with bf16 or fp16 parameters")
    if not recompute_none:
        out.append("what a recomputed layer keeps under FP8 is not priced (recompute none)")
    if fsdp:
        out.append("FP8 parameters in Megatron FSDP's buffers are not priced (--fsdp none)")
    if muon:
        out.append(
            "FP8 parameters beside Muon's layer-wise buffers are not priced (--optimizer adam)"
        )
    return out


def check_fp8(fp8: Fp8 | None, **facts: object) -> None:
    """Refuse ``fp8`` with every reason ``fp8_problems`` gives (nothing for bf16)."""
    if fp8 is None:
        return
    problems = fp8_problems(fp8, **facts)  # type: ignore[arg-type]
    if problems:
        raise InputError("fp8", fp8.label, "; ".join(problems))
