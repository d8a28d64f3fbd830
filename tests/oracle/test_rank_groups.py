"""The TP x CP x PP blocks admission agrees over, against megatron-core 0.16's own
``RankGenerator`` (the class ``parallel_state.initialize_model_parallel`` builds its groups
with, in its default order ``tp-cp-ep-dp-pp``). cpmem imports no megatron; the restatement
is ``cpmem.admission.groups``."""

from __future__ import annotations

import itertools
import warnings

import pytest

pytest.importorskip("megatron.core")

from megatron.core.parallel_state import RankGenerator

from cpmem.admission.groups import MEGATRON_ORDER, block_of, model_parallel_blocks
from cpmem.errors import InputError

warnings.filterwarnings("ignore")

SIZES = [1, 2, 4]


@pytest.mark.parametrize(
    ("tp", "cp", "pp", "dp"), list(itertools.product(SIZES, SIZES, SIZES, [1, 2, 3]))
)
def test_blocks_are_megatrons_tp_cp_pp_groups(tp: int, cp: int, pp: int, dp: int) -> None:
    generator = RankGenerator(tp=tp, ep=1, dp=dp, pp=pp, cp=cp, order=MEGATRON_ORDER)
    theirs = sorted(tuple(sorted(g)) for g in generator.get_ranks("tp-cp-pp"))
    ours = model_parallel_blocks(tp * cp * pp * dp, tp, cp, pp)
    assert sorted(ours) == theirs
    # every rank in exactly one block, and its TP x CP group (megatron's) inside it
    assert sorted(r for b in ours for r in b) == list(range(tp * cp * pp * dp))
    for inner in generator.get_ranks("tp-cp"):
        assert set(inner) <= set(block_of(inner[0], ours))


def test_a_block_is_not_contiguous_with_data_parallel_replicas() -> None:
    # tp 1, cp 2, pp 2, dp 2: stage 1 of replica 0 sits after both replicas' stage 0
    assert model_parallel_blocks(8, 1, 2, 2) == ((0, 1, 4, 5), (2, 3, 6, 7))


def test_sizes_that_do_not_divide_the_world_are_refused() -> None:
    with pytest.raises(InputError) as err:
        model_parallel_blocks(12, 2, 2, 2)
    assert err.value.field == "tp x cp x pp"
