"""Peers side by side: the published activation formulas users reach for instead of
cpmem, gated as external estimators on the measured and simulated tiers, beside cpmem's
``reference`` and ``tight`` policies (``golden/reports/peers.md``): what the report
compares, its plain data and its Markdown.

The figures come from the gate (``cpmem.gate.peers.collect``: ``gate_external`` and
``gate_external_simulated`` for the peers, ``run_gate``'s coverage rows and the simulated
tier's ``price_rows`` for the policies), which sits above this package, so the command
is ``python -m cpmem.gate.peers [--write PATH | --check PATH]`` (as the simulated tier's
report is ``python -m cpmem.gate.simulated --write``). The peers live in
``oracles/peers.py`` and are named here only as ``module:function`` strings, loaded at
run time: cpmem never imports an oracle.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cpmem.reports.tables import pct, table
from cpmem.units import fmt_gib

__all__ = [
    "AS_PUBLISHED",
    "NAMED",
    "PEERS",
    "POLICIES",
    "REPORT_PATH",
    "Collected",
    "Point",
    "Stats",
    "render",
    "stats",
]

REPORT_PATH = "golden/reports/peers.md"
LONG_TOKENS = 2048  # "cells of >= 2,048 tokens": logical tokens, as the targets select


@dataclass(frozen=True)
class Peer:
    name: str
    spec: str  # package.module:function
    what: str


PEERS: tuple[Peer, ...] = (
    Peer(
        "megatron_theoretical",
        "oracles.peers:megatron_theoretical",
        "Megatron-LM `theoretical_memory_usage` activation term (Korthikanti et al. 2022, "
        "Table 2): SP + selective `s·h·(18 + 4·ffn/h)/t` a layer, otherwise "
        "`1.05·s·h·(10 + 24/t)`; the whole packed sequence on every rank (no CP division)",
    ),
    Peer(
        "even_cp_split",
        "oracles.peers:even_cp_split",
        "mbridge `memory_estimator`: its module-by-module count of what each forward "
        "keeps, divided evenly by CP (`packed_tokens / cp` tokens a rank)",
    ),
    Peer(
        "even_cp_split_at_busiest",
        "oracles.peers:even_cp_split_at_busiest",
        "counterfactual, not published: the even split's own count at the busiest CP "
        "rank's tokens; against `even_cp_split` it shows what the split alone misses",
    ),
)
AS_PUBLISHED: tuple[Peer, ...] = (
    Peer(
        "megatron_theoretical_with_head",
        "oracles.peers:megatron_theoretical_with_head",
        "`megatron_theoretical` with its PP-1 output-layer and cross-entropy term",
    ),
    Peer(
        "even_cp_split_with_head",
        "oracles.peers:even_cp_split_with_head",
        "`even_cp_split` with its output layer and fp32 softmax",
    ),
)
POLICIES: tuple[str, ...] = ("reference", "tight")

# (tier, id): rows that show the difference (the seed pair's 27B CP 2 cell first)
NAMED: tuple[tuple[str, str], ...] = (
    ("measured", "cp:27b-selective:4096+4096"),
    ("simulated", "llama-3.1-8b-style:tp4:cp2:single-2k:selective:core_attn+mlp"),
    ("simulated", "qwen3.5-4b:tp1:cp4:skew-whole-first:selective:core_attn+mlp"),
    ("simulated", "qwen3.5-27b:tp1:cp8:skew-whole-first:selective:core_attn+mlp"),
    ("simulated", "qwen3-32b-style:tp2:cp8:single-128k:selective:core_attn+mlp"),
)


@dataclass(frozen=True)
class Point:
    """One estimator on one cell or grid row, as its gate judged it; ``peak`` is the
    measured forward peak (measured tier) or the simulator's central figure (simulated)."""

    id: str
    estimate: int | None
    peak: int
    headroom: float | None
    covered: bool


@dataclass(frozen=True)
class Stats:
    n: int
    covered: int
    min: float | None
    median: float | None
    max: float | None


def stats(points: Iterable[Point]) -> Stats:
    pts = list(points)
    heads = [p.headroom for p in pts if p.headroom is not None]
    return Stats(
        n=len(pts),
        covered=sum(1 for p in pts if p.covered),
        min=min(heads) if heads else None,
        median=statistics.median(heads) if heads else None,
        max=max(heads) if heads else None,
    )


@dataclass(frozen=True)
class Collected:
    """Every estimator's points on both tiers, and what the subsets select on."""

    cells: Mapping[str, Mapping[str, Any]]  # cell_id -> description
    rows: Mapping[str, Mapping[str, Any]]  # config_id -> description
    families: Mapping[str, str]  # config_id -> the model's validation family
    measured: Mapping[str, Mapping[str, Point]]  # estimator -> cell_id -> point
    simulated: Mapping[str, Mapping[str, Point]]  # estimator -> config_id -> point
    summaries: Mapping[str, Mapping[str, str]]  # peer -> tier -> the gate's summary line
    megatron: Sequence[str] = ()  # the Megatron-LM tier's section, rendered by the gate

    def subset(self, tier: str, name: str, select: Callable[[str], bool]) -> Stats:
        points = (self.measured if tier == "measured" else self.simulated)[name]
        return stats(p for i, p in points.items() if select(i))

    def long_cell(self, cid: str) -> bool:
        return int(self.cells[cid]["logical_tokens"]) >= LONG_TOKENS

    def moe_row(self, cid: str) -> bool:
        return self.families[cid].startswith("moe")


# --- rendering -------------------------------------------------------------------------


def _cells(s: Stats) -> list[str]:
    return [
        f"{s.covered}/{s.n}",
        pct(s.min, signed=True),
        pct(s.median, signed=True),
        pct(s.max, signed=True),
    ]


def _label(name: str) -> str:
    return f"`{name}`" if name not in POLICIES else f"cpmem `{name}`"


def _tier_table(
    data: Collected,
    names: Sequence[str],
    tier: str,
    subsets: Sequence[tuple[str, Callable[[str], bool]]],
) -> list[str]:
    headers = ["estimator"]
    for title, _ in subsets:
        headers += [f"{title}: covered", "min", "median", "max"]
    body = [
        [_label(n), *(c for _, sel in subsets for c in _cells(data.subset(tier, n, sel)))]
        for n in names
    ]
    return table(headers, body, right=range(1, len(headers)), style="markdown")


def _named_table(data: Collected, names: Sequence[str]) -> list[str]:
    body = []
    for tier, cid in NAMED:
        d = data.cells[cid] if tier == "measured" else data.rows[cid]
        points = data.measured if tier == "measured" else data.simulated
        peak = points[names[0]][cid].peak
        rank_text = "+".join(str(t) for t in d["rank_tokens"]) + (
            " (busiest recorded)" if d["rank_tokens_recorded"] == "busiest" else ""
        )
        row = [
            f"`{cid}`",
            tier,
            rank_text,
            f"{d['busiest_tokens']:,}",
            f"{int(d['packed_tokens']) / int(d['cp']):,.0f}",
            fmt_gib(peak),
        ]
        for n in names:
            p = points[n][cid]
            mark = "" if p.covered else " ✗"
            row.append(f"{fmt_gib(p.estimate)} ({pct(p.headroom, signed=True)}){mark}")
        body.append(row)
    headers = [
        "cell / grid row",
        "tier",
        "CP ranks' tokens",
        "busiest",
        "even split",
        "peak GiB",
        *(_label(n) for n in names),
    ]
    return table(headers, body, right=range(3, len(headers)), style="markdown")


def _split_table(data: Collected) -> list[str]:
    pairs = (
        ("measured", "measured CP 2 cells", lambda cid: int(data.cells[cid]["cp"]) > 1),
        (
            "simulated",
            "simulated CP > 1 dense/hybrid rows",
            lambda cid: int(data.rows[cid]["cp"]) > 1 and not data.moe_row(cid),
        ),
    )
    body = []
    for tier, title, sel in pairs:
        a = data.subset(tier, "even_cp_split", sel)
        b = data.subset(tier, "even_cp_split_at_busiest", sel)
        body.append(
            [
                title,
                f"{a.covered}/{a.n}",
                pct(a.median, signed=True),
                f"{b.covered}/{b.n}",
                pct(b.median, signed=True),
            ]
        )
    headers = [
        "rows",
        "`even_cp_split` covered",
        "median",
        "`even_cp_split_at_busiest` covered",
        "median",
    ]
    return table(headers, body, right=range(1, 5), style="markdown")


def _design_check(data: Collected) -> str:
    """Megatron-LM's term on the measured Qwen3-1.7B TP 2 cells (SP, selective), the
    design note's "36-63% below the measured forward peak"."""
    sel = [
        cid
        for cid, d in data.cells.items()
        if "Qwen3-1.7B" in str(d["model"]) and int(d["tp"]) > 1 and d["recompute"] == "selective"
    ]
    s = data.subset("measured", "megatron_theoretical", lambda cid: cid in sel)
    return (
        f"On the {s.n} measured Qwen3-1.7B TP 2 cells (SP, selective) `megatron_theoretical` "
        f"is {pct(s.min, signed=True)} to {pct(s.max, signed=True)} against the measured "
        "forward peak, the 36-63% below reported for this formula on these cells: "
        "the restatement reads the formula as its users do."
    )


def render(data: Collected) -> str:
    main_names = [*(p.name for p in PEERS), *POLICIES]
    measured_subsets = (
        (f">= {LONG_TOKENS:,} tokens", data.long_cell),
        ("all cells", lambda cid: True),
    )
    simulated_subsets = (
        ("dense/hybrid rows", lambda cid: not data.moe_row(cid)),
        ("MoE rows", data.moe_row),
        # Megatron-LM's pipeline factor against the busiest stage (oracles/peers.py)
        ("pipeline rows", lambda cid: int(data.rows[cid].get("pp", 1)) > 1),
    )
    n_cells, n_rows = len(data.cells), len(data.rows)
    lines = [
        "# Peers side by side: published activation formulas against both tiers",
        "",
        f"Generated by `python -m cpmem.gate.peers --write {REPORT_PATH}`; do not edit by "
        "hand (`nox -s golden` fails when it is stale). The peers are external estimators "
        '(`oracles/peers.py`, docs/external-estimators.md "Peers"), gated exactly as '
        "`cpmem gate [--tier simulated] --estimator oracles.peers:NAME` gates them; cpmem's "
        "policies as `cpmem gate [--tier simulated] --policy NAME` prices them.",
        "",
        "- **Measured tier** (`golden/cells.csv`, "
        f"{n_cells} measured cells): covered = estimate >= the measured forward peak; "
        "headroom = estimate / peak - 1.",
        f"- **Simulated tier** (`golden/simulated/rows.csv`, {n_rows} grid rows): covered = "
        "estimate >= (simulated peak + cold set-up) / (1 - the simulator's worst "
        "under-estimate for the model's family) (`cpmem.samples.rows.required`); headroom "
        "= estimate / (simulated peak + cold set-up) - 1 (`central`). MoE rows apart.",
        "- Forward figures only: the peers price no backward.",
        "",
        "## The estimators",
        "",
    ]
    lines += table(
        ["estimator", "what it is"],
        [
            *([f"`{p.name}`", p.what] for p in PEERS),
            ["cpmem `reference`", "cpmem's reference policy (per-rank plan, LoRA, GDN, CP)"],
            ["cpmem `tight`", "cpmem's calibrated policy"],
        ],
        style="markdown",
    )
    lines += [
        "",
        "Both peers price frozen-base activations for the whole packed sequence "
        "(`packed_tokens`); neither knows LoRA, Gated DeltaNet or the busiest CP rank. The "
        "harness runs no LM head, so their output-layer terms are left out here (kept as "
        "published below). torchtitan's `scripts/estimate/estimation.py` is not a formula "
        "(FakeTensorMode, FSDP only) and is not gated.",
        "",
        "## Measured tier",
        "",
        *_tier_table(data, main_names, "measured", measured_subsets),
        "",
        _design_check(data),
        "",
        "## Simulated tier",
        "",
        *_tier_table(data, main_names, "simulated", simulated_subsets),
        "",
        "## What the even split misses",
        "",
        "An even split prices `packed_tokens / cp` tokens on every CP rank; the busiest rank "
        "holds more wherever the split is uneven (causal load balancing of a short or "
        "skewed request, whole sequences placed on one rank). The counterfactual prices "
        "the same count at the busiest rank's tokens:",
        "",
        *_split_table(data),
        "",
        "Named rows (GiB; headroom in brackets, ✗ not covered; the simulated tier's peak "
        "is its central figure, simulated peak + cold set-up):",
        "",
        *_named_table(data, main_names),
        "",
        "The first row is the seed pair's Qwen3.5-27B CP 2 cell: the busiest rank holds "
        "4,096 tokens where the even split prices 3,482.",
        "",
        "## As published, output layer included",
        "",
        "Both formulas add an output-layer / loss term at the last pipeline stage; the "
        "harness makes no logits, so it is credit for memory the cells never hold:",
        "",
        *_tier_table(data, [p.name for p in AS_PUBLISHED], "measured", measured_subsets),
        "",
        *_tier_table(data, [p.name for p in AS_PUBLISHED], "simulated", simulated_subsets),
        "",
        "## The gates' summaries",
        "",
        *(
            f"- `{p.name}` {tier}: {data.summaries[p.name][tier]}"
            for p in (*PEERS, *AS_PUBLISHED)
            for tier in ("measured", "simulated")
        ),
        *(["", *data.megatron] if data.megatron else []),
    ]
    return "\n".join(lines) + "\n"
