"""What the rank-simulator family tests share: a published example config, and one more
layer's retained elements per token against ``tight``'s first-layer widths.

Per-layer elements per token are the difference between 3 and 2 layers of one label's
retained bytes, on ``N`` tokens of one sequence, bf16, without recompute. The callers
import this after ``pytest.importorskip("torch")`` and ``("megatron.core")``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cpmem.api import describe_step
from cpmem.model.geometry import ModelGeometry
from cpmem.pricing.tight.compose import TightWidths, tight_widths
from oracles.rank_sim.geometry import SimModel
from oracles.rank_sim.layout import GdnPiece, RankLayout
from oracles.rank_sim.recompute import Recompute
from oracles.rank_sim.runner import simulate_rank

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NONE = Recompute.parse("none", "")
R = 1  # the harness's LoRA rank, on every projection
BF16 = 2  # bytes
N = 256  # tokens on the rank


def example_config(name: str, **small: Any) -> dict[str, Any]:
    """``examples/<name>/config.json`` with ``small``'s fields set over it."""
    cfg: dict[str, Any] = json.loads((EXAMPLES / name / "config.json").read_text())
    cfg.update(small)
    return cfg


def rank_layout(tp: int, sp: bool) -> RankLayout:
    """One sequence of ``N`` tokens on a rank of ``tp``, SP as given, no CP."""
    return RankLayout(tp, 1, 0, (N,), (N,), (GdnPiece(N),), N, sp)


def layer_per_token(model: SimModel, label: str, tp: int, sp: bool) -> float:
    """Retained bf16 elements per token of ``label`` that one more layer adds."""
    layout = rank_layout(tp, sp)
    got = [
        simulate_rank(model.truncated(n), layout, NONE).components["retained"].get(label, 0)
        for n in (2, 3)
    ]
    return (got[1] - got[0]) / BF16 / N


def tight_first_layer(geometry: ModelGeometry, tp: int) -> TightWidths:
    """``tight``'s widths of ``geometry`` on ``N`` tokens at ``tp`` (SP above TP 1)."""
    step = describe_step(
        geometry, [N], head="hidden", step="first", recompute="none", tp=tp, sp=tp > 1
    )
    return tight_widths(geometry, step)
