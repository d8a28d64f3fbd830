"""The simulated grid's definition: which (model, TP, CP, request, recompute) configurations
exist. Pure data: no torch, no cpmem.

Design: 7 models x 13 TP x CP layouts (TP and CP in {1, 2, 4, 8}, TP x CP up
to 16 ranks) x 5 (request, recompute) slots = 455 configurations. The slots rotate over
the requests and the four recompute paths with the model and layout index, so that every
model meets every request kind and every recompute path, and every CP size > 1 meets the
skewed request (busiest rank far above packed/CP). Slot 0 of every (model, layout) comes
first in generation order, then slot 1, ...: a partial run covers every model and layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SIM_DIR = REPO / "golden" / "simulated"
CONFIG_DIR = SIM_DIR / "configs"

# name -> (preset name, or None) / config file under golden/simulated/configs/
MODELS: dict[str, str] = {
    "qwen3.5-27b": "preset",
    "qwen3.5-4b": "preset",
    "qwen3-1.7b": "preset",
    "qwen3.5-9b": "configs/qwen3.5-9b.json",
    "llama-3.1-8b-style": "configs/llama-3.1-8b-style.json",
    "qwen3-32b-style": "configs/qwen3-32b-style.json",
    "qwen3-next-style-dense": "configs/qwen3-next-style-dense.json",
}
"""The four cpmem presets less the MoE one (qwen3.5-35b-a3b: its configurations are
``moe_grid()``, below), Qwen3.5-9B and three configs never measured."""

LAYOUTS: tuple[tuple[int, int], ...] = (
    (1, 1), (2, 1), (4, 1), (8, 1),
    (1, 2), (1, 4), (1, 8),
    (2, 2), (2, 4), (2, 8), (4, 2), (4, 4), (8, 2),
)  # fmt: skip
"""(TP, CP): every TP and CP in {1, 2, 4, 8} and TP x CP together up to 16 ranks."""

K = 1024


@dataclass(frozen=True)
class RequestSpec:
    """One request: lengths and a shared prefix. ``skew``: laid out explicitly with the
    first sequence whole on CP rank 0 and the rest spread evenly over the others (a
    runtime that keeps sequences whole), so that the busiest rank holds far more than
    packed/CP; otherwise cpmem's default planner lays it out."""

    name: str
    lengths: tuple[int, ...]
    shared_prefix: int = 0
    skew: bool = False


REQUESTS: tuple[RequestSpec, ...] = (
    RequestSpec("single-2k", (2 * K,)),
    RequestSpec("single-8k", (8 * K,)),
    RequestSpec("single-32k", (32 * K,)),
    RequestSpec("single-128k", (128 * K,)),
    RequestSpec("pair-16k", (16 * K, 16 * K)),
    RequestSpec("pair-32k-prefix-8k", (32 * K, 32 * K), 8 * K),
    RequestSpec("pack4-uneven", (12 * K, 2 * K, 6 * K + 512, 1 * K + 300)),
    RequestSpec(
        "pack8-uneven", (9000, 1500, 4096, 700, 12000, 2200, 3333, 5000)
    ),
    RequestSpec(
        "pack16-uneven",
        (8192, 1024, 3000, 500, 6000, 2048, 777, 4096, 9000, 1200, 2500, 640, 7000, 3500, 1800, 5200),
    ),
    RequestSpec("skew-whole-first", (48 * K, 2 * K, 2 * K, 2 * K, 2 * K, 2 * K, 2 * K, 2 * K), skew=True),
)  # fmt: skip

RECOMPUTE: tuple[tuple[str, str], ...] = (
    ("none", ""),
    ("selective", "core_attn"),
    ("selective", "core_attn+mlp"),
    ("full", ""),
)
"""(mode, modules) as golden/cells.csv records them."""

SLOTS = 5


@dataclass(frozen=True)
class TrainerSpec:
    """What a trainer's step holds beyond the calibration harness: the LM head and its
    loss, the adapters' rank, dropout and targets, attention's CP communication."""

    head: str = "hidden"
    lora_rank: int = 1
    lora_dropout: float = 0.0
    lora_targets: str = "all"
    cp_comm: str = "all_gather"

    @property
    def label(self) -> str:
        return (
            f"head={self.head}:r{self.lora_rank}:d{self.lora_dropout:g}:"
            f"t={self.lora_targets}:comm={self.cp_comm}"
        )


@dataclass(frozen=True)
class GridConfig:
    config_id: str
    model: str
    tp: int
    cp: int
    request: RequestSpec
    mode: str
    modules: str
    order: int  # generation order (slot-major)
    ep: int = 1  # expert parallel (MoE configurations only)
    routing: str = ""  # MoE routing: balanced | concentrated ("" for dense models)
    trainer: TrainerSpec | None = None  # the trainer's step; None: the measured harness

    @property
    def model_source(self) -> str:
        return MODELS.get(self.model, "preset")  # the MoE models are presets

    @property
    def config_path(self) -> Path | None:
        src = self.model_source
        return None if src == "preset" else SIM_DIR / src


def _requests_for(cp: int) -> tuple[RequestSpec, ...]:
    return REQUESTS if cp > 1 else tuple(r for r in REQUESTS if not r.skew)


def grid() -> list[GridConfig]:
    """Every configuration, in generation order (slot-major)."""
    out: list[GridConfig] = []
    models = list(MODELS)
    for slot in range(SLOTS):
        for li, (tp, cp) in enumerate(LAYOUTS):
            for mi, model in enumerate(models):
                reqs = _requests_for(cp)
                if slot == 0 and cp > 1 and (mi + li) % 3 == 0:
                    req = reqs[-1]  # the skewed request, for every CP size and model family
                else:
                    req = reqs[(3 * mi + 2 * li + 2 * slot) % len(reqs)]
                mode, modules = RECOMPUTE[(mi + li + slot) % len(RECOMPUTE)]
                rc = mode + (f":{modules}" if modules else "")
                cid = f"{model}:tp{tp}:cp{cp}:{req.name}:{rc}"
                out.append(GridConfig(cid, model, tp, cp, req, mode, modules, len(out)))
    # a slot that repeats an earlier slot's (request, recompute) is dropped
    seen: set[str] = set()
    unique = []
    for c in out:
        if c.config_id not in seen:
            seen.add(c.config_id)
            unique.append(c)
    return unique


def by_id() -> dict[str, GridConfig]:
    return {c.config_id: c for c in grid() + moe_grid() + trainer_grid()}


# MoE configurations, kept out of ``grid()``: the dense grid's axes and
# committed rows stay as they are. The 35B-A3B preset at the measured TP4 x EP4 layout
# (ETP 1, SP), CP1 and CP2, 4k-32k tokens, no recompute / selective core_attn /
# selective core_attn+moe, concentrated routing (cpmem's safe assumption and the eager
# measured cells'), plus balanced routing on selective core_attn.
MOE_MODELS: tuple[str, ...] = ("qwen3.5-35b-a3b",)
MOE_LAYOUTS: tuple[tuple[int, int, int], ...] = ((4, 1, 4), (4, 2, 4))
"""(TP, CP, EP): EP divides the TP x CP world (expert tensor parallel 1)."""
MOE_REQUESTS: tuple[RequestSpec, ...] = (
    RequestSpec("single-4k", (4 * K,)),
    RequestSpec("single-8k", (8 * K,)),
    RequestSpec("pair-16k", (16 * K, 16 * K)),
    RequestSpec("single-32k", (32 * K,)),
)
MOE_RECOMPUTE: tuple[tuple[str, str, str], ...] = (
    ("none", "", "concentrated"),
    ("selective", "core_attn", "concentrated"),
    ("selective", "core_attn", "balanced"),
    ("selective", "core_attn+moe", "concentrated"),
)
"""(mode, modules, routing)."""


def moe_grid() -> list[GridConfig]:
    """The MoE configurations, ids ``model:tpT:cpC:epE:routing:request:recompute``; their
    generation order continues after ``grid()``."""
    start = len(grid())
    out: list[GridConfig] = []
    for model in MOE_MODELS:
        for tp, cp, ep in MOE_LAYOUTS:
            for req in MOE_REQUESTS:
                for mode, modules, routing in MOE_RECOMPUTE:
                    rc = mode + (f":{modules}" if modules else "")
                    cid = f"{model}:tp{tp}:cp{cp}:ep{ep}:{routing}:{req.name}:{rc}"
                    out.append(
                        GridConfig(cid, model, tp, cp, req, mode, modules, start + len(out),
                                   ep, routing)
                    )  # fmt: skip
    return out


# The trainer's step, kept out of ``grid()``: the harness rows stay as they are. Every
# (model, layout) pair of the dense grid gets TRAINER_SLOTS configurations whose factors
# rotate with the model, layout and slot indices, as the dense grid's slots do, so that
# each level of each factor meets every model and every layout family; the request and
# recompute path rotate too (4k-128k requests, the trainers' usual selective core_attn
# twice as often as each other path).
TRAINER_HEADS: tuple[str, ...] = ("logits", "fused", "chunked:4096", "linear-ce", "hidden")
TRAINER_RANKS: tuple[int, ...] = (1, 16, 128)
TRAINER_DROPOUTS: tuple[float, ...] = (0.0, 0.1)
TRAINER_TARGETS: tuple[str, ...] = ("all", "attention")
TRAINER_COMMS: tuple[str, ...] = ("all_gather", "p2p", "a2a")
TRAINER_REQUESTS: tuple[RequestSpec, ...] = (
    RequestSpec("single-4k", (4 * K,)),
    RequestSpec("single-8k", (8 * K,)),
    RequestSpec("pair-16k", (16 * K, 16 * K)),
    RequestSpec("single-32k", (32 * K,)),
    RequestSpec("pair-32k-prefix-8k", (32 * K, 32 * K), 8 * K),
    RequestSpec("pack4-uneven", (12 * K, 2 * K, 6 * K + 512, 1 * K + 300)),
    RequestSpec("single-128k", (128 * K,)),
)
TRAINER_RECOMPUTE: tuple[tuple[str, str], ...] = (
    ("selective", "core_attn"),
    ("none", ""),
    ("selective", "core_attn"),
    ("selective", "core_attn+mlp"),
    ("full", ""),
)
TRAINER_SLOTS = 4
A2A_HEADS: dict[str, tuple[int, int]] = {
    "qwen3.5-27b": (24, 4),
    "qwen3.5-4b": (16, 4),
    "qwen3-1.7b": (16, 8),
    "qwen3.5-9b": (16, 4),
    "llama-3.1-8b-style": (32, 8),
    "qwen3-32b-style": (64, 8),
    "qwen3-next-style-dense": (16, 2),
}
"""(query heads, KV heads) of each grid model (its config), for Ulysses' divisibility:
the heads per TP rank must divide by CP, else the configuration's ring runs ``p2p``."""


def _a2a_runs(model: str, tp: int, cp: int) -> bool:
    q, kv = A2A_HEADS[model]
    kv_rank = kv // tp if kv >= tp else 1
    return (q // tp) % cp == 0 and kv_rank % cp == 0


def trainer_spec(mi: int, li: int, slot: int, model: str, tp: int, cp: int) -> TrainerSpec:
    """The slot's trainer step for model ``mi`` at layout ``li``; never the harness."""
    head = TRAINER_HEADS[(mi + 2 * li + slot) % len(TRAINER_HEADS)]
    rank = TRAINER_RANKS[(mi + li + 2 * slot) % len(TRAINER_RANKS)]
    dropout = TRAINER_DROPOUTS[(li + slot) % len(TRAINER_DROPOUTS)]
    targets = TRAINER_TARGETS[(mi + slot + li // 2) % len(TRAINER_TARGETS)]
    comm = "all_gather"
    if cp > 1:
        comm = TRAINER_COMMS[(mi + li + slot) % len(TRAINER_COMMS)]
        if comm == "a2a" and not _a2a_runs(model, tp, cp):
            comm = "p2p"
    spec = TrainerSpec(head, rank, dropout, targets, comm)
    if spec == TrainerSpec():  # the harness is the dense grid's
        spec = TrainerSpec(head, 16, dropout, targets, comm)
    return spec


def trainer_grid() -> list[GridConfig]:
    """The trainer-step configurations, ids ``<dense id>:<trainer label>``; their
    generation order continues after ``moe_grid()``."""
    start = len(grid()) + len(moe_grid())
    out: list[GridConfig] = []
    models = list(MODELS)
    for slot in range(TRAINER_SLOTS):
        for li, (tp, cp) in enumerate(LAYOUTS):
            for mi, model in enumerate(models):
                req = TRAINER_REQUESTS[(2 * mi + li + 3 * slot) % len(TRAINER_REQUESTS)]
                mode, modules = TRAINER_RECOMPUTE[(mi + 3 * li + slot) % len(TRAINER_RECOMPUTE)]
                spec = trainer_spec(mi, li, slot, model, tp, cp)
                rc = mode + (f":{modules}" if modules else "")
                cid = f"{model}:tp{tp}:cp{cp}:{req.name}:{rc}:{spec.label}"
                out.append(
                    GridConfig(cid, model, tp, cp, req, mode, modules, start + len(out),
                               trainer=spec)
                )  # fmt: skip
    return out
