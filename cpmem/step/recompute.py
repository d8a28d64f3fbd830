"""Recompute settings: what backward rebuilds instead of keeping, as a typed value.

Pricing asks a ``Recompute`` what it does (``keeps_gradients``, ``checkpoints(MLP)``,
``one_layer_at_a_time``...) and never compares its mode as text; text appears only where
a setting is parsed (the CLI, golden CSV rows) or shown (``label``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from cpmem.errors import InputError


class Mode(StrEnum):
    """``selective`` recomputes the named modules; ``none`` keeps everything; ``full``
    keeps each layer's input and recomputes the layer; ``no-grad`` runs forward only."""

    SELECTIVE = "selective"
    NONE = "none"
    FULL = "full"
    NO_GRAD = "no-grad"


class Module(StrEnum):
    """The sub-layers a selective recompute can checkpoint, named as megatron-core's
    ``recompute_modules`` names them (transformer_config.py:560-582 at the recordings'
    snapshot). ``core_attn``, ``mlp``, ``moe`` and ``shared_experts`` run under a checkpoint that keeps the
    module's inputs and recomputes it whole; ``layernorm``, ``moe_act`` and
    ``mla_up_proj`` under an output-discarding one (``CheckpointWithoutOutput``): the
    module's forward saves nothing, and its output's storage is freed once its consumer
    has run and rebuilt in that layer's backward (``cpmem.pricing.kinds.discarded``)."""

    CORE_ATTN = "core_attn"
    MLP = "mlp"
    MOE = "moe"
    LAYERNORM = "layernorm"
    """A sub-layer's input norm where it is a module of its own (transformer_layer.py:
    475-530): its output."""
    MOE_ACT = "moe_act"
    """The routed experts' activation (moe/experts.py:1019-1030): its saved set and its
    output, fc2's input."""
    SHARED_EXPERTS = "shared_experts"
    """An MoE layer's shared experts under a checkpoint of their own (moe/moe_layer.py:
    507-532): their saved set; their input, the pre-MLP norm's output, stays."""
    MLA_UP_PROJ = "mla_up_proj"
    """Latent attention's up projections and rope (multi_latent_attention.py:983-988,
    455-457): their saved sets and the core attention's query, key and value."""


MODES: tuple[str, ...] = tuple(m.value for m in Mode)
MODULES: tuple[str, ...] = tuple(m.value for m in Module)


def _mode(value: str) -> Mode:
    try:
        return Mode(value)
    except ValueError:
        raise InputError("recompute", value, f"must be one of {list(MODES)}") from None


def _module(value: str) -> Module:
    try:
        return Module(value)
    except ValueError:
        raise InputError(
            "modules", value, f"unknown recompute module; use {list(MODULES)}"
        ) from None


FullMethod = Literal["uniform", "block"]
FULL_METHODS: tuple[FullMethod, ...] = ("uniform", "block")


@dataclass(frozen=True)
class Recompute:
    """One recompute setting: a mode and, for ``selective``, the checkpointed modules.

    Under ``full``, megatron's ``--recompute-method`` and ``--recompute-num-layers`` ``k``
    (``transformer_block.py``, ``_checkpointed_forward``): ``uniform`` checkpoints groups
    of ``k`` consecutive layers (each group keeps its input; backward recomputes a group
    at a time), ``block`` checkpoints each of the first ``k`` layers of a chunk on its own
    and runs the rest without recompute. ``uniform`` with ``k = 1`` (the default) keeps
    every layer's input and recomputes one layer at a time."""

    mode: Mode = Mode.SELECTIVE
    modules: tuple[Module, ...] = (Module.CORE_ATTN,)
    full_method: FullMethod = "uniform"
    full_layers: int = 1

    def __post_init__(self) -> None:
        if self.full_method not in FULL_METHODS:
            raise InputError(
                "recompute_method", self.full_method, f"must be one of {list(FULL_METHODS)}"
            )
        if isinstance(self.full_layers, bool) or not isinstance(self.full_layers, int):
            raise InputError("recompute_num_layers", self.full_layers, "must be an integer")
        if self.full_layers < 1:
            raise InputError("recompute_num_layers", self.full_layers, "must be >= 1")
        mode = _mode(self.mode)
        # only a selective recompute names modules; the others take none
        modules = tuple(_module(m) for m in self.modules) if mode is Mode.SELECTIVE else ()
        if mode is Mode.SELECTIVE and not modules:
            raise InputError("modules", "", "selective recompute needs at least one module")
        object.__setattr__(self, "mode", mode)
        object.__setattr__(self, "modules", modules)

    @classmethod
    def parse(cls, mode: str, modules: str | Iterable[str] | None = None) -> Recompute:
        """From CLI/CSV text: ``modules`` as ``core_attn+mlp`` or ``core_attn,mlp``; modules
        given with a mode other than ``selective`` are ignored, as the constructor does."""
        if isinstance(modules, str):
            names = tuple(m.strip() for m in modules.replace(",", "+").split("+") if m.strip())
        elif modules is None:
            names = (Module.CORE_ATTN,) if mode == Mode.SELECTIVE else ()
        else:
            names = tuple(modules)
        checked = _mode(mode)
        if checked is not Mode.SELECTIVE:
            names = ()
        return cls(mode=checked, modules=tuple(_module(m) for m in names))

    @property
    def keeps_gradients(self) -> bool:
        """Whether backward follows (everything but ``no-grad``)."""
        return self.mode is not Mode.NO_GRAD

    @property
    def keeps_everything(self) -> bool:
        """``none``: every layer keeps its whole saved set."""
        return self.mode is Mode.NONE

    @property
    def full(self) -> bool:
        """``full``: each layer keeps its input and is recomputed whole in backward."""
        return self.mode is Mode.FULL

    @property
    def one_layer_at_a_time(self) -> bool:
        """Whether the forward runs every layer without saving its set (``full`` keeps only
        the layer inputs, ``no-grad`` nothing): one layer's working set is live at a time."""
        return self.mode in (Mode.FULL, Mode.NO_GRAD)

    @property
    def keeps_saved_sets(self) -> bool:
        """Whether layers keep their saved sets until backward (``selective``, ``none``)."""
        return self.mode in (Mode.SELECTIVE, Mode.NONE)

    def checkpoints(self, module: Module) -> bool:
        """Whether a selective recompute checkpoints ``module`` (drops its saved set)."""
        return self.mode is Mode.SELECTIVE and module in self.modules

    @property
    def full_group(self) -> tuple[str, int]:
        """Under ``full``, (method, layers): ``("uniform", 1)`` is one layer at a time."""
        return self.full_method, self.full_layers

    def full_kept(self, layers: int) -> tuple[int, int]:
        """Of ``layers`` consecutive layers (one model chunk) under ``full``: (layers that
        keep their whole saved set, checkpoints that keep only their input). ``uniform``:
        none and one per group of ``k``; ``block``: all but the first ``k``, and ``k``."""
        if self.full_method == "uniform":
            return 0, -(-layers // self.full_layers)
        recomputed = min(self.full_layers, layers)
        return layers - recomputed, recomputed

    def full_recomputed(self, layers: int) -> int:
        """Layers backward recomputes at once under ``full``: a uniform group, or one."""
        return min(self.full_layers, layers) if self.full_method == "uniform" else 1

    @property
    def label(self) -> str:
        if self.mode is Mode.FULL and self.full_group != ("uniform", 1):
            return f"full({self.full_method}:{self.full_layers})"
        return f"{self.mode}({'+'.join(self.modules)})" if self.modules else str(self.mode)
