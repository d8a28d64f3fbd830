"""The planner-facing API: one call from a model and a request to an estimate."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cpmem.errors import InputError
from cpmem.model.geometry import ModelGeometry
from cpmem.model.hf_config import load_config
from cpmem.model.presets import get_preset
from cpmem.plan.layout import ParallelLayout
from cpmem.plan.plan import Plan, explicit_plan
from cpmem.plan.planners import check_ranks, plan_request
from cpmem.plan.request import Request
from cpmem.pricing.estimate import Estimate
from cpmem.pricing.inputs import MoeRouting, PricingInput
from cpmem.pricing.profiles import ProfileStore
from cpmem.pricing.recompute import Recompute
from cpmem.pricing.registry import price


def load_model(
    model: str | ModelGeometry | None = None,
    *,
    config: str | Path | dict[str, Any] | None = None,
    fused_swiglu: bool | None = None,
) -> ModelGeometry:
    """A preset (name or recorded Hugging Face id), a config.json, or a geometry."""
    if config is not None:
        return load_config(config, fused_swiglu=fused_swiglu)
    if model is None:
        raise InputError("model", None, "name a preset or pass a config")
    geometry = model if isinstance(model, ModelGeometry) else get_preset(model)
    if fused_swiglu is not None:
        geometry = geometry.with_fused_swiglu(fused_swiglu)
    return geometry


def estimate(
    model: str | ModelGeometry,
    lengths: Sequence[int] | None = None,
    *,
    shared_prefix: int = 0,
    request: Request | None = None,
    plan: Plan | None = None,
    tp: int = 1,
    cp: int = 1,
    sp: bool | None = None,
    ep: int = 1,
    recompute: str | Recompute = "selective",
    modules: str | Sequence[str] | None = None,
    policy: str = "reference",
    planner: str | None = None,
    compiled: bool = False,
    moe_routing: MoeRouting = "concentrated",
    output_bytes: int | None = None,
    profiles: ProfileStore | None = None,
    allow_long: bool = False,
) -> Estimate:
    """Price one forward. Give ``lengths`` (+ ``shared_prefix``), a ``request``, or a
    ready ``plan`` (e.g. from :func:`cpmem.plan.plan.explicit_plan`). SP defaults to on
    when TP > 1, as Megatron runs it.

    A planned request is refused (InputError) when a sequence is longer than the
    model's ``max_position_embeddings`` (unless ``allow_long``) or when its CP size
    leaves a rank with no tokens. ``planner="worst"`` prices the planner that puts the
    most tokens on one rank, for callers who do not know their runtime's layout."""
    geometry = load_model(model)
    rc = recompute if isinstance(recompute, Recompute) else Recompute.parse(recompute, modules)
    if plan is None:
        layout = ParallelLayout(tp=tp, cp=cp, sp=(tp > 1) if sp is None else sp, ep=ep)
        geometry.check_tp(layout.tp)
        if request is None:
            if lengths is None:
                raise InputError("lengths", None, "give lengths, a request or a plan")
            request = Request.shared(list(lengths), shared_prefix)
        geometry.check_lengths(request.sequence_lengths, allow_long)
        plan = plan_request(request, layout, planner, geometry)
        check_ranks(plan, request.real_tokens)
    inputs = PricingInput(
        geometry=geometry,
        plan=plan,
        recompute=rc,
        compiled=compiled,
        moe_routing=moe_routing,
        output_bytes=output_bytes,
        profiles=profiles,
    )
    return price(inputs, policy)


__all__ = ["estimate", "explicit_plan", "load_model"]
