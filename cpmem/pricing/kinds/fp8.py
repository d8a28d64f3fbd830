"""What FP8 training (``StepSettings.fp8``) changes in the saved sets of the layer kinds it
is priced for (attention, latent attention: ``latent_fp8_width``, dense MLP, MoE:
``moe_fp8_width``) and of an MTP depth's
inputs (``eh_proj_fp8_width``), in elements of the step's dtype per token (the unit of
``tight``'s widths).

Transformer Engine's linears save their input for the weight gradient quantized, 1 B per
element, when the recipe runs them in FP8 (TE b9d690e0 ``module/linear.py:530-554``,
``module/layernorm_linear.py:230-285``): each linear's saved input drops from the dtype's
bytes to 1 B where no other module keeps the high-precision tensor, and is kept beside it
where one does.

- attention: the QKV projection's normed input (``H/s`` on the rank's sequence shard)
  loses ``b - 1`` bytes per element; the output projection's input, the core
  attention's output, stays in the dtype (the attention kernel saves its output for its
  backward) and gains an FP8 copy (``attention_output_width/t`` at 1 B); under a
  ``core_attn`` checkpoint the kernel saves nothing, and the output loses ``b - 1``
  bytes per element instead;
- the dense MLP: fc1's normed input (``H/s``) and fc2's input, the activation's output
  (``F/t``, which only fc2 keeps), lose ``b - 1`` bytes per element.

Under the ``blockwise`` recipe each of those 1 B inputs (its columnwise copy, the one the
weight gradient reads: TE drops the rowwise data of a blockwise input it saves,
``module/linear.py:536-549``, ``module/layernorm_linear.py:441-451``) also keeps its fp32
scales in 1 x 128 blocks along the tokens: ``[ceil(rows/128), roundup(cols, 4)]``
(``cpmem.pricing.fp8_blockwise.scale_shape``; ``csrc/quantizer.cpp:1323-1375``), 4 B per
128 tokens of each column, ``4 roundup(cols, 4) / 128`` B per token of the rank's rows
(``rows`` the tokens the input holds: the sequence shard for a normed input under SP, every
token for the projections' inputs). Priced per token, exact where those rows are a whole
number of 128-token blocks; otherwise under by less than one block's row of scales
(``4 roundup(cols, 4)`` B) per input and layer.

Under ``mxfp8`` the saved inputs keep their columnwise copy too (TE drops an MXFP8
input's rowwise data as a blockwise one's, the same lines) with its ``uint8`` e8m0 scales,
one per 32 rows of each column, ``[roundup(rows/32, 4), roundup(cols, 128)]``
(``cpmem.pricing.mxfp8.scale_shape``; ``csrc/quantizer.cpp:1710-1739``):
``roundup(cols, 128) / 32`` B per token of the rank's rows, exact where those rows are a
whole number of 128-token blocks, otherwise under by at most three rows of scales
(``3 roundup(cols, 128)`` B) per input and layer.

A byte change is turned into elements rounding towards the larger figure, so an odd byte
is never priced away.
"""

from __future__ import annotations

from fractions import Fraction
from math import ceil

from cpmem.pricing.fp8_blockwise import BLOCK, PAD, SCALE_BYTES
from cpmem.pricing.kinds.moe_padding import grouped_rows
from cpmem.pricing.kinds.spec import TightContext
from cpmem.pricing.mxfp8 import BLOCK as MX_BLOCK
from cpmem.pricing.mxfp8 import ROW_PAD as MX_ROW_PAD
from cpmem.pricing.widths import sp_divisor
from cpmem.step.recompute import Module
from cpmem.step.step import Step

FP8_BYTES = 1


def _elements(delta_bytes: int, dtype_bytes: int) -> int:
    """``delta_bytes`` in elements of ``dtype_bytes``, rounded up (towards more memory)."""
    return -(-delta_bytes // dtype_bytes)


def _active(ctx: TightContext) -> bool:
    return ctx.step.settings.fp8 is not None


def _block_scales(ctx: TightContext | Step, inputs: list[tuple[int, int | Fraction]]) -> Fraction:
    """Bytes per token of the block-scaled recipes' columnwise scales of the saved FP8
    ``inputs``, each ``(cols, shard)``: ``cols`` columns on rows of ``1/shard`` of the
    tokens (0 under the per-tensor recipes)."""
    step = ctx if isinstance(ctx, Step) else ctx.step
    fp8 = step.settings.fp8
    if fp8 is None or fp8.recipe not in ("blockwise", "mxfp8"):
        return Fraction(0)
    if fp8.recipe == "mxfp8":  # 1 B per 32 rows of each column, columns padded to 128
        per_row = [
            (-(-cols // MX_ROW_PAD) * MX_ROW_PAD, MX_BLOCK * shard) for cols, shard in inputs
        ]
    else:  # 4 B per 128 rows of each column, columns padded to 4
        per_row = [(SCALE_BYTES * -(-cols // PAD) * PAD, BLOCK * shard) for cols, shard in inputs]
    return sum((Fraction(n) / d for n, d in per_row), Fraction(0))


def attention_fp8_width(ctx: TightContext) -> int:
    """The attention layer's saved set under FP8 less its saved set without (0 without FP8;
    latent attention's: ``latent_fp8_width``)."""
    if not _active(ctx):
        return 0
    if ctx.geometry.is_mla:
        return latent_fp8_width(ctx)
    g, b = ctx.geometry, ctx.step.dtype_bytes
    s = sp_divisor(ctx.tp, ctx.sp)
    normed = g.hidden // s
    proj = g.attention_output_width // ctx.tp
    scales = _block_scales(ctx, [(g.hidden, s), (proj, 1)])
    # under a core_attn checkpoint the kernel no longer keeps its output: the output
    # projection's FP8 copy replaces it
    core_kept = not ctx.step.recompute.checkpoints(Module.CORE_ATTN)
    proj_delta = proj * FP8_BYTES if core_kept else -proj * (b - FP8_BYTES)
    return _elements(-normed * (b - FP8_BYTES) + proj_delta + ceil(scales), b)


KEEPS_OUTPUT = ("flash", "fused")
"""The attention backends whose kernel saves its output for its backward (FlashAttention's
and cuDNN's fused attention); the unfused one's last op, ``bmm(probs, value)``, saves its
inputs, not its output."""


def latent_fp8_width(ctx: TightContext) -> int:
    """Latent attention's saved set under FP8 less its saved set without, on a rank whose
    tokens SP does not split (``cpmem.step.fp8`` refuses the rest). megatron-core 0.16's
    Transformer Engine layer spec builds its input norm apart (``TENorm``), the query's
    and the KV's down projections as ``TELinear`` (the query's a column-parallel
    ``TELinear`` of ``H`` without ``q_lora_rank``), their up projections as
    ``TELayerNormColumnParallelLinear`` (``q_layernorm`` and ``kv_layernorm`` fused) and the
    output projection as ``TERowParallelLinear`` (Megatron-LM 4828d651
    ``gpt_layer_specs.py``, the unfused-down-projection MLA spec). Each saves its input
    quantized, 1 B an element (TE ``module/linear.py:530-554``,
    ``module/layernorm_linear.py:230-285``):

    - the input norm's output (``H``), which the norm does not save (it saves its input):
      the two down projections each keep their own 1 B copy in its place;
    - the up projections' normed inputs (``q_lora_rank``, ``kv_lora_rank``), their fused
      norms' outputs, which only they keep: ``b - 1`` bytes less an element (their norms'
      inputs, the down projections' outputs, stay: the fused norm saves them);
    - the output projection's input, the core attention's output
      (``heads x v_head_dim / TP``): a flash or fused kernel saves it too, so it gains a
      1 B copy; the unfused kernel and a ``core_attn`` checkpoint keep none, so it loses
      ``b - 1`` bytes an element;
    - the block-scaled recipes' scales of those inputs (``_block_scales``)."""
    g, step, b = ctx.geometry, ctx.step, ctx.step.dtype_bytes
    proj = g.attention_output_width // ctx.tp
    latent = [g.kv_lora_rank] + ([g.q_lora_rank] if g.q_lora_rank else [])
    kernel_keeps = step.settings.runtime.attention_backend in KEEPS_OUTPUT
    if kernel_keeps and not step.recompute.checkpoints(Module.CORE_ATTN):
        proj_delta = proj * FP8_BYTES
    else:
        proj_delta = -proj * (b - FP8_BYTES)
    delta = -g.hidden * (b - 2 * FP8_BYTES) - sum(latent) * (b - FP8_BYTES) + proj_delta
    inputs: list[tuple[int, int | Fraction]] = [(g.hidden, 1), (g.hidden, 1), (proj, 1)]
    inputs += [(n, 1) for n in latent]
    return _elements(delta + ceil(_block_scales(ctx, inputs)), b)


def dense_fp8_width(ctx: TightContext) -> int:
    """The dense MLP's saved set under FP8 less its saved set without (0 without FP8)."""
    if not _active(ctx):
        return 0
    g, b = ctx.geometry, ctx.step.dtype_bytes
    s = sp_divisor(ctx.tp, ctx.sp)
    normed = g.hidden // s
    scales = _block_scales(ctx, [(g.hidden, s), (g.ffn // ctx.tp, 1)])
    return _elements(-(normed + g.ffn // ctx.tp) * (b - FP8_BYTES) + ceil(scales), b)


def moe_fp8_width(ctx: TightContext) -> int:
    """The MoE block's saved set under FP8 less its saved set without (0 without FP8).

    - each routed row (``rows`` per token, ``Step.expert_rows_per_token``): fc1's input,
      the dispatched ``H``-wide row, which only fc1 keeps (TE ``GroupedLinear`` saves each
      expert's split of it quantized, columnwise, ``module/grouped_linear.py:617-631``),
      and fc2's, the weighted activation output (``F_e/ETP``), lose ``b - 1`` bytes per
      element; under a ``moe_act`` checkpoint fc2 saves its original input
      (``set_save_original_input``), which the checkpoint discards: no fc2 term;
    - the shared expert (``shared_fp8_bytes``);
    - the block-scaled recipes' scales of those inputs (``_block_scales``), per token of
      the rows each holds. The routed experts quantize each expert's split on its own
      (``tex.split_quantize``, ``grouped_linear.py:530``), so the per-row price is under
      by less than one 128-row block of scales per expert and input.

    The rows are the padded ones (``moe_padding.grouped_rows``)."""
    if not _active(ctx):
        return 0
    g, step, b = ctx.geometry, ctx.step, ctx.step.dtype_bytes
    rows = grouped_rows(step, ctx.tp, ctx.sp)
    fe = g.expert_ffn // max(step.plan.layout.etp, 1)
    per_row = [g.hidden] + ([] if step.recompute.checkpoints(Module.MOE_ACT) else [fe])
    delta = -rows * sum(per_row) * (b - FP8_BYTES)
    scales = _block_scales(ctx, [(cols, 1 / rows) for cols in per_row]) if rows else Fraction(0)
    return _elements(ceil(delta + scales + shared_fp8_bytes(step, ctx.tp, ctx.sp)), b)


def shared_fp8_bytes(step: Step, tp: int, sp: bool) -> Fraction:
    """Bytes per token FP8 changes in an MoE layer's shared expert's saved set (0 without
    FP8 or a shared expert): fc1's input, the pre-MLP norm's output (``H/s``), stays in
    the dtype (the router's GEMM saves it too) and gains a 1 B copy; fc2's, its
    activation's output (``F_s/t``, which only fc2 keeps), loses ``b - 1`` bytes per
    element; the block-scaled recipes' scales of both (``_block_scales``). A
    ``shared_experts`` checkpoint drops these with the rest of the shared expert's saved
    set (``cpmem.pricing.kinds.moe.act_dropped``)."""
    g, b = step.geometry, step.dtype_bytes
    shared = g.shared_expert_ffn
    if step.settings.fp8 is None or not shared:
        return Fraction(0)
    s = sp_divisor(tp, sp)
    delta = Fraction(g.hidden // s * FP8_BYTES - shared // tp * (b - FP8_BYTES))
    return delta + _block_scales(step, [(g.hidden, s), (shared // tp, 1)])


def eh_proj_fp8_width(step: Step) -> int:
    """What FP8 changes in one MTP depth's own inputs (0 without FP8): ``eh_proj``, a TE
    column-parallel linear run under the global FP8 context (Megatron-LM 4828d651
    ``multi_token_prediction.py``), saves its ``2H``-wide input, the concatenation only it
    keeps (``2H/s`` on the rank's sequence shard), quantized: ``b - 1`` bytes less per
    element, with the block-scaled recipes' scales."""
    if step.settings.fp8 is None or not step.geometry.mtp_depths:
        return 0
    layout, b = step.plan.layout, step.dtype_bytes
    s = sp_divisor(layout.tp, layout.sp and layout.tp > 1)
    width = 2 * step.geometry.hidden
    scales = _block_scales(step, [(width, s)])
    return _elements(ceil(-width // s * (b - FP8_BYTES) + scales), b)
