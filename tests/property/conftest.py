"""Hypothesis profiles for the property suite.

``ci`` is what ``nox -s property`` runs: many examples, derandomized so a red CI
run reproduces exactly, no deadline (shared 2-core runners have noisy timing).
``dev`` is the quick default for a local ``pytest tests/property``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# The oracles live at the repository root, outside the installed package.
ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

settings.register_profile(
    "ci",
    max_examples=500,
    derandomize=True,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "dev",
    max_examples=50,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)


def pytest_configure(config: pytest.Config) -> None:
    """Default to ``dev`` unless ``--hypothesis-profile`` chose one (the plugin loads it)."""
    if not config.getoption("--hypothesis-profile", default=None):
        settings.load_profile("dev")
