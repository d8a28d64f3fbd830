"""What megatron-core's fine-grained activation offloading keeps off the device: per
layer of a model chunk, the saved tensors each offloaded module (``cpmem.step.offload``)
copies to pinned host memory and frees on the device (``layer_offloads``), and which of
them are back on the device, or never left it, while the chunk waits for its backward
(``offloaded_bytes``). Pinned host memory is not device memory: what is offloaded is
priced nowhere.

Sources at the recordings' snapshot (Megatron-LM 4828d651). The manager
(``pipeline_parallel/fine_grained_activation_offload.py``) runs one group per module and
layer: the group opens at the module's forward (``on_group_start_forward``), every tensor
autograd saves inside it is pushed to it (``tensor_push``), and at its commit
(``on_group_commit_forward``, after the module's consumer) each pushed tensor of at least
``min_offloaded_tensor_size`` elements that is not a parameter is copied to the host
(``tensor_need_offloading_checker``, ``bulk_offload_group``: 986-1030) and the commit's
``forced_released_tensors`` are freed (``bulk_offload``, 1089-1108). In backward a group
is reloaded when the group after it finishes its backward (``on_group_start_backward``
-> ``bulk_reload``), a tensor not yet reloaded when autograd asks for it is reloaded then
(``tensor_pop``), and once a chunk's groups are all reloaded the next backward chunk's
last group is reloaded ahead (``bulk_reload``, ``pre_reload_last_layer``: 1131-1146,
1058-1064). From the second iteration (``post_warmup_callback``, 566-596) the last group
of each module in the first backward chunk holding that module stays on the device (the
"offload margin"), and a group whose module's next backward chunk is its own chunk and
that is the chunk's last of that module is not offloaded (``should_bulk_offload``,
1066-1087).

What each module sends, as priced (tensors cpmem's saved sets hold; every other tensor
the module offloads is priced on the device, a bound):

- ``attn_norm``, ``mlp_norm``: the norm's input, the layer's residual stream ``H/s``
  (transformer_layer.py:617-627, 689-693, 749-758, 930-936), where the norm is a module
  of its own (1376-1384: not ``IdentityOp``);
- ``core_attn``: an unfused core's ``s x s`` tensors (``attention_scores_bytes``)
  (multi_latent_attention.py:379-430, attention.py:1503-1560); not where the core is a
  ``core_attn`` checkpoint, which opens no group; the query, key and value it also
  offloads are priced on the device;
- ``attn_proj``: the output projection's input, the core's output
  ``heads x d_v / t`` (multi_latent_attention.py:461-464, attention.py:1577-1580), a
  ``core_attn`` checkpoint's output too (the projection runs outside it);
- ``expert_fc1``: the routed experts' fc1 input, ``H`` per routed row, saved whole
  (``set_save_original_input``, moe/experts.py:271-274, 701-712), under Transformer
  Engine's grouped experts;
- ``moe_act``: the activation's input, fc1's output (``2F_e`` gated, ``F_e`` plain, per
  row; moe/experts.py:714, 792-810);
- ``qkv_linear`` and ``fused_group_mlp``: nothing priced (their saved tensors are priced
  on the device).

The MTP layers are priced on the device. Every group's tensors are priced on the device
while its own chunk runs its forward or backward (the reload one group ahead and on
demand holds no more than the chunk held before offloading): only chunks in flight
keep less.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cpmem.pricing.components import OUTSIDE_FIGURE
from cpmem.pricing.kinds.attention import attention_scores_bytes
from cpmem.pricing.kinds.discarded import norm_is_module
from cpmem.pricing.kinds.moe import expert_shard
from cpmem.pricing.widths import sp_divisor
from cpmem.step.pipeline import Op
from cpmem.step.recompute import Module
from cpmem.step.step import Step

COMMIT_ORDER = (
    "qkv_linear",
    "core_attn",
    "attn_proj",
    "attn_norm",
    "expert_fc1",
    "moe_act",
    "mlp_norm",
)
"""The order a transformer layer's forward commits its groups (the order the manager's
backward reloads them, last first): the attention's three, then the input norm's after
the attention's residual add (transformer_layer.py:689-693), the experts' two, then the
pre-MLP norm's after the MLP's residual add (930-936)."""


@dataclass(frozen=True)
class LayerOffload:
    """One layer's groups, in commit order, with the bytes each offloads on each CP rank
    (0 where its tensors are below the smallest offloaded size or not priced)."""

    groups: tuple[str, ...]
    sent: tuple[tuple[int, ...], ...]


def _tensor(elements: int, step: Step) -> int:
    """The bytes of one saved tensor of ``elements`` in the step's dtype, 0 below the
    smallest offloaded tensor (it stays on the device)."""
    if elements < step.settings.offload.min_elements:
        return 0
    return elements * step.dtype_bytes


def _attention(step: Step, rows: int) -> dict[str, int]:
    g, layout = step.geometry, step.plan.layout
    tp = layout.tp
    out: dict[str, int] = {"qkv_linear": 0}
    if not step.recompute.checkpoints(Module.CORE_ATTN):
        # an unfused core keeps one s x s tensor set per layer; a tensor of the whole
        # micro-batch's [b x heads/t, s, s], each element counted in its own dtype
        scores = attention_scores_bytes(step)
        elements = sum((g.q_heads // tp) * (n // layout.cp) ** 2 for n in _lengths(step))
        out["core_attn"] = scores if elements >= step.settings.offload.min_elements else 0
    # the projection's group opens after the core, checkpointed or not
    v_dim = g.v_head_dim if g.is_mla else g.head_dim
    out["attn_proj"] = _tensor(rows * (g.q_heads * v_dim // tp), step)
    if norm_is_module(g, step, "attention"):
        out["attn_norm"] = _tensor(rows * g.hidden // sp_divisor(tp, layout.sp), step)
    return out


def _lengths(step: Step) -> list[int]:
    return [] if step.request is None else list(step.request.sequence_lengths)


def _moe(step: Step, tokens: int) -> dict[str, int]:
    g, layout = step.geometry, step.plan.layout
    out: dict[str, int] = {}
    runtime = step.settings.runtime
    if runtime.moe_grouped_gemm and runtime.transformer_impl == "transformer_engine":
        # the routing's rows per token of the rank, at the rank's tokens
        row_count = int(step.expert_rows_per_token() * tokens)
        out["expert_fc1"] = _tensor(row_count * g.hidden, step)
        act_input = (2 if g.gated_mlp else 1) * expert_shard(g, layout.etp)
        out["moe_act"] = _tensor(row_count * act_input, step)
    if norm_is_module(g, step, "moe"):
        out["mlp_norm"] = _tensor(tokens * g.hidden // sp_divisor(layout.tp, layout.sp), step)
    return out


def _dense(step: Step, tokens: int) -> dict[str, int]:
    g, layout = step.geometry, step.plan.layout
    if not norm_is_module(g, step, "dense"):
        return {}
    return {"mlp_norm": _tensor(tokens * g.hidden // sp_divisor(layout.tp, layout.sp), step)}


def module_sends(step: Step, tokens: int) -> list[dict[str, int]]:
    """Per layer of ``step`` (its MTP layers left out), on the rank holding ``tokens``
    model tokens, the bytes each module named above sends to the host (0 where its
    tensors are below the step's smallest offloaded size); a module the layer does not
    run is absent."""
    g = step.geometry
    out = []
    for mixer, mlp in zip(g.mixers, g.mlps, strict=True):
        found: dict[str, int] = {}
        if mixer == "attention":
            found |= _attention(step, tokens)
        if mlp == "moe":
            found |= _moe(step, tokens)
        elif mlp == "dense":
            found |= _dense(step, tokens)
        out.append(found)
    return out


def layer_offloads(step: Step) -> list[LayerOffload]:
    """Per layer of ``step`` (a model chunk's; its MTP layers left out: priced on the
    device), the groups megatron-core opens for the offloaded modules and what each
    sends to the host. None where the layers keep no saved sets (full recompute)."""
    offload = step.settings.offload
    g = step.geometry
    if not offload.active or not step.recompute.keeps_saved_sets:
        return []
    ranks = range(step.plan.layout.cp)
    by_rank = [module_sends(step, step.plan.rank_tokens[r]) for r in ranks]
    out = []
    for layer in range(g.layers):
        per_rank = [by_rank[r][layer] for r in ranks]
        groups = tuple(m for m in COMMIT_ORDER if offload.offloads(m) and m in per_rank[0])
        sent = tuple(tuple(per_rank[r][m] for r in ranks) for m in groups)
        out.append(LayerOffload(groups, sent))
    return out


Key = tuple[int, int]


def offloaded_bytes(
    layers: dict[Key, list[LayerOffload]], schedule: Sequence[Op], cp: int
) -> dict[Key, tuple[int, ...]]:
    """Per (micro-batch, chunk) of one stage's ``schedule``, the bytes on each CP rank
    that are off the device while the chunk is in flight: every group's, but

    - the last group (in commit order) of every chunk, which the manager may reload
      ahead of the chunk's backward (``pre_reload_last_layer``);
    - a chunk's last group of each module where the next backward after its forward
      holding that module is its own (``should_bulk_offload``). The offload margin (the
      last group of each module in the first backward chunk holding it,
      ``post_warmup_callback``) is one of these: that chunk's forward ran before every
      backward holding the module, so the next such backward is its own."""
    kept: dict[Key, set[tuple[int, str]]] = {}
    last_of: dict[Key, dict[str, int]] = {}
    for key, chunk in layers.items():
        last_of[key] = {m: i for i, layer in enumerate(chunk) for m in layer.groups}
        committed = [(i, m) for i, layer in enumerate(chunk) for m in layer.groups]
        kept[key] = {committed[-1]} if committed else set()
    backwards = [
        (i, (op.microbatch, op.chunk)) for i, op in enumerate(schedule) if op.kind == "backward"
    ]
    for at, op in enumerate(schedule):
        key = (op.microbatch, op.chunk)
        if op.kind != "forward" or key not in last_of:
            continue
        for module, i in last_of[key].items():
            after = (k for j, k in backwards if j > at and module in last_of.get(k, {}))
            if next(after, None) == key:
                kept[key].add((i, module))
    out: dict[Key, tuple[int, ...]] = {}
    for key, chunk in layers.items():
        totals = [0] * cp
        for i, layer in enumerate(chunk):
            for module, sent in zip(layer.groups, layer.sent, strict=True):
                if (i, module) in kept[key]:
                    continue
                for r in range(cp):
                    totals[r] += sent[r]
        out[key] = tuple(totals)
    return out


def merged_partners(schedule: Sequence[Op]) -> dict[int, Key]:
    """Under the combined 1F1B schedule (``--overlap-moe-expert-parallel-comm``:
    schedules.py:1465-1466, ``combined_1f1b_schedule_for_interleaved_pipelining``), each
    steady-state forward runs layer by layer beside the backward after it: per op index of
    such a pair, the other op's chunk, whose groups are offloaded as the forward runs and
    reloaded as the backward runs, so priced on the device at both ops (none where the
    two are one chunk: it is the op's own)."""
    out: dict[int, Key] = {}
    for at in range(len(schedule) - 1):
        f, b = schedule[at], schedule[at + 1]
        if f.kind != "forward" or b.kind != "backward":
            continue
        fk, bk = (f.microbatch, f.chunk), (b.microbatch, b.chunk)
        if fk != bk:
            out[at], out[at + 1] = bk, fk
    return out


def offload_notes(step: Step) -> tuple[str, ...]:
    """The answer's line on offloading, where the step offloads: what leaves the device
    and that the pinned host memory it lands in is not in the figure."""
    offload = step.settings.offload
    if not offload.modules:  # none, or whole layers (``layer_offload``)
        return ()
    where = (
        "the pipeline's in-flight chunks keep them on the host; the running chunk is "
        "priced with all of them on the device"
        if step.settings.pipeline.active
        else "priced on the device: without pipeline stages only the running micro-batch "
        "is in flight"
    )
    return (
        f"offload={'+'.join(offload.modules)}: the saved tensors of at least "
        f"{offload.min_elements} elements those modules copy to pinned host memory; {where}. "
        "Pinned host memory is not device memory: " + OUTSIDE_FIGURE,
    )
