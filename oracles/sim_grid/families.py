"""The model families' grids: one model per family (qwen3_moe, gpt_oss, gemma3_text,
gemma2, deepseek_v3), each its published config, priced by structure only; their rows
are generated after the pipeline grid (``oracles.sim_grid.grid``), in the order
``family_grid``, ``family_balanced_grid``, ``family_ep1_grid``. Pure data: no torch, no
cpmem.
"""

from __future__ import annotations

from dataclasses import replace

from oracles.sim_grid.grid import (
    FAMILY_MODELS,
    GridConfig,
    K,
    RequestSpec,
    TrainerSpec,
    grid,
    moe_grid,
    pipeline_grid,
    trainer_grid,
)

# The model families priced by structure only (cpmem's presets of the families issue),
# kept out of the grids of ``oracles.sim_grid.grid``: their rows stay as they are. One
# model per family, each its published config (golden/simulated/configs/, copied from
# examples/; ``FAMILY_MODELS``, beside the grid's ``MODELS``). Per model the
# ten TP x CP layouts of up to 8 ranks x FAMILY_SLOTS slots; the slots rotate the
# request (4k-32k tokens), the recompute path (none, selective core_attn, selective
# core_attn with the feed-forward checkpointed, full), the head (megatron's logits and
# loss, or the harness's hidden states) and the adapters (rank 16 or the harness's rank
# 1) with the layout index, so that every model meets every layout, request, path, head
# and rank; under CP the attention communication alternates between the all-gather and
# the p2p ring, or Ulysses a2a on the models with sliding windows (latent attention: the
# p2p ring always, as Transformer Engine requires). MoE models lay EP over the
# TP x CP world (ETP 1) and route concentrated (cpmem's safe assumption).
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
