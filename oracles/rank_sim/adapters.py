# mypy: disable-error-code="no-untyped-call,no-any-return"
"""What trains in a step, on megatron-core 0.16's Column/RowParallelLinear: LoRA adapters
on a frozen base (which projections carry one, ``lora_targets``; at which rank,
``lora_rank``; with which adapter dropout, ``lora_dropout``), or, under full-parameter
training (``training="full"``), every base weight and no adapter.

The base projection is megatron's own ``ColumnParallelLinear`` / ``RowParallelLinear``
with a frozen weight, i.e. ``linear_with_frozen_weight`` -> ``LinearWithFrozenWeight``
(tensor_parallel/layers.py, installed): its forward saves only the weight, never the
input, and its backward computes the input gradient alone. So a projection *without* an
adapter keeps nothing for backward; its input lives only as long as something else
holds it.

An adapted projection adds ``B(A(dropout(x)))`` in PEFT's order (Megatron-Bridge's
``dropout_position="pre"``): A is a rank-R linear on the adapter input, B maps R back
to the output width. ``A`` saves its input (the dropped copy when dropout is on, else
``x`` itself) and ``B`` saves the R-wide activation ``A·x`` (R values per token).
Column-parallel: A replicated, B sharded; the adapter input is the (SP-gathered) layer
input. Row-parallel: A sharded, its R-wide partial reduced (or reduce-scattered under
SP), B replicated.

Dropout is torch's own ``aten::native_dropout`` (``torch.native_dropout``): the op
``torch.nn.functional.dropout`` runs on a CUDA tensor (``at::dropout`` takes the fused
kernel when ``is_fused_kernel_acceptable``: a CUDA input, 0 < p < 1). It returns the
bf16 output and a bool mask; autograd keeps the mask (1 B per input element) and A keeps
the output (an input-sized bf16 copy), until backward. On the simulator's fake CPU
tensors ``F.dropout`` would take the CPU decomposition instead (a bf16 noise tensor,
2 B per element), which is not what a GPU runs, hence the direct call. With p = 0 the
adapter input is ``x`` itself (PEFT's ``nn.Identity``).

Full training (training.py has the step's side: main_grad, the gradient hook, the
dummy weight gradients): the base is megatron's ``ColumnParallelLinear`` /
``RowParallelLinear`` with a trainable weight, i.e.
``linear_with_grad_accumulation_and_async_allreduce`` ->
``LinearWithGradAccumulationAndAsyncCommunication`` (tensor_parallel/layers.py, installed):
its forward saves its input and the weight. Under SP a column-parallel projection is
handed the layer's local (sequence-sharded) input and gathers it itself, into megatron's
persistent ``GlobalMemoryBuffer`` ("mpu"), so it keeps the local shard only and gathers
again in backward; a row-parallel one keeps its (feature-sharded) input. Backward makes
the input gradient and the weight gradient: with ``gradient_accumulation_fusion`` (on,
Megatron-LM's default) the GEMM accumulates into the fp32 ``main_grad`` and the function
returns a dummy, else a bf16 weight-sized ``grad_output.t() @ input``.

Names: ``qkv`` (attention QKV), ``proj`` (attention output), ``gdn_in`` / ``gdn_out``
(Gated DeltaNet input/output projections), ``fc1`` / ``fc2`` (the dense MLP's and the
MoE shared expert's), ``experts`` (the routed experts' fc1 and fc2), ``mamba_in`` /
``mamba_out`` (the Mamba-2 mixer's ``in_proj`` / ``out_proj``). Groups: ``all``,
``attention`` (the attention and GDN projections), ``mamba`` (the Mamba-2 mixer's two),
``mlp`` (fc1, fc2, experts).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from oracles.rank_sim.geometry import SimInputError

BF16 = torch.bfloat16
TARGETS = ("qkv", "proj", "fc1", "fc2", "gdn_in", "gdn_out", "experts", "mamba_in", "mamba_out")
GROUPS: dict[str, tuple[str, ...]] = {
    "all": TARGETS,
    "attention": ("qkv", "proj", "gdn_in", "gdn_out"),
    "mamba": ("mamba_in", "mamba_out"),
    "mlp": ("fc1", "fc2", "experts"),
}


def parse_targets(targets: str | Iterable[str]) -> tuple[str, ...]:
    """Names and groups, joined by ``,`` or ``+`` (or given as a sequence), in
    ``TARGETS`` order; an unknown one is a SimInputError naming ``lora_targets``."""
    text = targets if isinstance(targets, str) else ",".join(targets)
    names = [t.strip() for t in text.replace("+", ",").split(",") if t.strip()]
    if not names:
        raise SimInputError("lora_targets", text, "name at least one projection or group")
    chosen: set[str] = set()
    for name in names:
        if name in GROUPS:
            chosen.update(GROUPS[name])
        elif name in TARGETS:
            chosen.add(name)
        else:
            known = ", ".join((*GROUPS, *TARGETS))
            raise SimInputError("lora_targets", name, f"unknown; known: {known}")
    return tuple(t for t in TARGETS if t in chosen)


TRAININGS = ("lora", "full")


@dataclass(frozen=True)
class AdapterSpec:
    """What trains: rank, dropout and targets of the LoRA adapters on a frozen base (the
    harness: 1, 0.0, all), or (``training`` "full") every base weight, no adapter, with
    or without megatron's gradient accumulation fusion (``wgrad_fusion``)."""

    rank: int = 1
    dropout: float = 0.0
    targets: tuple[str, ...] = TARGETS
    training: str = "lora"
    wgrad_fusion: bool = True

    @classmethod
    def parse(
        cls, rank: int = 1, dropout: float = 0.0, targets: str | Iterable[str] = "all",
        training: str = "lora", wgrad_fusion: bool = True,
    ) -> AdapterSpec:  # fmt: skip
        if training not in TRAININGS:
            raise SimInputError("training", training, f"one of {', '.join(TRAININGS)}")
        if training == "full":
            if (rank, float(dropout), parse_targets(targets)) != (1, 0.0, TARGETS):
                raise SimInputError(
                    "training", training,
                    "full training has no adapters: leave lora_rank, lora_dropout and "
                    "lora_targets at their defaults",
                )  # fmt: skip
            return cls(training="full", wgrad_fusion=bool(wgrad_fusion))
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise SimInputError("lora_rank", rank, "must be an integer >= 1")
        try:
            p = float(dropout)
        except (TypeError, ValueError):
            raise SimInputError("lora_dropout", dropout, "must be a number in [0, 1)") from None
        if not 0.0 <= p < 1.0:
            raise SimInputError("lora_dropout", dropout, "must be in [0, 1)")
        return cls(rank, p, parse_targets(targets))

    @property
    def full(self) -> bool:
        """Full-parameter training: every base weight trains, no adapter."""
        return self.training == "full"

    def on(self, name: str) -> bool:
        return not self.full and name in self.targets

    def as_dict(self) -> dict[str, Any]:
        if self.full:
            return {"training": "full", "gradient_accumulation_fusion": self.wgrad_fusion}
        return {"lora_rank": self.rank, "lora_dropout": self.dropout,
                "lora_targets": list(self.targets)}  # fmt: skip


def adapter_input(x: torch.Tensor, p: float) -> torch.Tensor:
    """PEFT's ``lora_dropout(x)``: x itself at p = 0, else torch's fused dropout."""
    if p == 0.0:
        return x
    return torch.native_dropout(x, p, True)[0]


class LoRAColumn(nn.Module):
    """Column-parallel frozen projection on an already gathered input, plus (when the
    projection is a target) a rank-R adapter (A replicated, B sharded) that saves its
    input: the gathered input, or its dropped copy. Trained (full training): megatron's
    projection on the layer's local input, gathering it itself under SP (``project``)."""

    def __init__(
        self, n_in: int, n_out_local: int, cfg: Any, tp: int, spec: AdapterSpec, name: str
    ) -> None:
        super().__init__()
        from megatron.core.tensor_parallel.layers import ColumnParallelLinear

        self.name, self.adapted, self.p = name, spec.on(name), spec.dropout
        self.trained, self.sp = spec.full, bool(cfg.sequence_parallel) and tp > 1
        self.base = ColumnParallelLinear(
            n_in, n_out_local * tp, config=cfg, init_method=nn.init.zeros_, bias=False,
            gather_output=False, skip_bias_add=True,
        )  # fmt: skip
        if self.trained:  # megatron's own SP gather (saves the local shard)
            self.base.gradient_accumulation_fusion = spec.wgrad_fusion
        else:
            self.base.sequence_parallel = False  # the layer gathered the input already
        if self.adapted:
            self.lora_a = nn.Parameter(torch.empty(spec.rank, n_in, dtype=BF16))
            self.lora_b = nn.Parameter(torch.empty(n_out_local, spec.rank, dtype=BF16))

    def forward(self, full: torch.Tensor) -> torch.Tensor:
        out, _ = self.base(full)
        if not self.adapted:
            return out
        return out + F.linear(F.linear(adapter_input(full, self.p), self.lora_a), self.lora_b)

    def project(
        self, hn: torch.Tensor, keep_local: bool | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The projection of a layer's local input ``hn`` (its sequence shard under SP):
        (the tensor the layer holds as the projection's input, the output). LoRA: the
        layer gathers ``hn`` first (``gather_sequence``; ``keep_local`` also keeps the
        local input, by default where the projection is adapted) and holds the gathered
        copy; trained: megatron's linear gathers it and the layer holds ``hn``."""
        from oracles.rank_sim.kernels import gather_sequence

        if self.trained:
            return hn, self(hn)
        keep = self.adapted if keep_local is None else keep_local
        full = gather_sequence(hn, self.sp, keep_local=keep)
        del hn  # the local input lives on only where something keeps it
        return full, self(full)


class LoRARow(nn.Module):
    """Row-parallel frozen projection (reduce-scattered under SP) plus (when a target) a
    rank-R adapter (A sharded, its R-wide partial reduced or scattered, B replicated)."""

    def __init__(
        self, n_in_local: int, n_out: int, cfg: Any, layout: Any, spec: AdapterSpec, name: str
    ) -> None:
        super().__init__()
        from megatron.core.tensor_parallel.layers import RowParallelLinear

        self.layout = layout
        self.name, self.adapted, self.p = name, spec.on(name), spec.dropout
        self.base = RowParallelLinear(
            n_in_local * layout.tp, n_out, config=cfg, init_method=nn.init.zeros_, bias=False,
            input_is_parallel=True, skip_bias_add=True,
        )  # fmt: skip
        if spec.full:
            self.base.gradient_accumulation_fusion = spec.wgrad_fusion
        if self.adapted:
            self.lora_a = nn.Parameter(torch.empty(spec.rank, n_in_local, dtype=BF16))
            self.lora_b = nn.Parameter(torch.empty(n_out, spec.rank, dtype=BF16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from megatron.core.tensor_parallel import mappings

        out, _ = self.base(x)
        if not self.adapted:
            return out
        mid = F.linear(adapter_input(x, self.p), self.lora_a)
        if self.layout.sp:
            mid = mappings.reduce_scatter_to_sequence_parallel_region(mid)
        elif self.layout.tp > 1:
            mid = mappings.reduce_from_tensor_model_parallel_region(mid)
        return out + F.linear(mid, self.lora_b)


class LoRADuplicated(nn.Module):
    """A frozen projection replicated on every TP rank, on the rank's own rows (Transformer
    Engine's ``TELinear`` with ``parallel_mode="duplicated"``: megatron's TE spec for the
    MLA down projections), plus (when a target) a rank-R adapter, A and B replicated. The
    frozen base is ``F.linear`` on a weight without grad: it saves only the weight.
    Trained: megatron's ``linear_with_grad_accumulation_and_async_allreduce`` without a
    TP collective (saves the local input; the weight gradient as any trained linear)."""

    def __init__(self, n_in: int, n_out: int, spec: AdapterSpec, name: str) -> None:
        super().__init__()
        self.name, self.adapted, self.p = name, spec.on(name), spec.dropout
        self.trained, self.fusion = spec.full, spec.wgrad_fusion
        self.weight = nn.Parameter(torch.empty(n_out, n_in, dtype=BF16), requires_grad=False)
        if self.adapted:
            self.lora_a = nn.Parameter(torch.empty(spec.rank, n_in, dtype=BF16))
            self.lora_b = nn.Parameter(torch.empty(n_out, spec.rank, dtype=BF16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.trained:
            from megatron.core.tensor_parallel.layers import (
                linear_with_grad_accumulation_and_async_allreduce as trained_linear,
            )

            return trained_linear(x, self.weight, None, self.fusion, False, False)
        out = F.linear(x, self.weight)
        if not self.adapted:
            return out
        return out + F.linear(F.linear(adapter_input(x, self.p), self.lora_a), self.lora_b)
