"""What a trainer's step holds beyond the calibration harness: the LM head and its loss,
the adapters (rank, dropout, which projections), and the CP communication of attention.

The measured harness (golden/) is the case ``Head("hidden")``, ``Adapter()`` (rank-1 LoRA
on every projection, no dropout) and ``cp_comm="all_gather"``: every measured figure is
priced at these defaults exactly as before they existed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, get_args

from cpmem.errors import InputError

HeadKind = Literal["hidden", "logits", "fused", "chunked", "linear-ce"]
HEAD_KINDS: tuple[HeadKind, ...] = get_args(HeadKind)
CpComm = Literal["all_gather", "p2p", "a2a", "a2a+p2p"]
CP_COMMS: tuple[CpComm, ...] = get_args(CpComm)
OptimizerKind = Literal["adam", "sgd", "muon", "none"]
OPTIMIZERS: tuple[OptimizerKind, ...] = get_args(OptimizerKind)
MUON_LAYOUTS = ("legacy", "precomputed", "bucketed")
"""Muon's layer-wise distributed optimizer's buffer layouts (``Optimizer.muon_layout``)."""
FSDP_STRATEGIES = (
    "none",
    "no_shard",
    "optim",
    "optim_grads",
    "optim_grads_params",
    "torch_fsdp2",
)
FSDP_BUFFERS = ("dynamic", "double-buffer", "nccl-ub")
"""How Megatron FSDP allocates its units' gathered and gradient buckets: each when used
(``dynamic``), from two persistent buffers per bucket (``--fsdp-double-buffer``), or those
from an NCCL memory pool (``--use-nccl-ub``, which turns the double buffer on)."""
"""Megatron FSDP's sharding strategies (``--data-parallel-sharding-strategy``), Torch FSDP2
(``--use-torch-fsdp2``: every parameter sharded, ``cpmem.pricing.torch_fsdp2``), or none."""

ADAPTER_TARGETS: tuple[str, ...] = (
    "qkv",
    "proj",
    "fc1",
    "fc2",
    "gdn_in",
    "gdn_out",
    "experts",
    "mamba_in",
    "mamba_out",
)
"""The projections an adapter can sit on: attention's fused QKV input and output
projections, the SwiGLU's gate‖up and down projections, GDN's input and output
projections, every routed expert's linears, and Mamba-2's ``in_proj`` and ``out_proj``."""
TARGET_GROUPS: dict[str, tuple[str, ...]] = {
    "all": ADAPTER_TARGETS,
    "attention": ("qkv", "proj", "gdn_in", "gdn_out", "mamba_in", "mamba_out"),
    "mlp": ("fc1", "fc2", "experts"),
}
"""``attention``: the token mixers' projections (attention, GDN and Mamba-2); ``mlp``: the
feed-forward ones (dense and routed experts)."""


@dataclass(frozen=True)
class Head:
    """What the forward ends with. ``hidden``: the final hidden states are returned (the
    measured harness; its loss is their mean square). ``logits``: megatron's
    vocabulary-parallel output layer and ``vocab_parallel_cross_entropy``. ``fused``:
    megatron's fused vocabulary-parallel cross entropy. ``chunked``: log-probabilities
    ``chunk`` tokens at a time, each chunk recomputed in backward. ``linear-ce``: a fused
    linear cross entropy that never materialises the logits."""

    kind: HeadKind = "hidden"
    chunk: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in HEAD_KINDS:
            raise InputError("head", self.kind, f"must be one of {_head_forms()}")
        if self.kind == "chunked":
            if isinstance(self.chunk, bool) or not isinstance(self.chunk, int) or self.chunk < 1:
                raise InputError("head", self.label, "the chunk size must be a positive integer")
        elif self.chunk is not None:
            raise InputError("head", self.label, "only the chunked head takes a chunk size")

    @classmethod
    def parse(cls, text: str | Head) -> Head:
        """``hidden``, ``logits``, ``fused``, ``chunked:N`` or ``linear-ce``."""
        if isinstance(text, Head):
            return text
        kind, sep, size = text.partition(":")
        if kind == "chunked":
            try:
                chunk = int(size) if sep else 0
            except ValueError:
                raise InputError("head", text, "the chunk size must be an integer") from None
            if chunk < 1:
                raise InputError("head", text, "the chunk size must be a positive integer")
            return cls("chunked", chunk)
        if sep or kind not in HEAD_KINDS:
            raise InputError("head", text, f"must be one of {_head_forms()}")
        return cls(kind)

    @property
    def label(self) -> str:
        return f"{self.kind}:{self.chunk}" if self.kind == "chunked" else self.kind

    @property
    def returns_hidden(self) -> bool:
        """Whether the forward returns the hidden states (no head on the rank)."""
        return self.kind == "hidden"


def _head_forms() -> list[str]:
    return ["hidden", "logits", "fused", "chunked:N", "linear-ce"]


@dataclass(frozen=True)
class Adapter:
    """LoRA adapters of rank ``rank`` with ``dropout`` on their input (before ``A``, as
    PEFT and Megatron-Bridge's "pre" position apply it), on the ``targets`` projections."""

    rank: int = 1
    dropout: float = 0.0
    targets: tuple[str, ...] = ADAPTER_TARGETS

    def __post_init__(self) -> None:
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise InputError("lora_rank", self.rank, "must be a positive integer")
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, int | float):
            raise InputError("lora_dropout", self.dropout, "must be a number in [0, 1)")
        if not 0 <= self.dropout < 1:
            raise InputError("lora_dropout", self.dropout, "must be in [0, 1)")
        object.__setattr__(self, "targets", parse_targets(self.targets))

    @property
    def is_harness(self) -> bool:
        """The measured harness's adapters: rank 1 on every projection, no dropout."""
        return self.rank == 1 and self.dropout == 0 and self.targets == ADAPTER_TARGETS

    def adapts(self, target: str) -> bool:
        return target in self.targets

    @property
    def label(self) -> str:
        parts = [f"lora r{self.rank}"]
        if self.dropout:
            parts.append(f"dropout {self.dropout:g}")
        if self.targets != ADAPTER_TARGETS:
            named = [g for g, ts in TARGET_GROUPS.items() if ts == self.targets]
            parts.append("targets " + (named[0] if named else ",".join(self.targets)))
        return " ".join(parts)


def parse_targets(targets: str | Iterable[str]) -> tuple[str, ...]:
    """A group name (``all``, ``attention``, ``mlp``), or projection names (a list, or
    text joined by commas or ``+``), in ``ADAPTER_TARGETS`` order."""
    text = targets if isinstance(targets, str) else ",".join(targets)
    names: set[str] = set()
    for item in (t.strip() for t in text.replace("+", ",").split(",")):
        if not item:
            raise InputError("lora_targets", text, "an item is empty")
        if item in TARGET_GROUPS:
            names.update(TARGET_GROUPS[item])
        elif item in ADAPTER_TARGETS:
            names.add(item)
        else:
            choices = [*TARGET_GROUPS, *ADAPTER_TARGETS]
            raise InputError("lora_targets", item, f"unknown target; use {choices}")
    return tuple(t for t in ADAPTER_TARGETS if t in names)


@dataclass(frozen=True)
class Optimizer:
    """How the trained parameters are stepped: ``adam`` (the default), ``sgd`` with
    momentum, ``muon`` (Megatron-LM's ``TensorParallelMuon``: one momentum per matrix, its
    update orthogonalised; the vectors, the embedding and the output layer stepped by
    Adam, ``cpmem.pricing.muon``), or ``none`` (no gradients or states: the measured
    harness before its first backward). ``distributed``: megatron's distributed optimizer
    shards the fp32 master copy and the states over the data-parallel ranks
    (``ParallelLayout.dp``); under ``muon`` it is the layer-wise distributed optimizer,
    which gives each rank whole tensors. ``grad_bytes``: the element of megatron's
    gradient buffer (``main_grad``): fp32 by default, 2 where the run reduces gradients in
    bf16 (``--grad-reduce-in-bf16``) or trains in fp16. ``instances``: the distributed
    optimizer's copies over the data-parallel ranks (``--num-distributed-optimizer-
    instances``): each shards the states over its own DP x CP / ``instances`` ranks.
    ``fsdp``: Megatron FSDP's sharding strategy (``--data-parallel-sharding-strategy``
    under ``--use-megatron-fsdp``: ``no_shard``, ``optim``, ``optim_grads``,
    ``optim_grads_params``; ``cpmem.pricing.fsdp``), ``torch_fsdp2`` (``--use-torch-fsdp2``:
    PyTorch's ``fully_shard``, every parameter sharded over DP x CP, stepped by the
    non-distributed optimizer; ``cpmem.pricing.torch_fsdp2``), or ``none`` (megatron-core's
    DDP); its gradient buffer's element is ``grad_bytes``, its main weights fp32;
    ``fsdp_buffers``: how it allocates its units' buckets (``FSDP_BUFFERS``). ``muon_layout``: how Muon's layer-wise distributed optimizer lays out its buffers, ``legacy``
    (Megatron-LM's ``--no-use-layer-wise-param-layout``: whole unpadded buffers, tensors
    dealt by size, ``cpmem.pricing.muon``) or ``precomputed`` (its default: Muon's
    matrices bin-packed into shard-aligned buffers, the rest in the distributed
    optimizer's, ``cpmem.pricing.layer_wise_layout``), or ``bucketed``: the precomputed
    layout under ``--overlap-grad-reduce``, whose DDP buckets it packs one by one
    (``cpmem.pricing.layer_wise_static``; the distributed optimizer's own buffers are
    priced as one bucket either way)."""

    kind: OptimizerKind = "adam"
    distributed: bool = False
    grad_bytes: int = 4
    instances: int = 1
    fsdp: str = "none"
    fsdp_buffers: str = "dynamic"
    muon_layout: str = "legacy"

    def __post_init__(self) -> None:
        check_optimizer(self.kind)
        if not isinstance(self.distributed, bool):
            raise InputError("distributed_optimizer", self.distributed, "must be true or false")
        if self.grad_bytes not in (2, 4):
            raise InputError("grad_bytes", self.grad_bytes, "must be 2 or 4")
        if isinstance(self.instances, bool) or not isinstance(self.instances, int):
            raise InputError("optimizer_instances", self.instances, "must be a positive integer")
        if self.instances < 1:
            raise InputError("optimizer_instances", self.instances, "must be a positive integer")
        if self.instances > 1 and not (self.distributed and self.kind != "none"):
            raise InputError(
                "optimizer_instances",
                self.instances,
                "divides the distributed optimizer's shards; give --distributed-optimizer "
                "(without it every rank holds the whole state whatever the instances)",
            )
        if self.fsdp not in FSDP_STRATEGIES:
            raise InputError("fsdp", self.fsdp, f"must be one of {list(FSDP_STRATEGIES)}")
        if self.fsdp_buffers not in FSDP_BUFFERS:
            raise InputError(
                "fsdp_buffers", self.fsdp_buffers, f"must be one of {list(FSDP_BUFFERS)}"
            )
        if self.fsdp_buffers != "dynamic" and self.fsdp in ("none", "no_shard", "torch_fsdp2"):
            raise InputError(
                "fsdp_buffers",
                self.fsdp_buffers,
                "Megatron FSDP's double buffer holds its units' buckets: give a sharding "
                "strategy with units (--fsdp optim, optim_grads or optim_grads_params)",
            )
        if self.fsdp == "torch_fsdp2" and self.distributed:
            raise InputError(
                "distributed_optimizer",
                self.distributed,
                "Megatron-LM rejects it beside Torch FSDP2: --use-torch-fsdp2 is not "
                "supported with MCore's distributed optimizer (arguments.py:980-981)",
            )
        if self.fsdp == "torch_fsdp2" and self.kind not in ("adam", "sgd"):
            raise InputError(
                "fsdp",
                self.fsdp,
                f"Megatron-LM rejects {self.kind} beside Torch FSDP2: emerging optimizer "
                "does not support Torch-FSDP2 for now (arguments.py:1545)",
            )
        if self.fsdp != "none" and self.kind not in ("adam", "sgd"):
            raise InputError(
                "fsdp",
                self.fsdp,
                f"Megatron FSDP steps adam or sgd (arguments.py asserts it), not {self.kind}",
            )
        if self.fsdp != "none" and self.instances > 1:
            raise InputError(
                "optimizer_instances",
                self.instances,
                "several optimizer instances under Megatron FSDP are its hybrid sharding "
                "(outer data-parallel groups), which cpmem does not price",
            )
        if self.muon_layout not in MUON_LAYOUTS:
            raise InputError(
                "muon_layout", self.muon_layout, f"must be one of {list(MUON_LAYOUTS)}"
            )
        if self.muon_layout != "legacy" and not (self.kind == "muon" and self.distributed):
            raise InputError(
                "muon_layout",
                self.muon_layout,
                "is the layout of Muon's layer-wise distributed optimizer: give --optimizer "
                "muon --distributed-optimizer",
            )
        if self.instances > 1 and self.kind == "muon":
            raise InputError(
                "optimizer_instances",
                self.instances,
                "Megatron-LM's layer-wise distributed optimizer (muon) has one instance "
                "(LayerWiseDistributedOptimizer asserts it, layer_wise_optimizer.py)",
            )

    @property
    def label(self) -> str:
        if self.fsdp == "torch_fsdp2":
            return f"{self.kind} (torch fsdp2)"
        if self.fsdp != "none":
            return f"{self.kind} (megatron fsdp {self.fsdp})"
        if not self.distributed or self.kind == "none":
            return self.kind
        if self.kind == "muon":
            if self.muon_layout != "legacy":
                return f"muon (layer-wise distributed, {self.muon_layout} layout)"
            return "muon (layer-wise distributed)"
        copies = f", {self.instances} instances" if self.instances > 1 else ""
        return f"{self.kind} (distributed{copies})"


def check_optimizer(kind: str) -> OptimizerKind:
    if kind not in OPTIMIZERS:
        raise InputError("optimizer", kind, f"must be one of {list(OPTIMIZERS)}")
    return kind


def check_cp_comm(cp_comm: str) -> CpComm:
    if cp_comm not in CP_COMMS:
        raise InputError("cp_comm", cp_comm, f"must be one of {list(CP_COMMS)}")
    return cp_comm
