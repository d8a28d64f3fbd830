"""Gradient accumulation at pp = 1: micro-batches one after another, the step priced at
its largest (megatron-core's ``forward_backward_no_pipelining`` runs each micro-batch's
forward and backward before the next one's forward)."""

from __future__ import annotations

import pytest

from cpmem.admission.admission import admit
from cpmem.api import estimate
from cpmem.errors import InputError
from cpmem.units import GIB

M4 = "qwen3.5-4b"


@pytest.mark.parametrize("policy", ["reference", "tight"])
def test_the_step_is_its_largest_microbatch(policy: str) -> None:
    """Each micro-batch's activations are freed by its own backward, so the step holds
    one micro-batch's at a time: the 65,536-token one's, in either order."""
    alone = estimate(M4, [65536], policy=policy)
    for order in ([[4096], [65536]], [[65536], [4096], [4096]]):
        est = estimate(M4, microbatch_requests=order, policy=policy)
        assert est.estimate_bytes == alone.estimate_bytes
        assert est.forward_backward_bytes == alone.forward_backward_bytes
        assert est.logical_tokens == 65536
        assert any("largest" in n for n in est.notes)


def test_admission_prices_the_largest_microbatch_and_does_not_split_it() -> None:
    """``admit --microbatch-lengths "4096;65536" --budget-gib 30``: the 65,536-token
    micro-batch alone needs far more than 30 GiB; admission refuses the step rather than
    pricing its first micro-batch (or splitting the trainer's micro-batches again); it
    requires the larger of the first and the steady step, the first here (the 64 MiB
    cold allowance)."""
    d = admit(M4, microbatch_requests=[[4096], [65536]], budget_bytes=30 * GIB)
    assert d.action == "refuse"
    first = estimate(M4, [65536], step="first").estimate_bytes
    assert first > estimate(M4, [65536]).estimate_bytes
    assert d.required_bytes == first
    assert not any(v.startswith("split-") for v, _ in d.considered)


@pytest.mark.parametrize(
    "extra",
    [
        {"lengths": [4096]},
        {"shared_prefix": 512},
        {"packed_tokens": 8192},
        {"logical_tokens": 8192},
        {"segments": 2},
        {"busiest_tokens": 4096, "cp": 2},
    ],
)
def test_a_microbatch_source_with_another_request_is_refused(extra: dict[str, object]) -> None:
    with pytest.raises(InputError) as err:
        estimate(M4, microbatch_requests=[[4096], [2048]], **extra)  # type: ignore[arg-type]
    assert err.value.field == "microbatch_requests"
