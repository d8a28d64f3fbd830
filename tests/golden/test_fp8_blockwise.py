"""FP8's ``blockwise`` recipe (TE's ``Float8BlockScaling``) priced on Megatron-LM's weekly
FP8 recording, ``gpt3_weekly_mcore_tp2_pp2_current_scaling_native_fp8_tp_pp_sp_tp_overlap``
(GPT h512, 12 layers, ffn 2048, TP2 PP2 SP, micro-batch 2 x 1024 tokens), with its
``--fp8-recipe tensorwise`` changed to ``blockwise``, with and without its
``--fp8-param-gather``: no Megatron-LM recording runs blockwise alone (the scoped
CUDA-graph cases run it with MoE layers and CUDA graphs), so the tensorwise price is the
reference and only what blockwise keeps beyond it may differ.

Hand figures, from Transformer Engine b9d690e0 (its last rank, stage 1: 6 layers):

- the weights on the rank, ``[out, in]``: QKV [768, 512], proj [512, 256], fc1
  [1024, 512], fc2 [512, 1024]. ``Float8BlockQuantizer::create_tensor``
  (``csrc/quantizer.cpp:966-1020``) allocates the rowwise data, the columnwise data (the
  transpose, on every device: no TN-layout shortcut as ``Float8Quantizer``'s
  ``is_non_tn_fp8_gemm_supported``) and a rowwise and a columnwise fp32 scale tensor,
  128 x 128 blocks (``common/recipe/__init__.py:425-427``), shapes
  ``[ceil(rows/128), roundup(ceil(cols/128), 4)]`` and ``[ceil(cols/128),
  roundup(ceil(rows/128), 4)]`` (``quantizer.cpp:1323-1375``): QKV 6 x 4 and 4 x 8, proj
  4 x 4 and 2 x 4, fc1 8 x 4 and 4 x 8, fc2 4 x 8 and 8 x 4 fp32, at most 128 B each:
  one 512 B block each, 24 weights x 2 x 512 = 24,576 B (tensorwise: one 512 B
  ``scale_inv`` a weight, 12,288 B);
- the columnwise copies, 1 B per element: 9,437,184 B on H100 and on GB200 (tensorwise
  keeps none on GB200);
- the saved inputs keep, beside tensorwise's 1 B copies, their 1 x 128 columnwise
  scales ``[ceil(rows/128), roundup(cols, 4)]`` fp32 (``quantizer.cpp:1323-1375``):
  QKV's and fc1's normed inputs [1024 local tokens, 512] under SP: 8 x 512 x 4 =
  16,384 B each; proj's input [2048, 256]: 16 x 256 x 4 = 16,384 B; fc2's input
  [2048, 1024]: 16 x 1024 x 4 = 65,536 B: 114,688 B a layer, 688,128 B on 6 layers.
  The widths are in bf16 elements per token, each sub-layer's rounded up: attention
  16 B a token (8 elements), the MLP 40 B (20 elements): exactly 56 B x 2,048 x 6.
"""

from __future__ import annotations

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
RECIPE = "  --fp8-recipe: tensorwise\n"
GATHER = "  --fp8-param-gather: true\n"

FP8_ELEMENTS = 9_437_184
SCALES = {"tensorwise": 24 * 512, "blockwise": 24 * 2 * 512}
SAVED_SCALES = 688_128
HOPPER = {"h100": True, "gb200": False}


def _recording(device: str) -> Recording:
    (rec,) = [r for r in load_recordings(GOLDEN, "gpt") if r.case == CASE and r.device == device]
    return rec


def _priced(device: str, tmp: Path, recipe: str, gather: bool) -> TierRow:
    rec = _recording(device)
    text = rec.model_config(GOLDEN).read_text(encoding="utf-8")
    assert text.count(RECIPE) == 1 and text.count(GATHER) == 1
    text = text.replace(RECIPE, f"  --fp8-recipe: {recipe}\n")
    if not gather:
        text = text.replace(GATHER, "")
    path = tmp / f"{recipe}_{gather}.yaml"
    path.write_text(text, encoding="utf-8")
    return price_recording(rec, GOLDEN, read_megatron_args(path))


def test_the_hand_figures() -> None:
    def blocks(n: int) -> int:
        return -(-n // 128)

    def pad4(n: int) -> int:
        return -(-n // 4) * 4

    weights = [(768, 512), (512, 256), (1024, 512), (512, 1024)]
    for rows, cols in weights:  # both scale tensors of a weight fit one 512 B block
        assert blocks(rows) * pad4(blocks(cols)) * 4 <= 512
        assert blocks(cols) * pad4(blocks(rows)) * 4 <= 512
    saved = [(1024, 512), (2048, 256), (1024, 512), (2048, 1024)]  # (rows, cols)
    per_layer = sum(blocks(rows) * pad4(cols) * 4 for rows, cols in saved)
    assert per_layer == 114_688 and 6 * per_layer == SAVED_SCALES == 56 * 2048 * 6


def test_the_door_reads_blockwise(tmp_path: Path) -> None:
    row = _priced("h100", tmp_path, "blockwise", gather=False)
    assert row.step.settings.fp8 == Fp8("blockwise", False)
    path = tmp_path / "args.yaml"
    text = _recording("h100").model_config(GOLDEN).read_text(encoding="utf-8")
    path.write_text(text.replace(RECIPE, "  --fp8-recipe: blockwise\n"), encoding="utf-8")
    assert megatron_fp8(read_megatron_args(path)) == Fp8("blockwise", True)


@pytest.mark.parametrize("device", ["h100", "gb200"])
@pytest.mark.parametrize("gather", [True, False])
def test_blockwise_keeps_its_columnwise_copies_and_block_scales(
    device: str, gather: bool, tmp_path: Path
) -> None:
    tensorwise = _priced(device, tmp_path, "tensorwise", gather).estimate.static.components
    blockwise = dict(_priced(device, tmp_path, "blockwise", gather).estimate.static.components)
    assert tensorwise["fp8_scale_inverses"] == SCALES["tensorwise"]
    assert tensorwise["fp8_transposes"] == (FP8_ELEMENTS if HOPPER[device] else 0)
    assert blockwise.pop("fp8_scale_inverses") == SCALES["blockwise"]
    assert blockwise.pop("fp8_transposes") == FP8_ELEMENTS
    # the weights (the uint8 buffer, or the bf16 one beside the cached rowwise copies) and
    # everything else are tensorwise's
    assert blockwise == {
        k: v for k, v in tensorwise.items() if k not in ("fp8_scale_inverses", "fp8_transposes")
    }


@pytest.mark.parametrize("gather", [True, False])
def test_the_saved_inputs_keep_their_block_scales(gather: bool, tmp_path: Path) -> None:
    tensorwise = _priced("h100", tmp_path, "tensorwise", gather).estimate.components
    blockwise = _priced("h100", tmp_path, "blockwise", gather).estimate.components
    retained = "retained_activations"
    assert blockwise[retained] - tensorwise[retained] == SAVED_SCALES
