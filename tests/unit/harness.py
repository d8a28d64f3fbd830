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
