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
    "even_cp_split",
    "even_cp_split_at_busiest",
    "even_cp_split_tokens",
    "even_cp_split_with_head",
    "mbridge_elements",
    "megatron_activation_bytes",
    "megatron_args_theoretical",
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


# --- Megatron-LM's report_theoretical_memory, on Megatron-LM's own arguments ----------


def megatron_args_theoretical(a: dict[str, Any]) -> dict[str, float]:
    """Megatron-LM's ``report_theoretical_memory`` for a dense GPT run, in bytes.

    Source: NVIDIA/Megatron-LM ``megatron/training/theoretical_memory_usage.py`` at
    d98e8a64 (the functional-test snapshot of ``golden/megatron/``), restated. It reports
    MB (bytes / 2**20); here the bytes. ``a`` holds Megatron-LM's argparse destinations
    with its defaults resolved: ``num_layers``, ``hidden_size``, ``num_attention_heads``,
    ``kv_channels``, ``group_query_attention``, ``num_query_groups``, ``swiglu``,
    ``ffn_hidden_size``, ``normalization``, ``padded_vocab_size``,
    ``untie_embeddings_and_output_weights``, ``tensor_model_parallel_size``,
    ``pipeline_model_parallel_size``, ``virtual_pipeline_model_parallel_size`` (None
    without interleaving), ``data_parallel_size``, ``use_distributed_optimizer``,
    ``seq_length``, ``micro_batch_size``, ``sequence_parallel``,
    ``recompute_granularity`` and ``num_microbatches``.

    - Weights and optimizer: the most loaded shard's parameters (the first stage's:
      its layers, the final norm's share, the embedding; the output layer too when
      untied at PP 1), attention ``2h²(1 + g/a)·(a·d/h)``, MLP ``2·h·ffn`` (x 3/2 with
      SwiGLU), two norms of ``h`` (x 2 for LayerNorm), no biases; times 18 bytes, or
      ``6 + 12/DP`` with the distributed optimizer (DP alone, not DP x CP).
    - Activations: with SP and selective recompute, ``s·b·h·(18 + 4·ffn/h)`` per
      layer, else ``s·b·h·(10 + 24/t)`` (times 1.05 at the end); ``8·s·b`` token ids
      and ``s·b·h`` embedding dropout per in-flight micro-batch (``pp``); interleaving
      multiplies by ``1 + (pp - 1)/(pp·v)``, 1F1B by ``min(1, M/pp)``; the output layer
      only at PP 1 (``4·s·b·h·(1 + V/h)`` in the SP branch, ``2·(s·b·V/t + s·b·h)`` in
      the other).

    What it leaves out, read against the functional tests: it prices the *first*
    pipeline stage, while Megatron-LM logs the *last* (which holds the output layer
    and the loss, and one micro-batch in flight under 1F1B); no CP division; no fp32
    copy of the logits at PP > 1, no unfused attention's ``s x s`` scores, no kernel
    workspaces, no biases, no padding of the distributed optimizer's buffers.
    """
    h = int(a["hidden_size"])
    heads = int(a["num_attention_heads"])
    d = int(a.get("kv_channels") or h // heads)
    groups = int(a["num_query_groups"]) if a.get("group_query_attention") else heads
    t, pp = int(a["tensor_model_parallel_size"]), int(a["pipeline_model_parallel_size"])
    v = a.get("virtual_pipeline_model_parallel_size")
    ffn = int(a["ffn_hidden_size"])
    vocab = int(a["padded_vocab_size"])
    layers = int(a["num_layers"])
    norm = 1 if a["normalization"] == "RMSNorm" else 2
    gated = 3 / 2 if a["swiglu"] else 1
    attention = 2 * h * h * ((1 + groups / heads) * (d * heads / h))
    mlp = 2 * h * ffn * gated
    norms = 2 * h * norm
    embedding = h * vocab
    sharded = ((attention + mlp) * layers / pp + embedding) / t
    replicated = (norms * layers + norm * h) / pp
    if a["untie_embeddings_and_output_weights"] and pp == 1:
        sharded += embedding / t
    dp = int(a["data_parallel_size"])
    per_param = 6 + 12 / dp if a["use_distributed_optimizer"] else 18
    weights = (sharded + replicated) * per_param

    s, b = int(a["seq_length"]), int(a["micro_batch_size"])
    m = a.get("num_microbatches")
    sp_selective = bool(a["sequence_parallel"]) and a.get("recompute_granularity") == "selective"
    per_layer = s * b * h * ((18 + 4 * ffn / h) if sp_selective else (10 + 24 / t))
    act = per_layer * layers + 8 * s * b * pp + s * b * h * pp
    if v is not None:
        act *= 1 + (pp - 1) / (pp * int(v))
    elif pp > 1 and m is not None:
        act *= min(1, int(m) / pp)
    if sp_selective:
        if pp == 1:
            act += s * b * h * 4 * (1 + vocab / h)
        act /= t
    else:
        if pp == 1:
            act += (s * b * vocab / t + s * b * h) * 2
        act *= NO_SP_OVERHEAD
    return {
        "weight_and_optimizer_bytes": weights,
        "activation_bytes": act,
        "total_bytes": weights + act,
    }
