"""``--step-batch-size-schedule`` read as megatron-core's step calculator reads it, and the
15B release runs' tier-level assumptions (tokenizer vocabulary, candidate worlds).

Hand-derived: 200B tokens // 4096 = 48,828,125 samples, 400B // 4096 = 97,656,250; the
15B release run's --train-samples 19,531,250 (80.0B tokens) ends inside the first stage.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from cpmem.errors import InputError
from cpmem.gate.megatron_tier import read_case
from cpmem.gate.tier_vocab import tier_vocab
from cpmem.gate.world_candidates import dp_candidates
from cpmem.megatron.batch_schedule import parse_schedule, schedule_problems
from cpmem.megatron.rules import check_megatron_args
from megatron_lm.tiny import step_of, tiny

SCHEDULE = "0:384 200B:768 400B:1152"
CASES = Path(__file__).resolve().parents[3] / "golden" / "megatron" / "cases" / "gpt"
RELEASE = CASES / "gpt3_15b_8t_release" / "model_config.yaml"


def test_thresholds_are_tokens_turned_into_samples() -> None:
    assert parse_schedule(SCHEDULE, 4096) == [(0, 384), (48_828_125, 768), (97_656_250, 1152)]
    assert parse_schedule("1.5K:8,0:4", 1) == [(0, 4), (1500, 8)]


@pytest.mark.parametrize(
    ("text", "reason"),
    [("384", "THRESHOLD"), ("10:384", "first threshold"), ("0:4 0:8", "increase"), ("0:0", "pos")],
)
def test_what_megatron_core_refuses(text: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        parse_schedule(text, 1)


def _scheduled(pp: int, **flags: int) -> list[tuple[str, str]]:
    args = tiny(
        global_batch_size=None,
        step_batch_size_schedule="0:32 1M:64",
        pipeline_model_parallel_size=pp,
    )
    values = {f"--{k.replace('_', '-')}": v for k, v in flags.items()}
    return schedule_problems(replace(args, flag_values=values))


def test_pipeline_runs_must_stay_in_the_first_stage() -> None:
    """1M tokens // 1024 = 976 samples: the second stage's threshold."""
    assert _scheduled(1) == []  # PP 1: the count does not move the peak
    assert _scheduled(2, train_samples=975) == []
    assert _scheduled(2, train_iters=30) == []  # 30 x 32 = 960 samples
    assert _scheduled(2, train_iters=31) != []  # 31 x 32 = 992 samples
    assert "reaches the second stage" in _scheduled(2, train_samples=976)[0][1]
    assert "neither --train-samples" in _scheduled(2)[0][1]


def test_the_first_stage_batch_sets_the_microbatches() -> None:
    tp2 = {"global_batch_size": None, "tensor_model_parallel_size": 2}
    args = tiny(**tp2, step_batch_size_schedule="0:32 1M:64")
    assert step_of(args, world_size=8).settings.pipeline.microbatches == 2  # 32 / (4 x 4)
    args = tiny(**tp2, step_batch_size_schedule="0:24 1M:64")
    with pytest.raises(InputError, match="first batch 24"):  # 24 % 16
        step_of(args, world_size=8)


def test_a_schedule_beside_a_global_batch_is_rejected() -> None:
    args = tiny(step_batch_size_schedule="0:32")
    args = replace(args, flag_values={"--step-batch-size-schedule": "0:32"})
    with pytest.raises(InputError, match="Cannot specify both"):
        check_megatron_args(args)


def test_the_release_runs_read_with_the_tier_vocabulary() -> None:
    assert tier_vocab(RELEASE) == 256_000
    assert tier_vocab(CASES / "gpt3_mcore_te_tp2_pp2" / "model_config.yaml") is None
    args = read_case(RELEASE)
    assert args.vocab_size == 256_000
    assert schedule_problems(args) == []
    assert dp_candidates(args) == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 96]
    step = step_of(args, world_size=8 * 96, device="h100")
    assert step.settings.pipeline.microbatches == 1


def test_the_peak_above_static_does_not_depend_on_the_world() -> None:
    """At PP 1 a larger DP shrinks the distributed optimizer's shard, which is live at the
    peak as between steps: the priced static falls with DP and the peak falls by the same
    bytes, so the peak above the static memory (what the report checks against the
    recordings whatever their world) is one figure at every candidate."""
    from cpmem.gate.world_candidates import static_by_dp
    from cpmem.golden.files import default_golden_dir
    from cpmem.golden.megatron import load_recordings

    rec = next(
        r
        for r in load_recordings(default_golden_dir(), "gpt")
        if r.recording_id == "gpt/gpt3_15b_8t_release/dev_dgx_h100"
    )
    rows = static_by_dp(read_case(RELEASE), rec, "nvcr.io/nvidia/pytorch:26.02-py3")
    assert [c.dp for c in rows] == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 96]
    statics = [c.static_bytes for c in rows]
    assert statics == sorted(statics, reverse=True) and statics[0] > 2 * statics[-1]
    assert len({c.peak_bytes - c.static_bytes for c in rows}) == 1
