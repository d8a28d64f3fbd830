"""Transformer Engine's op fuser (``cpmem.megatron.op_fuser_rules``) and the grouped experts'
padded rows it prices (``cpmem.pricing.kinds.moe_padding``).

Expected values are hand counts: each local expert's rows rounded up to a multiple of 256
(Transformer Engine b9d690e0 ``module/fp8_padding.py:120-123``, ``Fp8Padding`` with
``align_size`` 256, Megatron-LM d98e8a64 ``experts.py:305-314,736-748``); the worst split
found by enumerating every split of a small count; Megatron-LM 4828d651's asserts
(``experts.py:277-280,323-381``).
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from fractions import Fraction

import pytest

from cpmem.gate.megatron_tier import price_recording, read_case
from cpmem.golden.files import default_golden_dir
from cpmem.golden.megatron import load_recordings
from cpmem.megatron.op_fuser_rules import expert_row_align, op_fuser_problems
from cpmem.pricing.kinds.moe_padding import grouped_rows
from cpmem.step.routing import pad_rows, padded_rows
from tests.unit.megatron_lm.tiny import step_of, tiny

FUSER = dict(
    num_experts=4,
    moe_router_topk=1,
    moe_router_load_balancing_type="sinkhorn",
    add_bias_linear=False,
    swiglu=True,
    moe_grouped_gemm=True,
    use_transformer_engine_op_fuser=True,
)
"""The op fuser recording's MoE (golden/megatron/cases/moe/
gpt3_mcore_te_tp1_pp1_te_4experts_groupedGEMM_op_fuser): 4 experts, top-1, SwiGLU."""


def _worst_by_enumeration(total: int, local: int, align: int, cap: int | None) -> int:
    """The largest padded count over every split of ``total`` rows among ``local`` experts
    (each at most ``cap``), each split rounded up to ``align``."""
    best = 0
    top = total if cap is None else min(cap, total)
    for split in itertools.product(range(top + 1), repeat=local):
        if sum(split) == total:
            best = max(best, sum(-(-m // align) * align for m in split))
    return best


@pytest.mark.parametrize(
    ("total", "local", "align", "cap"),
    [(t, n, a, c) for t in range(0, 13) for n in (1, 2, 3) for a in (1, 4, 5) for c in (None, 5)]
    + [(9, 3, 4, 3)],
)
def test_the_padded_bound_is_the_worst_split(
    total: int, local: int, align: int, cap: int | None
) -> None:
    if cap is not None and cap * local < total:
        return  # no split fits the cap
    assert padded_rows(total, local, align, cap) == _worst_by_enumeration(total, local, align, cap)


def test_the_recording_s_rows_pad_by_at_most_three_segments() -> None:
    """4,096 rows over 4 local experts (top-1, EP 1): three experts of one row pad to 256
    each and the fourth's 4,093 to 4,096: 4,864, 768 rows more (not 4 x 255 = 1,020: the
    rows add up to a multiple of 256). At top-4 of 4 experts every expert holds each of
    its 1,000 tokens once: 4 x 1,024."""
    assert padded_rows(4096, 4, 256, 4096) == 4864
    assert padded_rows(4096, 4, 256) == 4864
    assert padded_rows(4000, 4, 256, 1000) == 4096
    assert padded_rows(3, 8, 256) == 768
    assert padded_rows(4096, 4, 0) == 4096


def test_balanced_rows_pad_the_even_share() -> None:
    """Balanced, 4 experts top-1 at EP 1: 4,096 tokens give each expert 1,024 rows, a
    multiple of 256 (no padding); 4,000 tokens 1,000 each, padded to 1,024: 4,096 rows."""
    step = step_of(tiny(**FUSER), world_size=1)
    g = step.geometry
    assert pad_rows(g, Fraction(1), "balanced", 256, 1, 1, 1, False, 4096) == 1
    assert pad_rows(g, Fraction(1), "balanced", 256, 1, 1, 1, False, 4000) == Fraction(4096, 4000)
    assert pad_rows(g, Fraction(1), "concentrated", 256, 1, 1, 1, False, 4096) == Fraction(
        4864, 4096
    )


def test_the_op_fuser_pads_only_the_grouped_experts_it_runs() -> None:
    """Only ``TEGroupedMLP`` (MoE with grouped GEMMs under Transformer Engine) reads the
    flag: 256-row segments there, nothing elsewhere (pretrain_gpt's layer spec does not pass
    it to the dense MLP: gpt_builders.py:117-131 at 4828d651)."""
    assert expert_row_align(tiny(**FUSER)) == 256
    assert expert_row_align(tiny(**{**FUSER, "moe_grouped_gemm": False})) == 0
    assert expert_row_align(tiny(**{**FUSER, "transformer_impl": "local"})) == 0
    assert expert_row_align(tiny(use_transformer_engine_op_fuser=True)) == 0
    assert expert_row_align(tiny(**{**FUSER, "use_transformer_engine_op_fuser": False})) == 0
    for args in (tiny(**FUSER), tiny(**{**FUSER, "moe_grouped_gemm": False})):
        assert op_fuser_problems(args) == []
    step = step_of(tiny(**FUSER), world_size=1)
    assert step.settings.runtime.moe_row_align == 256
    assert grouped_rows(step, 1) == Fraction(4864, 4096)


def test_what_the_fused_experts_do_not_support_or_cpmem_does_not_price_is_listed() -> None:
    """Megatron-LM asserts ``_is_fused_impl_supported`` (expert TP, expert_fc1 / moe_act
    offload, an activation other than SwiGLU, quick GeGLU or the fused weighted squared
    ReLU); cpmem does not price the quick GeGLU and squared ReLU ops, TE's own activation
    recompute under ``moe_act``, FP8 beside the op fuser, or the fused ops' deferred weight
    gradients (``--delay-wgrad-compute``), or the flex dispatcher's own 256-row padding."""
    cases = {
        "at expert TP 2": dict(tensor_model_parallel_size=2, sequence_parallel=True),
        "--offload-modules expert_fc1": dict(
            fine_grained_activation_offloading=True, offload_modules="expert_fc1"
        ),
        "without --swiglu": dict(swiglu=False),
        "with --quick-geglu": dict(swiglu=False, quick_geglu=True),
        "--recompute-modules moe_act": dict(
            recompute_granularity="selective", recompute_modules="moe_act"
        ),
        "--fp8-format e4m3": dict(fp8="e4m3"),
        "--delay-wgrad-compute": dict(flag_values={"--delay-wgrad-compute": True}),
        "--moe-token-dispatcher-type flex": dict(
            moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="hybridep"
        ),
    }
    for named, changes in cases.items():
        problems = op_fuser_problems(tiny(**{**FUSER, **changes}))
        assert len(problems) == 1 and named in problems[0][0], (named, problems)
        assert problems[0][0].startswith("--use-transformer-engine-op-fuser")
    both = op_fuser_problems(tiny(**{**FUSER, **cases["without --swiglu"], "fp8": "e4m3"}))
    assert len(both) == 2
    # FP8 without grouped GEMMs: the router's padding is 256 rows under the op fuser
    assert op_fuser_problems(tiny(**{**FUSER, "moe_grouped_gemm": False, "fp8": "e4m3"}))


def test_the_op_fuser_recording_is_priced_with_the_padded_rows() -> None:
    """The recording (H100, 4 layers, 4 x 1,024 tokens, H 512, F_e 1,344 = int(4 x 512 x
    2/3 / 64) x 64): its worst case keeps 768 padded rows more per layer, each the eager
    row's ``H + 6 F_e + 4`` elements (``moe.MOE_ROW_EAGER_F``, ``MOE_ROW_SMALL``) in
    bf16: 4 x 768 x 8,580 x 2 B = 52,715,520 B above the same run unpadded (each layer's
    width is rounded up to whole elements per token: up to 4 x 4,096 x 2 B more). The
    balanced expectation is not padded (1,024 rows an expert). Static within 3% of the
    recorded 1,384,147,968 B, the peak covered, the balanced expectation within 10%."""
    golden = default_golden_dir()
    rid = "moe/gpt3_mcore_te_tp1_pp1_te_4experts_groupedGEMM_op_fuser/dev_dgx_h100"
    rec = next(r for r in load_recordings(golden) if r.recording_id == rid)
    args = read_case(rec.model_config(golden))
    row = price_recording(rec, golden, args=args)
    unpadded = price_recording(
        rec, golden, args=replace(args, use_transformer_engine_op_fuser=False)
    )
    extra = row.peak_bytes - unpadded.peak_bytes
    assert 52_715_520 <= extra <= 52_715_520 + 4 * 4096 * 2
    assert row.balanced_peak == unpadded.balanced_peak
    assert row.passed("static") and row.passed("covers") and row.passed("headroom")
