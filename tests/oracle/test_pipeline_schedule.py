"""cpmem's pipeline schedule against megatron-core 0.16's own functions.

``cpmem.step.pipeline`` restates megatron's schedule (cpmem imports no megatron); here
the warm-up counts come from ``get_pp_rank_microbatches`` and the interleaved order from
``get_schedule_table``, called with a stand-in for the pipeline communicator.
"""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest

pytest.importorskip("megatron.core")

from megatron.core.pipeline_parallel import schedules

from cpmem.errors import InputError
from cpmem.step.pipeline import Pipeline, schedule_table, warmup_count

warnings.filterwarnings("ignore")


def megatron_warmup(pp: int, stage: int, vpp: int, microbatches: int) -> int:
    group = SimpleNamespace(size=lambda: pp, rank=lambda: stage)
    comm = SimpleNamespace(
        pp_group=group, virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None
    )
    _, _, warmup, _ = schedules.get_pp_rank_microbatches(
        microbatches, vpp, pp, p2p_communicator=comm
    )
    return int(warmup)


CASES = [(pp, vpp, m) for pp in (2, 4, 8) for vpp in (1, 2, 3) for m in (1, 2, 4, 8, 16)]


@pytest.mark.parametrize(("pp", "vpp", "microbatches"), CASES)
def test_warmup_counts_are_megatrons(pp: int, vpp: int, microbatches: int) -> None:
    for stage in range(pp):
        ours = min(warmup_count(pp, stage, vpp), microbatches * vpp)
        assert ours == megatron_warmup(pp, stage, vpp, microbatches), stage


@pytest.mark.parametrize(("pp", "vpp", "microbatches"), [c for c in CASES if c[1] > 1])
def test_the_interleaved_order_is_megatrons_schedule_table(
    pp: int, vpp: int, microbatches: int
) -> None:
    assert schedule_table(microbatches, vpp, pp) == [
        tuple(e) for e in schedules.get_schedule_table(microbatches, vpp, pp)
    ]


@pytest.mark.parametrize(("pp", "vpp", "microbatches"), CASES)
def test_every_forward_is_followed_by_its_backward_and_warmup_is_megatrons(
    pp: int, vpp: int, microbatches: int
) -> None:
    if vpp > 1 and microbatches % pp:  # megatron refuses it, and so does cpmem
        with pytest.raises(InputError) as err:
            Pipeline(pp, vpp, microbatches)
        assert err.value.field == "microbatches"
        return
    pipe = Pipeline(pp, vpp, microbatches)
    for stage in range(pp):
        order = pipe.schedule(stage)
        forwards = [(o.microbatch, o.chunk) for o in order if o.kind == "forward"]
        backwards = [(o.microbatch, o.chunk) for o in order if o.kind == "backward"]
        assert sorted(forwards) == sorted(backwards) and len(forwards) == microbatches * vpp
        done: set[tuple[int, int]] = set()
        for o in order:  # a chunk's backward comes after its forward
            key = (o.microbatch, o.chunk)
            assert (o.kind == "forward") != (key in done)
            done.add(key)
        leading = next((i for i, o in enumerate(order) if o.kind == "backward"), len(order))
        # forwards before the first backward: the warm-up and the first steady forward
        expected = megatron_warmup(pp, stage, vpp, microbatches)
        assert leading == min(expected + 1, microbatches * vpp)
