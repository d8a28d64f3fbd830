"""torch, imported only when a tensor is needed.

Why: argument handling, row formatting and the provenance record must work (and are
tested) where torch is not installed; only the engines and measurement need it.
"""

from __future__ import annotations

from typing import Any


def load_torch() -> Any:
    import torch

    return torch
