"""Recompute settings as megatron runs them: none; selective ``core_attn`` / ``mlp`` /
``moe`` (megatron's reentrant ``tensor_parallel.checkpoint`` around the core attention /
the MLP after its norm / the MoE layer on the pre-MLP norm output); full (uniform, one layer per checkpoint); and a no-grad forward."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from oracles.rank_sim.geometry import SimInputError

MODES = ("none", "selective", "full", "no-grad")
MODULES = ("core_attn", "mlp", "moe")


@dataclass(frozen=True)
class Recompute:
    mode: str = "selective"
    modules: tuple[str, ...] = ("core_attn",)

    @classmethod
    def parse(cls, mode: str, modules: str | None = None) -> Recompute:
        if mode not in MODES:
            raise SimInputError("recompute", mode, f"one of {', '.join(MODES)}")
        if mode != "selective":
            return cls(mode, ())
        names = tuple(m for m in (modules or "core_attn").split("+") if m)
        for name in names:
            if name not in MODULES:
                raise SimInputError(
                    "modules", modules, f"selective modules are {'+'.join(MODULES)}"
                )
        return cls(mode, names)

    @property
    def core_attn(self) -> bool:
        return self.mode == "selective" and "core_attn" in self.modules

    @property
    def mlp(self) -> bool:
        return self.mode == "selective" and "mlp" in self.modules

    @property
    def moe(self) -> bool:
        """megatron's ``moe`` module: MoELayer.forward under its checkpoint."""
        return self.mode == "selective" and "moe" in self.modules

    @property
    def full(self) -> bool:
        return self.mode == "full"

    @property
    def no_grad(self) -> bool:
        return self.mode == "no-grad"

    @property
    def label(self) -> str:
        return f"{self.mode}:{'+'.join(self.modules)}" if self.modules else self.mode

    def checkpoint(self, fn: Callable[..., Any], *args: Any) -> Any:
        """megatron's reentrant checkpoint: saves the inputs, reruns ``fn`` in backward."""
        from megatron.core.tensor_parallel.random import checkpoint

        return checkpoint(fn, False, *args)
