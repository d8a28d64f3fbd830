"""``tight``'s step: the layer kinds' widths composed over the model's layers and the
step's phases (what the forward keeps, what one layer holds at a time, the backward's
first moment), then the step's fixed terms, as unmargined components.

Each layer kind's physics is its own module (``attention``, ``gdn``, ``mlp``, ``moe``);
this module decides which of them a phase reads for the step's recompute setting.
``Structure`` names the two functions the composition calls that the gate's power
study replaces (``cpmem.gate``), so the policy itself holds no mutant switch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from cpmem.model.geometry import ModelGeometry
from cpmem.pricing.components import Component
from cpmem.pricing.delayed_wgrad import delayed_wgrad_bytes
from cpmem.pricing.head import head_bytes
from cpmem.pricing.kinds import attention, mixer_spec, mlp_spec
from cpmem.pricing.kinds.fp8 import (
    attention_fp8_width,
    dense_fp8_width,
    eh_proj_fp8_width,
    moe_fp8_width,
)
from cpmem.pricing.kinds.spec import LayerKindSpec, TightContext
from cpmem.pricing.layer_offload import offloaded_retained_bytes
from cpmem.pricing.tight.calibrated import COLD_SETUP, LOSS_BACKWARD_OUTPUTS, Margin
from cpmem.pricing.tight.widths import TightWidths
from cpmem.pricing.widths import common_width, sandwich_width, sp_divisor
from cpmem.step.step import Step

FINAL_HIDDEN_STATES = 1
"""Layer-input-wide tensors live beside the outputs under full recompute: the last
layer's output, which no checkpoint keeps but which the output gather reads (the
checkpoints keep the L layer inputs, the embedding output the first of them). Rank
simulator, ``qwen3-1.7b:tp2:cp8:single-32k:full`` busiest rank (7,680 tokens): forward
peak = embedding 15.7 MB + rope + 440.4 MB (28 layers' outputs, the last one included)
+ the gathered and unpacked outputs; L x layer input = 440.4 MB, so one layer input
(15.7 MB) beyond the checkpoints."""


def tight_widths(
    geometry: ModelGeometry,
    step: Step,
    tp: int | None = None,
    sp: bool | None = None,
    runtime_q: int | None = None,
) -> TightWidths:
    """One model's tight widths at the plan's TP/SP (or at ``tp``/``sp``), for the
    step's execution mode, recompute path and adapters (``cpmem.pricing.adapters``: what
    they keep beyond the harness's rank-1 LoRA, in the part of the layer they sit in):
    every kind the model has, by its spec (``cpmem.pricing.kinds``). ``runtime_q``: the
    Q-multiples the runtime keeps beyond the structure on ungated attention (default
    ``attention.q_extra``: the step's runtime's)."""
    layout = step.plan.layout
    tp = layout.tp if tp is None else tp
    sp = layout.sp if sp is None else sp
    lora = step.settings.training == "lora"
    ctx = TightContext(
        geometry=geometry,
        step=step,
        tp=tp,
        sp=sp,
        lora=lora,
        common=common_width(geometry, tp, sp, lora=lora),
        sandwich=sandwich_width(geometry, tp, sp),  # the post-norm's input, outside the cores
        masks=dropout_mask_width(geometry, tp, sp),  # each sub-layer's residual dropout
        eager_none=not step.compiled and step.recompute.keeps_everything,
        runtime_q=attention.q_extra(step) if runtime_q is None else runtime_q,
    )
    saved: dict[str, int] = {}
    for spec in layer_specs(geometry):
        saved.update(spec.tight_widths(ctx))
    parts = {part: saved.pop(part, 0) for part in NAMED_PARTS}
    return TightWidths(
        common=ctx.common,
        layer_input=geometry.hidden // sp_divisor(tp, sp),
        saved=saved,
        tp=tp,
        fp8_attention=attention_fp8_width(ctx),
        fp8_dense=dense_fp8_width(ctx),
        fp8_moe=moe_fp8_width(ctx),
        **parts,
    )


def bf16_layer_width(geometry: ModelGeometry, w: TightWidths, step: Step, layer: int) -> int:
    """What FP8 changes in ``layer``'s kept set that the layer does not have where it runs
    in bf16 under FP8 (``Fp8.bf16_layers``): its kinds' FP8 widths; 0 for a layer in FP8
    or without FP8."""
    fp8 = step.settings.fp8
    if fp8 is None or fp8.in_fp8(layer):
        return 0
    width = w.fp8_attention if geometry.mixers[layer] == "attention" else 0
    mlp = {"dense": w.fp8_dense, "moe": w.fp8_moe}.get(geometry.mlps[layer], 0)
    return width + mlp


NAMED_PARTS = ("attention_core", "mlp_core", "moe_kept")
"""The parts of a kind's width ``TightWidths`` names beside the kinds' saved sets."""


def layer_specs(geometry: ModelGeometry) -> list[LayerKindSpec]:
    """The spec of every mixer and feed-forward kind the model has (its MTP layers'
    included), mixers first, each once, in the order the stack first shows it."""
    mixers = dict.fromkeys((*geometry.mixers, *geometry.mtp_mixers))
    mlps = dict.fromkeys((*geometry.mlps, *geometry.mtp_mlps))
    specs: list[LayerKindSpec] = [mixer_spec(k) for k in mixers]
    return specs + [mlp_spec(k) for k in mlps]


DROPOUT_MASK_ELEMENTS = 0.5
"""A bool dropout mask in bf16 elements (1 B of 2): torch's CUDA ``native_dropout``
returns a bool mask, which its backward keeps (``aten/src/ATen/native/cuda/Dropout.cu``)."""


def dropout_mask_width(geometry: ModelGeometry, tp: int, sp: bool) -> int:
    """Elements per token of one sub-layer's hidden dropout mask (megatron's
    ``bias_dropout_add`` after the attention and after the MLP, on the rank's sequence
    shard): ``H/s`` bytes where ``hidden_dropout`` > 0."""
    if not geometry.hidden_dropout:
        return 0
    return int(DROPOUT_MASK_ELEMENTS * geometry.hidden // sp_divisor(tp, sp))


def kept_width(
    geometry: ModelGeometry, w: TightWidths, step: Step, *, bf16_layers: bool = True
) -> int:
    """Elements per token kept over all layers at the end of forward (what backward
    finds): every layer's saved set, less what a selective recompute drops; under full
    recompute the layer inputs its checkpoints keep; without gradients the current
    layer's input only. Beside them what a kind keeps after its forward whatever the
    recompute (an MoE dispatcher's state). ``bf16_layers``: whether ``geometry`` is the
    stack ``Fp8.bf16_layers`` numbers (an MTP depth's layers run in FP8 whatever it
    says)."""
    rc = step.recompute
    state = sum(
        geometry.mlp_count(k) * mlp_spec(k).after_forward(geometry, w, step)
        for k in geometry.mlp_kinds
    )
    if rc.full:
        return geometry.layers * w.layer_input + state
    if not rc.keeps_gradients:
        return w.layer_input + state
    total = sum((w.of(m) + w.of(f)) * n for m, f, n in geometry.layer_kinds)
    if step.settings.fp8 is not None and bf16_layers:
        total -= sum(bf16_layer_width(geometry, w, step, i) for i in step.settings.fp8.bf16_layers)
    for k in geometry.mixer_kinds:
        total -= geometry.mixer_count(k) * mixer_spec(k).checkpoint_dropped(w, step)
    for k in geometry.mlp_kinds:
        total -= geometry.mlp_count(k) * mlp_spec(k).checkpoint_dropped(w, step)
    return total


def forward_transient_width(geometry: ModelGeometry, w: TightWidths, step: Step) -> int:
    """Elements per token only one layer holds while it runs, on top of the kept set:
    an MoE layer's dispatch and combine buffers where no ``moe`` checkpoint drops its
    saved set; a checkpointed MLP's no-grad working set, a checkpointed MoE's saved set;
    a mixer's CP exchange in flight; under full recompute and no-grad the widest no-grad
    pass of a sub-layer. Freed before backward starts."""
    if not geometry.layers:  # a pipeline chunk of the embedding or the loss alone
        return 0
    if step.recompute.one_layer_at_a_time:
        return max(spec.nograd_width(geometry, w, step) for spec in layer_specs(geometry))
    width = sum(mlp_spec(k).forward_transient(geometry, w, step) for k in geometry.mlp_kinds)
    # a mixer's own moment (a CP exchange in flight, a kernel's working set) comes while
    # it runs, not while the feed-forward block does, at its last layer, before the
    # layers after it have kept anything
    later = kept_after(geometry, w, step)
    last = last_layer_of(geometry.mixers)
    mixers = [
        mixer_spec(k).forward_transient(geometry, w, step) - later[last[k] + 1]
        for k in geometry.mixer_kinds
    ]
    return max(width, *mixers)


def last_layer_of(kinds: tuple[str, ...]) -> dict[str, int]:
    """The index of the last layer of each kind in ``kinds`` (a stack's mixers or MLPs)."""
    return {k: i for i, k in enumerate(kinds)}


def kept_after(geometry: ModelGeometry, w: TightWidths, step: Step) -> list[int]:
    """``out[i]``: elements per token the layers from ``i`` on keep at the end of forward
    (what a sub-layer's moment at layer ``i - 1`` does not have beside it yet, and what
    the backward has freed by the time it reaches layer ``i - 1``); ``out[L]`` is 0."""
    out = [0] * (geometry.layers + 1)
    for i in range(geometry.layers - 1, -1, -1):
        mixer, mlp = mixer_spec(geometry.mixers[i]), mlp_spec(geometry.mlps[i])
        kept = w.of(mixer.name) + w.of(mlp.name) - bf16_layer_width(geometry, w, step, i)
        kept -= mixer.checkpoint_dropped(w, step) + mlp.checkpoint_dropped(w, step)
        out[i] = out[i + 1] + kept
    return out


def full_backward_width(geometry: ModelGeometry, w: TightWidths, step: Step) -> int:
    """Elements per token the backward of one layer holds under full recompute on top of
    the layer inputs: the layer recomputed with gradients (its whole saved set; of the
    mixer what it still holds once its forward has run, ``recompute_kept``: an
    attention layer's gathered K/V under CP, not its exchange in flight) plus the
    feed-forward block's backward buffers; then the mixer's own backward (a GDN kernel's
    once the MLP is done, the flash backward beside an attention layer's recomputed
    mixer, its exchange in flight included). The widest layer of the model."""
    widest = 0
    for m, f, _ in geometry.layer_kinds:
        mixer_kind, ffn_kind = mixer_spec(m), mlp_spec(f)
        mixer = mixer_kind.recompute_width(geometry, w, step)
        kept = mixer_kind.recompute_kept(geometry, w, step)
        ffn_backward = ffn_kind.full_backward_buffers(geometry, w, step)
        widest = max(widest, kept + w.of(f) + ffn_backward)
        widest = max(widest, mixer_kind.full_backward_peak(geometry, w, step, mixer))
    return widest


def last_layer_backward_width(geometry: ModelGeometry, w: TightWidths, step: Step) -> int:
    """Elements per token the first layer backward visits (the model's last) holds on
    top of the retained set and the incoming gradient, or under full recompute the
    widest layer's recompute and backward (``full_backward_width``). Its FFN's backward
    runs first and frees what it recomputed before the mixer's starts, so the larger of
    the two phases (the kinds' ``backward_phase``: the MLP's buffers, a checkpointed MoE's
    recompute, the attention's flash backward, Mamba's scan backward); a kind whose last
    layer is not the model's (a hybrid stack's mixer before an MLP-only layer) at its
    last layer, less what the layers after it kept and have freed. Rank simulator, Qwen3.5-4B TP1
    ``core_attn+mlp`` (8,192 tokens): 60,419 elements per token of backward buffers =
    ``2H + 6F`` + 3; the dense CP 8 grid rows without recompute peak in the flash
    backward."""
    if step.recompute.full:
        return full_backward_width(geometry, w, step)
    if not geometry.layers:  # a pipeline chunk of the loss alone: no layer runs backward
        return 0
    # a kind's last layer, once the layers after it have freed their kept sets (a
    # hybrid stack's Mamba layer before its MLP-only layer)
    later = kept_after(geometry, w, step)
    phases = [
        spec(k).backward_phase(geometry, w, step) - later[i + 1]
        for spec, stack in ((mlp_spec, geometry.mlps), (mixer_spec, geometry.mixers))
        for k, i in last_layer_of(stack).items()
    ]
    return max(phases)


def priced_tokens(step: Step) -> int:
    """R: the busiest CP rank's model tokens under CP (each rank keeps only its own
    tokens' activations, in every recompute mode and model family: a full-recompute
    checkpoint keeps its own tokens' layer inputs, an MoE rank dispatches its own tokens),
    the packed count without CP (``Step.priced_tokens``)."""
    return step.priced_tokens


def local_outputs(step: Step, tokens: int) -> int:
    """The gradient of the returned outputs the last layer's backward receives, on the
    rank holding ``tokens`` model tokens. Under CP the gather's backward hands each rank
    its own rows, not an even share of the outputs: ``tokens`` of them (TP padding
    included, a shared prefix once, as the rank holds it: the unpacking's backward has
    folded the repeated prefix back before the gather's runs). Rank simulator
    (oracles/rank_sim/runner.py; ``GatherTokens`` in kernels.py returns the rank's
    ``ctx.local`` rows): ``qwen3-1.7b`` 4,096+4,096 sharing 1,228 at TP1 CP2, laid out
    5,120 + 1,844, hands the last layer 5,120 rows on rank 0 and 1,844 on rank 1, where an
    even share is 4,096. Scaled from ``outputs`` per logical token, so a caller's
    ``output_bytes`` carries over. Under SP the simulator's last layer receives a TP
    shard of those rows (the SP gather's backward reduce-scatters them); the rank's whole
    rows are priced, as a head's gradient is (``backward_moment``). Without CP the whole
    ``outputs``."""
    if step.plan.layout.cp <= 1:
        return step.outputs
    logical = max(1, step.plan.logical_tokens)
    return -(-step.outputs * tokens // logical)


def gathered_outputs_bytes(step: Step, tokens: int) -> int:
    """The returned outputs gathered over CP: every rank's rows padded to the largest
    rank's count in transit (one ``CP x R`` buffer, R the priced busiest count), live
    beside the unpacked logical copy (``outputs``). Rank simulator
    (oracles/rank_sim/runner.py, ``GatherTokens`` in kernels.py): the gather buffer is
    ``CP x max(counts)`` rows; ``qwen3-1.7b:tp2:cp8:pair-16k:full`` holds 8 x 5,632 tokens
    (176 MiB) plus the 128 MiB unpacked copy at its forward peak. Scaled from ``outputs``
    per logical token, so a caller's ``output_bytes`` carries over; never below the
    logical count (a request's shared prefix is repeated by the unpacking, not by the
    gather). 0 without CP."""
    cp = step.plan.layout.cp
    if cp <= 1:
        return 0
    outputs, logical = step.outputs, max(1, step.plan.logical_tokens)
    return max(outputs, -(-outputs * cp * tokens // logical))


def backward_moment(step: Step, w: TightWidths, tokens: int) -> int:
    """Bytes of the backward's first moment on top of the retained set: the loss's
    backward over the returned outputs (or, with a head, the head's backward, which reuses
    what the head kept: ``cpmem.pricing.head``), or the layers' backward
    (``layers_backward_moment``). 0 without gradients."""
    if not step.recompute.keeps_gradients:
        return 0
    if step.head.returns_hidden:
        first = LOSS_BACKWARD_OUTPUTS * step.outputs
    else:  # the head's backward
        head = head_bytes(step, tokens)
        first = max(head.kept, head.backward)
    return max(first, layers_backward_moment(step, w, tokens))


def layers_backward_moment(step: Step, w: TightWidths, tokens: int) -> int:
    """Bytes of the layers' backward on top of what the layers keep, once the loss's or
    the head's backward has run: the last layer's backward on top of the incoming
    gradient, with what the weight-gradient store holds through a layer's backward under
    ``--delay-wgrad-compute`` (``cpmem.pricing.delayed_wgrad``); in the first backward of
    a CP run of a hybrid model, the GDN kernels' autotuning buffer (timed inside a GDN
    layer's backward, when the loss's buffers are gone). It stands for every layer's backward (``last_layer_backward_width`` takes the
    widest layer's on top of what each layer keeps), so it is the policy's backward moment
    from the one the first parameter gradient exists on. 0 without gradients."""
    if not step.recompute.keeps_gradients:
        return 0
    if step.head.returns_hidden:
        local = local_outputs(step, tokens)
    else:  # the gradient the head hands the last layer
        local = tokens * step.geometry.hidden * step.dtype_bytes
    last_layer = tokens * step.dtype_bytes * last_layer_backward_width(step.geometry, w, step)
    moment = local + last_layer + delayed_wgrad_bytes(step, tokens)
    g = step.geometry
    autotune = max((mixer_spec(k).cold_backward_bytes(step) for k in g.mixer_kinds), default=0)
    if autotune:
        moment = max(moment, local + autotune)
    return moment


MTP_TRAINED_INPUTS_H = 4
"""H-wide tensors per token on the sequence shard one MTP depth keeps for its own inputs
under full training (megatron-core ``MultiTokenPredictionLayer._concat_embeddings`` and
``GPTModel._postprocess`` at the recordings' snapshot): the ``enorm`` input (the shifted
tokens' embedding), the ``2H`` concatenation the trained ``eh_proj`` saves, and the copy
of the main hidden states in the ``[(1 + D) tokens, H]`` concatenation the trained output
layer saves (the main states themselves stay kept by ``hnorm``; each depth's own output
input is its head's, ``head_bytes``)."""
MTP_FROZEN_INPUTS_H = 1
"""The same under LoRA (``eh_proj``, the embedding and the output layer frozen, no adapter
on ``eh_proj``): only ``hnorm``'s input, the previous depth's hidden states, which carry a
gradient; ``enorm``'s input does not, and a frozen linear keeps no input."""


def mtp_input_width(step: Step) -> int:
    """Elements per token one MTP depth keeps for its inputs beyond its layers' kept set
    (whose first input norm is priced at ``H/s``): ``MTP_TRAINED_INPUTS_H`` or
    ``MTP_FROZEN_INPUTS_H`` of ``H/s``, and under SP the rest of the gathered ``eh_proj``
    output: ``scatter_to_sequence_parallel_region`` hands the depth's layer a first-dim
    slice of the ``[tokens, H]`` gather (``_split_along_first_dim``), a view whose
    storage is the whole gather, so the layer's input norm keeps ``H`` per token, not
    ``H/s`` (the rank simulator's MTP depth, ``oracles/rank_sim/mtp.py``)."""
    g, layout = step.geometry, step.plan.layout
    s = sp_divisor(layout.tp, layout.sp)
    own = MTP_TRAINED_INPUTS_H if step.settings.training == "full" else MTP_FROZEN_INPUTS_H
    return own * g.hidden // s + (g.hidden - g.hidden // s) + eh_proj_fp8_width(step)


def mtp_bytes(step: Step, w: TightWidths, tokens: int) -> int:
    """What the MTP depths keep until their backward on the rank holding ``tokens``
    tokens, where the step ends with the head whose output layer they share (the depths
    run after the last layer and their losses before the main head's:
    ``GPTModel._postprocess``, ``process_mtp_loss``): per depth its layers' kept set
    (``kept_width`` of a stack of them, under the step's recompute), its inputs
    (``mtp_input_width``) and the shifted token ids its embedding saves, and its head's
    kept set (the fp32 softmax of its logits). 0 without MTP or without a head."""
    g = step.geometry
    if not g.mtp_depths or step.head.returns_hidden:
        return 0
    depth = replace(
        g,
        mixers=g.mtp_mixers,
        mlps=g.mtp_mlps,
        mtp_mixers=(),
        mtp_mlps=(),
        mtp_depths=0,
        windows=(),
    )
    per_token = kept_width(depth, w, step, bf16_layers=False) + mtp_input_width(step)
    per_depth = tokens * (per_token * step.dtype_bytes + EMBEDDING_ID_BYTES)
    return g.mtp_depths * (per_depth + head_bytes(step, tokens).kept)


EMBEDDING_ID_BYTES = 8
"""The int64 token id per token the word embedding's lookup saves for its backward
(``F.embedding`` keeps its indices); the learned position table's lookup saves its
int64 position ids likewise (megatron's ``LanguageModelEmbedding``)."""


def embedding_bytes(step: Step, tokens: int) -> int:
    """What the embedding keeps until backward on the rank that embeds
    (``StepSettings.holds_embedding``): the token ids, the learned positions' ids, and
    the embedding dropout's bool mask on the rank's sequence shard (megatron applies the
    hidden dropout to the embedding's output after the SP scatter). Megatron-LM's
    recordings' first stages; within ``tight``'s fitted margin on ART's cells (8 B per
    token), which are not priced with it (``Runtime.fitted_margin``)."""
    settings = step.settings
    if not settings.holds_embedding or settings.runtime.fitted_margin:
        return 0
    g, layout = step.geometry, step.plan.layout
    ids = EMBEDDING_ID_BYTES * tokens * (2 if g.positions == "learned" else 1)
    mask = 0
    if g.hidden_dropout:
        mask = tokens // sp_divisor(layout.tp, layout.sp) * g.hidden  # bool, 1 B each
    return ids + mask


def dataloader_mask_bytes(step: Step) -> int:
    """The data loader's ``[b, 1, s, s]`` bool mask (``Runtime.dataloader_attention_mask``,
    Megatron-LM's ``--create-attention-mask-in-dataloader`` default,
    ``datasets/gpt_dataset.py``) on a rank that loads data: the first stage (it embeds)
    and the last (it computes the loss)."""
    settings = step.settings
    if not settings.runtime.dataloader_attention_mask or step.request is None:
        return 0
    if not (settings.holds_embedding or not step.head.returns_hidden):
        return 0
    lengths = step.request.sequence_lengths
    return len(lengths) * max(lengths) ** 2


def cold_setup_bytes(step: Step) -> int:
    """The first forward's kernel set-up where the step is cold."""
    return COLD_SETUP if step.cold else 0


def cold_backward_terms(step: Step, margin: Margin) -> dict[str, int]:
    """What the first backward of a process adds (nothing for a warm step): the margin's
    fitted cold-backward allowance."""
    if not step.cold:
        return {}
    return {Component.COLD_BACKWARD_SETUP: margin.cold_backward_allowance}


@dataclass(frozen=True)
class Structure:
    """The functions the policy composes that the gate's power study may replace: the
    layer widths (a model and step to ``TightWidths``), the backward's first moment
    (bytes) and its moment once the head's backward has run (bytes), the first forward's cold set-up (bytes) and the first backward's (components,
    from the margin). The defaults are the policy."""

    widths: Callable[[ModelGeometry, Step], TightWidths] = tight_widths
    backward: Callable[[Step, TightWidths, int], int] = backward_moment
    layers_backward: Callable[[Step, TightWidths, int], int] = layers_backward_moment
    cold: Callable[[Step], int] = cold_setup_bytes
    cold_backward: Callable[[Step, Margin], dict[str, int]] = cold_backward_terms


POLICY = Structure()


STEP_TERM_ORDER = (
    Component.ROPE_TABLES,
    Component.EMBEDDING,
    Component.ATTENTION_SCORES,
    Component.CP_GATHERED_KV,
    Component.MTP,
)
"""The order the step-level terms stand in an estimate's components."""


def structural_terms(
    step: Step, structure: Structure = POLICY, tokens: int | None = None
) -> tuple[dict[str, int], dict[str, int]]:
    """The unmargined forward components and forward+backward components of the rank
    holding ``tokens`` model tokens (default: the priced, busiest rank's).

    forward = retained set + one layer's transient; forward+backward = retained set +
    the larger of that transient and the backward's first moment. What every rank pads
    to the largest rank's count (the gathered outputs and K/V) is priced at the busiest
    rank's count whichever rank is asked for.
    """
    geometry = step.geometry
    b = step.dtype_bytes
    w = structure.widths(geometry, step)
    busiest = priced_tokens(step)
    tokens = busiest if tokens is None else tokens
    mixers = [mixer_spec(k) for k in geometry.mixer_kinds]
    terms: dict[str, int] = {}
    for mixer in mixers:  # what a kind holds for its layers beside the per-token widths
        for name, value in mixer.step_terms(step, w, tokens, busiest).items():
            terms[name] = terms.get(name, 0) + value
    outputs = step.outputs
    gathered_outputs = gathered_outputs_bytes(step, busiest)
    transient = tokens * b * forward_transient_width(geometry, w, step)
    transient += sum(mixer.transient_bytes(step, tokens, busiest) for mixer in mixers)
    if step.recompute.one_layer_at_a_time:
        # the outputs are formed after the last layer's pass: the forward peak is the
        # larger of the two on top of the layer inputs, not their sum; under full
        # recompute the last layer's output is live beside them (FINAL_HIDDEN_STATES)
        final = FINAL_HIDDEN_STATES * tokens * b * w.layer_input if step.recompute.full else 0
        transient = max(final, transient - outputs - gathered_outputs)
    padding = sum(mixer.retained_padding_bytes(step, w, tokens, busiest) for mixer in mixers)
    forward: dict[str, int] = {
        Component.COLD_SETUP: structure.cold(step),
        Component.SEGMENT_STATES: terms.pop(Component.SEGMENT_STATES, 0),
        Component.OUTPUTS: outputs,
        Component.GATHERED_OUTPUTS: gathered_outputs,
        # less what whole-layer offloading holds on the host at every moment priced
        Component.RETAINED_ACTIVATIONS: tokens * b * kept_width(geometry, w, step)
        + padding
        - offloaded_retained_bytes(step, tokens),
        Component.LAYER_TRANSIENT: transient,
    }
    embedding = embedding_bytes(step, tokens)
    if embedding:
        terms[Component.EMBEDDING] = embedding
    mtp = mtp_bytes(step, w, tokens)
    if mtp:
        terms[Component.MTP] = mtp
    # each a component only where it applies, in one order
    for name in (*STEP_TERM_ORDER, *sorted(set(terms) - set(STEP_TERM_ORDER))):
        if terms.get(name):
            forward[name] = terms[name]
    head = head_bytes(step, tokens)
    backward = structure.backward(step, w, tokens)
    forward_backward = {k: v for k, v in forward.items() if k != Component.LAYER_TRANSIENT}
    # the data loader's mask is held while the micro-batch runs, forward and backward
    # (Megatron-LM's PP 1 and TP 4 recordings peak 1-3 MiB above the figure without it)
    mask = dataloader_mask_bytes(step)
    if mask:
        forward[Component.DATALOADER_MASK] = mask
        forward_backward[Component.DATALOADER_MASK] = mask
    fb_moment = max(transient, backward)
    if not step.head.returns_hidden:
        # the head runs once the last layer's transient is freed: the forward peak is the
        # larger of that transient and the head's moment (what it keeps and holds beyond)
        peak = max(transient, head.kept + head.forward)
        forward[Component.HEAD_KEPT] = head.kept
        forward[Component.HEAD] = head.forward
        forward[Component.LAYER_TRANSIENT] = peak - head.kept - head.forward
        forward_backward[Component.HEAD_KEPT] = head.kept
        fb_moment = max(peak, backward) - head.kept
    forward_backward[Component.BACKWARD_TRANSIENT] = fb_moment
    return forward, forward_backward


def layers_backward_terms(
    step: Step, forward_backward: dict[str, int], structure: Structure = POLICY
) -> dict[str, int]:
    """The unmargined forward+backward components (``structural_terms``' second) at the
    layers' backward alone (``Structure.layers_backward``), on the priced rank: the head's
    kept tensors freed by its backward, the backward transient the layers' moment. What
    an in-flight term made only from that moment on (a parameter gradient bucket) is
    charged beside."""
    w = structure.widths(step.geometry, step)
    out = {
        k: v
        for k, v in forward_backward.items()
        if k not in (Component.HEAD_KEPT, Component.BACKWARD_TRANSIENT)
    }
    out[Component.BACKWARD_TRANSIENT] = structure.layers_backward(step, w, priced_tokens(step))
    return out
