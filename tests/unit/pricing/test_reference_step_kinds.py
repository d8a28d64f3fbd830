"""The reference charges a process's kernel set-up once: the first step in its activations
(``cold_setup``, 64 MiB before the 1.10 factor), a steady step in its static memory (the
cuBLAS and Transformer Engine workspaces the set-up left); and the golden layer's warm
cells' recorded estimates, made by an estimator that charged the allowance on every step,
are reproduced with that estimator's structure (``as_recorded``)."""

from __future__ import annotations

import pytest

from cpmem.api import describe_step, estimate
from cpmem.calibration.variant import as_recorded
from cpmem.golden.cells import load_cells
from cpmem.pricing.reference import REFERENCE, price_reference
from cpmem.samples.cells import cell_step, cell_was_cold

MIB = 2**20
PAIR = {"lengths": [4096, 4096], "shared_prefix": 1228, "cp": 2, "head": "hidden"}
# docs/pricing.md's worked example (27B CP 2, 4096+4096 sharing 1228), term by term:
# returned and gathered hidden states (2 x 8,192 x 5,120 x 2 B), 3 segments' states in 48
# GDN layers (6,414,336 B each), the busiest rank's 4,096 tokens x 2 B x 8,142,848 features
BODY = 2 * 8192 * 5120 * 2 + 3 * 48 * 6_414_336 + 4096 * 2 * 8_142_848
WORKSPACES = ("cublas_workspaces", "te_cublaslt_workspace")


@pytest.mark.parametrize("policy", ["reference", "global"])
def test_the_first_step_charges_the_allowance_and_a_steady_one_its_workspaces(
    policy: str,
) -> None:
    first = estimate("qwen3.5-27b", policy=policy, step="first", **PAIR)
    steady = estimate("qwen3.5-27b", policy=policy, step="steady", **PAIR)
    assert first.components["cold_setup"] == 64 * MIB
    assert steady.components["cold_setup"] == 0
    assert first.static is not None and steady.static is not None
    assert not any(first.static.components.get(w, 0) for w in WORKSPACES)
    assert all(steady.static.components[w] > 0 for w in WORKSPACES)
    if policy == "reference":  # the busiest rank's tokens: the worked example's terms
        assert first.estimate_bytes == int((BODY + 64 * MIB) * 1.10) == 74_651_231_846
        assert steady.estimate_bytes == int(BODY * 1.10)


def _warm_recorded() -> list[tuple[str, int]]:
    return [
        (c.cell_id, c.recorded_estimate_bytes)
        for c in load_cells()
        if not cell_was_cold(c)
        and c.recorded_estimate_bytes is not None
        and c.phase in ("final", "eager_control")
    ]


def test_warm_cells_recorded_estimates_held_the_allowance() -> None:
    """A cell whose first and repeat forward peaks agree ran warm (a steady step); the
    estimate recorded for it still charged the 64 MiB allowance: priced as a steady step
    it is 64 MiB x 1.10 (one byte either way for the rounding) under the record, priced
    with the allowance on every step it is the record to the byte."""
    warm = _warm_recorded()
    assert len(warm) == 20  # 3 eager_control rows (1.7B) and 17 final rows
    by_id = {c.cell_id: c for c in load_cells()}
    for cell_id, recorded in warm:
        step = cell_step(by_id[cell_id])
        assert not step.cold
        steady = price_reference(step, REFERENCE, "reference").estimate_bytes
        assert recorded - steady in (int(64 * MIB * 1.10), int(64 * MIB * 1.10) + 1)
        assert price_reference(step, as_recorded(REFERENCE), "reference").estimate_bytes == (
            recorded
        )


def test_as_recorded_changes_nothing_on_a_first_step() -> None:
    step = describe_step("qwen3.5-27b", step="first", **PAIR)
    plain = price_reference(step, REFERENCE, "reference")
    assert price_reference(step, as_recorded(REFERENCE), "reference") == plain
