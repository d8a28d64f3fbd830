"""The planner-facing API: one call from a model and a request to an estimate.

``estimate`` takes ``describe_step``'s arguments (``cpmem.step.describe``), so every
option it accepts is the one the CLI, admission and the gate pass the same way;
``describe_step`` returns the ``Step`` itself for callers that price it several ways
(``price_step``, ``cpmem.admission.admit``). ``describe_megatron`` reads a Megatron-LM
GPT training run from Megatron-LM's own arguments into that same step description
(``estimate_megatron`` prices it), so a Megatron-LM run is admitted, searched and
priced as any step is.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Unpack

from cpmem.errors import InputError, require_bytes
from cpmem.model.geometry import ModelGeometry
from cpmem.model.load import load_model
from cpmem.plan.plan import explicit_plan
from cpmem.pricing.estimate import Estimate
from cpmem.pricing.registry import price
from cpmem.step.describe import StepArguments, describe_settings, describe_step
from cpmem.step.device import Device
from cpmem.step.profiles import ProfileSignature, ProfileStore
from cpmem.step.step import Step

if TYPE_CHECKING:
    from cpmem.megatron.args import MegatronArgs


def estimate(
    model: str | ModelGeometry | None = None,
    lengths: list[int] | tuple[int, ...] | None = None,
    *,
    policy: str | None = None,
    **options: Unpack[StepArguments],
) -> Estimate:
    """Price one forward with ``policy`` (None: the step's runtime's, ``reference`` for
    ART's trainer and ``tight`` for Megatron-LM's, ``Runtime.default_policy``). ``options`` are ``describe_step``'s: a request
    (``lengths`` + ``shared_prefix``, or ``request``), a ready ``plan`` (e.g. from
    :func:`cpmem.plan.plan.explicit_plan`) or a plan's counts (``logical_tokens``,
    ``packed_tokens``, ``rank_tokens`` / ``busiest_tokens``, ``segments``); the layout
    (``tp``, ``cp``, ``sp`` (on when TP > 1 by default, as Megatron runs it), ``ep``);
    ``recompute`` + ``modules``; ``planner`` (``"worst"`` for callers who do not know
    their runtime's layout); ``compiled``, ``moe_routing``, ``step`` (``steady`` or ``first``); ``profiles``;
    ``output_bytes``; ``allow_long``; ``config`` / ``fused_swiglu`` for the model.

    A planned request is refused (InputError) when a sequence is longer than the model's
    ``max_position_embeddings`` (unless ``allow_long``) or when its CP size leaves a rank
    with no tokens."""
    return price_step(describe_step(model, lengths, **options), policy)


def price_step(step: Step, policy: str | None = None) -> Estimate:
    """Price a described step with ``policy`` (None: its runtime's)."""
    return price(step, policy)


def record_profile(
    path: str | Path,
    peak_bytes: int,
    model: str | ModelGeometry | None = None,
    lengths: list[int] | tuple[int, ...] | None = None,
    **options: Unpack[StepArguments],
) -> tuple[ProfileSignature, int]:
    """Record a measured activation peak (``peak_bytes``: the busiest rank's allocated
    bytes at the forward's peak less those before it) for the step ``options`` describe,
    into the JSON store at ``path`` (created if missing, written atomically): the step's
    signature and the busiest rank's tokens it was observed at, as ``--profiles`` floors
    later estimates of the same step (``cpmem.step.profiles``). A pipeline step is
    refused: record a single-stage step's peak; each chunk gets it scaled to its layers."""
    require_bytes("peak_bytes", peak_bytes)
    if "profiles" in options:
        raise InputError("profiles", options["profiles"], "give the store as path")
    step = describe_step(model, lengths, **options)
    if step.settings.pipeline.active or step.microbatches:
        raise InputError(
            "pp", step.settings.pipeline.pp, "record a single-stage step of one micro-batch"
        )
    target = Path(path)
    store = ProfileStore.load(target) if target.exists() else ProfileStore()
    tokens = step.plan.busiest_tokens
    store.observe(step.signature, int(peak_bytes), tokens)
    store.save(target)
    return step.signature, tokens


MEGATRON_POLICY = "tight"
"""The policy a Megatron-LM run is priced with by default: ``tight``, the structure both
measured runtimes check (``reference`` is ART's published LoRA formula and names the
runtime among the options it does not price)."""


def describe_megatron(
    megatron_args: str | Path | MegatronArgs,
    *,
    world_size: int | None = None,
    vocab_size: int | None = None,
    rank: str | int = "busiest",
    device: str | Device = "h100",
    attention_backend: str | None = None,
    container: str = "dev",
    **overrides: Any,
) -> Step:
    """A Megatron-LM GPT run from its arguments (a functional test's ``model_config.yaml``,
    a flags file, a launch script or command line, or ``MegatronArgs``) on ``world_size``
    GPUs of ``device`` (None: the launch's torchrun world; ``vocab_size`` replaces the
    arguments' ``--vocab-size``), as the one step
    description every caller prices (``cpmem.megatron.describe``), answered for ``rank``
    (``busiest``: the stage and data-parallel rank where static memory and activations
    together peak; ``last``: the rank Megatron-LM logs; or a global rank). ``overrides``
    are ``describe_step``'s keywords over the arguments' (``lora_rank``: a LoRA run on
    that model). ``attention_backend`` None: the arguments', ``auto`` as Transformer
    Engine picks it in ``container``. The Megatron-LM readers are imported here: a
    command that prices a preset or a config.json starts without them."""
    from cpmem.megatron.describe import describe_megatron as _describe_megatron

    return _describe_megatron(
        megatron_args,
        world_size=world_size,
        vocab_size=vocab_size,
        rank=rank,
        device=device,
        attention_backend=attention_backend,
        container=container,
        **overrides,
    )


def estimate_megatron(
    megatron_args: str | Path | MegatronArgs,
    *,
    world_size: int | None = None,
    vocab_size: int | None = None,
    rank: str | int = "busiest",
    device: str | Device = "h100",
    attention_backend: str | None = None,
    container: str = "dev",
    policy: str = MEGATRON_POLICY,
    **overrides: Any,
) -> Estimate:
    """A Megatron-LM run priced with ``policy``: ``static`` (allocated between steps) and
    ``peak_bytes`` (the allocator's peak over a steady step) on the answered rank's stage;
    see ``describe_megatron``."""
    step = describe_megatron(
        megatron_args,
        world_size=world_size,
        vocab_size=vocab_size,
        rank=rank,
        device=device,
        attention_backend=attention_backend,
        container=container,
        **overrides,
    )
    return price(step, policy)


__all__ = [
    "MEGATRON_POLICY",
    "describe_megatron",
    "describe_settings",
    "describe_step",
    "estimate",
    "estimate_megatron",
    "explicit_plan",
    "load_model",
    "price_step",
    "record_profile",
]
