"""``--delay-wgrad-compute`` at the door (``cpmem.megatron.delay_rules``): read under the
combined 1F1B schedule; what Megatron-LM rejects (transformer_config.py:2597-2601,
2616-2619 and arguments.py:1683-1685 at 4828d651) and what cpmem does not price,
refused by name."""

from __future__ import annotations

import pytest

from cpmem.errors import InputError
from cpmem.megatron.args import parse_megatron_args
from cpmem.megatron.delay_rules import delay_problems
from tests.unit.megatron_lm.tiny import FLAGS, tiny

OVERLAP = {
    **FLAGS,
    "--bf16": True,
    "--num-experts": 8,
    "--expert-model-parallel-size": 2,
    "--moe-token-dispatcher-type": "alltoall",
    "--overlap-moe-expert-parallel-comm": True,
    "--delay-wgrad-compute": True,
}


def test_the_delay_is_read_under_the_overlapped_schedule() -> None:
    args = parse_megatron_args(OVERLAP)
    assert args.delay_wgrad_compute and delay_problems(args) == []


def test_without_the_overlapped_schedule_megatron_rejects_it() -> None:
    flags = {k: v for k, v in OVERLAP.items() if k != "--overlap-moe-expert-parallel-comm"}
    with pytest.raises(InputError) as err:
        parse_megatron_args(flags)
    assert err.value.value == "--delay-wgrad-compute without --overlap-moe-expert-parallel-comm"
    assert "overlap_moe_expert_parallel_comm must be enabled" in err.value.reason


@pytest.mark.parametrize(
    ("changes", "value", "says"),
    [
        ({"transformer_impl": "local"}, "with --transformer-impl local", "transformer_engine"),
        ({"cuda_graph_impl": "transformer_engine"}, "with CUDA graphs", "graphed layers"),
        ({"mtp_num_layers": 1}, "with --mtp-num-layers", "MTP depth's delayed GEMMs"),
        ({"hybrid_layer_pattern": "M*-"}, "with a hybrid layer pattern", "Mamba"),
    ],
)
def test_what_is_rejected_or_unpriced_is_named(changes: dict, value: str, says: str) -> None:  # type: ignore[type-arg]
    args = tiny(delay_wgrad_compute=True, overlap_moe_expert_parallel_comm=True, **changes)
    ((named, reason),) = delay_problems(args)
    assert named == f"--delay-wgrad-compute {value}" and says in reason


def test_nothing_is_named_without_the_delay() -> None:
    assert delay_problems(tiny(overlap_moe_expert_parallel_comm=True, mtp_num_layers=1)) == []
