"""The calibration harness's step, as ``describe_step``'s keywords.

Every measured cell (golden/) and every recorded estimate of the published sources ran
the harness: the first step of its process (``step="first"``) and a forward that returns
the hidden states (``head="hidden"``, rank-1 adapters, no dropout, the defaults of
``lora_rank`` / ``lora_dropout``). cpmem's defaults are a trainer's steady step with an
LM head, so a test that reproduces a recorded harness figure passes these explicitly.
"""

from __future__ import annotations

from typing import Any

HARNESS: dict[str, Any] = {"head": "hidden", "step": "first"}

H200_TOTAL_BYTES = 150_121_021_440
"""The measured runtime's H200, as torch reports its total (``cpmem.step.device``)."""
H200_RESERVE_BYTES = 4_503_630_644
"""Its 3% reserve, 4,503,630,643.2 B, rounded up so that a budget below comes out whole."""
SEED_BUDGET_BYTES = 87_905_317_069
"""What the measured runtime computed for the seed pair (Qwen3.5-27B, 4,096 + 4,096
tokens, prefix 1,228, CP 2; README, docs/whole-device.md): its budget for the step's
activations, left after its static memory."""


def runtime_budget_flags(budget_bytes: int) -> list[str]:
    """``cpmem admit``'s runtime figures of a process on that H200 that has
    ``budget_bytes`` left for its activations, its static memory already allocated
    (free = the budget + the reserve, nothing reusable): admitted on the activations
    alone, as the runtime admits (``cpmem.admission.budget``)."""
    return [
        "--free-bytes",
        str(budget_bytes + H200_RESERVE_BYTES),
        "--reusable-reserved-bytes",
        "0",
        "--device-total-bytes",
        str(H200_TOTAL_BYTES),
    ]
