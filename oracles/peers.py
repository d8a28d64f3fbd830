"""Peers' activation-memory formulas, restated as external estimators for the gate.

The formulas a user would reach for instead of cpmem, written as
``cpmem gate --estimator oracles.peers:NAME`` functions (docs/external-estimators.md,
"Peers"). Each function receives one plain description dict (a measured cell's, from
``cpmem golden export``, or a simulated grid row's) and returns the busiest rank's
forward activation estimate in bytes. An oracle: this module never imports cpmem and
reads nothing but the description.

Each formula is restated in our own words from its source (named in its docstring);
no code is copied. What each leaves out is said where it is implemented.

What the description's fields become in both formulas:

- ``s·b`` (sequence length x micro-batch): ``packed_tokens``, the tokens actually
  packed into the step (a shared prefix stored once, padded to TP). A Megatron user sets
  ``--seq-length`` to the packed buffer's length with ``--micro-batch-size 1``; the
  logical tokens (``logical_tokens``) would count a shared prefix once per sequence,
  which no packed run holds. Neither formula is told about CP's per-rank split: both
  take the whole packed sequence (Megatron-LM's ``seq_length``, mbridge's
  ``input_shape``).
- ``h``: ``config.hidden_size``; ``L``: ``config.num_hidden_layers`` (every layer priced
  as an attention layer: neither formula knows Gated DeltaNet).
- ``ffn``: ``config.intermediate_size``; for a MoE model without one, see
  ``megatron_ffn``.
- ``a``, ``kv``: ``num_attention_heads x head_dim`` and ``num_key_value_heads x
  head_dim`` (mbridge only; Megatron-LM's formula takes ``h`` for the attention width).
- ``t``: ``tp``; sequence parallelism on when ``sp`` and ``tp > 1`` (Megatron-LM turns
  ``--sequence-parallel`` off at TP 1).
- LoRA: neither formula has adapters; the estimates price the frozen-base activations
  only.

The measured harness runs no LM head (golden/README.md; the forward returns the final
hidden states and the loss is their mean square), so the output-layer / cross-entropy
terms both formulas add at the last pipeline stage price logits the harness never
makes. ``megatron_theoretical`` and ``even_cp_split`` leave them out (the like-for-like
figure); ``megatron_theoretical_with_head`` and ``even_cp_split_with_head`` keep them as
published.

``megatron_args_theoretical`` is the other way in: Megatron-LM's whole
``report_theoretical_memory`` (weights and optimizer state, activations, their sum) for
a run described by Megatron-LM's own arguments (a dict keyed by argparse destination
names), to set beside Megatron-LM's functional-test runs; it is not a gate estimator.

Not implemented: torchtitan's ``scripts/estimate/estimation.py`` runs the real model
under ``FakeTensorMode`` with a fake process group and supports FSDP only ("DDP, TP,
PP, CP, EP are not supported yet"): it is not a formula and cannot price a TP or CP
layout.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = [
    "BF16_BYTES",
    "MEGATRON_SOURCE_COMMIT",
    "even_cp_split",
    "even_cp_split_at_busiest",
    "even_cp_split_tokens",
    "even_cp_split_with_head",
    "mbridge_elements",
    "megatron_activation_bytes",
    "megatron_args_theoretical",
    "megatron_args_weight_and_optimizer_bytes",
    "megatron_ffn",
    "megatron_theoretical",
    "megatron_theoretical_with_head",
    "padded_vocab",
]

BF16_BYTES = 2
VOCAB_DIVISOR = 128  # Megatron-LM's default --make-vocab-size-divisible-by
NO_SP_OVERHEAD = 1.05  # Megatron-LM's without-SP branch: "optimizer and miscellaneous temporaries"


def _sp_on(d: dict[str, Any]) -> bool:
    return bool(d["sp"]) and int(d["tp"]) > 1


def megatron_ffn(cfg: dict[str, Any]) -> int:
    """The ``ffn_hidden_size`` the formulas multiply.

    ``intermediate_size`` when the config has one (every dense model). Megatron-LM's
    activation formula has no MoE term and a MoE config (Qwen3.5-35B-A3B) has no dense
    width, so we pass the width a token activates: ``moe_intermediate_size x
    num_experts_per_tok + shared_expert_intermediate_size``. Our choice, not the
    source's; MoE rows are reported apart.
    """
    if cfg.get("intermediate_size"):
        return int(cfg["intermediate_size"])
    return int(cfg.get("moe_intermediate_size", 0)) * int(cfg.get("num_experts_per_tok", 0)) + int(
        cfg.get("shared_expert_intermediate_size") or 0
    )


def padded_vocab(vocab: int, tp: int) -> int:
    """Megatron's padded vocabulary: a multiple of 128 x TP (the head terms only)."""
    multiple = VOCAB_DIVISOR * tp
    return math.ceil(vocab / multiple) * multiple


# --- Megatron-LM ---------------------------------------------------------------------


def megatron_activation_bytes(d: dict[str, Any], *, head: bool) -> float:
    """Megatron-LM's ``theoretical_memory_usage`` activation term, in bytes.

    Source: NVIDIA/Megatron-LM ``megatron/training/theoretical_memory_usage.py``
    (main, commit 00caa53a), after Korthikanti et al. 2022, "Reducing Activation
    Recomputation in Large Transformer Models", Table 2. ``report_theoretical_memory``
    picks one of two branches, for the first pipeline stage (PP 1 here: one micro-batch
    in flight, no interleaving):

    - sequence parallelism **and** selective recompute (``compute_activation_memory``):
      each layer keeps ``s·b·h·(18 + 4·ffn/h)`` bytes (Table 2's ``34·s·b·h/t`` with
      the MLP's ``16·s·b·h`` rewritten for an ``ffn`` other than ``4h``), over the
      ``L`` layers; plus ``8·s·b`` for the int64 token ids and ``s·b·h`` for the
      embedding's dropout mask; at the last stage ``4·s·b·h·(1 + V/h)`` for the output
      layer's input and the cross-entropy; the whole divided by ``t``;
    - anything else, **including full recompute, no recompute and no SP**
      (``compute_activation_memory_without_sp``): each layer ``s·b·h·(10 + 24/t)``
      (Table 2's "tensor parallel + selective recompute" row: the 10 are the bytes
      TP alone leaves unsharded, the norms' and dropouts' share that SP shards), the
      same embedding terms, at the last stage ``2·(s·b·V/t + s·b·h)`` (bf16 logits and
      the final norm's output), and the whole multiplied by 1.05. This branch does
      not look at the recompute mode: full recompute is priced like selective.

    Pipeline stages (``pp``, ``vpp``, ``microbatches`` where the step has them; the
    figure is the first stage's): the layers' term covers the stage's ``L/pp`` layers
    for ``pp`` micro-batches in flight (so ``L`` layer-micro-batches), the embedding
    terms are kept for ``pp`` micro-batches, interleaving multiplies everything by
    ``1 + (pp - 1)/(pp v)``, 1F1B with fewer micro-batches than stages by ``M / pp``,
    and the output layer's term is added only at ``pp = 1`` (it is the last stage's).

    What it leaves out: CP (there is no CP division; the whole packed sequence is
    priced on every rank), the attention-score term (flash attention, selective
    recompute), LoRA, Gated DeltaNet (every layer priced as an attention layer),
    experts, the attention width when ``heads x head_dim != h`` (the source's own
    TODO), and transient buffers (the figure is what is kept, not a peak).
    ``head=False`` drops the last-stage output-layer term (the harness has no head).
    """
    cfg = d["config"]
    s = int(d["packed_tokens"])  # seq_length x micro_batch_size
    h = int(cfg["hidden_size"])
    layers = int(cfg["num_hidden_layers"])
    t = int(d["tp"])
    ffn = megatron_ffn(cfg)
    vocab = padded_vocab(int(cfg["vocab_size"]), t)
    pp, v, m = int(d.get("pp", 1)), int(d.get("vpp", 1)), int(d.get("microbatches", 1))
    embedding = (8 * s + s * h) * pp  # token ids (int64) + embedding dropout mask (1 B)
    schedule = 1 + (pp - 1) / (pp * v) if v > 1 else (min(1, m / pp) if pp > 1 else 1)
    head = head and pp == 1
    if _sp_on(d) and d["recompute"] == "selective":
        act = (layers * s * h * (18 + 4 * ffn / h) + embedding) * schedule
        if head:
            act += 4 * s * h * (1 + vocab / h)
        return act / t
    act = (layers * s * h * (10 + 24 / t) + embedding) * schedule
    if head:
        act += 2 * (s * vocab / t + s * h)
    return act * NO_SP_OVERHEAD


def megatron_theoretical(d: dict[str, Any]) -> int:
    """Megatron-LM's activation term without the output layer (the harness has none)."""
    return math.ceil(megatron_activation_bytes(d, head=False))


def megatron_theoretical_with_head(d: dict[str, Any]) -> int:
    """Megatron-LM's activation term as published at PP 1, output layer included."""
    return math.ceil(megatron_activation_bytes(d, head=True))


# --- mbridge -------------------------------------------------------------------------


def mbridge_elements(d: dict[str, Any], *, head: bool, tokens: float | None = None) -> float:
    """mbridge's modular activation count for the whole packed sequence, in elements,
    before its division by CP.

    Source: ISEEKYAN/mbridge ``memory_estimator/moe_mem_estimator/layers.py`` and
    ``gpt_model.py`` (commit 7ed546f0), ``memory_estimator/estimate_013.py`` (commit
    4e31da67): a mock of each megatron-core module counts the elements its forward
    keeps, for ``input_shape = [micro_batch_size, seq_length]``; the bytes are the count
    times 2 ("only support fp16"). Per layer of the Transformer Engine spec (norms fused
    into the linears, dropout 0; ``s`` tokens, ``t`` TP, ``t_sp`` = ``t`` under SP):

    - attention: ``4·s·a/t`` (its comment: the QKV output, rotary output, core
      attention output and projection input, each ``a/t`` wide), plus the core
      attention's ``2·s·kv/t`` (flash attention's K and V), doubled when CP > 1, unless
      recompute is selective (then mbridge assumes the core attention is recomputed,
      whatever modules are named);
    - dense MLP (gated): ``3·s·ffn/t`` (fc1's ``2·ffn/t`` output and the activation's
      ``ffn/t``);
    - MoE MLP: the router's ``2·s·h``, the dispatcher's ``k·s·h``, the grouped experts'
      ``3·k·s·e/t`` (``e`` the expert width, expert TP = TP, megatron-core's default;
      tokens assumed evenly routed, EP not dividing them), a shared expert
      ``3·s·e_shared/t`` (mbridge asserts on a gated shared expert; priced ungated),
      and the pre-MLP norm ``s·h/t_sp``;
    - the two residual adds ``2·s·h/t_sp``.

    Over the ``L`` layers, plus the embedding output ``s·h`` and the final norm ``s·h``;
    at the last stage (``head``) the output layer ``s·V/t`` and its fp32 softmax
    ``2·s·V/t``. Full recompute (uniform): the embedding, ``s·h`` kept between each pair
    of layers, and the larger of the head and one recomputed layer. Recompute ``none``
    and ``no-grad`` are priced alike (mbridge has no forward-only mode).

    What it leaves out: the busiest CP rank (the split is even), LoRA, Gated DeltaNet
    (no such module: every layer priced as an attention layer), selective recompute of
    anything but the core attention, q/k norms, transient buffers. ``tokens`` (default
    ``packed_tokens``) replaces the sequence length; every term is linear in it.
    """
    cfg = d["config"]
    # mbridge's input_shape: the whole sequence (``tokens`` prices another count)
    s = float(d["packed_tokens"] if tokens is None else tokens)
    h = int(cfg["hidden_size"])
    layers = int(cfg["num_hidden_layers"])
    t = int(d["tp"])
    t_sp = t if _sp_on(d) else 1
    head_dim = int(cfg.get("head_dim") or h // int(cfg["num_attention_heads"]))
    a = int(cfg["num_attention_heads"]) * head_dim
    kv = int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"]) * head_dim
    mode = d["recompute"]
    attention = 4 * s * a / t
    if mode != "selective":
        attention += 2 * s * kv / t * (2 if int(d["cp"]) > 1 else 1)
    if cfg.get("num_experts"):
        k = int(cfg["num_experts_per_tok"])
        shared = int(cfg.get("shared_expert_intermediate_size") or 0)
        mlp = (
            2 * s * h
            + k * s * h
            + 3 * k * s * int(cfg["moe_intermediate_size"]) / t
            + 3 * s * shared / t
            + s * h / t_sp
        )
    else:
        mlp = 3 * s * int(cfg["intermediate_size"]) / t
    per_layer = attention + mlp + 2 * s * h / t_sp
    pre = s * h  # the embedding's output (dropout 0 keeps nothing)
    post = 3 * s * padded_vocab(int(cfg["vocab_size"]), t) / t if head else 0.0
    if mode == "full":
        common = pre + s * h * layers
        return max(common + post, common + per_layer)
    return pre + layers * per_layer + s * h + post


def even_cp_split_tokens(d: dict[str, Any]) -> float:
    """The tokens per CP rank an even split prices: the packed sequence over CP."""
    return int(d["packed_tokens"]) / int(d["cp"])


def _even_split_bytes(d: dict[str, Any], *, head: bool) -> int:
    return math.ceil(BF16_BYTES * mbridge_elements(d, head=head) / int(d["cp"]))


def even_cp_split(d: dict[str, Any]) -> int:
    """mbridge's estimator: its activation count divided evenly by CP, in bf16 bytes.

    Source: ISEEKYAN/mbridge ``memory_estimator/estimate_013.py``
    (``report_memory_usage_one_pp_rank``: ``num_activation / context_parallel_size``),
    with the per-layer count of ``mbridge_elements``; the output layer left out (the
    harness has none). Every CP rank is priced ``packed_tokens / cp`` tokens: on the
    seed pair (Qwen3.5-27B, CP 2, 4096+4096 with a 1,228-token shared prefix) 3,482
    tokens a rank, where the busiest rank holds 4,096.
    """
    return _even_split_bytes(d, head=False)


def even_cp_split_at_busiest(d: dict[str, Any]) -> int:
    """A counterfactual, not a published formula: ``even_cp_split``'s own count at the
    busiest CP rank's tokens (``busiest_tokens``) instead of ``packed_tokens / cp``.

    Everything else is the even split's (the CP doubling of the core attention
    included), so the difference between the two is what the even split alone misses;
    at CP 1 they agree.
    """
    cp = int(d["cp"])
    busiest = int(d["busiest_tokens"])
    return math.ceil(BF16_BYTES * mbridge_elements(d, head=False, tokens=busiest * cp) / cp)


def even_cp_split_with_head(d: dict[str, Any]) -> int:
    """mbridge's estimator as published at PP 1: output layer and fp32 softmax included."""
    return _even_split_bytes(d, head=True)


# --- Megatron-LM's whole report, over Megatron-LM's own arguments ---------------------

MEGATRON_SOURCE_COMMIT = "d98e8a64ddf34856e74b24714e3bedb2f5a39553"
ADAM_BYTES_PER_PARAMETER = 18  # bf16 weight 2 + fp32 main grad 4 + fp32 master copy 4 + moments 8
DIST_OPT_UNSHARDED_BYTES = 6  # the bf16 weight and the fp32 main grad stay on every DP rank
DIST_OPT_SHARDED_BYTES = 12  # the master copy and the two moments, sharded over DP


def _arg(args: dict[str, Any], key: str) -> Any:
    """One of Megatron-LM's arguments, or a KeyError naming the missing one."""
    try:
        return args[key]
    except KeyError:
        raise KeyError(
            f"megatron_args_theoretical: missing Megatron-LM argument {key!r} "
            "(its argparse destination name; pass None where its default is None)"
        ) from None


def _moe_layer_pattern(args: dict[str, Any], layers: int) -> list[int]:
    """Which layers are MoE layers: every ``moe_layer_freq``-th one (an int) or the list."""
    if _arg(args, "num_experts") is None:
        return [0] * layers
    freq = _arg(args, "moe_layer_freq")
    if isinstance(freq, bool) or not isinstance(freq, int | list):
        raise ValueError(f"moe_layer_freq={freq!r}: Megatron-LM reads an int or a list")
    if isinstance(freq, int):
        return [1 if i % freq == 0 else 0 for i in range(layers)]
    if len(freq) != layers:
        raise ValueError(f"moe_layer_freq has {len(freq)} entries for num_layers={layers}")
    return [int(x) for x in freq]


def _attention_parameters(args: dict[str, Any], h: int, heads: int, norm: int) -> float:
    """One layer's attention weights: multi-latent attention's projections, or
    ``2·h²·(1 + groups/heads)·(kv_channels·heads/h)`` (Q and O at the query width, K and V
    at the groups' width)."""
    width_ratio = _arg(args, "kv_channels") * heads / h
    if _arg(args, "multi_latent_attention"):
        if _arg(args, "group_query_attention"):
            raise ValueError("Megatron-LM's formula asserts MLA without group_query_attention")
        qk, rope = _arg(args, "qk_head_dim"), _arg(args, "qk_pos_emb_head_dim")
        v_dim, q_rank = _arg(args, "v_head_dim"), _arg(args, "q_lora_rank")
        q = h * heads * (qk + rope) if q_rank is None else q_rank * (h + heads * (qk + rope) + norm)
        kv = _arg(args, "kv_lora_rank") * (h + heads * (qk + v_dim) + norm)
        return float(q + kv + h * rope + (heads * v_dim) * h)
    groups = _arg(args, "num_query_groups") if _arg(args, "group_query_attention") else heads
    return float(2 * h * h * ((1 + groups / heads) * width_ratio))


def megatron_args_weight_and_optimizer_bytes(args: dict[str, Any]) -> float:
    """Megatron-LM's ``compute_weight_and_optimizer_memory``: the weights, main gradients
    and Adam state on the most loaded model shard, in bytes.

    The most loaded shard is the first pipeline stage's: ``1/pp`` of the layers' weights,
    the input embedding ``V·h``, the MTP block, and at ``pp = 1`` with untied embeddings
    the output layer's ``V·h`` too; the TP-split weights (attention, dense MLP, shared
    expert, embeddings) over ``t``, the norms, routers, latent projections and shared
    expert gates whole, the routed experts over ``etp·ep``. Each parameter costs 18 B (a
    bf16 weight, an fp32 main gradient, an fp32 master copy and two fp32 moments), or with
    the distributed optimizer ``6 + 12/dp`` (the expert weights: ``6 + 12/edp``, with
    ``edp = world_size // (etp·ep·pp)``). ``megatron_args_theoretical`` says which keys
    it reads.
    """
    layers, h = _arg(args, "num_layers"), _arg(args, "hidden_size")
    heads, vocab = _arg(args, "num_attention_heads"), _arg(args, "padded_vocab_size")
    tp, pp = _arg(args, "tensor_model_parallel_size"), _arg(args, "pipeline_model_parallel_size")
    experts = _arg(args, "num_experts")
    n_experts = 1 if experts is None else experts
    gated = 3 / 2 if _arg(args, "swiglu") else 1
    shared_ffn = _arg(args, "moe_shared_expert_intermediate_size") or 0
    norm = 1 if _arg(args, "normalization") == "RMSNorm" else 2  # LayerNorm has a bias

    pattern = _moe_layer_pattern(args, layers)
    moe_layers = sum(pattern)
    dense_layers = layers - moe_layers
    moe_ffn = 0 if experts is None else _arg(args, "moe_ffn_hidden_size")
    mtp = _arg(args, "mtp_num_layers")
    mtp_moe = 0 if mtp is None else pattern[-1] * mtp  # the MTP layer is the last layer's kind
    mtp_dense = 0 if mtp is None else (1 - pattern[-1]) * mtp

    attention = _attention_parameters(args, h, heads, norm)
    dense_mlp = 2 * h * _arg(args, "ffn_hidden_size") * gated
    shared_mlp = 2 * h * shared_ffn * gated
    latent = _arg(args, "moe_latent_size")
    routed = 2 * (h if latent is None else latent) * moe_ffn * n_experts * gated
    latent_proj = 2 * h * latent if experts is not None and latent is not None else 0
    layer_norms = 2 * h * norm
    router = 0
    if experts is not None:
        router = h * n_experts + (n_experts if _arg(args, "add_bias_linear") else 0)
    shared_gate = h if shared_ffn > 0 and args.get("moe_shared_expert_gate", False) else 0
    moe_whole = layer_norms + latent_proj + router + shared_gate  # held whole on every rank

    embedding = h * vocab
    tp_split = (attention + dense_mlp) * dense_layers + (attention + shared_mlp) * moe_layers
    tp_split_mtp = (attention + dense_mlp) * mtp_dense + (attention + shared_mlp) * mtp_moe
    whole = layer_norms * dense_layers + moe_whole * moe_layers + norm * h  # + final norm
    whole_mtp = layer_norms * mtp_dense + moe_whole * mtp_moe

    etp, ep = _arg(args, "expert_tensor_parallel_size"), _arg(args, "expert_model_parallel_size")
    tp_split_shard = (tp_split / pp + tp_split_mtp + embedding) / tp
    whole_shard = whole / pp + whole_mtp
    expert_shard = (routed * moe_layers / pp + routed * mtp_moe) / (etp * ep)
    if _arg(args, "untie_embeddings_and_output_weights") and pp == 1:
        tp_split_shard += embedding / tp  # the output layer sits on the same stage

    def per_parameter(dp: int) -> float:
        if not _arg(args, "use_distributed_optimizer"):
            return ADAM_BYTES_PER_PARAMETER
        return DIST_OPT_UNSHARDED_BYTES + DIST_OPT_SHARDED_BYTES / dp

    expert_dp = _arg(args, "world_size") // (etp * ep * pp)
    dense_bytes = (tp_split_shard + whole_shard) * per_parameter(_arg(args, "data_parallel_size"))
    return float(dense_bytes + expert_shard * per_parameter(expert_dp))


def _megatron_args_activation_bytes(args: dict[str, Any]) -> float:
    """Megatron-LM's activation term for the first pipeline stage, in bytes (both branches)."""
    s, b = _arg(args, "seq_length"), _arg(args, "micro_batch_size")
    h, layers = _arg(args, "hidden_size"), _arg(args, "num_layers")
    tp, pp = _arg(args, "tensor_model_parallel_size"), _arg(args, "pipeline_model_parallel_size")
    vocab = _arg(args, "padded_vocab_size")
    vpp, m = _arg(args, "virtual_pipeline_model_parallel_size"), _arg(args, "num_microbatches")
    with_sp = _arg(args, "sequence_parallel") and _arg(args, "recompute_granularity") == "selective"
    if with_sp:
        act: float = (s * b * h) * (18 + 4 * (_arg(args, "ffn_hidden_size") / h))
    else:
        act = s * b * h * (10 + 24 / tp)
    act *= layers
    act += 8 * s * b * pp  # int64 token ids, pp micro-batches in flight
    act += s * b * h * pp  # the embedding's dropout mask (1 B), pp micro-batches in flight
    if vpp is not None:
        act *= 1 + (pp - 1) / (pp * vpp)  # the interleaved schedule's penalty
    elif pp > 1 and m is not None:
        act *= min(1, m / pp)  # 1F1B with fewer micro-batches than stages
    if with_sp:
        if pp == 1:  # the output layer's input and the cross-entropy, fp32
            act += s * b * h * 4 * (1 + vocab / h)
        return float(act / tp)
    if pp == 1:  # the bf16 logits and the final norm's output
        act += (s * b * vocab / tp + s * b * h) * 2
    return float(act * NO_SP_OVERHEAD)


def megatron_args_theoretical(args: dict[str, Any]) -> dict[str, float]:
    """Megatron-LM's ``report_theoretical_memory`` for a run given by its own arguments.

    Source: NVIDIA/Megatron-LM ``megatron/training/theoretical_memory_usage.py`` at
    ``MEGATRON_SOURCE_COMMIT`` (d98e8a64, the functional tests' snapshot; the file's last
    change there is 1bcb3b9e). ``training.py`` calls it on global rank 0 with
    ``num_microbatches=get_num_microbatches()``; here ``num_microbatches`` is a key.
    Restated, not copied: the figures are the source's float arithmetic in the same
    order, so they agree with it exactly. The source prints megabytes (``bytes / 2**20``);
    this returns bytes: ``weight_and_optimizer_bytes`` (see
    ``megatron_args_weight_and_optimizer_bytes``), ``activation_bytes`` and their sum,
    ``total_bytes``.

    The activation term takes one of two branches:

    - ``sequence_parallel`` and ``recompute_granularity == "selective"``: each layer
      keeps ``s·b·h·(18 + 4·ffn/h)`` bytes over ``num_layers`` layers, plus ``8·s·b·pp``
      (token ids) and ``s·b·h·pp`` (embedding dropout mask), scaled by the schedule, plus
      at ``pp = 1`` ``4·s·b·h·(1 + V/h)`` (output layer and cross entropy); all over ``t``;
    - anything else (no SP, full or no recompute): each layer ``s·b·h·(10 + 24/t)``, the
      same embedding terms and schedule, at ``pp = 1`` ``2·(s·b·V/t + s·b·h)``, and the
      whole x 1.05.

    The schedule: with ``virtual_pipeline_model_parallel_size`` not None, x ``1 + (pp -
    1)/(pp·vpp)``; without it at ``pp > 1``, x ``min(1, num_microbatches/pp)`` (nothing
    when ``num_microbatches`` is None, the source's default).

    Keys read (argparse destination names, as ``validate_args`` leaves them; every one is
    required where the source reads it, a missing one raises KeyError naming it):
    ``hybrid_layer_pattern`` (not None: the source reports nothing, ValueError here),
    ``num_layers``, ``hidden_size``, ``num_attention_heads``, ``kv_channels``,
    ``group_query_attention``, ``num_query_groups`` (with GQA), ``ffn_hidden_size``,
    ``swiglu``, ``normalization``, ``padded_vocab_size``,
    ``untie_embeddings_and_output_weights``, ``multi_latent_attention`` (with it:
    ``q_lora_rank``, ``kv_lora_rank``, ``qk_head_dim``, ``qk_pos_emb_head_dim``,
    ``v_head_dim``), ``num_experts``, ``moe_shared_expert_intermediate_size``,
    ``moe_latent_size``, ``mtp_num_layers`` (with experts: ``moe_layer_freq``,
    ``moe_ffn_hidden_size``, ``add_bias_linear``, and ``moe_shared_expert_gate``, False
    when absent as in the source), ``tensor_model_parallel_size``,
    ``pipeline_model_parallel_size``, ``virtual_pipeline_model_parallel_size`` (None
    without interleaving: ``validate_args`` turns 1 into None, and 1 here is priced as
    interleaving), ``expert_tensor_parallel_size``, ``expert_model_parallel_size``,
    ``world_size``, ``data_parallel_size``, ``use_distributed_optimizer``, ``seq_length``,
    ``micro_batch_size``, ``sequence_parallel`` (``validate_args`` turns it off at TP 1),
    ``recompute_granularity``, ``num_microbatches``. The source also sets
    ``num_query_groups = num_attention_heads`` on its ``args`` without GQA; this leaves
    the dict as it is. ``moe_router_topk`` only feeds the source's printed counts.

    Not read: ``context_parallel_size`` (no CP division of the activations: the whole
    ``seq_length`` on every rank; the distributed optimizer sharded over DP, where
    megatron-core shards over DP x CP), the precision (bf16 weights, fp32 gradients
    assumed), the attention scores, the recompute mode beyond the branch (full recompute
    priced like selective), the query width when ``kv_channels·heads != h`` (the source's
    own TODO), and every transient (the figure is what is kept, not a peak).

    The figure is the first pipeline stage's (global rank 0: its input embedding, ``pp``
    micro-batches in flight under 1F1B). Megatron-LM's functional tests log the last
    rank, the last stage. At ``pp = 1`` that is the same stage (another TP / DP rank,
    priced alike). At ``pp > 1`` the last stage holds the output layer (a tied
    embedding's copy or the untied output weights, ``V·h/t`` either way) where the first
    holds the input embedding, so the weight term is about its size; but its activations
    are one micro-batch's layers plus the logits and cross entropy, where the formula
    prices ``pp`` micro-batches and no output layer: the activation term is another
    rank's. The logged ``mem-max-allocated-bytes`` is an allocated peak since the process
    began, transients included; ``mem-allocated-bytes`` (after the optimizer step) is
    the closer match to ``weight_and_optimizer_bytes``.
    """
    if _arg(args, "hybrid_layer_pattern") is not None:
        raise ValueError(
            "Megatron-LM's report_theoretical_memory has no figure for hybrid "
            "Mamba-Transformer models (hybrid_layer_pattern is set)"
        )
    weights = megatron_args_weight_and_optimizer_bytes(args)
    activations = _megatron_args_activation_bytes(args)
    return {
        "weight_and_optimizer_bytes": weights,
        "activation_bytes": activations,
        "total_bytes": weights + activations,
    }
