"""The gathered K/V term: which paths keep the other CP ranks' K/V, and how the
reference prices the ranks beyond the CP it was calibrated on.

Expected bytes are written out from the Qwen3-1.7B geometry (28 attention layers,
8 KV heads x 128 = 1,024 KV width, bf16), not computed by the code under test.
"""

from __future__ import annotations

from functools import partial

import pytest
from harness import HARNESS

from cpmem.model.presets import get_preset
from cpmem.plan.layout import ParallelLayout
from cpmem.plan.plan import explicit_plan
from cpmem.pricing.gathered import gathered_kv_bytes, keeps_gathered_kv
from cpmem.pricing.registry import price
from cpmem.step.describe import describe_step as _describe_step
from cpmem.step.step import Step

# every figure here is recorded for the calibration harness's step (tests/unit/harness.py)
describe_step = partial(_describe_step, **HARNESS)

TOKENS = 4096


def _inputs(cp: int, mode: str, modules: str | None = None, tp: int = 1) -> Step:
    plan = explicit_plan(
        ParallelLayout(tp=tp, cp=cp),
        logical_tokens=cp * TOKENS,
        packed_tokens=cp * TOKENS,
        grad_segments=1,
        rank_tokens=[TOKENS] * cp,
    )
    return describe_step(
        get_preset("qwen3-1.7b"),
        plan=plan,
        tp=tp,
        cp=cp,
        sp=False,
        recompute=mode,
        modules=modules,
    )


@pytest.mark.parametrize(
    ("cp", "mode", "modules", "kept"),
    [
        (1, "none", None, False),  # no other rank
        (4, "none", None, True),
        (4, "selective", "mlp", True),  # the core attention is not checkpointed
        (4, "selective", "core_attn", False),  # the checkpoint keeps local K/V only
        (4, "selective", "core_attn+mlp", False),
        (4, "full", None, False),  # one layer at a time, inside its working set
        (4, "no-grad", None, False),
    ],
)
def test_which_paths_keep_gathered_kv(cp: int, mode: str, modules: str | None, kept: bool) -> None:
    assert keeps_gathered_kv(_inputs(cp, mode, modules)) is kept


def test_gathered_kv_bytes_by_hand() -> None:
    # 28 layers x (K + V) x 1,024 x 3 remote ranks x 4,096 tokens x 2 bytes
    assert gathered_kv_bytes(_inputs(4, "none"), TOKENS, 3) == 28 * 2 * 1024 * 3 * 4096 * 2
    # TP 2 shards the 8 KV heads: 512 per rank
    assert gathered_kv_bytes(_inputs(4, "none", tp=2), TOKENS, 3) == 28 * 2 * 512 * 3 * 4096 * 2
    assert gathered_kv_bytes(_inputs(4, "selective", "core_attn"), TOKENS, 3) == 0


def test_reference_prices_only_the_ranks_beyond_cp2() -> None:
    assert "cp_gathered_kv" not in price(_inputs(2, "none"), "reference").components
    est = price(_inputs(8, "none"), "reference")
    # six ranks beyond the calibrated CP 2
    assert est.components["cp_gathered_kv"] == 28 * 2 * 1024 * 6 * 4096 * 2
    assert (
        "cp_gathered_kv" not in price(_inputs(8, "selective", "core_attn"), "reference").components
    )
    # kept until backward: part of what a sub-forward retains
    c = est.components
    assert (
        est.retained_bytes == c["retained_activations"] + c["segment_states"] + c["cp_gathered_kv"]
    )
