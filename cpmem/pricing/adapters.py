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
  (a frozen megatron linear saves only its weight, ``LinearWithFrozenWeight``), and gives
  back what the harness's rank-1 adapter pinned there (``pinned_width``).

Sources: PEFT's LoRA layer (dropout on the input of ``A``); megatron-core 0.16
``tensor_parallel/layers.py``; docs/pricing.md ("Adapters"). The rank simulator runs
PEFT-ordered dropout and per-projection targets (oracles/rank_sim).
"""

from __future__ import annotations

from cpmem.model.geometry import ModelGeometry
from cpmem.step.trainer import Adapter

MASK_ELEMENTS = 0.5
"""A bool dropout mask in bf16 elements (1 B of 2)."""


def _input_widths(geometry: ModelGeometry, tp: int, part: str = "") -> dict[str, tuple[str, float]]:
    """Per target: the layer part it sits in (``attention``, ``gdn``, ``mamba``, ``mlp``,
    ``expert``)
    and the width of the adapter's input per token (experts: per routed row). Part
    ``shared`` (an MoE layer's shared expert, a dense SwiGLU its ``fc1`` / ``fc2`` targets
    name, as in the rank simulator's ``SharedExpertMLP``): fc1's and fc2's inputs at the
    shared expert's width."""
    if part == "shared":
        return {
            "fc1": ("shared", geometry.hidden),
            "fc2": ("shared", geometry.shared_expert_ffn / tp),
        }
    v = geometry.gdn_value_width
    qkv = float(geometry.hidden)
    if geometry.is_mla:  # each projection's own dropout mask: both down, both up inputs
        qkv = 2 * geometry.hidden + geometry.kv_lora_rank + geometry.q_lora_rank
    return {
        "qkv": ("attention", qkv),
        "proj": ("attention", geometry.attention_output_width / tp),
        "gdn_in": ("gdn", geometry.hidden),
        "gdn_out": ("gdn", v / tp),
        "mamba_in": ("mamba", geometry.hidden),
        "mamba_out": ("mamba", geometry.mamba_inner / tp),
        "fc1": ("mlp", geometry.hidden),
        "fc2": ("mlp", geometry.ffn / tp),
        "experts": ("expert", geometry.hidden + geometry.expert_ffn),
    }


def projections(geometry: ModelGeometry, target: str) -> int:
    """Linear layers one target names in a layer: two per routed expert row (fc1, fc2);
    under multi-head latent attention ``qkv`` is the query's and the KV's down and up
    projections (three without ``q_lora_rank``: one plain query projection); one else."""
    if target == "experts":
        return 2
    if target == "qkv" and geometry.is_mla:
        return 4 if geometry.q_lora_rank else 3
    return 1


def pinned_width(
    geometry: ModelGeometry, target: str, tp: int, sp: bool, core_kept: bool, part: str = ""
) -> int:
    """Elements per token the harness's rank-1 adapter on ``target`` pins that nothing else
    keeps (a frozen megatron linear saves only its weight), given back where ``target``
    has no adapter: its ``A·x`` and ``A``'s saved input, where no other saved set keeps
    it. The input side (qkv, fc1, gdn_in): the norm output and, under SP, its gathered
    copy; the output side: attention's kernel output (where a ``core_attn`` checkpoint
    drops it; without one the kernel keeps it), GDN's gated-norm output, the SwiGLU's
    output. Rank simulator, Qwen3.5-4B, 8,192 tokens, selective core_attn, per layer: an
    MLP without adapters keeps H + F + 2 fewer at TP1 and H/2 + H + F/2 + 2 at TP2 (SP); an
    attention layer H + Q + 2 and H/2 + H + Q/2 + 2; a GDN layer about 1.5k/t more than
    the H + V/t + 2 priced here (left priced). Routed experts, per row: the dispatched
    input fc1's adapter saves and the scaled activation fc2's saves (a frozen grouped
    linear saves neither) and their two A·x: ``H + F_e + 2`` (the rank simulator,
    tests/oracle/test_tight_simulated_facts.py). A shared
    expert's fc1: its SP-gathered input (the norm output stays, the router's gating saves
    it); its fc2: the SwiGLU's output."""
    s = tp if sp and tp > 1 else 1
    if part == "shared":
        if target == "fc1":
            return (geometry.hidden if s > 1 else 0) + 1
        return geometry.shared_expert_ffn // tp + 1
    gathered = geometry.hidden // s + (geometry.hidden if s > 1 else 0)
    widths = {
        "qkv": gathered,
        "fc1": gathered,
        "gdn_in": gathered,
        "mamba_in": gathered,
        "mamba_out": geometry.mamba_inner // tp,
        "proj": 0 if core_kept else geometry.attention_output_width // tp,
        "gdn_out": geometry.gdn_value_width // tp,
        "fc2": geometry.ffn // tp,
        "experts": geometry.hidden + geometry.expert_ffn,
    }
    return widths[target] + (2 if target == "experts" else 1)


def extra_width(
    geometry: ModelGeometry,
    adapter: Adapter,
    tp: int,
    part: str,
    core_kept: bool = False,
    sp: bool = False,
) -> int:
    """Elements per token (per routed row for ``expert``) one layer part keeps beyond the
    harness's adapters: ``(r - 1)`` values per adapted projection (two per expert row:
    its fc1's and fc2's), plus dropout's mask of each adapted projection's input; where
    the attention core's output is kept for backward anyway (``core_kept``: no
    ``core_attn`` checkpoint drops it), the output projection's dropped copy beside it
    (the rank simulator, Qwen3-32B-style TP2 CP2 without recompute: 17,327 B per token
    and attention layer = the masks of H + Q/t and a bf16 copy of Q/t); less what the
    harness's adapter pinned on each projection left without one (``pinned_width``)."""
    if adapter.is_harness:
        return 0
    total = 0.0
    for target, (where, width) in _input_widths(geometry, tp, part).items():
        if where != part:
            continue
        if not adapter.adapts(target):
            total -= pinned_width(geometry, target, tp, sp, core_kept, part)
            continue
        total += projections(geometry, target) * (adapter.rank - 1)
        if adapter.dropout:
            total += MASK_ELEMENTS * width
            if target == "proj" and core_kept:
                total += width
    return int(total)
