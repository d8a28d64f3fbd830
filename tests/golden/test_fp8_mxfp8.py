"""FP8's ``mxfp8`` recipe (TE's ``MXFP8BlockScaling``) priced without
``--fp8-param-gather`` on Megatron-LM's weekly FP8 recording's GB200 run (compute
capability 10, where TE runs MXFP8),
``gpt3_weekly_mcore_tp2_pp2_current_scaling_native_fp8_tp_pp_sp_tp_overlap`` (GPT h512,
12 layers, ffn 2048, TP2 PP2 SP, micro-batch 2 x 1024 tokens), with ``--fp8-recipe mxfp8``
and its ``--fp8-param-gather`` line taken out: no Megatron-LM recording runs MXFP8, so the
tensorwise price without param-gather is the reference and only what MXFP8 keeps beyond
it may differ.

Hand figures, from Transformer Engine b9d690e0 (its last rank, stage 1: 6 layers):

- the cached weight copies keep both usages (``_is_weight_workspace_valid``,
  ``module/base.py:654-658``): per weight a rowwise and a columnwise ``uint8`` copy of its
  shape and ``uint8`` scales padded to ``[roundup(rows, 128), roundup(cols/32, 4)]`` and
  ``[roundup(rows/32, 4), roundup(cols, 128)]`` (``csrc/quantizer.cpp:1383-1417``,
  ``:1710-1739``). QKV [768, 512]: 768 x 16 = 12,288 B and 24 x 512 = 12,288 B; proj
  [512, 256]: 512 x 8 and 16 x 256, 4,096 B each; fc1 [1024, 512]: 1,024 x 16 and
  32 x 512, 16,384 B each; fc2 [512, 1024]: 512 x 32 and 16 x 1,024, 16,384 B each:
  98,304 B a layer, all whole 512 B blocks, 589,824 B on 6 layers (tensorwise: one
  512 B ``scale_inv`` a weight, 12,288 B); the columnwise copies 9,437,184 B (tensorwise
  keeps no transpose on Blackwell);
- the saved inputs keep, beside tensorwise's 1 B copies, their columnwise scales
  ``[roundup(rows/32, 4), roundup(cols, 128)]``: QKV's and fc1's normed inputs [1,024
  local tokens, 512]: 32 x 512 = 16,384 B each; proj's input [2,048, 256]: 64 x 256 =
  16,384 B; fc2's input [2,048, 1,024]: 64 x 1,024 = 65,536 B: 114,688 B a layer,
  688,128 B on 6 layers (56 B a token: 8 elements for attention, 20 for the MLP).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cpmem.errors import InputError
from cpmem.gate.megatron_tier import TierRow, price_recording
from cpmem.golden.files import default_golden_dir
from cpmem.golden.megatron import Recording, load_recordings
from cpmem.megatron.args import read_megatron_args

GOLDEN = default_golden_dir()
CASE = "gpt3_weekly_mcore_tp2_pp2_current_scaling_native_fp8_tp_pp_sp_tp_overlap"
RECIPE = "  --fp8-recipe: tensorwise\n"
GATHER = "  --fp8-param-gather: true\n"
REUSE = "  --reuse-grad-buf-for-mxfp8-param-ag: true\n"
FP8_ELEMENTS = 9_437_184
SCALES = 589_824
SAVED_SCALES = 688_128


def _recording(device: str) -> Recording:
    (rec,) = [r for r in load_recordings(GOLDEN, "gpt") if r.case == CASE and r.device == device]
    return rec


def _path(tmp: Path, device: str, recipe: str, gather: bool = False, reuse: bool = False) -> Path:
    text = _recording(device).model_config(GOLDEN).read_text(encoding="utf-8")
    assert text.count(RECIPE) == 1 and text.count(GATHER) == 1
    text = text.replace(RECIPE, f"  --fp8-recipe: {recipe}\n")
    if not gather:
        text = text.replace(GATHER, "")
    if reuse:
        text = text.replace(GATHER, GATHER + REUSE)
    path = tmp / f"{device}_{recipe}_{gather}_{reuse}.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def _priced(tmp: Path, recipe: str) -> TierRow:
    rec = _recording("gb200")
    return price_recording(rec, GOLDEN, read_megatron_args(_path(tmp, "gb200", recipe)))


def test_the_hand_figures() -> None:
    def up(n: int, m: int) -> int:
        return -(-n // m) * m

    weights = [(768, 512), (512, 256), (1024, 512), (512, 1024)]
    layer = sum(up(r, 128) * up(c // 32, 4) + up(r // 32, 4) * up(c, 128) for r, c in weights)
    assert layer == 98_304 and 6 * layer == SCALES
    saved = [(1024, 512), (2048, 256), (1024, 512), (2048, 1024)]
    per_layer = sum(up(r // 32, 4) * up(c, 128) for r, c in saved)
    assert per_layer == 114_688 and 6 * per_layer == SAVED_SCALES == 56 * 2048 * 6


def test_mxfp8_keeps_both_copies_and_their_scales(tmp_path: Path) -> None:
    tensorwise = _priced(tmp_path, "tensorwise").estimate
    mxfp8 = _priced(tmp_path, "mxfp8").estimate
    static_t, static_m = tensorwise.static.components, dict(mxfp8.static.components)
    assert static_t["fp8_transposes"] == 0  # Blackwell: no transpose under tensorwise
    assert static_m.pop("fp8_transposes") == FP8_ELEMENTS
    assert static_m.pop("fp8_scale_inverses") == SCALES
    assert static_m == {
        k: v for k, v in static_t.items() if k not in ("fp8_transposes", "fp8_scale_inverses")
    }
    retained = "retained_activations"
    assert mxfp8.components[retained] - tensorwise.components[retained] == SAVED_SCALES


@pytest.mark.parametrize(
    ("device", "gather", "named"),
    [
        # param_and_grad_buffer.py:1186-1211, TE tensor/utils.py:68-69: the mapping raises
        ("gb200", True, "replace_raw_data raises NotImplementedError for an MXFP8Tensor"),
        ("h100", False, "MXFP8 on compute capability 10 and 11 only"),
    ],
)
def test_mxfp8_gathered_without_the_reuse_or_on_hopper_is_refused(
    device: str, gather: bool, named: str, tmp_path: Path
) -> None:
    rec = _recording(device)
    with pytest.raises(InputError) as err:
        price_recording(rec, GOLDEN, read_megatron_args(_path(tmp_path, device, "mxfp8", gather)))
    assert named in str(err.value)


def test_gathered_mxfp8_weights_are_their_own_tensors_beside_the_gradient_buffer(
    tmp_path: Path,
) -> None:
    """``--fp8-param-gather`` kept, with ``--reuse-grad-buf-for-mxfp8-param-ag`` (the
    recording runs the distributed optimizer). Against tensorwise with ``--fp8-param-gather``
    (``tests/golden/test_fp8_priced.py``: the 9,437,184 FP8 elements in the ``uint8``
    buffer, 1 B each, no transpose on Blackwell, 24 x 512 B of scale inverses): the MXFP8
    weights are in no buffer, their parameter storage the gradient buffer's
    (param_and_grad_buffer.py:1102-1121, :1184-1186), and each keeps its rowwise data,
    1 B an element (9,437,184 B, where the ``uint8`` buffer held as many), its columnwise
    copy (9,437,184 B) and both usages' scales (589,824 B, ``test_the_hand_figures``)."""
    rec = _recording("gb200")
    gathered = {
        recipe: price_recording(
            rec, GOLDEN, read_megatron_args(_path(tmp_path, "gb200", recipe, True, reuse))
        ).estimate.static.components
        for recipe, reuse in (("tensorwise", False), ("mxfp8", True))
    }
    tensorwise, mxfp8 = dict(gathered["tensorwise"]), dict(gathered["mxfp8"])
    assert tensorwise.pop("fp8_transposes") == 0
    assert tensorwise.pop("fp8_scale_inverses") == 24 * 512
    assert mxfp8.pop("fp8_transposes") == FP8_ELEMENTS
    assert mxfp8.pop("fp8_scale_inverses") == SCALES
    assert mxfp8 == tensorwise
