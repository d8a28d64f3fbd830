"""An estimator that is not a cpmem policy, gated with
``cpmem gate --estimator examples.my_estimator:estimate`` (docs/external-estimators.md).

A deliberately crude, generous model: 1 GiB plus 40 bf16 copies of the hidden state
per layer for every token on the busiest rank, ignoring that TP/SP shards them; the
whole step twice that. Replace the body with your trainer's own memory model.
"""

from __future__ import annotations

from typing import Any

GIB = 1 << 30


def estimate(cell: dict[str, Any]) -> dict[str, int]:
    cfg = cell["config"]
    hidden, layers = cfg["hidden_size"], cfg["num_hidden_layers"]
    forward = GIB + 40 * cell["busiest_tokens"] * hidden * layers * 2
    return {"forward": forward, "forward_backward": 2 * forward}
