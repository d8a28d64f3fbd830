"""What the step's adapters keep beyond the measured harness's rank-1 LoRA on every
projection without dropout, per layer kind, in elements per token: every policy adds it
to its own widths (which are the harness's).

- Rank ``r``: each adapted projection saves ``A·x``, ``r`` values per token, for ``B``'s
  weight gradient; the harness's widths hold ``r = 1`` of them, so ``r - 1`` more.
- Dropout (PEFT's ``lora_B(lora_A(dropout(x)))``, before ``A``): each adapted projection
  keeps the dropout's bool mask (1 B per input element, half a bf16 element) until
  backward; ``A`` saves the dropped copy of its input in place of the input itself, which
  the frozen base does not save (the rank simulator: 33,792 mask bytes per token and
  layer on Qwen3.5-27B, the adapted inputs' width, 8.2 GiB on the seed pair's busiest
  rank).
- Targets: a projection without an adapter keeps neither the extra rank nor the dropout
  (a frozen megatron linear saves only its weight, ``LinearWithFrozenWeight``). What the
  harness's widths hold for its rank-1 adapter (its ``A·x`` and the SP-gathered norm
  output ``A`` reads) stays priced: an over-estimate where targets are narrowed, never
  an under-estimate.

Sources: PEFT's LoRA layer (dropout on the input of ``A``); megatron-core 0.16
``tensor_parallel/layers.py``; docs/pricing.md ("Adapters"). The rank simulator runs
PEFT-ordered dropout and per-projection targets (oracles/rank_sim).
"""

from __future__ import annotations

from dataclasses import replace

from cpmem.model.geometry import ModelGeometry
from cpmem.pricing.widths import LayerWidths, moe_rows_per_token
from cpmem.step.step import MoeRouting
from cpmem.step.trainer import Adapter

MASK_ELEMENTS = 0.5
"""A bool dropout mask in bf16 elements (1 B of 2)."""


def _input_widths(geometry: ModelGeometry, tp: int) -> dict[str, tuple[str, float]]:
    """Per target: the layer part it sits in (``attention``, ``gdn``, ``mlp``, ``expert``)
    and the width of the adapter's input per token (experts: per routed row)."""
    q, v = geometry.q_width, geometry.gdn_value_width
    return {
        "qkv": ("attention", geometry.hidden),
        "proj": ("attention", q / tp),
        "gdn_in": ("gdn", geometry.hidden),
        "gdn_out": ("gdn", v / tp),
        "fc1": ("mlp", geometry.hidden),
        "fc2": ("mlp", geometry.ffn / tp),
        "experts": ("expert", geometry.hidden + geometry.expert_ffn),
    }


def extra_width(geometry: ModelGeometry, adapter: Adapter, tp: int, part: str) -> int:
    """Elements per token (per routed row for ``expert``) one layer part keeps beyond the
    harness's adapters: ``(r - 1)`` values per adapted projection (two per expert row:
    its fc1's and fc2's), plus dropout's mask of each adapted projection's input."""
    if adapter.is_harness:
        return 0
    total = 0.0
    for target, (where, width) in _input_widths(geometry, tp).items():
        if where != part:
            continue
        linears = 2 if target == "experts" else 1
        if not adapter.adapts(target):
            continue
        total += linears * (adapter.rank - 1)
        if adapter.dropout:
            total += MASK_ELEMENTS * width
    return int(total)


def with_adapters(
    widths: LayerWidths,
    geometry: ModelGeometry,
    adapter: Adapter,
    tp: int,
    ep: int,
    routing: MoeRouting,
) -> LayerWidths:
    """Reference widths (the harness's) with what ``adapter`` keeps beyond them added to
    the layer kind each adapted projection sits in (a routed expert's per row)."""
    if adapter.is_harness:
        return widths
    rows = moe_rows_per_token(geometry, ep, routing) if geometry.is_moe else 0
    return replace(
        widths,
        attention=widths.attention + extra_width(geometry, adapter, tp, "attention"),
        gdn=widths.gdn + (extra_width(geometry, adapter, tp, "gdn") if widths.gdn else 0),
        mlp=widths.mlp + (extra_width(geometry, adapter, tp, "mlp") if widths.mlp else 0),
        moe=widths.moe + rows * extra_width(geometry, adapter, tp, "expert"),
    )
