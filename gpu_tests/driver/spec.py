"""The cell: what one measurement depends on, validated, and what cpmem says about it.

Why a module of its own: every other part (engines, rows, the CLI) takes a CellSpec
that has already been checked against the model and the request, and the plan and
estimate it is compared with come from the same place, so the driver measures exactly
the layout cpmem prices.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from cpmem.api import estimate as cpmem_estimate
from cpmem.errors import InputError
from cpmem.model.geometry import ModelGeometry
from cpmem.model.load import load_model
from cpmem.plan.layout import ParallelLayout
from cpmem.plan.plan import Plan
from cpmem.plan.planners import plan_request
from cpmem.plan.request import Request
from cpmem.step.trainer import Head

ENGINES = ("auto", "megatron", "torch")
DEVICES = ("auto", "cuda", "cpu")
MODES = ("selective", "none", "full")
# Selective-recompute module sets the golden schema accepts.
MODULE_SETS = ("core_attn", "core_attn+mlp")
# What the forward ends with (cpmem.step.trainer.Head): the harness's hidden states, a
# frozen output layer and cross entropy, or chunked log-probs. cpmem also prices
# ``fused`` and ``linear-ce``; the driver does not run them.
HEADS = ("hidden", "logits", "chunked:N")
# The logits head's cross entropy: megatron's vocab_parallel_cross_entropy or torch's
# over an fp32 upcast; ``auto`` = megatron where megatron-core is importable.
HEAD_CES = ("auto", "megatron", "torch")


@dataclass(frozen=True)
class CellSpec:
    """Everything one measurement depends on (picklable, JSON-able)."""

    model: str | None
    config: str | None
    layers: int | None
    lengths: tuple[int, ...]
    shared_prefix: int
    tp: int = 1
    cp: int = 1
    sp: bool = False
    recompute: str = "selective"
    modules: str = "core_attn"
    engine: str = "auto"
    device: str = "auto"
    seed: int = 1234
    source_commit: str | None = None
    # Absolute path of a CUDA memory-history snapshot to record (measure.py), or None.
    memory_history: str | None = None
    # The trainer's step beyond the harness (head.py, engine_*.py); the defaults are the
    # harness exactly. ``head_ce`` is resolved ("megatron" / "torch") for the logits
    # head and "" otherwise.
    head: str = "hidden"
    head_ce: str = ""
    lora_rank: int = 1
    lora_dropout: float = 0.0

    @property
    def world(self) -> int:
        return self.tp * self.cp

    @property
    def is_harness(self) -> bool:
        """The calibration harness's step: hidden states out, rank-1 LoRA, no dropout."""
        return self.head == "hidden" and self.lora_rank == 1 and self.lora_dropout == 0

    @property
    def harness_adapters(self) -> bool:
        """Rank-1 adapters without dropout (the torch engine's per-projection layout)."""
        return self.lora_rank == 1 and self.lora_dropout == 0

    @property
    def head_chunk(self) -> int | None:
        return Head.parse(self.head).chunk


def parse_lengths(text: str) -> tuple[int, ...]:
    """``2048+2048`` or ``2048,2048``: positive integers, else InputError naming the field."""
    parts = [p.strip() for p in str(text).replace(",", "+").split("+")]
    out: list[int] = []
    for p in parts:
        if not p.isdigit() or int(p) < 1:
            raise InputError("lengths", text, "must be positive integers joined by '+' or ','")
        out.append(int(p))
    return tuple(out)


def int_field(name: str, text: str, minimum: int) -> int:
    try:
        value = int(str(text).strip())
    except ValueError:
        raise InputError(name, text, "must be an integer") from None
    if value < minimum:
        raise InputError(name, text, f"must be >= {minimum}")
    return value


def spec_from_args(args: argparse.Namespace) -> CellSpec:
    """Validate the parsed arguments into a CellSpec; InputError names the bad field."""
    lengths = parse_lengths(args.lengths)
    prefix = int_field("shared_prefix", args.shared_prefix, 0)
    tp = int_field("tp", args.tp, 1)
    cp = int_field("cp", args.cp, 1)
    layers = None if args.layers is None else int_field("layers", args.layers, 1)
    seed = int_field("seed", args.seed, 0)
    if args.recompute not in MODES:
        raise InputError("recompute", args.recompute, f"must be one of {list(MODES)}")
    modules = (
        args.modules
        if args.modules is not None
        else ("core_attn" if args.recompute == "selective" else "")
    )
    if args.recompute != "selective":
        if modules:
            raise InputError(
                "modules",
                modules,
                f"only selective recompute takes modules (recompute={args.recompute})",
            )
    elif modules not in MODULE_SETS:
        raise InputError("modules", modules, f"must be one of {list(MODULE_SETS)}")
    if args.engine not in ENGINES:
        raise InputError("engine", args.engine, f"must be one of {list(ENGINES)}")
    if args.device not in DEVICES:
        raise InputError("device", args.device, f"must be one of {list(DEVICES)}")
    commit = args.source_commit
    if commit is not None and not is_hex(commit, 40):
        raise InputError("source_commit", commit, "must be a 40-hex git revision")
    history = getattr(args, "memory_history", None)
    if history is not None:
        history = history_path(history, getattr(args, "out", None))
    head = parse_head(getattr(args, "head", "hidden"))
    head_ce = getattr(args, "head_ce", "auto")
    if head_ce not in HEAD_CES:
        raise InputError("head_ce", head_ce, f"must be one of {list(HEAD_CES)}")
    lora_rank = int_field("lora_rank", getattr(args, "lora_rank", "1"), 1)
    lora_dropout = dropout_field(getattr(args, "lora_dropout", "0"))
    spec = CellSpec(
        model=args.model,
        config=args.config,
        layers=layers,
        lengths=lengths,
        shared_prefix=prefix,
        tp=tp,
        cp=cp,
        sp=(tp > 1) if args.sp is None else bool(args.sp),
        recompute=args.recompute,
        modules=modules,
        engine=args.engine,
        device=args.device,
        seed=seed,
        source_commit=commit,
        memory_history=history,
        head=head,
        head_ce=head_ce,
        lora_rank=lora_rank,
        lora_dropout=lora_dropout,
    )
    return validate_spec(spec)


def parse_head(text: str) -> str:
    """``hidden``, ``logits`` or ``chunked:N`` (cpmem's spelling); InputError names ``head``."""
    head = Head.parse(str(text).strip())  # raises InputError("head", ...) on a bad form
    if head.kind not in ("hidden", "logits", "chunked"):
        raise InputError("head", text, f"the driver measures {list(HEADS)} (cpmem prices more)")
    return head.label


def dropout_field(text: str) -> float:
    """A probability in [0, 1); InputError names ``lora_dropout``."""
    try:
        value = float(str(text).strip())
    except ValueError:
        raise InputError("lora_dropout", text, "must be a number in [0, 1)") from None
    if not 0 <= value < 1:  # also refuses nan
        raise InputError("lora_dropout", text, "must be in [0, 1)")
    return value


def history_path(text: str, out: str | None) -> str:
    """Where ``--memory-history`` writes: a bare file name goes into ``--out`` (if given).

    Any other path is taken relative to the working directory. The result is absolute,
    so that worker ranks started elsewhere write to the same place.
    """
    name = str(text).strip()
    path = Path(name)
    if out is not None and len(path.parts) == 1:
        path = Path(out) / path
    if not name or name.endswith(("/", "\\")) or path.is_dir():
        raise InputError("memory_history", text, "must be a file path, not a directory")
    parent = path.parent
    if parent.exists() and not parent.is_dir():
        raise InputError("memory_history", text, f"{parent} is not a directory")
    return str(path.resolve())


def validate_spec(spec: CellSpec) -> CellSpec:
    """Cross-field checks against the model and the request; resolves ``engine=auto``."""
    geometry = cell_geometry(spec)
    Request.shared(list(spec.lengths), spec.shared_prefix)  # raises on a bad prefix
    geometry.check_tp(spec.tp)
    if geometry.is_moe:
        raise InputError("model", geometry.name, "MoE models are not measured by this driver")
    engine = spec.engine
    if engine == "auto":
        engine = "megatron" if (spec.cp == 1 and not geometry.is_hybrid) else "torch"
    if engine == "megatron":
        if spec.cp != 1:
            raise InputError("cp", spec.cp, "the megatron engine runs CP = 1 only (use torch)")
        if geometry.is_hybrid:
            raise InputError("engine", "megatron", f"{geometry.name} has GDN layers; use torch")
    if engine == "torch" and spec.tp != 1:
        raise InputError("tp", spec.tp, "the torch engine runs TP = 1 only (use megatron)")
    if spec.head != "hidden" and spec.tp != 1:
        raise InputError("head", spec.head, "the driver runs a head at TP = 1 only")
    if spec.head != "hidden" and geometry.vocab < 1:
        raise InputError("head", spec.head, f"{geometry.name} has no vocabulary size")
    return replace(spec, engine=engine, head_ce=resolve_head_ce(spec))


def resolve_head_ce(spec: CellSpec) -> str:
    """The logits head's cross entropy ("" for every other head): ``auto`` is megatron's
    where megatron-core is importable, else torch's; asking for megatron without it is
    an InputError."""
    from .head import have_megatron_cross_entropy

    if spec.head != "logits":
        if spec.head_ce not in ("", "auto"):
            raise InputError("head_ce", spec.head_ce, "only the logits head takes a cross entropy")
        return ""
    if spec.head_ce in ("", "auto"):
        return "megatron" if have_megatron_cross_entropy() else "torch"
    if spec.head_ce == "megatron" and not have_megatron_cross_entropy():
        raise InputError("head_ce", "megatron", "megatron-core is not importable")
    return spec.head_ce


def cell_geometry(spec: CellSpec) -> ModelGeometry:
    """The model geometry, truncated to the first ``layers`` layers if asked."""
    geometry = load_model(spec.model, config=spec.config)
    if spec.layers is not None:
        if spec.layers > geometry.layers:
            raise InputError("layers", spec.layers, f"exceeds the model's {geometry.layers} layers")
        geometry = replace(
            geometry, mixers=geometry.mixers[: spec.layers], mlps=geometry.mlps[: spec.layers]
        )
    return geometry


def recorded_model_name(spec: CellSpec, geometry: ModelGeometry) -> str:
    """The Hugging Face id for presets (as the sources record it), else the config's name."""
    return geometry.aliases[0] if (spec.model and geometry.aliases) else geometry.name


def cell_plan(spec: CellSpec, geometry: ModelGeometry) -> Plan:
    """cpmem's default plan for the request: the token counts each rank will own."""
    layout = ParallelLayout(tp=spec.tp, cp=spec.cp, sp=spec.sp)
    request = Request.shared(list(spec.lengths), spec.shared_prefix)
    return plan_request(request, layout, None, geometry)


def cell_estimate(
    spec: CellSpec, geometry: ModelGeometry, plan: Plan, policy: str = "reference"
) -> Any:
    """cpmem's estimate (``policy``: reference or tight) for exactly the plan and the
    step the driver measures: its head and adapters too (the defaults are the harness)."""
    layout = plan.layout
    return cpmem_estimate(
        geometry,
        plan=plan,
        tp=layout.tp,
        cp=layout.cp,
        sp=layout.sp,
        ep=layout.ep,
        recompute=spec.recompute,
        modules=spec.modules or None,
        policy=policy,
        head=spec.head,
        lora_rank=spec.lora_rank,
        lora_dropout=spec.lora_dropout,
    )


def is_hex(text: str, n: int) -> bool:
    return len(text) == n and all(c in "0123456789abcdef" for c in text)
