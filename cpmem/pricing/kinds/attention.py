"""The attention mixer in its variants (MHA/GQA, windowed, attention sinks, an output
gate, multi-head latent attention): its parameters and adapters, the reference's width,
and in ``tight`` its saved set, its peak without gradients, its backward, and what it
holds under CP (the gathered K/V) and for rotary embedding (``ATTENTION``, its spec).

megatron-core 0.16's ``SelfAttention`` and ``MLASelfAttention`` as the rank simulator
runs them (oracles/rank_sim/), with the measured runtime's extra query-wide tensors
(``calibrated``)."""

from __future__ import annotations

from cpmem.model.geometry import ModelGeometry
from cpmem.plan.layout import ParallelLayout
from cpmem.pricing import adapters, cp_comm
from cpmem.pricing.components import Component
from cpmem.pricing.gathered import gathered_kv_bytes, gathered_kv_width, keeps_gathered_kv
from cpmem.pricing.kinds.discarded import layernorm_dropped, mla_up_proj_dropped
from cpmem.pricing.kinds.fp8 import attention_fp8_width
from cpmem.pricing.kinds.latent import mla_parameters, mla_tensors
from cpmem.pricing.kinds.linears import attention_linears
from cpmem.pricing.kinds.spec import MixerSpec, TightContext, TrainedTensors
from cpmem.pricing.layer_parameters import (
    LayerParameters,
    Linear,
    qk_norm_widths,
    sublayer_norm_parameters,
    sublayer_norm_tensors,
)
from cpmem.pricing.tight.calibrated import EAGER_NONE_GATED, UNGATED_RUNTIME_Q
from cpmem.pricing.tight.widths import LORA_SUM_COPIES, TightWidths
from cpmem.pricing.widths import attention_width, mla_core_width
from cpmem.step.recompute import Module
from cpmem.step.step import Step
from cpmem.step.trainer import Adapter

GATE_SIGMOID_Q = 2
"""Q-multiples of the output gate's sigmoid, which gated attention keeps in fp32:
megatron-core's ``_apply_output_gate`` computes ``(out * sigmoid(gate.float())).to(bf16)``
and keeps the fp32 sigmoid for the product's backward (``2Q``; the saved-tensor oracle's
bf16 gate kept ``Q``). With the QKV+gate projection (``2Q + 2KV``), the roped q and k,
the kernel output and the bf16 gated output (``Q`` each) the layer keeps ``7Q + 3KV``.
Rank simulator, Qwen3.5-4B TP1, 8,192 tokens: 41,004 elements per token per attention
layer = ``2H + 7Q + 3KV`` + the query's per-group copy ``Q`` + the fp32 softmax
statistics. The simulator with this set matches the measured 27B TP4/TP8 cells (one
query group per rank: no copy) within 1%. The copy is not priced on gated attention: on
the measured 4B (TP1 CP2, TP2: more than one group per rank) the simulator is 1.1-2.3%
over the ``core_attn`` peaks (golden/reports/rank_sim_validation.md)."""

UNGATED_GROUP_COPY_Q = 1
"""Q-multiples of the query's per-group copy on ungated attention where the rank holds
more than one query group and a q RMSNorm keeps it: megatron-core 0.16's
``get_query_key_value_tensors`` splits the per-group QKV projection and reshapes the
query to heads, which copies when the groups interleave (one group per rank: a view);
the q norm saves that copy as its input. Without a q norm (Gemma 2, gpt-oss) the copy
goes straight into the rope, whose backward needs only its cos/sin tables, and is freed.
The rank simulator keeps it with the norm (Qwen3-32B-style, 4,096 tokens, ``core_attn``:
``3Q + 3KV`` + this at TP1, ``3Q + 3KV`` at TP8, one group per rank) and not without
(Gemma 2 9B, two groups at TP1: 29,251 elements per token per attention layer, the
``3Q + 3KV`` set with the norms, the sandwich norm's input and the LoRA activations);
every measured ungated cell (Qwen3-1.7B, q/k-normed, TP2 and CP2: 4 and 8 groups per
rank) holds it and ``UNGATED_RUNTIME_Q`` besides. Not priced on gated attention
(``GATE_SIGMOID_Q``)."""

FLASH_BACKWARD_DQ_Q = 3
"""Q-multiples of a flash attention backward's query gradient: dq (bf16) and its fp32
accumulator (oracles/rank_sim/kernels.py ``FlashAttention.backward``, "FlashAttention-2's
contract"). With the head-expanded dk/dv over the CP-gathered tokens it is what the
simulator's full-recompute rows at CP 8 peak on (Qwen3.5-4B TP1 CP8, 16,384 tokens per
rank: tight's unmargined forward+backward is 3.3% under the simulated peak without it,
0.1% over with it)."""

ROPE_TABLES = 2
"""head_dim-wide bf16 tables the step's rotary embedding keeps per rank token: cos and
sin, allocated once per step and live through backward (recompute reads them). Rank
simulator (oracles/rank_sim/runner.py, label ``rope``: two ``(tokens, head_dim)`` bf16
tables; megatron's unfused ``_apply_rotary_pos_emb_bshd`` saves only the tables): 512
elements per token on Qwen3.5-35B-A3B (head_dim 256), whatever the TP degree."""


MLA_SMALL_PER_HEAD = 2
"""bf16-equivalent elements per query head and token beside MLA's wide tensors: the flash
kernel's fp32 log-sum-exp (as on every attention layer; ``widths.mla_core_width`` holds
the wide ones)."""


def core_width(
    geometry: ModelGeometry,
    tp: int,
    eager_none: bool,
    sp: bool = False,
    runtime_q: int = UNGATED_RUNTIME_Q,
    backend: str = "fused",
) -> int:
    """Elements per token one attention layer keeps beyond the common norm/LoRA input.

    Gated: the QKV+gate projection output (``2Q + 2KV``; K and V are views of it), the
    roped q and k, the kernel output, and the output gate's fp32 sigmoid and gated output
    (``GATE_SIGMOID_Q``) -> ``7Q + 3KV``. Ungated (``ungated_multiples``): the projection
    output, the kernel's q and k where rope or a q/k norm makes new ones, its output, the
    q norm's per-group copy; ``runtime_q`` more Q where the runtime keeps one
    (``UNGATED_RUNTIME_Q``, ART's measured cells; 0 for Megatron-LM's, ``q_extra``).
    Eager gated attention outside a ``core_attn`` checkpoint also keeps
    ``EAGER_NONE_GATED`` (``eager_none``). With fewer KV groups than TP ranks the
    replicated-QKV LoRA path adds the rest of the full-width projection. The fp32 softmax
    statistics are priced beside (``softmax_stats_width``)."""
    if geometry.is_mla:  # latent attention: its own saved set (no group copy, no gate)
        return mla_core_width(geometry, tp, sp) + MLA_SMALL_PER_HEAD * geometry.q_heads // tp
    q, kv = geometry.q_width, geometry.kv_width
    gated = geometry.attention_output_gate
    if gated:
        qs, kvs = 5 + GATE_SIGMOID_Q, 3
    else:
        qs, kvs = ungated_multiples(geometry, tp, backend)
        qs += runtime_q
    core = (qs * q + kvs * kv) // tp
    if gated and eager_none:
        core += EAGER_NONE_GATED * q // tp
    if geometry.kv_groups < tp:  # replicated-QKV LoRA path
        core += ((2 if gated else 1) * q + 2 * kv) * (tp - 1) // tp
    return core


def ungated_multiples(geometry: ModelGeometry, tp: int, backend: str = "fused") -> tuple[int, int]:
    """(Q, KV) multiples an ungated attention layer keeps for backward (megatron-core
    0.16's ``SelfAttention``), counted as distinct tensors:

    - the QKV projection's output (``Q + 2KV``), kept while anything holds a view of it:
      a q/k norm's saved input, or the fused (cuDNN) kernel's q, k or v, which it takes
      as megatron hands them (``sbhd`` views);
    - the kernel's q (``Q``) and k (``KV``): new tensors where rope or a q/k norm makes
      them (with rope the norms' outputs are freed: the rope saves only its tables); the
      query also where megatron's reshape of interleaved groups copies it (GQA with more
      than one group on the rank) and nothing replaces the copy;
    - the q norm's saved input where that copy is made (``UNGATED_GROUP_COPY_Q``);
    - the kernel's output (``Q``, the output projection's input).

    Transformer Engine's flash backend (``FlashAttention``, flash-attn) copies q, k and v
    to ``bshd`` (``.transpose(0, 1).contiguous()``, ``backends.py``) and saves the copies
    and its ``bshd`` output, and returns an ``sbhd`` copy of the output
    (``output.contiguous()``), which the output projection saves: ``Q + 2KV`` for the
    kernel's inputs, ``2Q`` for the outputs, the originals kept only where a norm holds
    them. Megatron-LM's recordings: the flash platforms (A100; GB200 deterministic)
    peak one Q per layer above H100's fused runs of the same arguments at TP 1.

    Rope with q/k norms under fused: ``3Q + 3KV`` + the copy (the rank simulator's Qwen3
    layers, ART's measured cells); learned positions without norms: ``2Q + 2KV`` fused,
    ``3Q + 2KV`` flash.

    q/k norms over the whole projection (OLMo 2, ``ModelGeometry.qk_norm_projection``,
    as Megatron-Bridge's ``OLMoESelfAttention`` flattens q and k to ``[s, b, heads x
    head_dim]``): with more than one group on the rank the flattened q and k are copies,
    saved by the norms, holding no view of the projection: fused ``4Q + 4KV``."""
    groups_per_rank = geometry.kv_groups // tp if geometry.kv_groups >= tp else 1
    flat_copies = geometry.qk_norm_projection and groups_per_rank > 1
    copies = groups_per_rank > 1 and (geometry.q_heads > geometry.kv_groups or flat_copies)
    normed, rope = geometry.qk_norm, geometry.positions == "rope"
    copy_saved = copies and normed  # the q norm saves the per-group copy as its input
    if backend == "flash":
        qkv_held = normed and not flat_copies  # a norm's saved input is a view of it
        qs = (1 if qkv_held else 0) + 1 + 2  # the projection's Q; q's copy; both outputs
        kvs = (2 if qkv_held else 0) + 2  # the projection's K and V; k's and v's copies
    else:
        qs = 1 + (1 if rope or normed or copies else 0) + 1
        kvs = 2 + (1 if rope or normed else 0)
    if copy_saved:
        qs += UNGATED_GROUP_COPY_Q
    if flat_copies:  # the k norm saves the flattened key's copy
        kvs += 1
    return qs, kvs


def q_extra(step: Step) -> int:
    """The Q-multiples the step's runtime keeps beyond the structure on an ungated
    attention layer: ``UNGATED_RUNTIME_Q`` for ART's trainer (its measured cells), none
    for Megatron-LM (its recordings are covered without it)."""
    return UNGATED_RUNTIME_Q if step.settings.runtime.keeps_query_copy else 0


SOFTMAX_STATS_PER_HEAD = 2
"""bf16-equivalent elements per query head and token a flash or fused kernel keeps for
backward: its fp32 log-sum-exp (``softmax_lse``; Transformer Engine's
``FlashAttention``/``FusedAttention`` save it beside q, k, v and the output)."""


def softmax_stats_width(step: Step, tp: int) -> int:
    """Elements per token of one attention layer's softmax statistics: priced for
    Megatron-LM's runs (the recordings' 2 per head), within ``tight``'s fitted margin on
    ART's cells (latent attention holds them in its own set)."""
    g = step.geometry
    if g.is_mla or step.settings.runtime.keeps_attention_scores:
        return 0
    if step.settings.runtime.fitted_margin:
        return 0
    return SOFTMAX_STATS_PER_HEAD * g.q_heads // tp


def gather_freed_width(step: Step, tp: int) -> int:
    """Elements per token an attention layer without a k norm gives back of its saved set
    when it keeps the CP all-gather's K/V (``all_gather``, CP > 1, the core kept): the
    flash kernel saves the gathered K and V, whose own slot holds the rank's K/V
    (``+2·KV/t``), so nothing holds the local rotated key (``-KV/t``) or the QKV
    projection output that the value was a view of (``-(Q + 2·KV)/t``): ``(Q + KV)/t``.
    Rank simulator (oracles/rank_sim/cp_comm.py ``core_attention``: ``GatherTokens``
    saves nothing of its input), Gemma 2 9B ``none`` under ``all_gather``: without this
    +12-14% over the simulator at CP 2-8 where CP 1 is +7-8%. With a k norm the norm's
    saved key view holds the projection, so only the rotated key goes and the own slot
    stands beside it (``+KV/t`` over the widths): not priced, as the measured
    Qwen3/Qwen3.5 CP 2 cells are priced without it and the margin covers it on every
    grid row. A k norm over the whole projection that saves a flattened copy
    (``ungated_multiples``) holds no view of the projection: freed as without a norm.
    0 for latent attention (its own set) and where no gathered K/V is kept."""
    g = step.geometry
    holds_view = g.qk_norm and not (g.qk_norm_projection and g.kv_groups > tp)  # nested
    if holds_view or g.is_mla or step.cp_comm != "all_gather" or not keeps_gathered_kv(step):
        return 0
    return g.q_width // tp + g.kv_pair_width // min(tp, g.kv_groups) // 2


def nograd_width(geometry: ModelGeometry, w: TightWidths, step: Step) -> int:
    """One attention mixer's peak without gradients, beside the kept layer inputs: its
    SP-gathered (or, at TP 1, plain) norm output ``H``, the local norm output being freed
    once gathered and nothing being saved; then the larger of two moments: the QKV
    projection formed as base + LoRA delta + sum (``LORA_SUM_COPIES x projection/t``),
    and, with fewer KV groups than TP ranks, megatron's all-gather of the projection to
    full width (the gather buffer and its concatenation, two full-width copies, beside
    the local projection). Under CP the gathered K/V on top. Rank simulator, full
    recompute, 8,192 tokens, the attention layer's forward peak per token (a test holds
    them): Qwen3.5-4B TP8 24,320 = ``H + proj/t + 2 proj``; Qwen3.5-27B TP8 35,584;
    Qwen3-Next-style TP4 22,784."""
    q, kv, tp = geometry.q_width, geometry.kv_width, w.tp
    projection = (2 if geometry.attention_output_gate else 1) * q + 2 * kv
    if geometry.is_mla:  # the query's and the KV's up projections
        projection = q + geometry.q_heads * (geometry.qk_nope_head_dim + geometry.v_head_dim)
    moment = LORA_SUM_COPIES * projection // tp
    if geometry.kv_groups < tp:
        moment = max(moment, projection // tp + 2 * projection)
    return geometry.hidden + moment + cp_kv_width(step)


def flash_backward_width(step: Step, tp: int) -> int:
    """Elements per token a flash attention backward allocates (FlashAttention-2's
    contract as the rank simulator lays it out): dq, its fp32 accumulator
    (``FLASH_BACKWARD_DQ_Q``) and dk, dv expanded to the query heads for every token the
    kernel saw at once: every CP rank's under ``all_gather`` (``2 x CP x Q/t``), fewer under
    ``p2p`` and ``a2a`` (``cpmem.pricing.cp_comm.backward_key_ranks``)."""
    q = step.geometry.q_width
    return (FLASH_BACKWARD_DQ_Q + 2 * cp_comm.backward_key_ranks(step)) * q // tp


def discarded_width(step: Step, w: TightWidths) -> int:
    """What the ``layernorm`` and ``mla_up_proj`` checkpoints drop of an attention layer
    (``cpmem.pricing.kinds.discarded``)."""
    g = step.geometry
    return layernorm_dropped(g, step, w.tp, "attention") + mla_up_proj_dropped(g, step, w.tp)


def backward_phase(step: Step, w: TightWidths) -> int:
    """Elements per token the attention mixer's backward holds on top of the retained set
    and the incoming gradient: the flash backward, with the recomputed core under a
    ``core_attn`` checkpoint."""
    phase = flash_backward_width(step, w.tp)
    if step.recompute.checkpoints(Module.CORE_ATTN):
        phase += w.attention_core
    return phase


def recompute_width(step: Step, w: TightWidths) -> int:
    """Under full recompute, the attention mixer recomputed with gradients: its saved set
    and, under CP, the other ranks' K/V it holds while it runs (``cp_kv_width``)."""
    return w.of("attention") + cp_kv_width(step)


def recompute_kept_width(step: Step, w: TightWidths) -> int:
    """Under full recompute, what the recomputed attention holds while its layer's
    feed-forward block recomputes and runs its backward: its saved set and the gathered
    K/V an ``all_gather`` kernel saves for backward, not the exchange in flight while it
    ran (``p2p``'s chunks, ``a2a``'s copy: ``cp_comm.forward_in_flight_width``), freed
    when its forward returned. Rank simulator, at the forward+backward peak, in the first
    MoE layer's backward, the busiest rank's recomputed attention holds its saved set
    alone: Moonlight-16B-A3B p2p full recompute, EP 1, TP1 CP8 (pair of 16k, 5,632
    tokens): 15,524 elements per token (the saved set 15,516; the ring's seven chunks in
    flight are 35,840, one kept chunk 5,120); TP2 CP2 (8,192 tokens, 5,120 on the rank):
    10,293 (10,288)."""
    return recompute_width(step, w) - cp_comm.forward_in_flight_width(step)


def cp_kv_width(step: Step) -> int:
    """Elements per token of other CP ranks' K/V (and CP exchange buffers) an attention
    layer holds while it runs: the gathered K/V under ``all_gather``, the ring's chunks in
    flight under ``p2p``, the exchanged q/k/v under ``a2a`` (``cpmem.pricing.cp_comm``)."""
    remote = gathered_kv_width(step, cp_comm.gathered_ranks(step))
    return remote + cp_comm.forward_in_flight_width(step)


def cp_gathered_kv_bytes(step: Step, busiest: int, tokens: int | None = None) -> int:
    """K and V of every other CP rank, all-gathered inside the core attention (padded to
    the largest rank's count ``busiest``) and saved by the flash kernel for backward,
    beyond the local K/V the widths already hold (``cpmem.pricing.gathered``: only where
    no ``core_attn`` checkpoint drops them; under full recompute one layer holds them at
    a time, priced in that layer's width). The simulated grid's dense CP 8 rows without
    recompute miss by up to 7% without it (docs/simulated-grid.md). Measured only on the
    4B CP 2 cells without recompute, where it is 0.6% of the peak. For a rank of
    ``tokens`` below the largest, its own slot of the padded buffer too (the widths hold
    only its ``tokens``): the simulator's small ranks of the skewed CP 4/8 rows without
    recompute are 2-3% under without it. Under ``p2p`` the one chunk the ring's kernel
    keeps, under ``a2a`` none (``cpmem.pricing.cp_comm.kept_remote_ranks``)."""
    own_padding = 0 if tokens is None else max(0, busiest - tokens)
    remote = gathered_kv_bytes(step, busiest, cp_comm.kept_remote_ranks(step))
    own = gathered_kv_bytes(step, own_padding, 1) if step.cp_comm == "all_gather" else 0
    return remote + own


def rope_table_bytes(step: Step, tokens: int) -> int:
    """The rope cos/sin tables (``ROPE_TABLES``) at ``tokens``, for a model with rotary
    attention layers (GDN layers take no rope; learned or no positions none)."""
    g = step.geometry
    if "attention" not in g.mixers or g.positions != "rope":
        return 0
    rope_dim = g.qk_rope_head_dim if g.is_mla else g.head_dim
    return ROPE_TABLES * rope_dim * tokens * step.dtype_bytes


DROPOUT_MASK_BYTES = 1
"""torch's CUDA ``native_dropout`` returns a bool mask."""
FP32_BYTES = 4


def attention_scores_bytes(step: Step) -> int:
    """Bytes one unfused attention layer (Transformer Engine's ``UnfusedDotProductAttention``
    or megatron's local ``DotProductAttention``) keeps for backward of its ``s x s``
    probabilities, where its core is kept (no ``core_attn`` checkpoint); 0 for the flash
    and fused kernels.

    Per sequence of ``s`` tokens, ``N = (q_heads / t) x s x s``: the masked softmax's
    output (``dtype`` bytes each) where the fused masked-softmax kernel runs, else its fp32
    fallback's fp32 softmax (and, without attention dropout, its cast copy); with
    attention dropout the dropout's bool mask and its output (the context GEMM's input).
    Transformer Engine's fused kernel runs where ``16 < s_k < 16384``, ``s_k % 8 == 0``,
    ``s_q % 4 == 0`` and the batch x heads is a multiple of 4, unless
    ``NVTE_MASKED_SOFTMAX_FUSION=0`` (TE ``softmax.py``, ``is_kernel_available``); megatron's
    local one where ``16 < s_k <= 4096`` and the same shapes, unless
    ``--no-masked-softmax-fusion`` (``fusions/fused_softmax.py``). TE's fallback computes
    in fp32 always (``softmax_in_fp32=True``); the local one where
    ``--attention-softmax-in-fp32`` or ``--apply-query-key-layer-scaling``
    (``Runtime.softmax_in_fp32``)."""
    rc = step.recompute
    if not rc.keeps_saved_sets or rc.checkpoints(Module.CORE_ATTN):
        return 0
    return _scores_kept(step)


def _score_elements(step: Step) -> list[int]:
    """``N = (q_heads / t) x s x s`` per sequence of the request (empty where the
    backend keeps no scores or the step has no request)."""
    if not step.settings.runtime.keeps_attention_scores or step.request is None:
        return []
    g, layout = step.geometry, step.plan.layout
    heads = g.q_heads // layout.tp
    return [heads * (n // layout.cp) ** 2 for n in step.request.sequence_lengths]


def _scores_kept(step: Step) -> int:
    """What one unfused layer keeps of its ``s x s`` tensors while its core is kept."""
    runtime = step.settings.runtime
    g, layout, b = step.geometry, step.plan.layout, step.dtype_bytes
    heads = g.q_heads // layout.tp
    dropout = g.attention_dropout > 0
    total = 0
    elements = _score_elements(step)
    assert step.request is not None or not elements
    lengths = [] if step.request is None else step.request.sequence_lengths
    for n, full in zip(elements, lengths, strict=False):
        s = full // layout.cp
        if _fused_softmax(step, s, heads * len(lengths)):
            softmax = b * n
        elif runtime.attention_backend == "unfused" or runtime.softmax_in_fp32:
            softmax = FP32_BYTES * n + (0 if dropout else b * n)
        else:
            softmax = b * n
        total += softmax + ((DROPOUT_MASK_BYTES + b) * n if dropout else 0)
    return total


SCORE_GRADIENTS = 2
"""``s x s`` tensors an unfused layer's backward makes beside what its forward kept: the
probabilities' gradient (from the context GEMM's backward) and the scores' gradient
(the softmax's backward), each in the activation dtype (TE's
``UnfusedDotProductAttention``, megatron's ``DotProductAttention``: ``bmm`` and
``scaled_masked_softmax`` backward). In a forward without gradients the raw ``baddbmm``
scores sit beside the probabilities the same way."""


def attention_scores_transient_bytes(step: Step) -> int:
    """One unfused attention layer's ``s x s`` working set where its core is not kept (a
    ``core_attn`` checkpoint, full recompute, a forward without gradients): the layer
    recomputed with gradients keeps what an unrecomputed one keeps (``_scores_kept``) and
    its backward adds ``SCORE_GRADIENTS`` tensors; a forward without gradients holds the
    raw scores beside the probabilities, no more than that. Restated from the kernels'
    op order, not measured (the recordings' full-recompute unfused runs peak in the head,
    beyond this term); 0 for flash and fused, and where the core is kept (its scores
    are then ``attention_scores_bytes``, retained)."""
    rc = step.recompute
    if rc.keeps_saved_sets and not rc.checkpoints(Module.CORE_ATTN):
        return 0
    elements = _score_elements(step)
    if not elements:
        return 0
    return _scores_kept(step) + SCORE_GRADIENTS * step.dtype_bytes * sum(elements)


def _fused_softmax(step: Step, s: int, batch_heads: int) -> bool:
    """Whether the fused masked-softmax kernel runs for sequences of ``s`` tokens."""
    runtime = step.settings.runtime
    shapes = s % 8 == 0 and s % 4 == 0 and batch_heads % 4 == 0
    if runtime.attention_backend == "local":
        return runtime.masked_softmax_fusion and 16 < s <= 4096 and shapes
    if runtime.environment().get("NVTE_MASKED_SOFTMAX_FUSION", "1") == "0":
        return False
    return 16 < s < 16384 and shapes


def attention_parameters(g: ModelGeometry) -> LayerParameters:
    """The attention sub-layer's parameters with its own norms (its input norm, any
    post-attention norm): the QKV projection (with the output gate's second Q) and the
    output projection sharded over TP, the norms replicated; the biases where the model
    has them (the QKV bias sharded with its output, the output projection's whole); the
    q/k norms; gpt-oss's per-head sinks."""
    h = g.hidden
    if g.is_mla:
        return mla_parameters(g, h + (h if g.sandwich_norms else 0))
    norms = sublayer_norm_parameters(g)  # the input norm and any post-attention norm
    q_out = g.q_width * (2 if g.attention_output_gate else 1)
    sharded = h * (q_out + 2 * g.kv_width) + g.q_width * h
    replicated = norms + sum(qk_norm_widths(g))
    if g.attention_bias:  # the QKV bias is sharded with its output, proj's is whole
        sharded += q_out + 2 * g.kv_width
        replicated += h
    if g.attention_sinks:
        sharded += g.q_heads
    return LayerParameters(sharded, 0, replicated)


def adapter_widths(g: ModelGeometry, tp: int) -> dict[str, int]:
    """Per attention target: the (in + out) widths of its adapters' factors on one rank.
    ``qkv`` is one fused projection, or under MLA the query's and KV's down and up
    projections (the down projections replicated, the up projections' outputs sharded);
    ``proj`` the output projection."""
    h = g.hidden
    proj = g.attention_output_width // tp + h
    if not g.is_mla:
        q_out = g.q_width * (2 if g.attention_output_gate else 1) + 2 * g.kv_width
        return {"qkv": h + q_out // tp, "proj": proj}
    heads = g.q_heads
    kv_up = g.kv_lora_rank + heads * (g.qk_nope_head_dim + g.v_head_dim) // tp
    kv = (h + g.kv_lora_rank + g.qk_rope_head_dim) + kv_up
    if g.q_lora_rank:
        q = (h + g.q_lora_rank) + (g.q_lora_rank + heads * g.head_dim // tp)
    else:
        q = h + heads * g.head_dim // tp
    return {"qkv": q + kv, "proj": proj}


def tight_core(ctx: TightContext) -> int:
    """Elements per token the attention's core keeps beyond the input norm's set
    (``core_width``), with what the step changes of it: the CP all-gather's freed
    projection, the softmax statistics, the step's adapters."""
    g, step, tp = ctx.geometry, ctx.step, ctx.tp
    backend = step.settings.runtime.attention_backend
    core = core_width(g, tp, ctx.eager_none, ctx.sp, ctx.runtime_q, backend)
    core -= gather_freed_width(step, tp)
    core += softmax_stats_width(step, tp)
    rc = step.recompute
    core_kept = rc.keeps_saved_sets and not rc.checkpoints(Module.CORE_ATTN)
    return core + adapters.extra_width(g, step.adapter, tp, "attention", core_kept, ctx.sp)


def a2a_padding_bytes(step: Step, w: TightWidths, busiest: int, tokens: int) -> int:
    """Under ``a2a`` the all-to-all pads every rank's share to the largest, so the
    attention cores a rank keeps (``[CP·s, h/CP]`` after the exchange) are the busiest
    rank's size: a rank of ``tokens`` below it keeps the difference too. Rank simulator,
    Qwen3-1.7B TP1 CP2 4,096 tokens laid out 3,584 + 512 without recompute: the 512-token
    rank peaks at 3.5 GiB."""
    if step.cp_comm != "a2a" or tokens >= busiest or not step.recompute.keeps_saved_sets:
        return 0
    layers = step.geometry.attention_layers
    return (busiest - tokens) * layers * w.attention_core * step.dtype_bytes


class AttentionSpec(MixerSpec):
    """The attention mixer (``cpmem.pricing.kinds.spec``)."""

    name = "attention"
    attends = True

    def parameters(self, g: ModelGeometry) -> LayerParameters:
        return attention_parameters(g)

    def linears(self, g: ModelGeometry) -> tuple[Linear, ...]:
        return attention_linears(g)

    def trained_tensors(self, g: ModelGeometry, tp: int) -> TrainedTensors:
        """The QKV projection (with the output gate's second Q) and the output
        projection, the sub-layer's norms (input, post-attention), their biases (a
        row-parallel bias is whole), the q/k norms and gpt-oss's per-head sinks; latent
        attention's own (``latent.mla_tensors``). Their sum on the rank is ``parameters``'."""
        if g.is_mla:
            return mla_tensors(g, tp)
        h = g.hidden
        q_out = g.q_width * (2 if g.attention_output_gate else 1)
        qkv_out = q_out + 2 * g.kv_width
        sinks = (g.q_heads // tp,) if g.attention_sinks else ()
        return TrainedTensors(
            weights=(qkv_out * h // tp, h * g.q_width // tp),
            norms=sublayer_norm_tensors(g),
            biases=(qkv_out // tp, h) if g.attention_bias else (),
            extra=(*qk_norm_widths(g), *sinks),
            shapes=((h, g.q_width // tp), (qkv_out // tp, h)),  # linear_proj, linear_qkv
        )

    def adapter_parameters(self, g: ModelGeometry, adapter: Adapter, layout: ParallelLayout) -> int:
        widths = adapter_widths(g, layout.tp)
        return sum(adapter.rank * w for t, w in widths.items() if adapter.adapts(t))

    def reference_width(
        self, g: ModelGeometry, layout: ParallelLayout, adapter: Adapter, core_kept: bool
    ) -> int:
        tp, sp = layout.tp, layout.sp
        return attention_width(g, tp, sp) + adapters.extra_width(
            g, adapter, tp, "attention", core_kept, sp
        )

    def tight_widths(self, ctx: TightContext) -> dict[str, int]:
        core = tight_core(ctx)
        kept = ctx.common + ctx.sandwich + ctx.masks + core + attention_fp8_width(ctx)
        return {self.name: kept, "attention_core": core}

    def nograd_width(self, g: ModelGeometry, w: TightWidths, step: Step) -> int:
        return nograd_width(g, w, step)

    def recompute_width(self, g: ModelGeometry, w: TightWidths, step: Step) -> int:
        return recompute_width(step, w)

    def recompute_kept(self, g: ModelGeometry, w: TightWidths, step: Step) -> int:
        return recompute_kept_width(step, w)

    def full_backward_peak(self, g: ModelGeometry, w: TightWidths, step: Step, mixer: int) -> int:
        return mixer + flash_backward_width(step, w.tp)

    def checkpoint_dropped(self, w: TightWidths, step: Step) -> int:
        return discarded_width(step, w)

    def backward_phase(self, g: ModelGeometry, w: TightWidths, step: Step) -> int:
        # what output-discarding checkpoints dropped is rebuilt in the layer's backward
        return backward_phase(step, w) + discarded_width(step, w)

    def forward_transient(self, g: ModelGeometry, w: TightWidths, step: Step) -> int:
        # its CP exchange (p2p's chunks, a2a's copy) is live while it runs
        return cp_comm.forward_in_flight_width(step)

    def step_terms(self, step: Step, w: TightWidths, tokens: int, busiest: int) -> dict[str, int]:
        out: dict[str, int] = {}
        rope = rope_table_bytes(step, tokens)
        if rope:
            out[Component.ROPE_TABLES] = rope
        scores = step.geometry.attention_layers * attention_scores_bytes(step)
        if scores:
            out[Component.ATTENTION_SCORES] = scores
        gathered = cp_gathered_kv_bytes(step, busiest, tokens)
        if gathered:  # CP without a core_attn checkpoint
            out[Component.CP_GATHERED_KV] = gathered
        return out

    def transient_bytes(self, step: Step, tokens: int, busiest: int) -> int:
        # an unfused core recomputed: one layer's s x s; p2p's ring and a2a's exchange pad
        # every rank's share to the largest: a smaller rank's buffers are the busiest's
        # size (the rank simulator pads them likewise)
        padded = max(0, busiest - tokens) * step.dtype_bytes * cp_comm.forward_in_flight_width(step)
        return attention_scores_transient_bytes(step) + padded

    def retained_padding_bytes(self, step: Step, w: TightWidths, tokens: int, busiest: int) -> int:
        return a2a_padding_bytes(step, w, busiest, tokens)


ATTENTION = AttentionSpec()
