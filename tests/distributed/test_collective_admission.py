"""Collective admission over torch.distributed: gloo, several CPU processes on 127.0.0.1.

Why: a rank that decides alone can admit a forward its TP x CP peers refuse, and a
rank whose planning fails can leave its peers blocked in the next collective. Each
test forks one process per rank (``worker``, ``pipeline_worker``; ranks.py), lets
every rank admit the same work from a *different* local budget, injects planning
failures, and checks in the parent that every rank of a group agreed, that the
agreed figures are MAX(required) / MIN(available), and that nothing hung.

Expected figures come from budgets chosen here and from single-process decisions
(LocalCommunicator), never from the collective path under test.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections import defaultdict
from typing import Any

import pytest

pytest.importorskip("torch.distributed")

from tests.distributed.ranks import Ranks, preload

INIT_TIMEOUT_S = 30  # init_process_group / collective timeout: a hang fails in 30 s
JOIN_TIMEOUT_S = 90  # the whole worker group, per test
MIB = 2**20
FAIL_PLANNER = "no-such-planner"
FAIL_POLICY = "no-such-policy"


# --------------------------------------------------------------------------- worker


def _timed(timings: dict[str, float], name: str, fn: Any) -> Any:
    start = time.perf_counter()
    try:
        return fn()
    finally:
        timings[name] = round(time.perf_counter() - start, 4)


def _outcome(fn: Any) -> dict[str, Any]:
    """A decision's agreed figures, or the error a rank raised."""
    from cpmem.errors import PlanningError

    try:
        d = fn()
    except PlanningError as exc:
        return {"error": "PlanningError", "failed_rank": exc.failed_rank, "message": str(exc)}
    except Exception as exc:
        return {"error": type(exc).__name__, "message": str(exc)}
    return {
        "action": d.action,
        "required": d.required_bytes,
        "available": d.available_bytes,
        "parts": d.parts,
        "variant": d.variant,
    }


def _init_gloo(rank: int, world: int, port: int) -> None:
    """This process joins the gloo group on 127.0.0.1; a hang fails in INIT_TIMEOUT_S."""
    from datetime import timedelta

    import torch.distributed as dist

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=INIT_TIMEOUT_S),
    )


def worker(rank: int, world: int, port: int, tp: int, cp: int, megatron: bool) -> dict[str, Any]:
    """One rank: init gloo, build the TP x CP communicator, run every scenario."""

    import torch.distributed as dist

    from cpmem.admission.admission import admit
    from cpmem.admission.comm import LocalCommunicator
    from cpmem.admission.torch_comm import torch_communicator
    from cpmem.model.presets import get_preset
    from cpmem.plan.layout import ParallelLayout
    from cpmem.plan.plan import explicit_plan
    from cpmem.plan.request import Request

    timings: dict[str, float] = {}
    _timed(timings, "init", lambda: _init_gloo(rank, world, port))
    if megatron:
        from megatron.core import parallel_state

        _timed(
            timings,
            "megatron_init",
            lambda: parallel_state.initialize_model_parallel(
                tensor_model_parallel_size=tp, context_parallel_size=cp
            ),
        )
    comm = torch_communicator(tp, cp)
    g, n = comm.rank, comm.size
    megatron_group = None
    if megatron:
        megatron_group = comm.group is parallel_state.get_tensor_and_context_parallel_group()
    local = LocalCommunicator()
    geometry = get_preset("qwen3.5-4b")
    layout = ParallelLayout(tp=tp, cp=cp, sp=tp > 1)
    at_layout = {"tp": layout.tp, "cp": layout.cp, "sp": layout.sp}

    def admit_plan(plan: Any, budget: int, **kwargs: Any) -> Any:
        """A plan the runtime fixed, admitted as it stands (described inside the first
        collective)."""
        return admit(geometry, plan=plan, budget_bytes=budget, **at_layout, **kwargs)

    def admit_request(request: Any, budget: int, **kwargs: Any) -> Any:
        return admit(geometry, request=request, budget_bytes=budget, **at_layout, **kwargs)

    out: dict[str, Any] = {
        "rank": rank,
        "group_rank": g,
        "group_size": n,
        "group_ranks": sorted(dist.get_process_group_ranks(comm.group)),
        "megatron": megatron,
        "megatron_group": megatron_group,
    }

    # an uneven explicit plan, as a runtime would report it
    packed = 6144 * tp
    args = {"logical_tokens": packed + 1024, "packed_tokens": packed, "grad_segments": 3}
    busiest = -(-packed // cp) + 512 * tp

    def plan_for(extra: int) -> Any:
        return explicit_plan(layout, busiest_tokens=busiest + extra, **args)

    need = admit_plan(plan_for(0), 2**62, comm=local).required_bytes
    out["need"] = need

    # 1. the smallest budget in the group still fits: everyone fits
    budgets = [need + r * 64 * MIB for r in range(n)]
    out["fit_budget_min"] = min(budgets)
    out["fit"] = _timed(
        timings,
        "fit",
        lambda: _outcome(lambda: admit_plan(plan_for(0), budgets[g], comm=comm)),
    )

    # 2. one rank is a byte short: everyone refuses, though the others alone would fit
    short = [need + 2**30] * n
    short[n - 1] = need - 1
    out["short_budget_min"] = min(short)
    out["short"] = _timed(
        timings,
        "short",
        lambda: _outcome(lambda: admit_plan(plan_for(0), short[g], comm=comm)),
    )

    # 3. ranks price different plans: the group requires the largest
    extras = [128 * tp * r for r in range(n)]
    needs = [admit_plan(plan_for(e), 2**62, comm=local).required_bytes for e in extras]
    out["max_need"] = max(needs)
    out["max"] = _timed(
        timings,
        "max",
        lambda: _outcome(lambda: admit_plan(plan_for(extras[g]), 2**62, comm=comm)),
    )

    # 4. request-level admission (fit / memory-minimal / split ladder) from budgets whose
    #    minimum allows less than the others would alone: once just below the
    #    cost-optimal figure, once below every unsplit candidate
    shared = Request.shared([4096, 3072, 2048, 4096, 1024, 3072, 2048, 4096], 512)
    unshared = Request.independent([4096] * 8)
    below_cost_optimal = admit_request(shared, 2**62, comm=local).required_bytes - 1
    whole = admit_request(unshared, 0, comm=local).considered
    below_all = min(v for k, v in whole if not k.startswith("split")) - 1
    lows = {
        "request_below_cost_optimal": (shared, below_cost_optimal),
        "request_below_all": (unshared, below_all),
    }
    for name, (request, low) in lows.items():
        budgets_r = [low] + [low + 2**30 + r * MIB for r in range(1, n)]
        budgets_r = budgets_r[g:] + budgets_r[:g]  # the low budget sits on a different rank
        out[name + "_expected"] = _outcome(lambda q=request, b=low: admit_request(q, b, comm=local))
        out[name + "_budget_min"] = min(budgets_r)
        out[name] = _timed(
            timings,
            name,
            lambda q=request, b=budgets_r: _outcome(lambda: admit_request(q, b[g], comm=comm)),
        )
    request = shared

    # 4b. ranks price different requests and nothing fits: every rank refuses with the
    #     group's MAX of the least-demanding variant, whichever request it priced itself
    def longer(r: int) -> Any:
        return Request.independent([4096 + 512 * tp * r] * 8)

    every = [dict(admit_request(longer(r), 0, comm=local).considered) for r in range(n)]
    agreed = {v: max(c[v] for c in every) for v in every[0] if not v.startswith("split")}
    least = min(agreed, key=agreed.__getitem__)
    out["refuse_differing_expected"] = {"variant": least, "required": agreed[least]}
    out["refuse_differing"] = _timed(
        timings,
        "refuse_differing",
        lambda: _outcome(lambda: admit_request(longer(g), 0, comm=comm)),
    )

    # 5. planning fails on the last group rank only (unknown planner)
    bad = n - 1
    out["fail_planner_rank"] = bad
    out["fail_planner"] = _timed(
        timings,
        "fail_planner",
        lambda: _outcome(
            lambda: admit_request(
                request,
                2**62,
                planner=FAIL_PLANNER if g == bad else None,
                comm=comm,
            )
        ),
    )

    # 6. pricing fails on group rank 0 only (unknown policy), explicit plan
    out["fail_policy"] = _timed(
        timings,
        "fail_policy",
        lambda: _outcome(
            lambda: admit_plan(
                plan_for(0),
                2**62,
                policy=FAIL_POLICY if g == 0 else "reference",
                comm=comm,
            )
        ),
    )

    # 7. the group is still usable after the failures
    out["after"] = _timed(
        timings,
        "after",
        lambda: _outcome(lambda: admit_plan(plan_for(0), need, comm=comm)),
    )
    # 8. an explicit member list (every process calls new_group; members reduce)
    evens = list(range(0, world, 2))
    try:
        sub = torch_communicator(ranks=evens)
        out["explicit_ranks"] = {
            "size": sub.size,
            "max": sub.max_int(rank),
            "min": sub.min_int(rank),
        }
    except Exception as exc:
        out["explicit_ranks"] = {"error": type(exc).__name__}
    out["timings"] = timings
    dist.barrier()  # nobody leaves while a peer may still need it
    return out


def pipeline_worker(
    rank: int, world: int, port: int, tp: int, cp: int, pp: int, megatron: bool
) -> dict[str, Any]:
    """One rank of a TP x CP x PP job: admission over its whole block, every stage
    pricing the same pipeline step from its own budget."""

    import torch.distributed as dist

    from cpmem.admission.admission import admit
    from cpmem.admission.comm import LocalCommunicator
    from cpmem.admission.torch_comm import torch_communicator

    _init_gloo(rank, world, port)
    if megatron:
        from megatron.core import parallel_state

        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=tp,
            pipeline_model_parallel_size=pp,
            context_parallel_size=cp,
        )
    comm = torch_communicator(tp, cp, pp=pp)
    g, n = comm.rank, comm.size
    step = {"tp": tp, "cp": cp, "pp": pp, "policy": "tight"}

    def admit_mbs(mbs: list[list[int]], budget: int, on: Any) -> Any:
        return admit("qwen3.5-4b", microbatch_requests=mbs, budget_bytes=budget, comm=on, **step)

    mbs = [[4096], [2048, 2048], [3072]]
    need = admit_mbs(mbs, 2**62, LocalCommunicator()).required_bytes
    out: dict[str, Any] = {
        "rank": rank,
        "group_rank": g,
        "group_size": n,
        "group_ranks": sorted(dist.get_process_group_ranks(comm.group)),
        "need": need,
    }
    budgets = [need + r * 64 * MIB for r in range(n)]
    out["fit"] = _outcome(lambda: admit_mbs(mbs, budgets[(g + 1) % n], comm))
    short = [need + 2**30] * n
    short[n - 1] = need - 1
    out["short"] = _outcome(lambda: admit_mbs(mbs, short[g], comm))
    # a rank that sees a longer micro-batch: the block requires the largest figure
    mine = [*mbs[:-1], [3072 + 1024 * g]]
    out["max_need"] = admit_mbs([*mbs[:-1], [3072 + 1024 * (n - 1)]], 2**62, LocalCommunicator())
    out["max_need"] = out["max_need"].required_bytes
    out["max"] = _outcome(lambda: admit_mbs(mine, 2**62, comm))
    dist.barrier()
    return out


# --------------------------------------------------------------------------- parent


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_group(
    world: int, tp: int, cp: int, megatron: bool = False, pp: int = 1
) -> list[dict[str, Any]]:
    """Fork ``world`` ranks (the pipeline worker with ``pp > 1``; tests/distributed/ranks.py);
    fail (never hang) if any does not finish in time."""
    port = _free_port()
    preload(megatron)
    if pp > 1:
        args = [(r, world, port, tp, cp, pp, megatron) for r in range(world)]
        ranks = Ranks(pipeline_worker, args)
    else:
        ranks = Ranks(worker, [(r, world, port, tp, cp, megatron) for r in range(world)])
    results: list[dict[str, Any]] = []
    failures: list[str] = []
    try:
        for r in range(world):
            kind, value = ranks.outcome(r, JOIN_TIMEOUT_S)
            if kind == "result":
                results.append(value)
            elif kind == "hung":
                failures.append(f"rank {r} hung (> {JOIN_TIMEOUT_S} s)")
            else:
                failures.append(f"rank {r} {kind}: {value}")
    finally:
        ranks.stop()
    wall = time.perf_counter() - ranks.start
    print(f"\n[world={world} tp={tp} cp={cp} pp={pp} megatron={megatron}] wall {wall:.2f} s")
    for res in sorted(results, key=lambda x: x["rank"]) if pp == 1 else ():
        print(
            f"  rank {res['rank']} group {res['group_ranks']} (group rank {res['group_rank']}): "
            f"fit={res['fit'].get('action')} short={res['short'].get('action')} "
            f"request={res['request_below_all'].get('action')}/{res['request_below_all'].get('parts')} "
            f"fail_planner={res['fail_planner'].get('error')} timings={res['timings']}"
        )
    assert not failures, "\n".join(failures)
    assert len(results) == world
    return results


def _by_group(results: list[dict[str, Any]]) -> dict[tuple[int, ...], list[dict[str, Any]]]:
    groups: dict[tuple[int, ...], list[dict[str, Any]]] = defaultdict(list)
    for res in results:
        groups[tuple(res["group_ranks"])].append(res)
    return groups


def _check(results: list[dict[str, Any]], tp: int, cp: int) -> None:
    world = len(results)
    groups = _by_group(results)
    # TP x CP groups are contiguous blocks of tp*cp ranks covering the world
    assert sorted(groups) == [tuple(range(s, s + tp * cp)) for s in range(0, world, tp * cp)]
    for members, ranks in groups.items():
        assert len(ranks) == tp * cp
        assert sorted(r["group_rank"] for r in ranks) == list(range(tp * cp))
        need = ranks[0]["need"]
        assert all(r["need"] == need for r in ranks)

        fit = {json.dumps(r["fit"], sort_keys=True) for r in ranks}
        assert len(fit) == 1, fit
        assert ranks[0]["fit"] == {
            "action": "fit",
            "required": need,
            "available": need,  # MIN of need + r * 64 MiB
            "parts": 1,
            "variant": "explicit",
        }

        short = {json.dumps(r["short"], sort_keys=True) for r in ranks}
        assert len(short) == 1, short
        assert ranks[0]["short"]["action"] == "refuse"
        assert ranks[0]["short"]["available"] == need - 1

        assert len({json.dumps(r["max"], sort_keys=True) for r in ranks}) == 1
        assert ranks[0]["max"]["required"] == ranks[0]["max_need"]

        for name in ("request_below_cost_optimal", "request_below_all"):
            outcomes = {json.dumps(r[name], sort_keys=True) for r in ranks}
            assert len(outcomes) == 1, outcomes
            assert ranks[0][name] == ranks[0][name + "_expected"]
            assert ranks[0][name]["available"] == ranks[0][name + "_budget_min"]
        assert ranks[0]["request_below_cost_optimal"]["action"] == "fit"
        assert ranks[0]["request_below_cost_optimal"]["variant"].startswith("memory-minimal")
        assert ranks[0]["request_below_all"]["action"] == "split"
        assert ranks[0]["request_below_all"]["parts"] >= 2

        refusals = {json.dumps(r["refuse_differing"], sort_keys=True) for r in ranks}
        assert len(refusals) == 1, refusals
        assert ranks[0]["refuse_differing"] == {
            **ranks[0]["refuse_differing"],
            "action": "refuse",
            **ranks[0]["refuse_differing_expected"],
        }

        bad = ranks[0]["fail_planner_rank"]
        for r in ranks:
            f = r["fail_planner"]
            if r["group_rank"] == bad:
                assert f["error"] == "InputError" and FAIL_PLANNER in f["message"], f
            else:
                assert f["error"] == "PlanningError", f
                assert f["failed_rank"] == bad
                assert f"rank {bad}" in f["message"] and FAIL_PLANNER in f["message"]
            p = r["fail_policy"]
            if r["group_rank"] == 0:
                assert p["error"] == "InputError" and FAIL_POLICY in p["message"], p
            else:
                assert p["error"] == "PlanningError" and p["failed_rank"] == 0, p
            assert r["after"]["action"] == "fit", members
    evens = list(range(0, world, 2))
    for r in results:
        if r["rank"] in evens:
            assert r["explicit_ranks"] == {"size": len(evens), "max": evens[-1], "min": 0}
        else:
            assert r["explicit_ranks"] == {"error": "InputError"}


@pytest.mark.parametrize(
    ("world", "tp", "cp"),
    [(2, 1, 2), (4, 2, 2), (4, 1, 4), (4, 1, 2)],
    ids=["w2-tp1xcp2", "w4-tp2xcp2", "w4-tp1xcp4", "w4-two-tp1xcp2-groups"],
)
def test_every_rank_takes_the_same_decision(world: int, tp: int, cp: int) -> None:
    """Different local budgets, one decision per group; failures raise everywhere."""
    _check(_run_group(world, tp, cp), tp, cp)


def test_megatron_tensor_and_context_group() -> None:
    """With megatron's parallel_state initialized, its TP x CP group is the one used."""
    pytest.importorskip("megatron.core.parallel_state")
    results = _run_group(4, 2, 2, megatron=True)
    assert all(r["megatron"] and r["megatron_group"] for r in results)
    _check(results, 2, 2)


@pytest.mark.parametrize("megatron", [False, True], ids=["default-order", "megatron"])
def test_every_stage_of_a_replica_takes_the_same_decision(megatron: bool) -> None:
    """TP 1 x CP 2 x PP 2 over 8 ranks (two data-parallel replicas): admission agrees over
    each replica's 4 ranks, which are not contiguous (megatron's order tp-cp-ep-dp-pp),
    from different budgets and different micro-batches; the two replicas decide apart."""
    if megatron:
        pytest.importorskip("megatron.core.parallel_state")
    results = _run_group(8, 1, 2, megatron=megatron, pp=2)
    groups = _by_group(results)
    assert sorted(groups) == [(0, 1, 4, 5), (2, 3, 6, 7)]
    for ranks in groups.values():
        assert sorted(r["group_rank"] for r in ranks) == [0, 1, 2, 3]
        need = ranks[0]["need"]
        for name in ("fit", "short", "max"):
            assert len({json.dumps(r[name], sort_keys=True) for r in ranks}) == 1, name
        assert ranks[0]["fit"]["action"] == "fit" and ranks[0]["fit"]["available"] == need
        assert ranks[0]["short"] == {**ranks[0]["short"], "action": "refuse", "available": need - 1}
        assert ranks[0]["max"]["required"] == ranks[0]["max_need"] > need


def test_import_does_not_need_torch() -> None:
    """torch is imported lazily: importing the module must not pull it in."""
    code = "import sys, cpmem.admission.torch_comm; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0
