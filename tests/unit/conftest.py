"""Fixtures: the measured sources, read raw."""

from __future__ import annotations

import pytest
from raw_sources import read_source


@pytest.fixture(scope="session")
def cp_rows() -> list[dict[str, str]]:
    return read_source("art_recompute_memory_cp.csv")


@pytest.fixture(scope="session")
def tp_rows() -> list[dict[str, str]]:
    return read_source("art_recompute_memory.csv")
