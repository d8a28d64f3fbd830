"""Megatron-LM's sliding-window flags read onto ``ModelGeometry.windows``.

Expected windows are worked out by hand from the snapshot's source (d98e8a64):
``is_layer_window_attention`` (megatron/core/transformer/utils.py:531-547) windows layer
n (1-based) where ``n % freq != 0``, every layer when the frequency is absent, and layer n
where list entry n - 1 is set; Transformer Engine's ``(left, 0)`` window covers the query
and the ``left`` keys before it, ``left + 1`` tokens.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cpmem.errors import InputError
from cpmem.megatron.args import read_megatron_args
from cpmem.megatron.describe import megatron_geometry
from cpmem.megatron.rules import check_megatron_args
from cpmem.megatron.windows import megatron_windows
from cpmem.model.presets import get_preset
from tests.unit.megatron_lm.tiny import priced, step_of, tiny

EXAMPLES = Path(__file__).parent / "data" / "examples"


def _args(flags: str):  # type: ignore[no-untyped-def]
    base = (
        "--num-layers 4 --hidden-size 512 --num-attention-heads 8 --seq-length 1024 "
        "--max-position-embeddings 1024 --micro-batch-size 4 --bf16 "
    )
    return read_megatron_args(base + flags + " --vocab-size 1024")


def test_gpt_oss_flags_window_the_odd_layers_over_128_tokens() -> None:
    args = tiny(window_size=(127, 0), window_attn_skip_freq=2)
    # layers 1, 3, ..., 11: n % 2 == 1 != 0, windowed over 127 + 1 tokens; even ones full
    assert megatron_windows(args) == (128, 0) * 6
    # the Hugging Face door's gpt-oss (GptOssConfig: sliding_window 128, even 0-based
    # layers slide) is the same layout
    assert get_preset("gpt-oss-20b").windows[:12] == (128, 0) * 6


def test_flags_read_from_text() -> None:
    args = _args("--window-size (63,0) --window-attn-skip-freq 4")
    assert args.window_size == (63, 0)
    assert megatron_windows(args) == (64, 64, 64, 0)  # layer 4: 4 % 4 == 0
    # no skip frequency: every layer windowed (utils.py:537-538)
    assert megatron_windows(_args("--window-size 7,0")) == (8,) * 4
    # a list: entry n - 1 (utils.py:541-542)
    assert megatron_windows(_args("--window-size 7,0 --window-attn-skip-freq [0,1]*2")) == (
        0,
        8,
        0,
        8,
    )
    # a skip frequency alone windows nothing (utils.py:535-536)
    assert megatron_windows(_args("--window-attn-skip-freq 2")) == ()


@pytest.mark.parametrize(
    ("changes", "shown", "why"),
    [
        ({"window_size": (127, 1)}, "--window-size 127,1", "right 0"),
        ({"window_size": (-1, 0)}, "--window-size -1,0", "no sliding window"),
        ({"window_size": (127,)}, "--window-size 127", "two integers"),
        ({"window_size": (7, 0), "window_attn_skip_freq": 0}, "--window-attn-skip-freq 0", ""),
        (
            {"window_size": (7, 0), "window_attn_skip_freq": (1, 0)},
            "--window-attn-skip-freq of 2 layers",
            "each of the 12 layers",
        ),
        ({"window_size": (7, 0), "mtp_num_layers": 1}, "--window-size 7,0", "MTP"),
    ],
)
def test_what_cpmem_cannot_read_is_refused(changes: dict, shown: str, why: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(InputError) as err:
        check_megatron_args(tiny(position_embedding_type="rope", **changes))
    assert shown in err.value.value
    assert why in err.value.reason


def test_window_text_that_is_not_integers_is_refused() -> None:
    with pytest.raises(InputError, match="must be integers"):
        _args("--window-size 127,x")
    with pytest.raises(InputError, match=r"0 \(full attention\) or 1 \(windowed\)"):
        _args("--window-size 7,0 --window-attn-skip-freq [2,0]*2")


def test_a_window_moves_no_byte_and_refuses_p2p_under_cp() -> None:
    windowed = tiny(window_size=(127, 0), window_attn_skip_freq=2)
    # no byte term reads a window (ModelGeometry.windows): the same figures
    assert priced(windowed).components == priced(tiny()).components
    # Megatron-LM's default --cp-comm-type p2p: Transformer Engine's CP attention refuses
    # a window there (cp_comm_rules.TE_WINDOW_CP_COMMS); all_gather runs it
    with pytest.raises(InputError, match="sliding-window"):
        step_of(tiny(window_size=(127, 0), context_parallel_size=2))
    step = step_of(tiny(window_size=(127, 0), context_parallel_size=2, cp_comm_type="all_gather"))
    assert step.settings.geometry.windows == (128,) * 12


def test_gpt_oss_example_with_a_valid_pipeline_windows_its_layers() -> None:
    text = (EXAMPLES / "gptoss__02_train.sh").read_text(encoding="utf-8")
    assert text.count("PP_SIZE=${WORLD_SIZE}") == 1
    text = text.replace("PP_SIZE=${WORLD_SIZE}", "PP_SIZE=4")  # 12 layers, 3 a stage
    # its FP8 on MoE layers is refused at the step (cpmem.step.fp8): the model is read here
    geometry = megatron_geometry(read_megatron_args(text))
    assert geometry.windows == (128, 0) * 6
