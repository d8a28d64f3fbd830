"""The simulated grid's definition: which (model, TP, CP, request, recompute) configurations
exist. Pure data: no torch, no cpmem.

Design: 7 models x 13 TP x CP layouts (TP and CP in {1, 2, 4, 8}, TP x CP up
to 16 ranks) x 5 (request, recompute) slots = 455 configurations. The slots rotate over
the requests and the four recompute paths with the model and layout index, so that every
model meets every request kind and every recompute path, and every CP size > 1 meets the
skewed request (busiest rank far above packed/CP). Slot 0 of every (model, layout) comes
first in generation order, then slot 1, ...: a partial run covers every model and layout.

The MoE preset (``moe_grid``), the trainer's step (``trainer_grid``) and pipeline stages
(``pipeline_grid``: PP 2/4/8, V 1/2, M PP/2 PP/8, even and uneven stages, micro-batches
that differ) follow in that order; each says how its subset was chosen.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
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
    pipeline: PipelineSpec | None = None  # pipeline stages; None: pp = 1, one micro-batch

    @property
    def model_source(self) -> str:
        # the MoE models are presets; the families' models are their published configs
        return MODELS.get(self.model, FAMILY_MODELS.get(self.model, "preset"))

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
    return {c.config_id: c for c in everything()}


def everything() -> list[GridConfig]:
    """Every grid's configurations in generation order."""
    return (
        grid()
        + moe_grid()
        + trainer_grid()
        + pipeline_grid()
        + family_grid()
        + family_balanced_grid()
        + family_ep1_grid()
    )


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


# Pipeline stages, kept out of the grids above: their rows stay as they are (each is the
# case pp = 1). A designed subset, not the product, chosen to fit ~30 minutes on 2 cores
# (the simulation's time grows with layers x M x distinct CP ranks, not with tokens):
# each of the 14 (PP, V, M) schedules (PP in {2, 4, 8}, V in {1, 2}, M in {PP, 2 PP, 8}:
# M 2/4/8 at PP 2, 4/8 at PP 4, 8/16 at PP 8) gets PIPELINE_SLOTS[M] configurations (13 at
# M <= 4, 10 at M = 8, 7 at M = 16) whose model, TP x CP layout, micro-batch set,
# recompute path and stage split rotate with the schedule and slot indices, as the dense
# grid's slots do, so that each schedule meets several models, layouts, sets and paths.
# Models whose layer counts divide (32 and 28 layers; the 64-layer models only where
# M <= 4); every second slot uneven (megatron's first/last-stage counts or an explicit
# per-stage list), and every slot whose even split does not divide (the 1.7B's 28 layers
# at PP 8 or at PP 4 x V 2). Every micro-batch holds 2k-8k tokens; three of the seven
# micro-batch sets differ from one micro-batch to the next (cycled over M).
PIPELINE_SCHEDULES: tuple[tuple[int, int, int], ...] = (
    (2, 1, 2), (2, 1, 4), (2, 1, 8), (2, 2, 2), (2, 2, 4), (2, 2, 8),
    (4, 1, 4), (4, 1, 8), (4, 2, 4), (4, 2, 8),
    (8, 1, 8), (8, 1, 16), (8, 2, 8), (8, 2, 16),
)  # fmt: skip
"""(PP, V, M). Interleaving (V = 2) needs M >= PP and M % PP == 0 (megatron's
``microbatch_group_size_per_vp_stage`` = PP): every M here is a multiple of PP."""
PIPELINE_MODELS: tuple[str, ...] = (
    "qwen3.5-4b", "qwen3-1.7b", "llama-3.1-8b-style", "qwen3.5-9b",
)  # fmt: skip
"""32, 28, 32, 32 layers: hybrid, attention-only, attention-only (config), hybrid (config)."""
PIPELINE_LARGE_MODELS: tuple[str, ...] = ("qwen3.5-27b", "qwen3-32b-style")
"""64 layers; only in schedules of M <= 4 (PIPELINE_LARGE_M)."""
PIPELINE_LARGE_M = 4
PIPELINE_LAYERS: dict[str, int] = {
    "qwen3.5-4b": 32, "qwen3-1.7b": 28, "llama-3.1-8b-style": 32, "qwen3.5-9b": 32,
    "qwen3.5-27b": 64, "qwen3-32b-style": 64,
}  # fmt: skip
"""Each pipeline model's layers (its config; tests/oracle/test_sim_grid_pipeline.py holds
them to the simulator's)."""
PIPELINE_LAYOUTS: tuple[tuple[int, int], ...] = (
    (1, 1), (2, 1), (1, 2), (2, 2), (1, 1), (2, 1), (1, 2), (2, 2), (4, 1), (1, 4),
)  # fmt: skip
"""(TP, CP) rotation: TP x CP in {1, 2}^2 four times as often as TP 4 or CP 4."""
PIPELINE_SLOTS: dict[int, int] = {2: 13, 4: 13, 8: 10, 16: 7}
"""Configurations per schedule, by M: fewer where M is large (the time grows with M)."""
PIPELINE_WIDE_M = 8
"""TP 4 and CP 4 only in schedules of M <= 8 (CP 4 may need 4 distinct ranks' stages)."""


@dataclass(frozen=True)
class MicrobatchSet:
    """The micro-batches of one step: ``cycle`` is repeated over the M micro-batches (each
    entry one micro-batch's sequence lengths, no shared prefix)."""

    name: str
    cycle: tuple[tuple[int, ...], ...]

    def lengths(self, microbatches: int) -> tuple[tuple[int, ...], ...]:
        return tuple(self.cycle[i % len(self.cycle)] for i in range(microbatches))

    @property
    def differ(self) -> bool:
        return len(set(self.cycle)) > 1


MICROBATCH_SETS: tuple[MicrobatchSet, ...] = (
    MicrobatchSet("mb-4k", ((4 * K,),)),
    MicrobatchSet("mbs-cycle-a", ((8 * K,), (2 * K,), (4 * K, 4 * K), (6000,))),
    MicrobatchSet("mb-8k", ((8 * K,),)),
    MicrobatchSet("mbs-ramp", ((2 * K,), (4 * K,), (6 * K,), (8 * K,))),
    MicrobatchSet("mb-2k", ((2 * K,),)),
    MicrobatchSet("mbs-cycle-b", ((2 * K, 2 * K), (6 * K,), (3000, 1500, 2500), (8 * K,))),
    MicrobatchSet("mb-pack3", ((3000, 2000, 1500),)),
)
"""Four sets whose micro-batches are equal (``mb-*``) and three whose micro-batches
differ (``mbs-*``: packs of 1-3 sequences, 2,048-8,192 tokens each)."""


@dataclass(frozen=True)
class StageSplit:
    """How the layers are cut over the stages: even (all None), megatron's
    ``num_layers_in_first/last_pipeline_stage`` (the other stages share the rest evenly),
    or an explicit count per stage (each stage's count cut evenly over its V chunks)."""

    first: int | None = None
    last: int | None = None
    stages: tuple[int, ...] | None = None

    @property
    def label(self) -> str:
        if self.stages is not None:
            return "stages=" + "+".join(map(str, self.stages))
        parts = [
            f"first{self.first}" if self.first else "",
            f"last{self.last}" if self.last else "",
        ]
        return "-".join(p for p in parts if p) or "even"

    @property
    def even(self) -> bool:
        return self.first is None and self.last is None and self.stages is None

    def per_stage(self, layers: int, pp: int) -> tuple[int, ...] | None:
        """Layers per stage (megatron's rule restated), None where it does not cut."""
        if self.stages is not None:
            return self.stages if len(self.stages) == pp and sum(self.stages) == layers else None
        head, tail = self.first or 0, self.last or 0
        middle = pp - (self.first is not None) - (self.last is not None)
        rest = layers - head - tail
        if middle <= 0 or rest <= 0 or rest % middle:
            return None
        return (
            ((head,) if self.first else ()) + (rest // middle,) * middle + ((tail,) if self.last else ())
        )  # fmt: skip


UNEVEN_SPLITS: dict[tuple[int, int], tuple[StageSplit, ...]] = {
    (32, 2): (StageSplit(first=14), StageSplit(last=12)),
    (32, 4): (StageSplit(first=2), StageSplit(first=6, last=6), StageSplit(stages=(7, 9, 9, 7))),
    (32, 8): (StageSplit(first=2, last=6), StageSplit(stages=(3, 4, 4, 4, 4, 4, 4, 5))),
    (28, 2): (StageSplit(first=12), StageSplit(last=10)),
    (28, 4): (StageSplit(first=4), StageSplit(first=6, last=6), StageSplit(stages=(5, 8, 8, 7))),
    (28, 8): (StageSplit(first=2, last=2), StageSplit(stages=(3, 3, 4, 4, 4, 4, 3, 3))),
    (64, 2): (StageSplit(first=30), StageSplit(last=28)),
    (64, 4): (StageSplit(first=10), StageSplit(first=14, last=14)),
    (64, 8): (StageSplit(first=2, last=2), StageSplit(stages=(6, 8, 8, 8, 8, 8, 8, 10))),
}
"""Uneven splits per (layers, PP): the first stage lighter (it holds the embedding), the
last lighter (the head), or both; those whose stages do not cut evenly over V chunks are
skipped at V = 2."""


def _splits(layers: int, pp: int, vpp: int) -> tuple[StageSplit, ...]:
    out = []
    for s in UNEVEN_SPLITS[(layers, pp)]:
        per = s.per_stage(layers, pp)
        if per is not None and len(set(per)) > 1 and all(n % vpp == 0 for n in per):
            out.append(s)
    return tuple(out)


@dataclass(frozen=True)
class PipelineSpec:
    """PP stages of V chunks, the step's micro-batches (``microbatch_lengths``, one length
    tuple each) and the stage split."""

    pp: int
    vpp: int
    microbatch_set: MicrobatchSet
    microbatches: int
    split: StageSplit = StageSplit()

    @property
    def microbatch_lengths(self) -> tuple[tuple[int, ...], ...]:
        return self.microbatch_set.lengths(self.microbatches)

    @property
    def differ(self) -> bool:
        return len(set(self.microbatch_lengths)) > 1

    @property
    def label(self) -> str:
        return f"pp{self.pp}:v{self.vpp}:m{self.microbatches}:{self.split.label}"


def pipeline_grid() -> list[GridConfig]:
    """The pipeline configurations, ids ``<model>:tpT:cpC:<micro-batch set>:<recompute>:
    ppP:vV:mM:<split>`` (split ``even``, ``firstN``, ``lastN``, ``firstN-lastN`` or
    ``stages=a+b+...``); their generation order continues after ``trainer_grid()``. The
    config's ``request`` is its first micro-batch under the set's name."""
    start = len(grid()) + len(moe_grid()) + len(trainer_grid())
    out: list[GridConfig] = []
    seen: set[str] = set()
    for si, (pp, vpp, m) in enumerate(PIPELINE_SCHEDULES):
        models = PIPELINE_MODELS + (PIPELINE_LARGE_MODELS if m <= PIPELINE_LARGE_M else ())
        layouts = PIPELINE_LAYOUTS if m <= PIPELINE_WIDE_M else PIPELINE_LAYOUTS[:8]
        for slot in range(PIPELINE_SLOTS[m]):
            model = models[(slot + 3 * si) % len(models)]
            tp, cp = layouts[(7 * slot + si) % len(layouts)]
            mbs = MICROBATCH_SETS[(slot + 2 * si) % len(MICROBATCH_SETS)]
            mode, modules = RECOMPUTE[(slot + si + slot // 4) % len(RECOMPUTE)]
            layers = PIPELINE_LAYERS[model]
            options = _splits(layers, pp, vpp)
            even_ok = layers % (pp * vpp) == 0
            if even_ok and (slot % 2 == 0 or not options):
                split = StageSplit()
            else:
                split = options[(slot // 2 + si) % len(options)]
            spec = PipelineSpec(pp, vpp, mbs, m, split)
            first = spec.microbatch_lengths[0]
            request = RequestSpec(mbs.name, first)
            rc = mode + (f":{modules}" if modules else "")
            cid = f"{model}:tp{tp}:cp{cp}:{mbs.name}:{rc}:{spec.label}"
            if cid in seen:
                continue
            seen.add(cid)
            out.append(
                GridConfig(cid, model, tp, cp, request, mode, modules, start + len(out),
                           pipeline=spec)
            )  # fmt: skip
    return out


# The model families priced by structure only (cpmem's presets of the families issue),
# kept out of the grids above: their rows stay as they are. One model per family, each
# its published config (golden/simulated/configs/, copied from examples/). Per model the
# ten TP x CP layouts of up to 8 ranks x FAMILY_SLOTS slots; the slots rotate the
# request (4k-32k tokens), the recompute path (none, selective core_attn, selective
# core_attn with the feed-forward checkpointed, full), the head (megatron's logits and
# loss, or the harness's hidden states) and the adapters (rank 16 or the harness's rank
# 1) with the layout index, so that every model meets every layout, request, path, head
# and rank; under CP the attention communication alternates between the all-gather and
# the p2p ring, or Ulysses a2a on the models with sliding windows (latent attention: the
# p2p ring always, as Transformer Engine requires). MoE models lay EP over the
# TP x CP world (ETP 1) and route concentrated (cpmem's safe assumption).
FAMILY_MODELS: dict[str, str] = {
    "qwen3-30b-a3b": "configs/qwen3-30b-a3b.json",
    "gpt-oss-20b": "configs/gpt-oss-20b.json",
    "gemma-3-12b": "configs/gemma-3-12b.json",
    "gemma-2-9b": "configs/gemma-2-9b.json",
    "moonlight-16b-a3b": "configs/moonlight-16b-a3b.json",
}
"""qwen3_moe, gpt_oss, gemma3_text, gemma2 and deepseek_v3 (multi-head latent attention
with DeepSeek-V3's experts; Moonlight-16B-A3B, the family's smallest published model)."""
FAMILY_MOE = ("qwen3-30b-a3b", "gpt-oss-20b", "moonlight-16b-a3b")
FAMILY_LAYOUTS: tuple[tuple[int, int], ...] = (
    (1, 1), (2, 1), (4, 1), (8, 1), (1, 2), (1, 4), (1, 8), (2, 2), (2, 4), (4, 2),
)  # fmt: skip
"""(TP, CP): TP x CP up to 8 ranks."""
FAMILY_REQUESTS: tuple[RequestSpec, ...] = (
    RequestSpec("single-4k", (4 * K,)),
    RequestSpec("single-8k", (8 * K,)),
    RequestSpec("pair-16k", (16 * K, 16 * K)),
    RequestSpec("pack4-uneven", (12 * K, 2 * K, 6 * K + 512, 1 * K + 300)),
    RequestSpec("single-32k", (32 * K,)),
)
FAMILY_SLOTS = 4


FAMILY_WINDOWED = ("gpt-oss-20b", "gemma-3-12b", "gemma-2-9b")
"""The models with sliding-window layers: Transformer Engine runs their CP attention only
under ``all_gather`` or ``a2a`` (``attn_forward_func_with_cp``), never the ``p2p`` ring."""
FAMILY_HEADS: dict[str, tuple[int, int]] = {
    "qwen3-30b-a3b": (32, 4),
    "gpt-oss-20b": (64, 8),
    "gemma-3-12b": (16, 8),
    "gemma-2-9b": (16, 8),
    "moonlight-16b-a3b": (16, 16),
}
"""(query heads, KV heads) of each family model (its config), for Ulysses' divisibility."""


FAMILY_MLA = ("moonlight-16b-a3b",)
"""The models with latent attention (K and V of different widths): Transformer Engine runs
their CP attention only under ``p2p`` or ``a2a+p2p`` (``attn_forward_func_with_cp``)."""


def family_comm(model: str, tp: int, cp: int, index: int) -> str:
    """The slot's CP communication: the all-gather every other slot, else the p2p ring,
    or on a windowed model Ulysses ``a2a`` where its heads per TP rank divide by CP; a
    latent-attention model's CP attention always rides the p2p ring."""
    if cp > 1 and model in FAMILY_MLA:
        return "p2p"
    if cp == 1 or index % 2 == 0:
        return "all_gather"
    if model not in FAMILY_WINDOWED:
        return "p2p"
    q, kv = FAMILY_HEADS[model]
    kv_rank = kv // tp if kv >= tp else 1
    return "a2a" if (q // tp) % cp == 0 and kv_rank % cp == 0 else "all_gather"


def family_recompute(model: str, index: int) -> tuple[str, str]:
    """The slot's (mode, modules): the feed-forward checkpoint is ``moe`` on MoE models."""
    ffn = "moe" if model in FAMILY_MOE else "mlp"
    paths = (("none", ""), ("selective", "core_attn"), ("selective", f"core_attn+{ffn}"),
             ("full", ""))  # fmt: skip
    return paths[index % len(paths)]


def family_grid() -> list[GridConfig]:
    """The families' configurations, ids ``<model>:tpT:cpC[:epE]:<request>:<recompute>:
    <trainer label>``; their generation order continues after ``pipeline_grid()``."""
    start = len(grid()) + len(moe_grid()) + len(trainer_grid()) + len(pipeline_grid())
    out: list[GridConfig] = []
    for slot in range(FAMILY_SLOTS):
        for li, (tp, cp) in enumerate(FAMILY_LAYOUTS):
            for mi, model in enumerate(FAMILY_MODELS):
                req = FAMILY_REQUESTS[(li + 2 * slot + mi) % len(FAMILY_REQUESTS)]
                mode, modules = family_recompute(model, li + slot + mi)
                head = ("logits", "hidden")[(li + slot) % 2]
                rank = (16, 1)[(li // 2 + slot + mi) % 2]
                comm = family_comm(model, tp, cp, li + slot + mi)
                spec = TrainerSpec(head, rank, 0.0, "all", comm)
                ep, routing = (tp * cp, "concentrated") if model in FAMILY_MOE else (1, "")
                rc = mode + (f":{modules}" if modules else "")
                where = f"tp{tp}:cp{cp}" + (f":ep{ep}" if routing else "")
                cid = f"{model}:{where}:{req.name}:{rc}:{spec.label}"
                out.append(
                    GridConfig(cid, model, tp, cp, req, mode, modules, start + len(out),
                               ep, routing, trainer=spec)
                )  # fmt: skip
    return out


def family_balanced_grid() -> list[GridConfig]:
    """The MoE families' configurations of ``family_grid`` under balanced routing, the
    expectation a trainer's routed rows sit near (``family_grid``'s MoE rows are the
    worst case), at EP > 1: ids ``<model>:tpT:cpC:epE:balanced:<request>:<recompute>:<trainer>``;
    their generation order continues after ``family_grid()``."""
    start = len(everything_but_balanced())
    out: list[GridConfig] = []
    for c in family_grid():
        if c.routing != "concentrated" or c.ep == 1:
            continue  # at EP 1 every routed copy is on the rank's experts: no twin
        where = f"tp{c.tp}:cp{c.cp}:ep{c.ep}"
        cid = c.config_id.replace(where, f"{where}:balanced", 1)
        out.append(replace(c, config_id=cid, routing="balanced", order=start + len(out)))
    return out


def everything_but_balanced() -> list[GridConfig]:
    """The grids generated before ``family_balanced_grid``."""
    return grid() + moe_grid() + trainer_grid() + pipeline_grid() + family_grid()


FAMILY_EP1_SLOTS = 2
"""``family_grid``'s first two slots at EP 1 (ART's runtime with experts unsharded)."""


def family_ep1_grid() -> list[GridConfig]:
    """The MoE families' configurations of ``family_grid``'s first ``FAMILY_EP1_SLOTS``
    slots on the layouts beyond one rank, with every expert local (EP 1, so the routing
    moves nothing: concentrated): each TP rank routes only its sequence shard to all the
    experts. ids ``<model>:tpT:cpC:ep1:<request>:<recompute>:<trainer>``; their
    generation order continues after ``family_balanced_grid()``."""
    start = len(everything_but_balanced()) + len(family_balanced_grid())
    per_slot = len(FAMILY_LAYOUTS) * len(FAMILY_MODELS)
    out: list[GridConfig] = []
    for i, c in enumerate(family_grid()):
        if c.model not in FAMILY_MOE or c.ep == 1 or i // per_slot >= FAMILY_EP1_SLOTS:
            continue
        where = f"tp{c.tp}:cp{c.cp}:ep{c.ep}"
        cid = c.config_id.replace(where, f"tp{c.tp}:cp{c.cp}:ep1", 1)
        out.append(replace(c, config_id=cid, ep=1, order=start + len(out)))
    return out
