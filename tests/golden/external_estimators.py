"""Two small estimators that are not cpmem policies, for the external-estimator gate.

Both read only the cell description (``cpmem golden export``): the config's
``hidden_size`` and ``num_hidden_layers`` and the busiest rank's tokens.

``generous``: 1 GiB plus 40 bf16 copies of the hidden state per layer and token on
the busiest rank, ignoring that TP/SP shards them; forward+backward twice that.
It covers every measured cell (the test checks each one against the recorded peak).

``capped``: the same, but believes no rank ever needs more than ``CAP`` bytes, so
it misses the cells whose measured peak is above the cap.
"""

from __future__ import annotations

from typing import Any

GIB = 1 << 30
COPIES = 40
CAP = 80 * GIB


def _forward(cell: dict[str, Any]) -> int:
    cfg = cell["config"]
    return GIB + COPIES * cell["busiest_tokens"] * cfg["hidden_size"] * cfg["num_hidden_layers"] * 2


def generous(cell: dict[str, Any]) -> dict[str, int]:
    fwd = _forward(cell)
    return {"forward": fwd, "forward_backward": 2 * fwd}


def capped(cell: dict[str, Any]) -> int:
    return min(_forward(cell), CAP)


def not_bytes(cell: dict[str, Any]) -> str:
    return "a lot"
