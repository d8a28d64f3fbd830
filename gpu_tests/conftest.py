"""GPU-marked tests skip, with the reason, wherever no CUDA device is visible.

Why: `nox -s gpu` and CI must stay green on CPU-only machines while the same tests
measure real peaks on a lent H200.
"""

from __future__ import annotations

import pytest


def _no_cuda_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "no CUDA device: torch is not installed"
    if not torch.cuda.is_available():
        return f"no CUDA device: torch {torch.__version__} sees none (torch.cuda.is_available())"
    return None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA device (run with `pytest -m gpu`)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = _no_cuda_reason()
    if reason is None:
        return
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=reason))
