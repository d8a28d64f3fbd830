"""The rows the routed experts' grouped GEMMs hold: the dispatched rows, with each local
expert's rows padded where the runtime pads them (``Runtime.moe_row_align``).

Under Transformer Engine's op fuser with grouped GEMMs megatron-core pads each local
expert's permuted tokens and probabilities to 256-row segments (``Fp8Padding`` with
``align_size`` 256) before the fused ops, which save the padded tensors and compute on
the padded rows (Megatron-LM d98e8a64 ``experts.py:305-314,736-748``;
``cpmem.megatron.op_fuser_rules``). The padded copy replaces the dispatched rows in what
the experts save (``Fp8Padding`` saves no tensor: TE b9d690e0
``module/fp8_padding.py:24-50``); the dispatcher's own per-row tensors (its indices, the
combine's buffers) stay at the dispatched count."""

from __future__ import annotations

from fractions import Fraction

from cpmem.step.routing import pad_rows
from cpmem.step.step import Step


def grouped_rows(step: Step, tp: int, sp: bool | None = None) -> Fraction:
    """Rows per token of the rank's own the grouped experts compute on and save:
    ``Step.expert_rows_per_token`` padded as the runtime pads each local expert's
    (``cpmem.step.routing.pad_rows``: a bound under a bounding routing, the even share's
    padding under ``balanced``)."""
    layout, plan = step.plan.layout, step.plan
    sp = layout.sp if sp is None else sp
    rows = step.expert_rows_per_token(tp, sp)
    align = step.settings.runtime.moe_row_align
    tokens = plan.busiest_tokens if layout.cp > 1 else plan.packed_tokens
    return pad_rows(
        step.geometry, rows, step.moe_routing, align, layout.ep, layout.etp, tp, sp, tokens
    )
