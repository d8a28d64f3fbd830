"""The measured facts behind ``tight``'s constants chosen from golden cells by coverage.

cpmem/pricing/tight/calibrated.py chose ``UNGATED_RUNTIME_Q``, ``SEGMENT_STATES_SPARED``
and ``MOE_COMPILED_ROW_FP32_F`` so that ``tight`` covers the measured cells that show
what each stands for. Each test re-derives that choice from the measured peaks: with the
constant the policy covers every measured cell of the family it is priced on (forward and
forward+backward), and with the next value in the direction of a tighter estimate it
misses the cells the constant's docstring names. The cells are test_tight.py's
``CASES``, read raw from golden/sources (the ids and peaks of golden/cells.csv's
measured cells, which test_tight.py holds), each priced from its recorded counts through
``cpmem.pricing.registry.price``. The alternative value is set where the constant is
read (the layer-kind module), so a changed constant fails here for a measured reason.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from test_tight import CASES

import cpmem.pricing.kinds.attention as attention
import cpmem.pricing.kinds.gdn as gdn
import cpmem.pricing.kinds.moe as moe
from cpmem.pricing.registry import price
from cpmem.pricing.tight.calibrated import (
    MOE_COMPILED_ROW_FP32_F,
    SEGMENT_STATES_SPARED,
    UNGATED_RUNTIME_Q,
)
from cpmem.step.step import Step

Case = tuple[str, Step, int, int]


def _family(select: Callable[[Step], bool]) -> list[Case]:
    return [c for c in CASES if select(c[1])]


def _misses(cases: list[Case]) -> set[str]:
    """The cells (and figures) ``tight`` prices below their measured peak."""
    out: set[str] = set()
    for name, step, forward, forward_backward in cases:
        est = price(step, "tight")
        if est.estimate_bytes < forward:
            out.add(f"{name} forward")
        assert est.forward_backward_bytes is not None
        if est.forward_backward_bytes < forward_backward:
            out.add(f"{name} forward+backward")
    return out


def test_ungated_runtime_q_is_the_least_that_covers_the_ungated_cells(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``UNGATED_RUNTIME_Q``: the Q-wide tensor the measured runtime keeps per ungated
    attention layer beyond the rank simulator's set. Every measured ungated cell is a
    Qwen3-1.7B one (TP2, and the TP1 CP2 cells); with the constant ``tight`` covers all of
    them, with one Q fewer it misses TP2 cells, eager and compiled."""
    ungated = _family(lambda s: not s.geometry.attention_output_gate)
    assert {c[1].geometry.name for c in ungated} == {"qwen3-1.7b"}
    assert _misses(ungated) == set()
    monkeypatch.setattr(attention, "UNGATED_RUNTIME_Q", UNGATED_RUNTIME_Q - 1)
    missed = _misses(ungated)
    assert {
        "tp:eager_control:Qwen3-1.7B:tp2:selective:core_attn:eager:8192+8192 forward",
        "tp:final:Qwen3-1.7B:tp2:selective:core_attn:compiled:4096+4096 forward",
    } <= missed
    assert all(":tp2:" in m for m in missed)


def test_segment_states_spared_is_the_most_that_covers_the_hybrid_cells(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``SEGMENT_STATES_SPARED``: a GDN layer keeps ``2n - 1`` of the ``2n`` segment states
    of ``n`` segments. With one spared ``tight`` covers every measured hybrid cell; with
    two spared (``2n - 2``) it misses the short two-segment cells, where the states are
    the largest share of the peak (the 27B TP4 and TP8 64+64 cells, the 4B CP2 64+64
    cell), and of the dense hybrids only cells of at most 512 tokens (the hybrid MoE's
    checkpointed cells sit within 1% of their peak, so any byte less misses them)."""
    hybrid = _family(lambda s: s.geometry.gdn_layers > 0)
    assert _misses(hybrid) == set()
    monkeypatch.setattr(gdn, "SEGMENT_STATES_SPARED", SEGMENT_STATES_SPARED + 1)
    missed = _misses(hybrid)
    assert {
        "tp:final:Qwen3.8-27B:tp4:selective:core_attn:compiled:64+64 forward",
        "tp:final:Qwen3.8-27B:tp8:selective:core_attn:compiled:64+64 forward",
        "cp:4b-selective:64+64 forward",
    } <= missed
    short = {c[0] for c in hybrid if c[1].plan.logical_tokens <= 512}
    dense = {c[0] for c in hybrid if not c[1].geometry.is_moe}
    assert {m.rsplit(" ", 1)[0] for m in missed} & dense <= short


def test_moe_compiled_row_fp32_is_the_least_that_covers_the_compiled_moe_cells(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``MOE_COMPILED_ROW_FP32_F``: one fp32 ``F_e`` tensor (``2·F_e`` bf16 elements) per
    expert row the measured compiled MoE runs keep beyond the fused set. With it
    ``tight`` covers every measured MoE cell; with one ``F_e`` fewer it misses the
    compiled ``core_attn`` (balanced) cells the simulator is short on, and no eager
    cell (where it is not priced)."""
    moe_cells = _family(lambda s: s.geometry.is_moe)
    assert _misses(moe_cells) == set()
    monkeypatch.setattr(moe, "MOE_COMPILED_ROW_FP32_F", MOE_COMPILED_ROW_FP32_F - 1)
    missed = _misses(moe_cells)
    assert "tp:final:Qwen3.5-35B-A3B:tp4:selective:core_attn:compiled:1500+1500 forward" in missed
    assert all(":core_attn:compiled:" in m for m in missed)
