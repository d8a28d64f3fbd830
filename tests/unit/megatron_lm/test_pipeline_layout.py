"""``--pipeline-model-parallel-layout``: the string read as megatron-core's
``PipelineParallelLayerLayout`` reads it, its checks, and the stages cpmem prices.

Expected stages are unrolled by hand from the strings (megatron-core's
``parse_str_to_list``: ``(...)*n`` then ``x*n``, split at ``|``)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cpmem.errors import InputError
from cpmem.megatron.layout import layout_problems, stage_layer_counts, virtual_pipeline_size
from cpmem.megatron.pipeline_layout import parse_layout
from cpmem.megatron.rules import check_megatron_args
from tests.unit.megatron_lm.tiny import step_of, tiny

RECORDED = "Et*3|(tt|)*6tmL"
"""The layout of moe/gpt3_mcore_te_tp2_pp2_ep4_etp1_selective_recompute_experimental."""


def test_the_recordings_layout_unrolls_into_eight_stages() -> None:
    parsed = parse_layout(RECORDED)
    assert not isinstance(parsed, str)
    assert parsed.stages == ("Ettt", "tt", "tt", "tt", "tt", "tt", "tt", "tmL")
    assert parsed.layers() == (3, 2, 2, 2, 2, 2, 2, 1)


def test_megatrons_docstring_example_reads_with_its_cosmetic_comma() -> None:
    # pipeline_parallel_layer_layout.py:284-286: "Ettt|(tt|)*29,m|L"
    parsed = parse_layout("Ettt|(tt|)*29,m|L")
    assert not isinstance(parsed, str)
    assert parsed.stages == ("Ettt", *(("tt",) * 29), "m", "L")


def test_an_unknown_character_is_megatrons_refusal() -> None:
    reason = parse_layout("Ettx|tL")
    assert isinstance(reason, str) and "'x'" in reason and "315-318" in reason


def _run(layout: str, **changes: object):  # type: ignore[no-untyped-def]
    base = {"num_layers": 16, "pipeline_model_parallel_size": 2, "mtp_num_layers": 1}
    return tiny(pipeline_model_parallel_layout=layout, **{**base, **changes})


def test_the_layout_gives_the_virtual_stages_and_their_layers() -> None:
    args = _run(RECORDED)
    assert layout_problems(args) == []
    assert virtual_pipeline_size(args) == 4  # 8 stages over PP 2
    assert stage_layer_counts(args) == (3, 2, 2, 2, 2, 2, 2, 1)
    # one stage per rank: no virtual stages (arguments.py:949-951)
    plain = _run("Et*8|t*8mL")
    assert virtual_pipeline_size(plain) is None and stage_layer_counts(plain) == (8, 8)


def test_the_step_places_the_layers_as_the_layout_does() -> None:
    args = replace(_run(RECORDED), position_embedding_type="rope")
    pipe = step_of(args, world_size=8).settings.pipeline
    assert (pipe.pp, pipe.vpp, pipe.layers) == (2, 4, (3, 2, 2, 2, 2, 2, 2, 1))
    # rank 0 holds virtual stages 0, 2, 4, 6: 3 + 2 + 2 + 2 layers; rank 1 the rest
    assert [len(pipe.chunk_layers(16, 0, c)) for c in range(4)] == [3, 2, 2, 2]
    assert [len(pipe.chunk_layers(16, 1, c)) for c in range(4)] == [2, 2, 2, 1]


@pytest.mark.parametrize(
    ("layout", "changes", "expected"),
    [
        ("Et*3|(tt|)*6tmL", {"pipeline_model_parallel_size": 3}, "arguments.py:944-949"),
        ("t*3E|(tt|)*6tmL", {}, "pipeline_parallel_layer_layout.py:95-97"),
        ("Et*3|(tt|)*6tLm", {}, "pipeline_parallel_layer_layout.py:98-100"),
        ("Et*3|(tt|)*6tmL", {"num_layers": 15}, "pipeline_parallel_layer_layout.py:107-110"),
        ("Et*3|(tt|)*6tmL", {"mtp_num_layers": None}, "pipeline_parallel_layer_layout.py:112-114"),
        ("Et*3|(tt|)*6mtL", {}, "pipeline_parallel_layer_layout.py:115-120"),
        ("Et*5|(tt|)*5mt|L", {}, "pipeline_parallel_layer_layout.py:115-120"),
        (RECORDED, {"num_virtual_stages_per_pipeline_rank": 4}, "arguments.py:929-939"),
        (RECORDED, {"decoder_first_pipeline_num_layers": 3}, "transformer_config.py:2242-2259"),
    ],
)
def test_megatrons_checks_of_the_layout_refuse_it(
    layout: str, changes: dict[str, object], expected: str
) -> None:
    problems = layout_problems(_run(layout, **changes))
    assert any(expected in reason for _, reason in problems), problems


def test_the_mtp_layers_outside_a_ranks_last_stage_are_megatrons_refusal() -> None:
    # stage 5 is rank 1's chunk 2 of 4 (pipeline_parallel_layer_layout.py:121-126)
    problems = layout_problems(_run("Et*3|tt|tt|tt|tt|ttm|tt|tL"))
    assert any("121-126" in reason for _, reason in problems), problems


@pytest.mark.parametrize(
    ("layout", "what"),
    [
        ("|Et*3|(tt|)*6t|mL", "embedding on a virtual stage after the first"),
        ("Et*5|tt|tt|tt||tt|tt|tmL", "virtual stage 4 holds no transformer layer"),
        # megatron's mtp_standalone: the MTP on rank 0's last chunk (PP 2, 2 stages each)
        ("Et*8|t*8|m|L", "mtp_standalone"),
    ],
)
def test_placements_cpmem_does_not_price_are_refused_by_name(layout: str, what: str) -> None:
    problems = layout_problems(_run(layout))
    assert any(what in reason and "does not price" in reason for _, reason in problems), problems


def test_every_problem_is_listed_in_one_refusal() -> None:
    args = _run("Et*3|(tt|)*6tmL", num_layers=15, num_virtual_stages_per_pipeline_rank=4)
    with pytest.raises(InputError) as err:
        check_megatron_args(args)
    assert "arguments.py:929-939" in err.value.reason
    assert "pipeline_parallel_layer_layout.py:107-110" in err.value.reason


def test_the_busiest_rank_is_the_one_the_layout_loads_most() -> None:
    # the recording's layout: rank 0 holds the embedding and 3 + 2 + 2 + 2 layers, rank 1
    # 2 + 2 + 2 + 1 with the MTP depth and the loss; Megatron-LM logs rank 1 (the last)
    from cpmem.pricing.registry import price

    args = replace(_run(RECORDED), position_embedding_type="rope")
    peaks = {
        rank: price(step_of(args, world_size=8, rank=rank), "tight").peak_bytes
        for rank in (0, "last", "busiest")
    }
    assert peaks["busiest"] == max(peaks[0], peaks["last"])
    statics = {
        rank: price(step_of(args, world_size=8, rank=rank), "tight").static.total  # type: ignore[union-attr]
        for rank in (0, "last")
    }
    assert statics[0] != statics["last"]  # the stages hold different layers and heads
