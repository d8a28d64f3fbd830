"""The rows the routed experts' grouped GEMMs hold: the dispatched rows, with each local
expert's rows padded where the runtime pads them (``row_align``).

Two runtimes pad, by the same mechanism (Transformer Engine's ``Fp8Padding``: a new
``[sum of padded splits, H]`` tensor, zero rows appended to each local expert's split, TE
b9d690e0 ``module/fp8_padding.py:24-50,120-123``; it saves no tensor):

- under Transformer Engine's op fuser with grouped GEMMs megatron-core pads each local
  expert's permuted tokens and probabilities to 256-row segments before the fused ops,
  which save the padded tensors and compute on the padded rows (Megatron-LM d98e8a64
  ``experts.py:305-314,736-748``; ``Runtime.moe_row_align``,
  ``cpmem.megatron.op_fuser_rules``);
- under FP8 megatron-core's ``TEGroupedMLP`` pads each of its local experts' rows, and the
  permuted probabilities with them, to a multiple of 16, or 32 under MXFP8
  (``FP8_ROW_ALIGN``), before fc1 (``Fp8Padding(num_local_experts)``, Megatron-LM
  4828d651 ``moe/experts.py:295-302, 676-691``); fc1's saved input, its output, the
  activation's saved set and fc2's input hold the padded rows, unpadded only after fc2
  (``Fp8Unpadding``). The padding is keyed on ``config.fp8``, so layers kept in bf16 pad
  too. The HybridEP dispatcher pads the rows to the same multiple itself
  (``token_dispatcher.py:1087-1088``) and the experts then skip theirs
  (``moe_utils.skip_routed_expert_padding``): the same rows.

The padded copy replaces the dispatched rows in what the experts save; the dispatcher's
own per-row tensors (its indices, the combine's buffers) stay at the dispatched count."""

from __future__ import annotations

from fractions import Fraction

from cpmem.step.routing import pad_rows
from cpmem.step.step import Step

FP8_ROW_ALIGN = {"mxfp8": 32}
"""The multiple of rows each local expert's split is padded to under FP8 where it is not
``FP8_ROW_ALIGN_DEFAULT``: Megatron-LM 4828d651 ``fp8_utils.py:168-173``
(``get_fp8_align_size``: 32 for MXFP8, else 16), as Transformer Engine b9d690e0
``quantization.py:262-268`` (``get_align_size_for_quantization``) gives it to
``Fp8Padding``."""
FP8_ROW_ALIGN_DEFAULT = 16


def row_align(step: Step) -> int:
    """The multiple each local expert's rows are padded to on ``step`` (0: not padded):
    the runtime's (``Runtime.moe_row_align``, the op fuser's 256), else FP8's on a model
    with MoE layers (``FP8_ROW_ALIGN``)."""
    runtime_align = step.settings.runtime.moe_row_align
    if runtime_align:
        return runtime_align
    fp8 = step.settings.fp8
    if fp8 is None or not step.geometry.is_moe:
        return 0
    return FP8_ROW_ALIGN.get(fp8.recipe, FP8_ROW_ALIGN_DEFAULT)


def grouped_rows(step: Step, tp: int, sp: bool | None = None) -> Fraction:
    """Rows per token of the rank's own the grouped experts compute on and save:
    ``Step.expert_rows_per_token`` padded as the runtime pads each local expert's
    (``cpmem.step.routing.pad_rows``: a bound under a bounding routing, the even share's
    padding under ``balanced``; a real batch's counts scatter about the share, and where
    the share is a multiple of the alignment the expectation is under their average
    padding of about half the alignment an expert)."""
    layout = step.plan.layout
    sp = layout.sp if sp is None else sp
    rows = step.expert_rows_per_token(tp, sp)
    align, tokens = row_align(step), step.priced_tokens
    return pad_rows(
        step.geometry, rows, step.moe_routing, align, layout.ep, layout.etp, tp, sp, tokens
    )
