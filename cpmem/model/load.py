"""One way to name a model: a preset (name or recorded Hugging Face id), a config.json,
or a ready geometry."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cpmem.errors import InputError
from cpmem.model.geometry import ModelGeometry
from cpmem.model.presets import get_preset


def load_model(
    model: str | ModelGeometry | None = None,
    *,
    config: str | Path | dict[str, Any] | None = None,
    fused_swiglu: bool | None = None,
) -> ModelGeometry:
    """A preset (name or recorded Hugging Face id), a config.json, or a geometry;
    ``fused_swiglu`` overrides the model's activation fusion where given."""
    if config is not None:
        from cpmem.model.hf_config import load_config  # a preset's estimate does without it

        return load_config(config, fused_swiglu=fused_swiglu)
    if model is None:
        raise InputError("model", None, "name a preset or pass a config")
    geometry = model if isinstance(model, ModelGeometry) else get_preset(model)
    if fused_swiglu is not None:
        geometry = geometry.with_fused_swiglu(fused_swiglu)
    return geometry
