"""Small estimators that are not cpmem policies, for the external-estimator gate.

They read only the description (``cpmem golden export``): the config's
``hidden_size``, ``num_hidden_layers`` and ``vocab_size``, the busiest rank's tokens,
TP and (``head_aware``) the head.

``generous``: 1 GiB plus 40 bf16 copies of the hidden state per layer and token on
the busiest rank, ignoring that TP/SP shards them; forward+backward twice that.
It covers every measured cell (the test checks each one against the recorded peak).

``capped``: the same, but believes no rank ever needs more than ``CAP`` bytes, so
it misses the cells whose measured peak is above the cap.

``head_aware``: ``generous`` plus the logits the step's head keeps on the busiest rank
(its vocabulary shard, ``vocab_size / tp``): bf16 logits and their fp32 softmax for
``logits``, the bf16 logits alone for ``fused``, one chunk's worth of both for
``chunked:N``, none for ``hidden`` (no head) and ``linear-ce`` (never materialised).
"""

from __future__ import annotations

import math
from typing import Any

GIB = 1 << 30
COPIES = 40
CAP = 80 * GIB
BF16, FP32 = 2, 4


def _forward(cell: dict[str, Any]) -> int:
    cfg = cell["config"]
    return GIB + COPIES * cell["busiest_tokens"] * cfg["hidden_size"] * cfg["num_hidden_layers"] * 2


def generous(cell: dict[str, Any]) -> dict[str, int]:
    fwd = _forward(cell)
    return {"forward": fwd, "forward_backward": 2 * fwd}


def capped(cell: dict[str, Any]) -> int:
    return min(_forward(cell), CAP)


def logits_bytes(cell: dict[str, Any]) -> int:
    """The logits ``head_aware`` adds for the description's head."""
    tokens = cell["busiest_tokens"]
    shard = math.ceil(cell["config"]["vocab_size"] / cell["tp"])
    kind = cell["head_kind"]
    if kind == "logits":
        return tokens * shard * (BF16 + FP32)
    if kind == "fused":
        return tokens * shard * BF16
    if kind == "chunked":
        return min(cell["head_chunk"], tokens) * shard * (BF16 + FP32)
    return 0  # hidden: no head; linear-ce: the logits are never materialised


def head_aware(cell: dict[str, Any]) -> dict[str, int]:
    fwd = _forward(cell) + logits_bytes(cell)
    return {"forward": fwd, "forward_backward": 2 * fwd}


def not_bytes(cell: dict[str, Any]) -> str:
    return "a lot"
