"""The measured evidence behind the constants ``tight`` chose from golden cells.

cpmem/pricing/tight/calibrated.py names, for each constant it holds, the cells that
chose it. Each test here recomputes that evidence from the measured sources read raw
with the csv module (``raw_sources``) and the documented model geometry, and fails
when the constant stops matching it. Nothing here prices a cell with cpmem.

``COLD_SETUP`` and ``LOSS_BACKWARD_OUTPUTS`` are restated from the golden cells by
tests/golden/test_fitting.py; the fitted ``MARGIN`` by the refit there.
"""

from __future__ import annotations

import pytest
from raw_sources import read_source

from cpmem.pricing.tight.calibrated import CP_HYBRID_BACKWARD_AUTOTUNE, EAGER_NONE_GATED

MIB = 2**20
BF16 = 2  # bytes per element

CP_ROWS = read_source("art_recompute_memory_cp.csv")

# Qwen3.5-4B (golden/sources/README.md, "Model geometries"): 32 layers, full attention
# at every fourth (8 attention layers), 16 query heads and 4 KV groups of head dim 256
QWEN35_4B_ATTENTION_LAYERS = 32 // 4
QWEN35_4B_Q = 16 * 256
QWEN35_4B_KV = 4 * 256


def _cp_cell(case: str, lengths: str) -> dict[str, str]:
    (row,) = [r for r in CP_ROWS if r["case"] == case and r["lengths"] == lengths]
    assert int(row["measured_samples"]) > 0
    return row


def _backward_rise(row: dict[str, str]) -> int:
    """How far the forward+backward peak rises above the forward peak (bytes)."""
    return int(row["forward_backward_peak_bytes"]) - int(row["forward_peak_bytes"])


def test_cp_hybrid_autotune_is_the_4b_cp2_64_token_cells_backward_excess() -> None:
    """``CP_HYBRID_BACKWARD_AUTOTUNE``: Triton's 256 MiB benchmark buffer in the first
    backward of a CP run of a hybrid model. The 4B CP2 ``core_attn`` cells' backward rise
    above the forward peak (what the first layers' backward and the loss add) is linear
    in the rank's tokens at 2,048 and 4,096 (53.5 and 83.0 MiB); extrapolated to 64
    tokens it is 24.9 MiB. The 64+64 cell rises 279.5 MiB: 254.6 MiB beyond it, the
    buffer's size within 1% and far from the next size a buffer would plausibly have
    (128 or 512 MiB). The attention-only CP2 cells (no GDN kernel to autotune) rise
    37 MiB at 218 tokens."""
    cells = {n: _cp_cell("4b-selective", f"{n}+{n}") for n in (64, 2048, 4096)}
    tokens = {n: int(row["retained_tokens"]) for n, row in cells.items()}
    assert tokens == {64: 64, 2048: 2048, 4096: 4096}
    rise = {n: _backward_rise(row) for n, row in cells.items()}
    assert rise[64] == pytest.approx(279.5 * MIB, abs=0.1 * MIB)
    slope = (rise[4096] - rise[2048]) / (tokens[4096] - tokens[2048])
    explained = rise[2048] - slope * (tokens[2048] - tokens[64])
    assert explained == pytest.approx(24.9 * MIB, abs=0.1 * MIB)
    excess = rise[64] - explained
    assert excess == pytest.approx(CP_HYBRID_BACKWARD_AUTOTUNE, rel=0.01)
    # the same shape's dense counterpart shows nothing of the kind
    dense = _cp_cell("attention-selective", "256+256")
    assert _backward_rise(dense) < CP_HYBRID_BACKWARD_AUTOTUNE / 4


@pytest.mark.parametrize("n", [2048, 4096])
def test_eager_none_gated_is_the_4b_cp2_none_cells_excess_over_core_attn(n: int) -> None:
    """``EAGER_NONE_GATED``: the 4B CP2 cells without recompute (eager) exceed the
    ``core_attn`` cells of the same shape, in forward, by 10,304 elements per rank token
    per attention layer. The gathered K/V of the other rank, which a ``core_attn``
    checkpoint does not keep, is ``2 x KV`` = 2,048 of them; the rest, 8,256, is
    ``2.016 x Q`` (Q = 4,096): two query-wide tensors (the query before the qk-norm and
    before the rope). Both cells peak in forward at the same rank tokens."""
    none, core = _cp_cell("4b-none", f"{n}+{n}"), _cp_cell("4b-selective", f"{n}+{n}")
    assert none["modules"] == "" and core["modules"] == "core_attn"
    assert none["compiled"] == core["compiled"] == "False"
    tokens = int(none["retained_tokens"])
    assert tokens == int(core["retained_tokens"]) == n
    excess = int(none["forward_peak_bytes"]) - int(core["forward_peak_bytes"])
    per_layer_token = excess / (tokens * BF16 * QWEN35_4B_ATTENTION_LAYERS)
    gathered_kv = 2 * QWEN35_4B_KV * (2 - 1)  # K and V of the one other CP rank
    assert per_layer_token - gathered_kv == pytest.approx(8_256, abs=1)
    assert (per_layer_token - gathered_kv) / QWEN35_4B_Q == pytest.approx(
        EAGER_NONE_GATED, abs=0.05
    )
