"""What a Megatron-LM GPT run's forward keeps for backward, and the moments of a step
where the allocator peaks, on one rank (sources in ``docs/megatron-runtime.md``).

One transformer layer keeps, for ``n`` tokens of a micro-batch on the rank (``n_sp``:
``n / TP`` under sequence parallelism), ``h`` hidden, ``t`` TP, 2-byte activations:

- the attention's input norm: its input and its output (the QKV GEMM's input, saved for
  the weight gradient): ``2 x 2 n_sp h``; the MLP's input norm the same;
- the QKV GEMM's output, which query, key and value view: ``2 n (a + 2g) d / t``; rotary
  embeddings apply out of place (the rotated query and key, ``2 n (a + g) d / t``), and
  so do the query/key norms;
- the core attention's output (the projection's input): ``2 n a d / t``, and the
  flash/fused kernels' fp32 softmax statistics ``4 n a / t``; the unfused backends keep
  the ``s x s`` scores per head (``cpmem.megatron.activations.attention_scores``);
- the two hidden dropouts' bool masks, ``n_sp h`` each, where ``--hidden-dropout`` > 0;
- the MLP: fc1's output (the activation's input) ``2 n f1 / t`` and the activation's
  output (fc2's input) ``2 n f / t`` (``f1`` = 2f gated, else f).

The last stage's head keeps the final norm's input and output and the cross entropy's
fp32 copy of the logits, ``4 n V / t`` (``tensor_parallel/cross_entropy.py``: the
softmax is computed in place on a ``.float()`` copy and saved); while it is made the
bf16 logits exist too (6 B per logit), and again in backward, where the fp32 gradient is
cast to bf16 while it is still held. The first stage keeps the token ids (int64) and the
embedding dropout's mask.
"""

from __future__ import annotations

from cpmem.megatron.run import MegatronRun

DROPOUT_MASK_BYTES = 1  # torch's CUDA native_dropout returns a bool mask
FP32 = 4
INT64 = 8
FP64 = 8


def _n_sp(run: MegatronRun) -> int:
    return run.tokens // run.tp if run.sp else run.tokens


def attention_scores(run: MegatronRun) -> int:
    """Bytes the unfused attentions keep per layer for their ``s x s`` scores.

    ``N = b x (a / t) x s_q x s_k``. Transformer Engine's unfused attention with its
    fused masked softmax keeps the bf16 softmax output (2N); where attention dropout is
    on, its bool mask (1N) and its bf16 output (2N, the context GEMM's input). The local
    attention's fused softmax keeps the same. Where the fused kernel does not run
    (``_fused_softmax``), the fallback computing in fp32 (``_fallback_in_fp32``) keeps the
    fp32 softmax (4N), then its 2-byte copy where no dropout follows."""
    a = run.args
    if run.attention_backend not in ("unfused", "local"):
        return 0
    if a.recompute_granularity == "selective":
        return 0  # the core attention is recomputed in backward
    s = a.seq_length // run.cp
    n = a.micro_batch_size * (run.heads // run.tp) * s * s
    dtype = run.dtype_bytes
    dropout = a.attention_dropout > 0
    if _fused_softmax(run):
        softmax = dtype * n
    elif _fallback_in_fp32(run):
        # the fp32 softmax is kept, and its 2-byte copy too where no dropout follows
        softmax = FP32 * n + (0 if dropout else dtype * n)
    else:
        softmax = dtype * n
    if dropout:
        return softmax + DROPOUT_MASK_BYTES * n + dtype * n
    return softmax


def _fallback_in_fp32(run: MegatronRun) -> bool:
    """Whether the unfused softmax's fallback computes in fp32: always under Transformer
    Engine (its ``FusedScaleMaskSoftmax`` keeps ``softmax_in_fp32=True``; Megatron-LM
    does not pass ``--attention-softmax-in-fp32`` to it), and in the local attention
    where ``--attention-softmax-in-fp32`` or ``--apply-query-key-layer-scaling`` (which
    forces it) is given (``arguments.py``)."""
    a = run.args
    if run.attention_backend == "unfused":
        return True
    return a.attention_softmax_in_fp32 or a.apply_query_key_layer_scaling


def _fused_softmax(run: MegatronRun) -> bool:
    """Whether the fused masked-softmax kernel runs. Transformer Engine's unfused
    attention (``softmax.py``, ``is_kernel_available``): 16 < s_k < 16384, s_k % 8 == 0,
    s_q % 4 == 0, b x a / t % 4 == 0, unless ``NVTE_MASKED_SOFTMAX_FUSION=0``
    (``--no-masked-softmax-fusion`` is not passed to it). The local attention
    (``fusions/fused_softmax.py``): 16 < s_k <= 4096 and the same shape rules, unless
    ``--no-masked-softmax-fusion``."""
    a = run.args
    s = a.seq_length // run.cp
    heads = a.micro_batch_size * (run.heads // run.tp)
    shapes = s % 8 == 0 and s % 4 == 0 and heads % 4 == 0
    if run.attention_backend == "local":
        return a.masked_softmax_fusion and 16 < s <= 4096 and shapes
    if a.env.get("NVTE_MASKED_SOFTMAX_FUSION", "1") == "0":
        return False
    return 16 < s < 16384 and shapes


def routed_rows(run: MegatronRun) -> int:
    """The (token, expert) rows this rank's local experts compute for one micro-batch,
    under the routing priced (``run.routing``).

    The dispatcher brings the tokens of the ETP x EP ranks of its group (``n_sp`` each)
    to the local experts: the allgather dispatcher gathers them all over ETP x EP, the
    alltoall dispatcher receives over EP the copies routed here and gathers them over
    ETP (``token_dispatcher.py``). ``worst``: every token sends ``min(k, E / EP)`` of its
    ``k`` copies here (the most a rank can receive: a token picks ``k`` distinct
    experts); ``balanced``: each expert gets ``k / E`` of the tokens."""
    gathered = _n_sp(run) * run.etp * run.ep
    k = run.args.moe_router_topk
    if run.routing == "balanced":
        return -(-gathered * k * run.local_experts // run.num_experts)
    return gathered * min(k, run.local_experts)


def moe_components(run: MegatronRun) -> dict[str, int]:
    """What one MoE layer keeps for backward beyond the attention, for one micro-batch.

    - the router (``router.py``, ``moe_utils.py``): per token and expert, its logits in
      the router dtype (kept by the score function), the scores and the probabilities
      (kept by the top-k masking), the bool routing map, and, with an auxiliary loss,
      the fp32 scores it reads (``compute_routing_scores_for_aux_loss``);
    - the shared experts: a TP-sharded MLP (its fc1 output and activation output);
    - per routed row (``routed_rows``): the permuted token (the experts' fc1 input,
      ``TEGroupedMLP`` / ``SequentialMLP`` keep it for the weight gradient), fc1's output
      (the activation's input), the activation's output (kept by the multiplication
      with the row's probability) and the weighted product (fc2's input), the last
      three sharded over ETP; the permutations' int64 row indices (two permutations
      under alltoall, one under allgather) and the row's probability.

    The dispatcher's gathered or exchanged tokens and the combine's unpermuted output
    are kept by no backward (all-gather, all-to-all and index operations save only
    indices): the allgather dispatcher's gathered input lives in Megatron-LM's
    ``GlobalMemoryBuffer`` (static)."""
    a = run.args
    b, h, t = run.dtype_bytes, a.hidden_size, run.tp
    n, n_sp = run.tokens, _n_sp(run)
    router = {"fp32": FP32, "fp64": FP64}.get(a.moe_router_dtype or "", b)
    aux = a.moe_aux_loss_coeff > 0 and a.moe_router_load_balancing_type != "sinkhorn"
    per_score = 3 * router + 1 + (FP32 if aux else 0)
    out = {"router": n_sp * run.num_experts * per_score}
    shared = a.moe_shared_expert_intermediate_size
    if shared is not None:
        f1 = 2 * shared if run.gated else shared
        out["shared_experts"] = b * n * (f1 + shared) // t
    rows = routed_rows(run)
    f = run.moe_ffn
    f1 = 2 * f if run.gated else f
    permutations = 2 if a.moe_token_dispatcher_type == "alltoall" else 1
    out["expert_inputs"] = b * rows * h
    out["expert_mlp"] = b * rows * (f1 + 2 * f) // run.etp
    out["expert_indices_probs"] = rows * (permutations * INT64 + router)
    return out


def layer_components(run: MegatronRun) -> dict[str, int]:
    """Bytes one transformer layer keeps for one micro-batch on the rank."""
    a = run.args
    n, n_sp, t, h, d = run.tokens, _n_sp(run), run.tp, a.hidden_size, run.head_dim
    b = run.dtype_bytes
    q, g = run.heads // t, run.kv_groups // t if run.kv_groups >= t else 1
    f1 = 2 * run.ffn if run.gated else run.ffn
    out = {
        "norm_inputs_outputs": 4 * b * n_sp * h,
        "qkv": b * n * (q + 2 * g) * d,
        "attention_output": b * n * q * d,
    }
    if run.moe:
        out.update(moe_components(run))
    else:
        out["mlp"] = b * n * (f1 + run.ffn) // t
    if a.position_embedding_type == "rope":
        out["rotary"] = b * n * (q + g) * d
    if a.qk_layernorm:
        out["qk_norm"] = b * n * (q + g) * d
    if run.attention_backend in ("flash", "fused"):
        out["softmax_stats"] = FP32 * n * q
    scores = attention_scores(run)
    if scores:
        out["attention_scores"] = scores
    if a.hidden_dropout > 0:
        out["hidden_dropout_masks"] = 2 * DROPOUT_MASK_BYTES * n_sp * h
    return out


def layer_bytes(run: MegatronRun) -> int:
    return sum(layer_components(run).values())


def checkpoint_input_bytes(run: MegatronRun) -> int:
    """A full-recompute chunk's kept input (the hidden states entering it)."""
    return run.dtype_bytes * _n_sp(run) * run.args.hidden_size


def stage_layers_kept(run: MegatronRun, layers: int) -> tuple[int, int]:
    """(layers whose activations a micro-batch keeps, checkpointed chunk inputs) for
    ``layers`` layers of one model chunk under the run's recompute setting.

    Full recompute ``uniform`` checkpoints every ``--recompute-num-layers`` layers (only
    each group's input is kept; in backward one group is recomputed at a time, priced
    as a backward moment); ``block`` checkpoints the first ``--recompute-num-layers``
    layers and keeps the rest."""
    a = run.args
    if a.recompute_granularity != "full":
        return layers, 0
    k = a.recompute_num_layers or 1
    if a.recompute_method == "uniform":
        return 0, -(-layers // k)
    recomputed = min(k, layers)
    return layers - recomputed, recomputed


def recompute_group_layers(run: MegatronRun, layers: int) -> int:
    """Layers recomputed at once in backward (0 without full recompute)."""
    a = run.args
    if a.recompute_granularity != "full":
        return 0
    return min(a.recompute_num_layers or 1, layers)


def head_components(run: MegatronRun) -> dict[str, int]:
    """What the last stage's output layer and loss keep for one micro-batch."""
    a = run.args
    n, n_sp, h = run.tokens, _n_sp(run), a.hidden_size
    b = run.dtype_bytes
    return {
        "final_norm": 2 * b * n_sp * h,
        "cross_entropy_fp32_logits": FP32 * n * run.padded_vocab // run.tp,
    }


def logits_bytes(run: MegatronRun) -> int:
    """The output layer's logits, ``n x V / t`` in the activations' dtype."""
    return run.dtype_bytes * run.tokens * run.padded_vocab // run.tp


def output_wgrad_bytes(run: MegatronRun) -> int:
    """The output layer's weight gradient, ``V / t x h`` in the activations' dtype, made
    in its backward without gradient-accumulation fusion (``tensor_parallel/layers.py``:
    ``grad_output.t() @ input``) before the DDP hook adds it into ``main_grad``.

    The head's backward moment prices it beside the logits' fp32 gradient and its bf16
    copy: the A100 and GB200 recordings peak one output-layer gradient above the
    forward's 6 bytes per logit (H100's do not), so the fp32 gradient is taken as held
    until the output layer's backward has run. With gradient-accumulation fusion the
    gradient is accumulated in place (0)."""
    if run.args.gradient_accumulation_fusion:
        return 0
    return run.dtype_bytes * run.padded_vocab // run.tp * run.args.hidden_size


def output_dgrad_bytes(run: MegatronRun) -> int:
    """The output layer's input gradient, ``n x h`` (``grad_output @ weight``), computed
    before its weight gradient and held while that is made (before the sequence-parallel
    reduce-scatter shrinks it)."""
    return run.dtype_bytes * run.tokens * run.args.hidden_size


def embedding_components(run: MegatronRun) -> dict[str, int]:
    """What the first stage's embedding keeps for one micro-batch."""
    a = run.args
    out = {"token_ids": INT64 * run.tokens}
    if a.hidden_dropout > 0:
        out["embedding_dropout_mask"] = DROPOUT_MASK_BYTES * _n_sp(run) * a.hidden_size
    return out


def attention_mask_bytes(run: MegatronRun) -> int:
    """The dataloader's ``[b, 1, s, s]`` bool attention mask, on the first and last
    stages while a micro-batch runs (``--no-create-attention-mask-in-dataloader`` drops
    it; ``datasets/gpt_dataset.py``)."""
    a = run.args
    if not a.create_attention_mask_in_dataloader:
        return 0
    return a.micro_batch_size * a.seq_length * a.seq_length
