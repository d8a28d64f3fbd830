"""The chunk planner and the default planners against the recorded CP cells.

Expected busiest counts come from golden/cells.csv, read raw with csv (never from a
planner); the cost constants from runtime-layout.md's figures.
"""

from __future__ import annotations

import csv
import itertools
from pathlib import Path

import pytest

from cpmem.errors import InputError
from cpmem.model.presets import get_preset
from cpmem.plan.chunked import (
    CHUNK_TOKENS,
    FETCH_FS,
    MAX_MOVES,
    STAGE_FS,
    ChunkCosts,
    chunk_costs,
    chunk_edges,
    chunked_loads,
)
from cpmem.plan.layout import ParallelLayout
from cpmem.plan.planners import PLANNERS, check_ranks, plan_request
from cpmem.plan.request import Request

CELLS = Path(__file__).resolve().parents[3] / "golden" / "cells.csv"
DENSE = get_preset("qwen3-1.7b")
HYBRID = get_preset("qwen3.5-27b")


def _cp_cells() -> list[dict[str, str]]:
    with CELLS.open(newline="", encoding="utf-8") as fh:
        return [r for r in csv.DictReader(fh) if int(r["cp"]) > 1]


CP_CELLS = _cp_cells()


def test_there_are_13_cp_cells() -> None:
    assert len(CP_CELLS) == 13


@pytest.mark.parametrize("row", CP_CELLS, ids=[r["cell_id"] for r in CP_CELLS])
def test_default_planner_reproduces_the_recorded_busiest_count(row: dict[str, str]) -> None:
    """From the request alone (lengths, shared prefix, TP, CP), taken as recorded."""
    lengths = [int(n) for n in row["lengths"].split("+")]
    layout = ParallelLayout(tp=int(row["tp"]), cp=int(row["cp"]))
    request = Request.shared(lengths, int(row["shared_prefix"]))
    plan = plan_request(request, layout, geometry=get_preset(row["model"]))
    assert plan.busiest_tokens == int(row["retained_tokens"])


@pytest.mark.parametrize(
    ("cell_id", "expected"),
    [
        # runtime-layout.md: rank 0 takes chunks 0-9, rank 1 the other 1,844
        ("cp:attention-selective:4096+4096", (5120, 1844)),
        # one chunk < CP: re-cut at 436 // 2, and no move may empty a rank
        ("cp:attention-selective:256+256", (218, 218)),
    ],
)
def test_chunk_planner_lays_out_the_1_7b_pairs_as_recorded(
    cell_id: str, expected: tuple[int, int]
) -> None:
    (row,) = [r for r in CP_CELLS if r["cell_id"] == cell_id]
    lengths = [int(n) for n in row["lengths"].split("+")]
    plan = plan_request(
        Request.shared(lengths, int(row["shared_prefix"])), ParallelLayout(cp=2), "chunked", DENSE
    )
    assert plan.rank_tokens == expected
    assert max(expected) == int(row["retained_tokens"])
    assert plan.packed_tokens == int(row["packed_tokens"])


def test_the_27b_pair_keeps_gdn_segments_whole_busiest_4096() -> None:
    """Attention splits 3,584 / 3,380 under this cost model (runtime-layout.md reports
    4,096 / 2,868); GDN keeps the prefix with one completion: busiest 4,096 either way."""
    plan = plan_request(Request.pair(4096, 4096, 1228), ParallelLayout(cp=2), "chunked", HYBRID)
    (group,) = plan.groups
    assert group.attention_tokens == (3584, 3380)
    assert sorted(group.gdn_tokens) == [2868, 4096]
    assert plan.busiest_tokens == 4096


def test_cost_constants_are_runtime_layout_figures() -> None:
    """c = 3 (8h^2 + 6hf) / 400e12 s: about 0.0008 ms (1.7B) and 0.0056 ms (27B)."""
    fs_per_ms = 10**12
    assert round(chunk_costs(DENSE).owned / fs_per_ms, 4) == 0.0008
    assert round(chunk_costs(HYBRID).owned / fs_per_ms, 4) == 0.0056
    assert chunk_costs(DENSE).owned == 3 * (8 * 2048**2 + 6 * 2048 * 6144) * 10**15 // (
        400 * 10**12
    )
    assert chunk_costs(DENSE).pair == 3 * 4 * (16 * 128) * 10**15 // (400 * 10**12)
    assert (STAGE_FS, FETCH_FS) == (2_400_000_000_000, 60_000_000)
    assert STAGE_FS / fs_per_ms == 2 * 1.2  # 1.2 ms forward and again in backward
    assert FETCH_FS / fs_per_ms == 2 * 3e-5  # fetch in forward, reduce in backward
    assert (CHUNK_TOKENS, MAX_MOVES) == (512, 8)


def test_the_5120_holds_only_for_a_band_of_owned_token_costs() -> None:
    """Cheaper tokens pull more chunks onto the rank holding the prefix, dearer ones fewer."""
    request = Request.pair(4096, 4096, 1228)
    base = chunk_costs(DENSE)

    def busiest(owned_ms: float) -> int:
        costs = ChunkCosts(owned=int(owned_ms * 10**12), pair=base.pair)
        return max(chunked_loads(request, 2, costs, hybrid=False)[0])

    assert busiest(0.0007) == 5120
    assert busiest(0.0008) == 5120
    assert busiest(0.0004) > 5120
    assert busiest(0.0012) < 5120


def test_chunk_edges() -> None:
    assert chunk_edges(6964, 2) == [*range(0, 6964, 512), 6964]  # 14 chunks, last partial
    assert chunk_edges(436, 2) == [0, 218, 436]  # one chunk < CP: re-cut at 436 // 2
    assert chunk_edges(109, 2) == [0, 54, 109]  # the last re-cut chunk takes the remainder
    assert chunk_edges(3, 8) == [0, 1, 2, 3]  # shorter than CP: 1-token chunks


def test_a_row_shorter_than_cp_leaves_ranks_empty_and_check_ranks_refuses_it() -> None:
    request = Request.independent([3])
    plan = plan_request(request, ParallelLayout(cp=8), "chunked", DENSE)
    assert plan.rank_tokens == (1, 1, 1, 0, 0, 0, 0, 0)
    with pytest.raises(InputError, match="cp=8"):
        check_ranks(plan, request.real_tokens)


def test_check_ranks_refuses_an_empty_rank_and_warns_on_a_tiny_one() -> None:
    request = Request.pair(4096, 4096)
    gdn = plan_request(request, ParallelLayout(cp=1000), "gdn-segments", HYBRID)
    with pytest.raises(InputError, match="ranks with no tokens"):
        check_ranks(gdn, request.real_tokens)
    chunked = plan_request(request, ParallelLayout(cp=1000), "chunked", DENSE)
    (warning,) = check_ranks(chunked, request.real_tokens)
    assert "holds 8 tokens" in warning
    fine = plan_request(request, ParallelLayout(cp=2), None, DENSE)
    assert check_ranks(fine, request.real_tokens) == []


def test_worst_takes_the_largest_busiest_count_of_every_planner() -> None:
    request = Request.pair(2048, 2048, 614)
    layout = ParallelLayout(cp=2)
    geometry = get_preset("qwen3.5-4b")
    each = {p: plan_request(request, layout, p, geometry).busiest_tokens for p in PLANNERS}
    worst = plan_request(request, layout, "worst", geometry)
    assert worst.busiest_tokens == max(each.values())
    assert worst.planner == f"worst:{max(each, key=lambda p: each[p])}"
    # the 4B's chunk layout puts 2,560 of the shared 3,482 on one rank: more than
    # its default (gdn-segments, 2,048)
    assert each["chunked"] == 2560 > each["gdn-segments"] == 2048


def test_the_chunk_planner_needs_the_geometry() -> None:
    with pytest.raises(InputError, match="planner='chunked'"):
        plan_request(Request.pair(64, 64), ParallelLayout(cp=2), "chunked")


def test_one_sweep_prices_every_chunk_as_its_own_work() -> None:
    """``chunk_work`` (one pass over the spans) is ``work`` chunk by chunk, on a prefix
    tree whose spans straddle chunk edges, and each chunk's causal pairs add up to the
    row's: a single 4,096-token sequence holds 4,096 x 4,097 / 2 pairs."""
    from cpmem.plan.chunked import _Row
    from cpmem.plan.request import Request

    costs = chunk_costs(get_preset("qwen3-1.7b"))
    tree = _Row(Request.shared([3000, 2500, 1900], 1228), costs)
    edges = chunk_edges(tree.n, 4)
    assert tree.chunk_work(edges) == [tree.work(a, b) for a, b in itertools.pairwise(edges)]
    single = _Row(Request.independent([4096]), costs)
    assert sum(single.chunk_work(chunk_edges(4096, 2))) == 4096 * 4097 // 2
