"""The output layer's weight gradient deferred to the pipeline's drain
(``--defer-embedding-wgrad-compute``) and the output layer's cached dummy gradient, on
the tiny GPT of Megatron-LM's functional tests (``tiny.py``).

Hand-derived: TP 2, PP 2 on 8 GPUs leaves DP 2, so the step runs 32 / (4 x 2) = 4
micro-batches of 4 x 1024 = 4096 tokens. GPT-2's 50,257 tokens padded to a multiple of
128 x 2 are 50,432, 25,216 on a TP rank. One deferred micro-batch keeps its logits'
gradient, 4096 x 25,216 x 2 B = 206,569,472 B, and the output layer's input, 4096 x 512
x 2 B = 4,194,304 B: 210,763,776 B (megatron-core tensor_parallel/layers.py: the
``grad_output_buffer`` and ``embedding_activation_buffer`` appends). The dummy is
``[25,216, 512]`` bf16: 25,821,184 B.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from cpmem.errors import InputError
from cpmem.gate.megatron_misses import CACHED_DUMMY_SINCE
from cpmem.megatron.rules import check_megatron_args
from cpmem.pricing.dummy_wgrad import dummy_wgrad_bytes
from cpmem.step.describe import describe_step
from cpmem.step.pipeline import Pipeline
from megatron_lm.tiny import priced, step_of, tiny

PER_MICROBATCH = 4096 * 25_216 * 2 + 4096 * 512 * 2
DUMMY = 25_216 * 512 * 2
TP2_PP2 = {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2}
GOLDEN = Path(__file__).resolve().parents[3] / "golden" / "megatron"


def test_per_microbatch_bytes_are_the_hand_derived_figure() -> None:
    assert PER_MICROBATCH == 210_763_776
    assert DUMMY == 25_821_184


@pytest.mark.parametrize(("limit", "held"), [(1, 1), (2, 2), (0, 3), (9, 3)])
def test_the_last_stage_holds_the_deferred_microbatches(limit: int, held: int) -> None:
    """The peak rises by the deferred micro-batches whose backward ran before the busiest
    op: all four micro-batches price alike, so the busiest op of a later micro-batch sees
    ``min(limit, 3)`` of them (every one at limit 0; the fourth's is kept only after its
    own backward, the stage's last op)."""
    base = priced(tiny(**TP2_PP2))
    deferred = priced(
        tiny(**TP2_PP2, defer_embedding_wgrad_compute=True, wgrad_deferral_limit=limit)
    )
    assert deferred.static == base.static
    assert deferred.peak_bytes - base.peak_bytes == held * PER_MICROBATCH
    assert deferred.forward_backward_components is not None
    assert deferred.forward_backward_components["deferred_wgrad"] == held * PER_MICROBATCH


def test_the_first_stage_defers_nothing() -> None:
    args = tiny(**TP2_PP2)
    on = tiny(**TP2_PP2, defer_embedding_wgrad_compute=True, wgrad_deferral_limit=2)
    assert priced(on, rank=0).peak_bytes == priced(args, rank=0).peak_bytes


def test_the_dummy_gradient_is_static_on_the_output_layers_stage() -> None:
    last = priced(tiny(**TP2_PP2))
    assert last.static is not None
    assert last.static.components["dummy_wgrad"] == DUMMY
    first = priced(tiny(**TP2_PP2), rank=0)
    assert first.static is not None
    assert "dummy_wgrad" not in first.static.components


def test_no_dummy_without_fusion_te_or_its_cache() -> None:
    """Without fused accumulation the weight gradient is a real tensor, freed; without
    Transformer Engine's modules, or in NGC 24.01 (TE 1.x: no ``get_dummy_wgrad``), the
    dummy is a ``torch.empty`` freed with the step's gradients."""
    for args, options in (
        (tiny(**TP2_PP2, gradient_accumulation_fusion=False), {}),
        (tiny(**TP2_PP2, transformer_impl="local"), {}),
        (tiny(**TP2_PP2), {"container": "ngc-24.01"}),
    ):
        step = step_of(args, **options)
        assert dummy_wgrad_bytes(step.settings, 1) == 0
    assert dummy_wgrad_bytes(step_of(tiny(**TP2_PP2)).settings, 1) == DUMMY


def test_lora_training_keeps_no_dummy() -> None:
    """ART's adapters leave the output layer frozen: no weight gradient, no dummy."""
    step = describe_step("qwen3-1.7b", [2048], runtime="megatron-lm", training="lora")
    assert dummy_wgrad_bytes(step.settings, 0) == 0


def test_megatron_rejects_what_its_config_rejects_all_at_once() -> None:
    args = tiny(
        defer_embedding_wgrad_compute=True,
        wgrad_deferral_limit=-1,
        gradient_accumulation_fusion=False,
    )
    with pytest.raises(InputError) as exc:
        check_megatron_args(args)
    text = str(exc.value)
    assert "pipeline model parallel is not used" in text
    assert "gradient accumulation fusion is not used" in text
    assert "greater than or equal to 0" in text


def test_sequence_parallel_deferral_is_refused() -> None:
    args = tiny(**TP2_PP2, sequence_parallel=True, defer_embedding_wgrad_compute=True)
    with pytest.raises(InputError, match="mpu_0"):
        check_megatron_args(args)


def test_a_limit_without_the_deferral_changes_nothing() -> None:
    assert priced(tiny(**TP2_PP2, wgrad_deferral_limit=2)) == priced(tiny(**TP2_PP2))


def test_the_pipeline_counts_deferred_microbatches() -> None:
    assert Pipeline(2, microbatches=4).deferred_microbatches == 0
    assert Pipeline(2, microbatches=4, deferred_wgrad=0).deferred_microbatches == 4
    assert Pipeline(2, microbatches=4, deferred_wgrad=3).deferred_microbatches == 3
    assert Pipeline(2, microbatches=4, deferred_wgrad=7).deferred_microbatches == 4
    with pytest.raises(InputError, match="pp > 1"):
        Pipeline(1, microbatches=4, deferred_wgrad=0)
    with pytest.raises(InputError, match="deferred_wgrad"):
        Pipeline(2, microbatches=4, deferred_wgrad=-1)


def test_only_a_trained_output_layer_defers() -> None:
    with pytest.raises(InputError, match="--training full"):
        describe_step("qwen3-1.7b", [2048], pp=2, microbatches=2, deferred_wgrad=0)


def _static(rows: list[dict[str, str]], case: str, file: str) -> int:
    match = [r for r in rows if r["case"] == case and r["file"] == file]
    assert len(match) == 1, (case, file)
    return int(match[0]["allocated_last_bytes"])


def test_the_cache_date_is_where_the_recordings_change() -> None:
    """Read raw from golden/megatron: the resumed TP 2 PP 2 case with the deferral (and
    fused accumulation, which it needs) against the same case without either, file by
    file. Recorded on or after CACHED_DUMMY_SINCE in an image past NGC 24.01, the
    deferral's run holds at least the dummy more between steps; before it, or on 24.01,
    less than half of it."""
    with open(GOLDEN / "recordings.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    with open(GOLDEN / "recorded_images.csv", newline="") as fh:
        images = {r["recording_id"]: r for r in csv.DictReader(fh)}
    case = "gpt3_mcore_te_tp2_pp2_resume_torch_dist"
    deferred = f"{case}_defer_embedding_wgrad_compute"
    files = {r["file"] for r in rows if r["case"] == deferred} & {
        r["file"] for r in rows if r["case"] == case
    }
    seen = {True: 0, False: 0}
    for file in sorted(files):
        image = images[f"gpt/{deferred}/{file.removeprefix('golden_values_')[:-5]}"]
        cached = (
            image["values_date"] >= CACHED_DUMMY_SINCE and ":24.01-" not in (image["base_image"])
        )
        above = _static(rows, deferred, file) - _static(rows, case, file)
        assert (above >= DUMMY) if cached else (above < DUMMY / 2), (file, above)
        seen[cached] += 1
    assert seen[True] >= 4 and seen[False] >= 2


def test_the_release_runs_a100_h100_gap_is_the_cached_dummies_and_workspaces() -> None:
    """The 15B release run (TP 8, V 256,000, h 6144, FFN 24,576 squared-ReLU, 48 heads in
    8 groups of 128) holds 570,550,272 B more between steps on H100 (image 26.02) than on
    A100 (24.01, TE 1.x: nothing cached), read raw. Hand-derived, at the same DP: the
    output layer's dummy [32,000, 6144] bf16, TE's dummies of one layer's four weights
    ([1024, 6144], [6144, 768], [3072, 6144], [6144, 3072]), and Hopper's larger cuBLAS
    (2 x (32 MiB - 8,519,680 B)) and TE (32 MiB + 1 KiB - 4 MiB) workspaces: within 1 MiB."""
    with open(GOLDEN / "recordings.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    case = "gpt3_15b_8t_release"
    gap = _static(rows, case, "golden_values_dev_dgx_h100.json") - _static(
        rows, case, "golden_values_lts_dgx_a100.json"
    )
    output = 32_000 * 6144 * 2
    layers = (1024 * 6144 + 6144 * 768 + 3072 * 6144 + 6144 * 3072) * 2
    workspaces = 2 * ((32 << 20) - 8_519_680) + ((32 << 20) + 1024 - (4 << 20))
    assert abs(gap - (output + layers + workspaces)) < 1 << 20
