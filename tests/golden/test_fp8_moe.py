"""FP8 on MoE layers and MTP depths (``cpmem.pricing.fp8_static``' roles,
``cpmem.pricing.kinds.fp8.moe_fp8_width``) on Megatron-LM's
``gpt3_moe_mcore_te_tp4_ep2_etp2_pp2_scoped_cudagraph`` case (GPT h512, 13 layers, the
first 4 dense and 9 MoE, 8 experts top-2 with ``--moe-ffn-hidden-size 1024`` and a 512-wide
shared expert, one MTP depth, TP4 SP PP2 (VPP 4 by ``Et|(tt|)*6mL``) EP2 ETP2, blockwise
FP8 without ``--fp8-param-gather``, ``--first-last-layers-bf16``, ``--recompute-modules
[moe_act]``), with its CUDA graphs, ``--moe-router-fusion`` and ``global_aux_loss`` (for
``aux_loss``) taken out: what is left is priced, and the run without FP8 is the reference,
so only what Transformer Engine keeps for FP8 may differ.

Hand figures, the last rank (stage 1: chunks 1, 3, 5, 7: layers 1, 2 dense, 5, 6, 9, 10
MoE, and the MTP depth; the bf16 layers 0 and 12 are stage 0's). Each FP8 weight on the
rank, ``[out, in]``:

- attention (6 layers and the MTP depth's): QKV ``[3H/4, H]`` = 196,608, proj
  ``[H, H/4]`` = 65,536;
- dense MLP (2 layers, ffn 4H): fc1 ``[4H/4, H]`` and fc2 ``[H, 4H/4]``, 262,144 each;
- MoE (4 layers and the MTP depth's): the shared expert's fc1 ``[512/4, H]`` and fc2
  ``[H, 512/4]``, 65,536 each, and 8/2 = 4 local experts' fc1 ``[1024/2, H]`` and fc2
  ``[H, 1024/2]``, 262,144 each (the router stays bf16: megatron-core's ``TopKRouter``);
- the MTP depth's ``eh_proj`` ``[H/4, 2H]`` = 131,072.

7 x 262,144 + 2 x 524,288 + 5 x (131,072 + 2,097,152) + 131,072 = 14,155,776 elements.
Blockwise keeps the rowwise data (the cached copy) and the columnwise data on every device
(``Float8BlockQuantizer::create_tensor``, TE b9d690e0 ``csrc/quantizer.cpp:966-1020``), 1 B
each, every weight a whole number of 512 B blocks; and per weight a rowwise and a
columnwise fp32 scale tensor of 128 x 128 blocks, each under 512 B here (at most
``[4, 4]`` x 4 B): 2 x 512 B for each of 7 x 2 + 2 x 2 + 5 x 10 + 1 = 69 weights = 70,656 B.
"""

from __future__ import annotations

import re
from dataclasses import replace
from fractions import Fraction
from pathlib import Path

import pytest

from cpmem.gate.megatron_tier import TierRow, price_recording
from cpmem.gate.tier_vocab import tier_vocab
from cpmem.golden.files import default_golden_dir
from cpmem.golden.megatron import Recording, load_recordings
from cpmem.megatron.args import read_megatron_args
from cpmem.step.recompute import Recompute
from cpmem.step.step import Step

GOLDEN = default_golden_dir()
CASE = "gpt3_moe_mcore_te_tp4_ep2_etp2_pp2_scoped_cudagraph"
OUT = re.compile(r"^\s*--(moe-router-fusion|cuda-graph-impl|cuda-graph-modules)\b")
FP8 = re.compile(r"^\s*--(fp8-format|fp8-recipe|first-last-layers-bf16)\b")

H = 512
FP8_ELEMENTS = 14_155_776
SCALE_INVERSES = 69 * 2 * 512


def _recording(device: str) -> Recording:
    rid = f"moe/{CASE}/dev_dgx_{device}"
    (rec,) = [r for r in load_recordings(GOLDEN, "moe") if r.recording_id == rid]
    return rec


def _priced(device: str, tmp: Path, drop: re.Pattern[str] | None = None) -> TierRow:
    rec = _recording(device)
    source = rec.model_config(GOLDEN)
    text = source.read_text(encoding="utf-8").replace("global_aux_loss", "aux_loss")
    kept = [
        line
        for line in text.splitlines()
        if not OUT.match(line) and not (drop is not None and drop.match(line))
    ]
    path = tmp / f"{drop is not None}.yaml"
    path.write_text("\n".join(kept) + "\n", encoding="utf-8")
    args = read_megatron_args(path, vocab_size=tier_vocab(source))
    return price_recording(rec, GOLDEN, args)


def test_the_hand_figures() -> None:
    attention = 3 * H * H // 4 + H * H // 4
    dense = 2 * (4 * H * H // 4)
    moe = 2 * (512 * H // 4) + 4 * 2 * (1024 * H // 2)
    eh_proj = H // 4 * 2 * H
    assert 7 * attention + 2 * dense + 5 * moe + eh_proj == FP8_ELEMENTS
    assert 7 * 2 + 2 * 2 + 5 * (2 + 8) + 1 == 69


@pytest.mark.parametrize("device", ["h100", "gb200"])
def test_the_static_terms_are_the_bf16_run_and_the_fp8_copies(device: str, tmp_path: Path) -> None:
    fp8 = dict(_priced(device, tmp_path).estimate.static.components)
    bf16 = _priced(device, tmp_path, FP8).estimate.static.components
    assert fp8.pop("fp8_weight_cache") == FP8_ELEMENTS
    assert fp8.pop("fp8_transposes") == FP8_ELEMENTS
    assert fp8.pop("fp8_scale_inverses") == SCALE_INVERSES
    assert fp8 == bf16


def _widths(step: Step, **given: object) -> tuple[int, int, Fraction]:
    from cpmem.pricing.kinds.fp8 import eh_proj_fp8_width
    from cpmem.pricing.tight.compose import tight_widths

    if given:
        step = replace(step, settings=replace(step.settings, **given))
    w = tight_widths(step.geometry, step)
    return w.fp8_moe, eh_proj_fp8_width(step), step.expert_rows_per_token(4, True)


def test_the_saved_inputs_by_hand(tmp_path: Path) -> None:
    """Per token, b = 2, H = 512, TP 4 with SP (s = 4), the shared expert 512 wide, each
    expert's fc2 input 1024/2 = 512 wide on the rank; blockwise scales 4 B per 128 rows of
    each column (columns padded to 4): per routed row fc1's input -512 B + 16 B of scales
    (fc2's input is the moe_act checkpoint's, discarded: no term); the shared expert's fc1
    copy +128 B and fc2 input -128 B, their scales 4 + 4 B; ``eh_proj``'s 2H/s = 256 input
    -256 B + 8 B. Without the checkpoint fc2's input moves too: another -512 + 16 B a row.

    The rows are the experts' padded ones: 2 routed rows a token (top-2 of 8 experts, the
    EP 2 x ETP 2 sources over SP 4), and FP8's padding of each of the 8/2 = 4 local
    experts' splits to a multiple of 16 rows, bounded under the concentrated routing by
    15 rows each and a padded total that is a multiple of 16: 4,096 + 60 rounded down to
    4,144, 48 rows on the micro-batch's 2 x 1,024 = 2,048 tokens. With the checkpoint
    -496 (2 + 48/2048) + 8 = -995.625 B, -995 B rounded up, -497 elements; without it
    -992 (2 + 48/2048) + 8 = -1999.25 B, -1999 B, -999 elements."""
    step = _priced("h100", tmp_path).step
    moe, eh_proj, rows = _widths(step)
    assert rows == 2 and step.priced_tokens == 2048
    assert moe == -497
    assert eh_proj == -124
    none = Recompute.parse("none")
    moe_none, _, _ = _widths(step, recompute=none)
    assert moe_none == -999


def test_a_core_attn_checkpoint_leaves_the_output_projection_its_copy_alone(
    tmp_path: Path,
) -> None:
    """Attention per token (H/s = 128, the output projection's input H/t = 128): without
    the checkpoint QKV's normed input -128 B, the projection's FP8 copy +128 B beside the
    kernel's bf16 output, scales 4 + 4 B: +8 B = 4 elements; under ``core_attn`` the kernel
    keeps nothing and the output goes to the projection alone, saved at 1 B: -128 - 128 +
    8 = -248 B = -124 elements."""
    from cpmem.pricing.tight.compose import tight_widths

    step = _priced("h100", tmp_path).step
    for modules, width in (("moe_act", 4), ("core_attn,moe_act", -124)):
        rc = Recompute.parse("selective", modules)
        given = replace(step, settings=replace(step.settings, recompute=rc))
        assert tight_widths(given.geometry, given).fp8_attention == width
