"""``--first-last-layers-bf16`` under FP8 (``Fp8.bf16_layers``) priced on Megatron-LM's
weekly FP8 recording, ``gpt3_weekly_mcore_tp2_pp2_current_scaling_native_fp8_tp_pp_sp_tp_overlap``
(GPT h512, 12 layers, ffn 2048, TP2 PP2 SP, micro-batch 2 x 1024 tokens, tensorwise,
``--fp8-param-gather``), with ``--first-last-layers-bf16`` added: megatron-core builds and
runs layers 0 and 11 (its defaults, one at each end, ``transformer_config.py:618-625`` at
4828d651) outside Transformer Engine's FP8 contexts (``is_first_last_bf16_layer``,
``fp8_utils.py:513-531``; ``transformer_block.py:342-343``, ``:651``).

Hand figures on the last rank (stage 1: layers 6-11, of which layer 11 in bf16):

- FP8 weights: 5 layers x (qkv 3H x H + proj H x H + fc1 4H x H + fc2 H x 4H) / 2 at
  H = 512 = 7,864,320 elements (the recording's 6 layers: 9,437,184); their transposes
  7,864,320 B on H100, and 20 scale inverses of 512 B = 10,240 B;
- layer 11's saved inputs stay bf16: it keeps 1,280 B a token more than an FP8 layer
  (``test_fp8_priced``'s -1,280 B per token and layer), 2,621,440 B on the micro-batch's
  2,048 tokens.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cpmem.errors import InputError
from cpmem.gate.megatron_tier import TierRow, price_recording
from cpmem.golden.files import default_golden_dir
from cpmem.golden.megatron import Recording, load_recordings
from cpmem.megatron.args import read_megatron_args
from cpmem.megatron.fp8_rules import megatron_fp8
from cpmem.step.fp8 import Fp8

GOLDEN = default_golden_dir()
CASE = "gpt3_weekly_mcore_tp2_pp2_current_scaling_native_fp8_tp_pp_sp_tp_overlap"
RECIPE = "  --fp8-recipe: tensorwise\n"
H, TP = 512, 2
LAYER = (3 * H * H + H * H + 4 * H * H + H * 4 * H) // TP
FP8_ELEMENTS = 5 * LAYER
SAVED = 1_280 * 2_048


def _recording() -> Recording:
    (rec,) = [r for r in load_recordings(GOLDEN, "gpt") if r.case == CASE and r.device == "h100"]
    return rec


def _path(tmp: Path, extra: str, recipe: str = "tensorwise") -> Path:
    text = _recording().model_config(GOLDEN).read_text(encoding="utf-8")
    assert text.count(RECIPE) == 1
    path = tmp / "args.yaml"
    path.write_text(text.replace(RECIPE, f"  --fp8-recipe: {recipe}\n" + extra), encoding="utf-8")
    return path


def _priced(tmp: Path, extra: str) -> TierRow:
    return price_recording(_recording(), GOLDEN, read_megatron_args(_path(tmp, extra)))


def test_the_hand_figures() -> None:
    assert FP8_ELEMENTS == 7_864_320 and SAVED == 2_621_440


def test_the_door_reads_megatrons_default_ends(tmp_path: Path) -> None:
    args = read_megatron_args(_path(tmp_path, "  --first-last-layers-bf16: true\n"))
    assert megatron_fp8(args) == Fp8("tensorwise", True, bf16_layers=(0, 11))
    more = "  --first-last-layers-bf16: true\n  --num-layers-at-start-in-bf16: 2\n"
    more += "  --num-layers-at-end-in-bf16: 0\n"
    assert megatron_fp8(read_megatron_args(_path(tmp_path, more))).bf16_layers == (0, 1)


def test_the_last_ranks_fp8_terms_lose_the_bf16_layer(tmp_path: Path) -> None:
    plain = _priced(tmp_path, "").estimate
    ends = _priced(tmp_path, "  --first-last-layers-bf16: true\n").estimate
    static = ends.static.components
    assert static["fp8_transposes"] == FP8_ELEMENTS
    assert static["fp8_scale_inverses"] == 20 * 512
    # layer 11's weights leave the uint8 buffer (1 B) for the bf16 one (2 B)
    assert static["weights"] - plain.static.components["weights"] == LAYER
    retained = "retained_activations"
    assert ends.components[retained] - plain.components[retained] == SAVED


@pytest.mark.parametrize(
    ("extra", "recipe", "named"),
    [
        ("  --first-last-layers-bf16: true\n", "delayed", "Delayed scaling does not support"),
        (
            "  --first-last-layers-bf16: true\n  --num-layers-at-end-in-bf16: 7\n",
            "tensorwise",
            "number of layers per pipeline stage (6)",
        ),
    ],
)
def test_what_megatron_rejects_is_refused_with_its_reason(
    extra: str, recipe: str, named: str, tmp_path: Path
) -> None:
    with pytest.raises(InputError) as err:
        read_megatron_args(_path(tmp_path, extra, recipe))
    assert named in err.value.reason
