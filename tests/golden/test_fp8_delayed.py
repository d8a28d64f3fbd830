"""FP8's ``delayed`` recipe (Megatron-LM's default) priced (``cpmem.pricing.fp8_static``'s
``scaling_state_bytes``) on the one FP8 recording without Megatron FSDP or CUDA graphs,
``gpt3_weekly_mcore_tp2_pp2_current_scaling_native_fp8_tp_pp_sp_tp_overlap``, with its
``--fp8-recipe tensorwise`` changed to ``delayed``: no Megatron-LM recording runs delayed
scaling alone (the scoped CUDA-graph cases run blockwise), so the recording's tensorwise
price is the reference and only delayed scaling's own state may differ.

Hand figures, from Transformer Engine b9d690e0's source:

- each TE module keeps, per direction, ``scale`` ``[n]`` fp32 and ``amax_history``
  ``[history, n]`` fp32 (``quantization.py:1412-1418``), n = 3 quantizers per GEMM
  forward, 2 backward (``module/base.py:979-981``);
- a layer runs 4 one-GEMM linears (QKV, proj, fc1, fc2: ``init_fp8_metadata`` default
  ``num_gemms=1``, ``base.py:1327``) and one ``DotProductAttention`` of 3 GEMMs
  (``dot_product_attention.py:1208-1209``), which keeps the linears' delayed recipe
  (``:627-631``, ``NVTE_DPA_FP8_RECIPE`` unset);
- each tensor takes whole 512 B blocks of PyTorch's caching allocator.

At history 1: every tensor is at most 9 x 4 = 36 B, one block: (4 linears + 1 attention)
x 4 tensors x 512 B = 10,240 B a layer, 61,440 B on the last stage's 6 layers.
At history 1024: a linear's forward history 1024 x 3 x 4 = 12,288 B (24 blocks), its
backward 1024 x 2 x 4 = 8,192 B, its two scales a block each: 21,504 B; the attention's
1024 x 9 x 4 = 36,864 B and 1024 x 6 x 4 = 24,576 B and two blocks: 62,464 B; a layer
4 x 21,504 + 62,464 = 148,480 B, 6 layers 890,880 B.
At history 100 (not a whole number of blocks): a linear 512 + 1,536 (1,200 B) + 512 +
1,024 (800 B) = 3,584 B, the attention 512 + 4,096 (3,600 B) + 512 + 2,560 (2,400 B) =
7,680 B; a layer 22,016 B, 6 layers 132,096 B.
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from cpmem.gate.megatron_tier import TierRow, price_recording
from cpmem.golden.files import default_golden_dir
from cpmem.golden.megatron import Recording, load_recordings
from cpmem.megatron.args import read_megatron_args
from cpmem.megatron.fields import MegatronArgs
from cpmem.megatron.fp8_rules import megatron_fp8
from cpmem.megatron.snapshot import arguments
from cpmem.pricing.fp8_static import scaling_state_bytes
from cpmem.step.fp8 import DEFAULT_HISTORY, Fp8

GOLDEN = default_golden_dir()
CASE = "gpt3_weekly_mcore_tp2_pp2_current_scaling_native_fp8_tp_pp_sp_tp_overlap"
RECIPE = "  --fp8-recipe: tensorwise"
LAYERS = 6
STATE = {1: 61_440, 100: 132_096, 1024: 890_880}


def _recording(device: str) -> Recording:
    (rec,) = [r for r in load_recordings(GOLDEN, "gpt") if r.case == CASE and r.device == device]
    return rec


def _priced(device: str, tmp: Path, history: int | None) -> TierRow:
    rec = _recording(device)
    text = rec.model_config(GOLDEN).read_text(encoding="utf-8")
    assert text.count(RECIPE + "\n") == 1
    if history is not None:
        delayed = "  --fp8-recipe: delayed\n"
        if history != 1:
            delayed += f"  --fp8-amax-history-len: {history}\n"
        text = text.replace(RECIPE + "\n", delayed)
    path = tmp / "model_config.yaml"
    path.write_text(text, encoding="utf-8")
    return price_recording(rec, GOLDEN, read_megatron_args(path))


def test_the_hand_figures() -> None:
    assert STATE[1] == LAYERS * (4 + 1) * 4 * 512
    linear = 512 + 1024 * 3 * 4 + 512 + 1024 * 2 * 4
    attention = 512 + 1024 * 9 * 4 + 512 + 1024 * 6 * 4
    assert LAYERS * (4 * linear + attention) == STATE[1024]
    assert STATE[100] == LAYERS * (4 * 3_584 + 7_680)


@pytest.mark.parametrize("history", sorted(STATE))
def test_the_state_of_one_stage_is_the_hand_one(history: int) -> None:
    assert scaling_state_bytes(["attention", "dense"] * LAYERS, history) == STATE[history]


@pytest.mark.parametrize("device", ["h100", "gb200"])
@pytest.mark.parametrize("history", sorted(STATE))
def test_delayed_differs_from_tensorwise_by_its_state_alone(
    device: str, history: int, tmp_path: Path
) -> None:
    """The FP8 weights, their transposes and scale inverses (TE ``quantizer.cpp:271-280``
    and ``:593-626``: one fp32 ``scale_inv`` and the same uint8 data and transpose under
    both quantizers) and the linears' 1 B saved inputs are the tensorwise ones."""
    tensorwise = _priced(device, tmp_path, None).estimate
    delayed = _priced(device, tmp_path, history).estimate
    static_t, static_d = tensorwise.static.components, delayed.static.components
    assert "fp8_scaling_state" not in static_t
    assert static_d.pop("fp8_scaling_state") == STATE[history]
    assert static_d == static_t
    for term in ("retained_activations",):
        assert delayed.components[term] == tensorwise.components[term]


def _args(tmp: Path, recipe: str, extra: str = "") -> MegatronArgs:
    text = _recording("h100").model_config(GOLDEN).read_text(encoding="utf-8")
    path = tmp / "args.yaml"
    path.write_text(text.replace(RECIPE, f"  --fp8-recipe: {recipe}" + extra), encoding="utf-8")
    return read_megatron_args(path)


def test_the_door_reads_the_history_under_delayed_alone(tmp_path: Path) -> None:
    history = "\n  --fp8-amax-history-len: 1024"
    args = _args(tmp_path, "delayed", history)
    assert megatron_fp8(args) == Fp8("delayed", True, 1024)
    assert "--fp8-amax-history-len" not in args.ignored
    # tensorwise keeps no history: the flag changes nothing there
    assert megatron_fp8(_args(tmp_path, "tensorwise", history)) == Fp8("tensorwise", True)


def test_the_margin_algorithm_and_interval_are_ignored_not_refused(tmp_path: Path) -> None:
    extra = "\n  --fp8-margin: 2\n  --fp8-amax-compute-algo: max\n  --fp8-interval: 4"
    args = _args(tmp_path, "delayed", extra)
    for flag in ("--fp8-margin", "--fp8-amax-compute-algo", "--fp8-interval"):
        assert flag in args.ignored


def test_the_default_history_is_the_snapshots() -> None:
    # transformer_config.py:621 (d98e8a64): fp8_amax_history_len: int = 1, as the
    # snapshot's parser records it
    default = arguments()["--fp8-amax-history-len"].default
    assert default == DEFAULT_HISTORY == 1
    (field,) = [f for f in fields(MegatronArgs) if f.name == "fp8_amax_history_len"]
    assert field.default == default
