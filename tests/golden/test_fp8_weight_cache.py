"""FP8 without ``--fp8-param-gather`` priced (``cpmem.pricing.fp8_static``'s
``cached_weight_bytes``, the ``fp8_weight_cache`` component) on Megatron-LM's weekly FP8
recording, ``gpt3_weekly_mcore_tp2_pp2_current_scaling_native_fp8_tp_pp_sp_tp_overlap``
(GPT h512, 12 layers, ffn 2048, TP2 PP2 SP, tensorwise), with its ``--fp8-param-gather``
line taken out: no Megatron-LM recording runs tensorwise or delayed scaling without it, so
the run without FP8 is the reference and only what Transformer Engine keeps for FP8 may
differ.

Hand figures, from Transformer Engine b9d690e0's source (its last rank, stage 1: 6 layers):

- the bf16 weights stay in megatron-core's bf16 buffer: ``weights``, the gradient buffer
  and the optimizer's state are the run without FP8's;
- each TE linear (QKV, proj, fc1, fc2) caches the FP8 cast of its weight across
  micro-batches and steps (megatron-core passes ``is_first_microbatch``,
  ``extensions/transformer_engine.py:671-678``; TE ``module/linear.py:1805-1809``,
  ``:1906-1909``): ``Float8Quantizer::create_tensor`` (``csrc/quantizer.cpp:282-310``) a
  ``uint8`` data tensor of the weight's shape, its transpose where the GEMM needs TN
  layouts (``columnwise_usage && !is_non_tn_fp8_gemm_supported``: Hopper, not
  Blackwell) and one fp32 ``scale_inv`` (``:277``). The stage's FP8 elements:
  6 x (3H x H + H x H + 4H x H + H x 4H) / 2 at H = 512 = 9,437,184, each weight a whole
  number of 512 B blocks (the smallest, proj, 512 x 512 / 2 = 131,072 B); 24 weights x one
  512 B ``scale_inv`` block = 12,288 B;
- the saved inputs are the param-gather run's: QKV's and fc1's normed inputs and fc2's
  input at 1 B, proj's FP8 copy beside its bf16 input: -1,280 B per token and layer,
  -15,728,640 B on a micro-batch of 2,048 tokens over 6 layers.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cpmem.gate.megatron_tier import TierRow, price_recording
from cpmem.golden.files import default_golden_dir
from cpmem.golden.megatron import Recording, load_recordings
from cpmem.megatron.args import read_megatron_args
from cpmem.megatron.fp8_rules import megatron_fp8
from cpmem.step.fp8 import Fp8

GOLDEN = default_golden_dir()
CASE = "gpt3_weekly_mcore_tp2_pp2_current_scaling_native_fp8_tp_pp_sp_tp_overlap"
GATHER = re.compile(r"^\s*--fp8-param-gather\b")
FP8 = re.compile(r"^\s*--(fp8-format|fp8-recipe|fp8-param-gather)\b")

H, LAYERS, TP = 512, 6, 2
FP8_ELEMENTS = 9_437_184
SCALE_INVERSES = 24 * 512
SAVED = -15_728_640
HOPPER = {"h100": True, "gb200": False}


def _recording(device: str) -> Recording:
    (rec,) = [r for r in load_recordings(GOLDEN, "gpt") if r.case == CASE and r.device == device]
    return rec


def _without(device: str, tmp: Path, lines: re.Pattern[str], recipe: str = "") -> TierRow:
    rec = _recording(device)
    text = rec.model_config(GOLDEN).read_text(encoding="utf-8")
    if recipe:
        text = text.replace("--fp8-recipe: tensorwise", f"--fp8-recipe: {recipe}")
    path = tmp / f"{lines.pattern.count('|')}_{recipe}.yaml"
    kept = [line for line in text.splitlines() if not lines.match(line)]
    path.write_text("\n".join(kept) + "\n", encoding="utf-8")
    return price_recording(rec, GOLDEN, read_megatron_args(path))


def test_the_hand_figures() -> None:
    assert LAYERS * (3 * H * H + H * H + 4 * H * H + H * 4 * H) // TP == FP8_ELEMENTS
    assert min(3 * H * H, H * H, 4 * H * H) // TP % 512 == 0
    assert (-(H // TP) - (H // TP) - (4 * H // TP) + (H // TP)) * 2048 * LAYERS == SAVED


def test_the_door_reads_fp8_without_param_gather(tmp_path: Path) -> None:
    path = tmp_path / "args.yaml"
    text = _recording("h100").model_config(GOLDEN).read_text(encoding="utf-8")
    path.write_text(
        "\n".join(line for line in text.splitlines() if not GATHER.match(line)) + "\n",
        encoding="utf-8",
    )
    assert megatron_fp8(read_megatron_args(path)) == Fp8("tensorwise", False)


@pytest.mark.parametrize("device", ["h100", "gb200"])
def test_the_static_terms_are_the_bf16_run_and_the_cached_copies(
    device: str, tmp_path: Path
) -> None:
    cached = dict(_without(device, tmp_path, GATHER).estimate.static.components)
    bf16 = _without(device, tmp_path, FP8).estimate.static.components
    assert cached.pop("fp8_weight_cache") == FP8_ELEMENTS
    assert cached.pop("fp8_transposes") == (FP8_ELEMENTS if HOPPER[device] else 0)
    assert cached.pop("fp8_scale_inverses") == SCALE_INVERSES
    assert cached == bf16


@pytest.mark.parametrize("device", ["h100", "gb200"])
def test_the_saved_inputs_are_the_param_gather_runs(device: str, tmp_path: Path) -> None:
    cached = _without(device, tmp_path, GATHER).estimate.components["retained_activations"]
    bf16 = _without(device, tmp_path, FP8).estimate.components["retained_activations"]
    assert cached - bf16 == SAVED


def test_delayed_scaling_adds_its_state_alone(tmp_path: Path) -> None:
    """At history 1 the state is 20 one-block tensors a layer (``test_fp8_delayed``):
    6 x 20 x 512 = 61,440 B; the cached copies are the tensorwise ones (the same
    ``uint8`` data, transpose and ``scale_inv``, ``quantizer.cpp:271-310`` and
    ``:593-626``)."""
    tensorwise = _without("h100", tmp_path, GATHER).estimate.static.components
    delayed = dict(_without("h100", tmp_path, GATHER, "delayed").estimate.static.components)
    assert delayed.pop("fp8_scaling_state") == LAYERS * 20 * 512
    assert delayed == tensorwise
