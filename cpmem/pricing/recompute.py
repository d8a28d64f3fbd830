"""Recompute settings: what backward will rebuild instead of keeping."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from cpmem.errors import InputError

Mode = Literal["selective", "none", "full", "no-grad"]
MODES: tuple[Mode, ...] = ("selective", "none", "full", "no-grad")
MODULES = ("core_attn", "mlp", "moe")


@dataclass(frozen=True)
class Recompute:
    """``selective`` recomputes the named modules; ``none`` keeps everything; ``full``
    keeps each layer's input and recomputes the layer; ``no-grad`` runs forward only."""

    mode: Mode = "selective"
    modules: tuple[str, ...] = ("core_attn",)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise InputError("recompute", self.mode, f"must be one of {list(MODES)}")
        for m in self.modules:
            if m not in MODULES:
                raise InputError("modules", m, f"unknown recompute module; use {list(MODULES)}")
        if self.mode == "selective" and not self.modules:
            raise InputError("modules", "", "selective recompute needs at least one module")

    @classmethod
    def parse(cls, mode: str, modules: str | Iterable[str] | None = None) -> Recompute:
        """From CLI/CSV text: ``modules`` as ``core_attn+mlp`` or ``core_attn,mlp``."""
        if isinstance(modules, str):
            names = tuple(m for m in modules.replace(",", "+").split("+") if m.strip())
            names = tuple(m.strip() for m in names)
        elif modules is None:
            names = ("core_attn",) if mode == "selective" else ()
        else:
            names = tuple(modules)
        if mode != "selective":
            names = ()
        return cls(mode=mode, modules=names)  # type: ignore[arg-type]

    @property
    def keeps_gradients(self) -> bool:
        return self.mode != "no-grad"

    @property
    def label(self) -> str:
        return f"{self.mode}({'+'.join(self.modules)})" if self.modules else self.mode
