"""The published example configs (``examples/<model>/config.json``) as the family tests
read them, and the refusal a config gets from ``load_config``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cpmem.errors import ConfigError
from cpmem.model.hf_config import load_config

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def example(name: str) -> dict[str, Any]:
    """``examples/<name>/config.json`` as published."""
    return json.loads((EXAMPLES / name / "config.json").read_text())


def refused(cfg: dict[str, Any]) -> ConfigError:
    """The error ``load_config`` refuses ``cfg`` with (the test fails if it is read)."""
    with pytest.raises(ConfigError) as err:
        load_config(cfg)
    return err.value
