"""FP8 training priced (``cpmem.step.fp8``, ``cpmem.pricing.fp8_static``,
``cpmem.pricing.kinds.fp8``) on Megatron-LM's one FP8 recording without Megatron FSDP or
CUDA graphs: ``gpt3_weekly_mcore_tp2_pp2_current_scaling_native_fp8_tp_pp_sp_tp_overlap``
(GPT h512, 12 layers, ffn 2048, TP2 PP2 SP, micro-batch 2 x 1024 tokens, tensorwise,
``--fp8-param-gather``, ``--tp-comm-overlap``), its last rank (stage 1: 6 layers).

Every expected byte is derived by hand here, from the model's shape and the source lines
the modules cite, never from the code under test:

- FP8 elements on the stage: 6 layers x (qkv 3H x H + proj H x H + fc1 4H x H + fc2
  H x 4H) / TP 2 at H = 512 = 9,437,184; each leaves the bf16 buffer for the ``uint8`` one
  (2 B -> 1 B), and is kept transposed on Hopper (1 B), not on Blackwell;
- 24 FP8 weights x one 512 B ``_scale_inv`` block = 12,288 B;
- the userbuffer GEMMs' workspace: 3 x (32 MiB + 1 KiB) = 100,666,368 B;
- the saved activations per token and layer (bytes, SP over TP 2): qkv's normed input
  H/2 = 256 elements and fc1's 256 lose a byte each, fc2's input 4H/2 = 1,024 loses a byte
  each, proj gains a 1 B copy of its H/2 = 256-element input: -1,280 B; one micro-batch of
  2,048 tokens over 6 layers: -15,728,640 B.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cpmem.errors import InputError
from cpmem.gate.megatron_misses import DECLARED_MISSES, STATIC_TOLERANCE
from cpmem.gate.megatron_tier import TierRow, price_recording
from cpmem.golden.files import default_golden_dir
from cpmem.golden.megatron import Recording, load_recordings
from cpmem.megatron.args import parse_megatron_args, read_megatron_args

GOLDEN = default_golden_dir()
CASE = "gpt3_weekly_mcore_tp2_pp2_current_scaling_native_fp8_tp_pp_sp_tp_overlap"
FLAGS = re.compile(r"^\s*--(fp8-format|fp8-recipe|fp8-param-gather|tp-comm-overlap)\b")

H, LAYERS, TP, TOKENS = 512, 6, 2, 2048
FP8_ELEMENTS = LAYERS * (3 * H * H + H * H + 4 * H * H + H * 4 * H) // TP
SCALE_INVERSES = 24 * 512
UB_WORKSPACE = 3 * (32 * (1 << 20) + 1024)
SAVED_PER_TOKEN_LAYER = -(H // TP) - (H // TP) - (4 * H // TP) + (H // TP)
HOPPER = {"h100": True, "gb200": False}


def _recording(device: str) -> Recording:
    (rec,) = [r for r in load_recordings(GOLDEN, "gpt") if r.case == CASE and r.device == device]
    return rec


def _priced(device: str) -> TierRow:
    rec = _recording(device)
    return price_recording(rec, GOLDEN, read_megatron_args(rec.model_config(GOLDEN)))


def _without_flags(device: str, tmp: Path) -> TierRow:
    rec = _recording(device)
    text = rec.model_config(GOLDEN).read_text(encoding="utf-8")
    path = tmp / "model_config.yaml"
    path.write_text(
        "\n".join(line for line in text.splitlines() if not FLAGS.match(line)) + "\n",
        encoding="utf-8",
    )
    return price_recording(rec, GOLDEN, read_megatron_args(path))


def test_the_hand_figures() -> None:
    assert FP8_ELEMENTS == 9_437_184
    assert SAVED_PER_TOKEN_LAYER == -1_280
    assert UB_WORKSPACE == 100_666_368


@pytest.mark.parametrize("device", ["h100", "gb200"])
def test_the_static_terms_are_the_hand_ones(device: str, tmp_path: Path) -> None:
    fp8 = _priced(device).estimate.static.components
    bf16 = _without_flags(device, tmp_path).estimate.static.components
    assert bf16["weights"] - fp8["weights"] == FP8_ELEMENTS  # 2 B -> 1 B each
    assert fp8["fp8_transposes"] == (FP8_ELEMENTS if HOPPER[device] else 0)
    assert fp8["fp8_scale_inverses"] == SCALE_INVERSES
    assert fp8["te_userbuffer_workspace"] == UB_WORKSPACE
    assert "te_userbuffer_workspace" not in bf16
    # the gradients and the optimizer's fp32 state keep the nominal dtype's bytes
    assert fp8["gradient_buffer"] == bf16["gradient_buffer"]
    assert fp8["optimizer_states"] == bf16["optimizer_states"]


@pytest.mark.parametrize("device", ["h100", "gb200"])
def test_the_saved_inputs_are_the_hand_ones(device: str, tmp_path: Path) -> None:
    fp8 = _priced(device).estimate.components["retained_activations"]
    bf16 = _without_flags(device, tmp_path).estimate.components["retained_activations"]
    assert fp8 - bf16 == SAVED_PER_TOKEN_LAYER * TOKENS * LAYERS == -15_728_640


@pytest.mark.parametrize("device", ["h100", "gb200"])
def test_the_recording_prices_in_the_tier(device: str) -> None:
    row = _priced(device)
    assert abs(row.static_error) <= STATIC_TOLERANCE
    assert row.passed("headroom")
    if device == "gb200":
        assert row.passed("covers")
    else:
        # 45,568 B (0.005%) under the recording: inside the allocator's block rounding
        assert row.measured_peak - row.peak_bytes == 45_568
        assert row.declared("covers") is not None
        (blocks,) = [m for m in DECLARED_MISSES if m.label == "allocator blocks"]
        assert blocks.matches(row, "covers")


def test_the_answer_names_the_userbuffers_outside_the_figure() -> None:
    notes = _priced("h100").estimate.notes
    assert any("userbuffers are device memory outside PyTorch's allocator" in n for n in notes)


REQUIRED = {
    "--num-layers": 2,
    "--hidden-size": 64,
    "--num-attention-heads": 4,
    "--seq-length": 128,
    "--max-position-embeddings": 128,
    "--micro-batch-size": 1,
    "--bf16": True,
    "--vocab-size": 1024,
    "--tokenizer-type": "NullTokenizer",
}


def test_the_default_recipe_is_priced_with_megatrons_default_history() -> None:
    # --fp8-recipe defaults to delayed (transformer_config.py:594), its
    # --fp8-amax-history-len to 1 (:621, at the snapshot d98e8a64)
    args = parse_megatron_args({**REQUIRED, "--fp8-format": "hybrid", "--fp8-param-gather": True})
    assert (args.fp8_recipe, args.fp8_amax_history_len) == ("delayed", 1)


@pytest.mark.parametrize(
    ("recipe", "given", "named"),
    [
        # TE b9d690e0 tensor/utils.py:68-69: replace_raw_data raises for an MXFP8Tensor
        (
            "mxfp8",
            {"--use-distributed-optimizer": True},
            "--fp8-recipe mxfp8 with --fp8-param-gather and --use-distributed-optimizer",
        ),
        ("custom", {}, "--fp8-recipe custom"),
    ],
)
def test_each_unpriced_recipe_is_refused_by_name(
    recipe: str, given: dict[str, object], named: str
) -> None:
    flags = {"--fp8-format": "e4m3", "--fp8-recipe": recipe, "--fp8-param-gather": True, **given}
    with pytest.raises(InputError) as err:
        parse_megatron_args({**REQUIRED, **flags})
    assert err.value.value == named


def test_fp8_without_param_gather_is_read_as_cached_copies() -> None:
    """Without ``--fp8-param-gather`` the weights stay bf16 beside TE's cached FP8 copies,
    priced (``test_fp8_weight_cache``), not refused."""
    args = parse_megatron_args({**REQUIRED, "--fp8-format": "e4m3", "--fp8-recipe": "tensorwise"})
    assert (args.fp8, args.fp8_param_gather) == ("e4m3", False)


def test_a_flag_read_only_under_fp8_is_ignored_without_it_and_refused_with_it() -> None:
    assert "--no-fp8-wgrad" in parse_megatron_args({**REQUIRED, "--no-fp8-wgrad": True}).ignored
    flags = {"--fp8-format": "e4m3", "--fp8-recipe": "tensorwise", "--fp8-param-gather": True}
    with pytest.raises(InputError) as err:
        parse_megatron_args({**REQUIRED, **flags, "--no-fp8-wgrad": True})
    assert err.value.value == "--no-fp8-wgrad"
