"""FP8 training as Transformer Engine runs it under Megatron-LM: the recipe and whether the
parameters are gathered (and kept) in FP8, the step setting ``fp8`` (``RECIPE[:param-gather]``).

Sources: Megatron-LM 4828d651 (``--fp8-recipe`` choices ``tensorwise``, ``delayed``,
``mxfp8``, ``blockwise``, ``custom``, default ``delayed``, transformer_config.py:594) and
the Transformer Engine it builds, b9d690e0. The format (``--fp8-format`` e4m3 or hybrid)
changes no byte: both keep 1 B per element.

Priced: ``tensorwise`` (current scaling), ``delayed`` (delayed scaling, with its amax
history of ``history`` steps, ``--fp8-amax-history-len``, Megatron-LM's default 1,
transformer_config.py:621 at d98e8a64) and ``blockwise`` (TE's ``Float8BlockScaling``:
weights in 128 x 128 blocks, activations in 1 x 128, fp32 scales), each with or without
``param-gather`` (``--fp8-param-gather``), and ``mxfp8`` (1 x 32 blocks, e8m0 scales, on
compute capability 10 and 11) with or without it (``GATHER_REASONS``), on full training
of attention (latent attention where SP splits no rank's tokens), dense-MLP and MoE layers
(and the MTP depths) under Transformer Engine's modules, in megatron-core's DDP buffers or
Megatron FSDP's, on a device of compute capability 9 or later, with bf16 or fp16
parameters, with nothing recomputed, full recompute (not under ``delayed`` nor beside bf16
layers) or a selective recompute of the modules in ``PRICED_RECOMPUTE`` (``mlp``, ``moe``
and ``shared_experts`` not under ``delayed`` nor beside bf16 layers either), the layers in
``bf16_layers`` out of FP8. What it changes is priced where each term lives
(``cpmem.pricing.static``, ``cpmem.pricing.fp8_static``, ``cpmem.pricing.fsdp``): with
``param-gather`` the weights in the ``uint8`` parameter buffer (MXFP8's in Transformer
Engine's own tensors); without it the weights left in the bf16 buffer and the FP8 copy of each
that Transformer Engine caches across micro-batches and steps (``fp8_weight_cache``);
either way their transposes (the block-scaled recipes' columnwise copies) and scale
inverses, delayed scaling's amax histories and scales, and the TE linears' saved inputs
(the layer kinds' tight widths, ``cpmem.pricing.kinds.fp8``: the same 1 B copies under
every recipe and both modes, with the block-scaled recipes' scales beside them).
Everything else is refused by name (``fp8_problems``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from cpmem.errors import InputError
from cpmem.step.recompute import Mode, Module, Recompute

PRICED_RECIPES = ("tensorwise", "delayed", "blockwise", "mxfp8")
DEFAULT_HISTORY = 1
"""Megatron-LM's ``--fp8-amax-history-len`` default (transformer_config.py:621 at d98e8a64)."""
RECIPE_REASONS = {
    "custom": "a user's quantizer factory keeps what it builds",
}
"""Why each recipe cpmem does not price is refused."""
GATHER_REASONS: dict[str, str] = {}
"""Why a recipe priced without ``param-gather`` is refused with it (every priced recipe is
priced with it too).

``mxfp8`` with ``param-gather`` is priced as megatron-core keeps it: the MXFP8 weights are
Transformer Engine's own tensors (rowwise and columnwise data with their e8m0 scales,
``cpmem.pricing.mxfp8``), never mapped into a parameter buffer. Under the distributed
optimizer the buffer holding them is one ``shared_buffer`` of the gradient dtype, the
gradient buffer, whose bf16 view the all-gather fills and which is zeroed once the
weights are quantized from it (Megatron-LM 4828d651 ``param_and_grad_buffer.py:1102-1121``,
``:279-300``): no parameter bytes beside the gradients'. That needs
``--reuse-grad-buf-for-mxfp8-param-ag`` (without it megatron-core maps each MXFP8 weight
into that buffer through Transformer Engine's ``replace_raw_data``, which raises
``NotImplementedError`` for an ``MXFP8Tensor``, TE b9d690e0 ``tensor/utils.py:68-69``;
``cpmem.megatron.fp8_rules`` refuses it); without the distributed optimizer no
parameter buffer is made (``:1123-1130``)."""
RECIPE_CAPABILITY = {
    "mxfp8": (
        10,
        12,
        "Transformer Engine runs MXFP8 on compute capability 10 and 11 only "
        "(quantization.py:162-168: 10.0 or higher, not yet 12.0+)",
    ),
}
"""Recipes whose Transformer Engine support check (``check_recipe_support``,
quantization.py:224-238 at b9d690e0) asks more than FP8's compute capability 8.9: the
lowest major it accepts, the first major it refuses again and why. (``blockwise`` asks
9.0 and CUDA 12.9, quantization.py:178-185: the general check's major 9 already holds it.)"""
IN_FSDP = (
    "FP8 parameters in Megatron FSDP's buffers are priced under the optim_grads_params "
    "strategy only (the uint8 weight shards, gathered per unit with their transposes for "
    "the backward and freed after it); under the others the weights stay whole, their "
    "transposes Transformer Engine's own, not laid out"
)
FSDP_TERMS = (
    "FP8 weights in Megatron FSDP's buffers are priced with param-gather under the "
    "tensorwise and delayed recipes, every layer in FP8 (the uint8 shards and their "
    "transposes); Transformer Engine's cached FP8 copies of gathered bf16 weights, the "
    "block-scaled recipes' columnwise copies and scales, and bf16 layers are priced in "
    "megatron-core's DDP buffers only"
)
BESIDE_MUON = (
    "FP8 parameters beside Muon's layer-wise buffers are not priced: Muon's buffers are not "
    "megatron-core's DDP buffers, where FP8's are priced"
)
"""Why FP8 parameters are refused where another mechanism keeps the parameters (both doors
give these reasons)."""
PRICED_KINDS = ("attention", "dense", "moe")
"""The layer kinds whose Transformer Engine modules FP8 is priced for."""
SEQUENTIAL = (
    "FP8 on MoE layers is priced for TEGroupedMLP (--moe-grouped-gemm): SequentialMLP's "
    "per-expert TE modules, each with its own scaling state, are not laid out"
)
LATENT_SP = (
    "FP8 on latent attention (MLA) is priced where SP does not split the rank's tokens "
    "(TP 1, or no --sequence-parallel): under SP its down projections run on the sequence "
    "shard and its up projections on gathered rows, and which rows each FP8 linear saves "
    "there is not laid out"
)
FP32 = (
    "priced with bf16 or fp16 parameters: fp32 parameters beside FP8 (neither --bf16 nor "
    "--fp16) keep fp32 activations, whose saved set under FP8 is not laid out: on the "
    "recordings that check it (Megatron-LM's DeepSeek proxies under Megatron FSDP, with the "
    "FP8 groups' bf16 gradients and the optimizer's fp32 copy of them priced) the 8-layer "
    "one's peak at balanced routing prices about 20% above the measured one, and its static "
    "memory 4.6% below, about 4.7 B an element of the rank's routed-expert shard not found"
)
PRICED_RECOMPUTE = (
    Module.CORE_ATTN,
    Module.LAYERNORM,
    Module.MOE_ACT,
    Module.MLP,
    Module.MOE,
    Module.SHARED_EXPERTS,
)
"""The selective recompute modules FP8 is priced under:

- the core attention (its checkpoint keeps its inputs, the QKV projection's output, and
  its output, the output projection's input, so no Transformer Engine linear's saved input
  moves);
- the output-discarding ``layernorm`` and ``moe_act`` (``cpmem.pricing.kinds.discarded``:
  under FP8 megatron-core has the routed experts' fc2 save its original input,
  ``set_save_original_input``, Megatron-LM 4828d651 ``moe/experts.py``, so the discarded
  activation output takes fc2's saved input with it and none is quantized; a norm's output
  the checkpoint drops is not a TE linear's saved FP8 copy, which is a tensor of its own);
- ``mlp`` (a dense MLP), ``moe`` (the whole MoE layer) and ``shared_experts``: under FP8
  megatron-core runs each under Transformer Engine's checkpoint (``te_checkpoint``,
  Megatron-LM 4828d651 ``transformer_layer.py:821-833``, ``moe/moe_layer.py:685-695``,
  ``:510-518``), TE b9d690e0 ``distributed.py:336-400``: the module's forward runs without
  gradients and the checkpoint saves its tensor inputs alone (``ctx.save_for_backward``),
  so every FP8 saved input inside the module (the kinds' FP8 widths) is dropped with the
  rest of its saved set and quantized again by the recompute in its backward; beside
  them the checkpoint keeps only, under delayed scaling, each TE module's copied amax
  history and scale (``DELAYED_CHECKPOINT``, refused)."""
RECOMPUTE_REASON = (
    "what a recomputed layer keeps under FP8 is priced with recompute none, full, or "
    "selective core_attn, layernorm, moe_act, mlp, moe and shared_experts only"
)
MLA_UP_PROJ = (
    "mla_up_proj's output-discarding checkpoint (megatron-core's CheckpointWithoutOutput "
    "with fp8, multi_latent_attention.py:961-966 at 4828d651) drops the up projections' "
    "saved inputs, which under FP8 are latent attention's 1 B copies of the latent norms' "
    "outputs, not their bf16 tensors (cpmem.pricing.kinds.discarded.mla_up_proj_dropped); "
    "priced when FP8 on latent attention is"
)
DELAYED_CHECKPOINT = (
    "selective recompute of {modules} with the delayed recipe: Transformer Engine's "
    "checkpoint (te_checkpoint) copies each module's forward amax history and scale for the "
    "recompute (copy_forward_fp8_meta_tensors_for_recompute, quantization.py:761-786 at "
    "b9d690e0, delayed scaling only), kept until the module's backward; not priced"
)
BF16_CHECKPOINT = (
    "selective recompute of {modules} with layers kept in bf16: a checkpointed module's "
    "working set is priced as an FP8 layer's"
)
TE_CHECKPOINTED = (Module.MLP, Module.MOE, Module.SHARED_EXPERTS)
"""The selective modules megatron-core checkpoints with Transformer Engine's checkpoint
under FP8 (``PRICED_RECOMPUTE``)."""
DELAYED_FULL = (
    "full recompute with the delayed recipe: Transformer Engine's checkpoint copies each "
    "module's forward amax history and scale for the recompute "
    "(copy_forward_fp8_meta_tensors_for_recompute, quantization.py:761-786 at b9d690e0, "
    "delayed scaling only), kept until the layer's backward; not priced"
)
BF16_FULL = (
    "full recompute with layers kept in bf16: a recomputed layer's working set is priced "
    "as an FP8 layer's"
)
"""Full recompute keeps each layer's input alone (bf16: the residual stream); the layer's
forward runs again in its backward under Transformer Engine's checkpoint (megatron-core's
``te_checkpoint`` under FP8, transformer_block.py), which re-makes the TE linears' FP8
saved inputs, so the recomputed layer holds its FP8 saved set, the kinds' widths."""
DELAYED_MOE_ACT = (
    "moe_act recompute with the delayed recipe: megatron-core has fc2 save its original "
    "input under FP8 and Transformer Engine raises 'DelayedScaling recipe is not supported "
    "with save_original_input' (module/grouped_linear.py:431-443 at b9d690e0)"
)
NO_RECOMPUTE = Recompute.parse("none")
DELAYED_BF16_LAYERS = (
    "Delayed scaling does not support first / last layer in BF16 (Megatron-LM's "
    "TransformerConfig raises it, transformer_config.py:1335-1336 at 4828d651)"
)


@dataclass(frozen=True)
class Fp8:
    """FP8 training: its ``recipe``, whether the parameters are FP8 tensors gathered as
    such (``param_gather``; without it bf16 parameters beside Transformer Engine's cached
    FP8 copies) and, under ``delayed``, the amax history's length in steps
    (``history``; the other recipes keep none)."""

    recipe: str
    param_gather: bool = False
    history: int = DEFAULT_HISTORY
    bf16_layers: tuple[int, ...] = ()
    """The layers (0-based, of the stack the step prices) kept out of FP8: megatron-core's
    ``--first-last-layers-bf16`` builds and runs them outside Transformer Engine's FP8
    contexts (``is_first_last_bf16_layer``, Megatron-LM 4828d651 ``fp8_utils.py:513-531``;
    ``transformer_block.py:342-343`` at build, ``:651`` in the forward), so they keep no
    FP8 weight, cached copy, scale or FP8 saved input."""

    @property
    def label(self) -> str:
        text = self.recipe + (":param-gather" if self.param_gather else "")
        if self.recipe == "delayed" and self.history != DEFAULT_HISTORY:
            text += f":history={self.history}"
        if self.bf16_layers:
            text += ":bf16-layers=" + ",".join(str(i) for i in self.bf16_layers)
        return text

    def in_fp8(self, layer: int) -> bool:
        """Whether ``layer`` runs in FP8."""
        return layer not in self.bf16_layers

    def sliced(self, start: int, stop: int) -> Fp8:
        """The setting for the layers ``start``..``stop - 1`` alone (a pipeline chunk),
        renumbered from 0."""
        kept = tuple(i - start for i in self.bf16_layers if start <= i < stop)
        return replace(self, bf16_layers=kept)

    @classmethod
    def parse(cls, value: str | Fp8 | None) -> Fp8 | None:
        """``RECIPE`` followed by ``:param-gather``, for ``delayed`` ``:history=N``
        (default ``DEFAULT_HISTORY``) and ``:bf16-layers=I,J,...`` (0-based layers kept
        in bf16), in any order; None, ``""`` and ``none``: bf16."""
        if value is None or isinstance(value, Fp8):
            return value
        usage = (
            "must be RECIPE[:param-gather][:history=N][:bf16-layers=I,J,...] "
            "(history: delayed only)"
        )
        if not isinstance(value, str):
            raise InputError("fp8", value, usage)
        text = value.strip().lower()
        if text in ("", "none"):
            return None
        recipe, *parts = text.split(":")
        gather = "param-gather" in parts
        history = [p.removeprefix("history=") for p in parts if p.startswith("history=")]
        bf16 = [p.removeprefix("bf16-layers=") for p in parts if p.startswith("bf16-layers=")]
        keyed = ("history=", "bf16-layers=")
        other = [p for p in parts if p != "param-gather" and not p.startswith(keyed)]
        if other or parts.count("param-gather") > 1 or len(history) > 1 or len(bf16) > 1:
            raise InputError("fp8", value, usage)
        layers: tuple[int, ...] = ()
        if bf16:
            items = bf16[0].split(",")
            if not all(i.isdigit() for i in items):
                raise InputError("fp8", value, usage + ", bf16 layers whole numbers from 0")
            layers = tuple(sorted({int(i) for i in items}))
        if not history:
            return cls(recipe, gather, bf16_layers=layers)
        if recipe != "delayed" or not history[0].isdigit() or int(history[0]) < 1:
            raise InputError("fp8", value, usage + ", a whole number of steps from 1")
        return cls(recipe, gather, int(history[0]), layers)


def fp8_problems(
    fp8: Fp8,
    *,
    training: str,
    kinds: tuple[str, ...],
    transformer_te: bool,
    compute_capability: int,
    dtype_bytes: int,
    recompute: Recompute = NO_RECOMPUTE,
    fsdp: str = "none",
    muon: bool = False,
    layers: int | None = None,
    latent: bool = False,
    sequence_split: bool = False,
    grouped_gemm: bool = True,
) -> list[str]:
    """Why ``fp8`` is not priced for this step, every reason (none: priced); ``layers``:
    the stack's, which the bf16 layers must lie in; ``latent``: the attention is latent,
    ``sequence_split``: SP splits the rank's tokens (TP > 1)."""
    out: list[str] = []
    if layers is not None and any(i >= layers for i in fp8.bf16_layers):
        out.append(f"bf16 layers {list(fp8.bf16_layers)} must lie in the {layers} layers")
    if fp8.bf16_layers and fp8.recipe == "delayed":
        out.append(DELAYED_BF16_LAYERS)
    if fp8.recipe in RECIPE_REASONS:
        out.append(f"recipe {fp8.recipe}: {RECIPE_REASONS[fp8.recipe]}")
    elif fp8.recipe not in PRICED_RECIPES:
        known = [*PRICED_RECIPES, *RECIPE_REASONS]
        out.append(f"recipe {fp8.recipe!r} is not one of Megatron-LM's {known}")
    if fp8.param_gather and fp8.recipe in GATHER_REASONS:
        out.append(f"recipe {fp8.recipe} with param-gather: {GATHER_REASONS[fp8.recipe]}")
    if fp8.recipe in RECIPE_CAPABILITY:
        low, high, why = RECIPE_CAPABILITY[fp8.recipe]
        if not low <= compute_capability < high:
            out.append(f"{why}; this device: {compute_capability}")
    if training != "full":
        out.append("priced for full training (--training full) only")
    other = [k for k in kinds if k not in PRICED_KINDS]
    if other:
        out.append(f"priced for attention, dense-MLP and MoE layers only, not {other}")
    if "moe" in kinds and not grouped_gemm:
        out.append(SEQUENTIAL)
    if latent and sequence_split:
        out.append(LATENT_SP)
    if not transformer_te:
        out.append("Transformer Engine's modules run FP8 (--transformer-impl local does not)")
    if compute_capability < 9:
        out.append("Transformer Engine's FP8 GEMMs need compute capability 8.9 or later")
    if dtype_bytes != 2:
        out.append(FP32)
    out += recompute_problems(fp8, recompute)
    if fsdp not in ("none", "optim_grads_params"):
        out.append(f"{IN_FSDP} (--fsdp none or optim_grads_params)")
    elif fsdp == "optim_grads_params" and not (
        fp8.param_gather and fp8.recipe in ("tensorwise", "delayed") and not fp8.bf16_layers
    ):
        out.append(FSDP_TERMS)
    if muon:
        out.append(f"{BESIDE_MUON} (--optimizer adam)")
    return out


def recompute_problems(fp8: Fp8, recompute: Recompute) -> list[str]:
    """Why what ``recompute`` keeps under ``fp8`` is not priced (none: priced)."""
    if recompute.keeps_everything:
        return []
    if recompute.full:
        full = [DELAYED_FULL] if fp8.recipe == "delayed" else []
        return full + ([BF16_FULL] if fp8.bf16_layers else [])
    if recompute.mode is not Mode.SELECTIVE:
        return [f"{RECOMPUTE_REASON} (recompute {recompute.mode.value})"]
    out: list[str] = []
    other = [m.value for m in recompute.modules if m not in PRICED_RECOMPUTE]
    if Module.MLA_UP_PROJ.value in other:
        other.remove(Module.MLA_UP_PROJ.value)
        out.append(MLA_UP_PROJ)
    if other:
        out.append(f"{RECOMPUTE_REASON} (recompute modules {other})")
    if fp8.recipe == "delayed" and Module.MOE_ACT in recompute.modules:
        out.append(DELAYED_MOE_ACT)
    checkpointed = [m.value for m in TE_CHECKPOINTED if m in recompute.modules]
    if checkpointed and fp8.recipe == "delayed":
        out.append(DELAYED_CHECKPOINT.format(modules=checkpointed))
    if checkpointed and fp8.bf16_layers:
        out.append(BF16_CHECKPOINT.format(modules=checkpointed))
    return out


def check_fp8(fp8: Fp8 | None, **facts: object) -> None:
    """Refuse ``fp8`` with every reason ``fp8_problems`` gives (nothing for bf16)."""
    if fp8 is None:
        return
    problems = fp8_problems(fp8, **facts)  # type: ignore[arg-type]
    if problems:
        raise InputError("fp8", fp8.label, "; ".join(problems))
