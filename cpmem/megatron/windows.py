"""Megatron-LM's sliding-window attention read onto ``ModelGeometry.windows``.

``--window-size`` (``tuple_type``, arguments.py:377-387, 2384) is the ``(left, right)``
window Megatron-LM hands to Transformer Engine's ``DotProductAttention`` of each windowed
layer (extensions/transformer_engine.py:2163-2171); a query at position i attends to the
keys i - left .. i + right, so a causal ``(left, 0)`` window covers ``left + 1`` tokens,
the count ``ModelGeometry.windows`` holds (gpt-oss's ``sliding_window`` 128 is Megatron-LM's
``--window-size 127,0``). ``--window-attn-skip-freq`` (``moe_freq_type``) picks the
windowed layers: ``is_layer_window_attention`` (transformer/utils.py:531-547, layer numbers
1-based) windows every layer when it is absent, layer n where ``n % freq != 0`` for an
integer, and layer n where entry ``n - 1`` is set for a list.

What cpmem accepts is what that field can say: a causal window (right 0, left 0 or more)
in a GPT decoder without MTP layers (a hybrid stack's and the MTP layers' attention are
not read here). No byte term reads a window (``ModelGeometry.windows``); it reaches
Transformer Engine's CP comm rule and backend selection.
"""

from __future__ import annotations

from cpmem.errors import InputError
from cpmem.megatron.fields import MegatronArgs

Problem = tuple[str, str]


def parse_window_size(flag: str, text: str) -> tuple[int, ...]:
    """``--window-size`` as ``tuple_type`` reads it: the text without its outer
    parentheses, split at commas, each an integer (its shape is checked by
    ``window_problems``)."""
    try:
        return tuple(int(part) for part in text.strip().strip("()").split(","))
    except ValueError:
        raise InputError(
            "megatron_args", f"{flag} {text}", "must be integers separated by commas"
        ) from None


def window_problems(args: MegatronArgs) -> list[Problem]:
    """What cpmem refuses in the run's window flags (none where ``--window-size`` is
    absent: ``is_layer_window_attention`` then windows no layer, whatever the skip
    frequency)."""
    size = args.window_size
    if size is None:
        return []
    shown = "--window-size " + ",".join(str(v) for v in size)
    out: list[Problem] = []
    if len(size) != 2:
        out.append((shown, "must be two integers, left and right"))
    elif size[1] != 0:
        out.append(
            (
                shown,
                "changes memory cpmem does not price: a window reaching right of the query "
                "(cpmem prices causal windows, right 0)",
            )
        )
    elif size[0] < 0:
        out.append(
            (
                shown,
                "a left of -1 or less is no sliding window (Transformer Engine's unbounded "
                "left): give no --window-size",
            )
        )
    if args.hybrid_layer_pattern or args.hybrid_override_pattern:
        out.append((shown, "cpmem reads sliding windows in a GPT decoder, not a hybrid stack"))
    if args.mtp_num_layers:
        out.append(
            (
                shown,
                "cpmem reads sliding windows for the decoder's layers, not the MTP layers'",
            )
        )
    freq = args.window_attn_skip_freq
    if isinstance(freq, int) and freq <= 0:
        out.append((f"--window-attn-skip-freq {freq}", "must be a positive integer"))
    elif isinstance(freq, tuple) and len(freq) != args.num_layers:
        out.append(
            (
                f"--window-attn-skip-freq of {len(freq)} layers",
                f"must name each of the {args.num_layers} layers: is_layer_window_attention "
                "reads entry layer_number - 1 (transformer/utils.py:541-542)",
            )
        )
    return out


def megatron_windows(args: MegatronArgs) -> tuple[int, ...]:
    """Each decoder layer's window in tokens (``left + 1``; 0: full attention), or ()
    where no layer is windowed. ``args`` are assumed valid (``window_problems``)."""
    size = args.window_size
    if size is None:
        return ()
    tokens = size[0] + 1
    freq = args.window_attn_skip_freq
    out: list[int] = []
    for number in range(1, args.num_layers + 1):
        if freq is None:
            windowed = True
        elif isinstance(freq, int):
            windowed = number % freq != 0
        else:
            windowed = bool(freq[number - 1])
        out.append(tokens if windowed else 0)
    return tuple(out)
