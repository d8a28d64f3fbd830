"""The arguments of the snapshot's ``pretrain_gpt.py`` that cpmem refuses
(``REFUSED``), each group with its reason: how the flag changes memory in a way cpmem
does not price, which model family it belongs to, or that Megatron-LM rejects it.
Decided by reading what the flag does at the snapshot; where it was unclear whether a
flag changes memory, it is refused.

A refused flag given at its snapshot default is read as absent (``args.py``), and
``HARMLESS_VALUES`` names the values of a refused flag that change nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from cpmem.megatron.ignored import groups_by_flag

UNPRICED = "changes memory cpmem does not price: "
REJECTED = "Megatron-LM rejects it: "


def _family(name: str) -> str:
    return f"is an argument of {name}, not of a GPT model cpmem prices"


REFUSED_GROUPS: tuple[tuple[str, str], ...] = (
    (
        UNPRICED + "FP4 weights and activations, the output projection in FP8, or "
        "per-module precision (quantized copies, transposes, scales)",
        "--fp4-format --fp8-output-proj --te-precision-config-file",
    ),
    (
        UNPRICED + "FP4 parameters gathered as such (distrib_optimizer.py, "
        "param_and_grad_buffer.py)",
        "--fp4-param-gather",
    ),
    (
        UNPRICED + "NVIDIA Kitchen's quantized linear layers and attention",
        "--kitchen-config-file --kitchen-recipe-number --use-kitchen-attention "
        "--kitchen-attention-backend",
    ),
    (
        UNPRICED + "Muon's vectors, embedding and output layer stepped by Lion (one moment) "
        "rather than Adam (optimizer/__init__.py, muon_scalar_optimizer)",
        "--muon-scalar-optimizer",
    ),
    (
        UNPRICED + "Muon's orthogonalisation other than its default (duplicated over TP, bf16 "
        "products, no Nesterov blend, QKV split by part): the Newton-Schulz tensors the "
        "optimizer step holds differ (cpmem.pricing.muon_step; emerging_optimizers.py "
        "TensorParallelMuon.orthogonalize, Emerging-Optimizers muon_utils.py)",
        "--muon-nesterov --muon-tp-mode --muon-fp32-matmul-prec --muon-no-split-qkv",
    ),
    (
        UNPRICED + "the optimizer's states on the host, captured in a CUDA graph, or kept "
        "in another dtype (the precision-aware optimizer)",
        "--optimizer-cpu-offload --optimizer-cuda-graph --use-precision-aware-optimizer "
        "--main-grads-dtype --main-params-dtype --exp-avg-dtype --exp-avg-sq-dtype",
    ),
    (
        UNPRICED + "gradients accumulated and reduced in fp32 where the model is not bf16 "
        "(under --bf16 validate_args sets it itself from --grad-reduce-in-bf16, "
        "arguments.py:1204-1216: there the flag changes nothing)",
        "--accumulate-allreduce-grads-in-fp32",
    ),
    (
        UNPRICED + "a dump of the parameter groups",
        "--dump-param-to-param-group-map",
    ),
    (
        UNPRICED + "the gradient buffer's buckets or padding (its size and the buckets in flight)",
        "--ddp-num-buckets --ddp-bucket-size --ddp-pad-buckets-for-high-nccl-busbw",
    ),
    (
        UNPRICED + "a scratch buffer per reduce-scatter, or fp32 accumulation of named "
        "parameters' gradients",
        "--ddp-reduce-scatter-with-fp32-accumulation "
        "--gtp-remat-reduce-scatter-with-fp32-accumulation "
        "--ddp-param-name-patterns-for-fp32-local-accumulation",
    ),
    (
        UNPRICED + "DDP buffers allocated from an NCCL memory pool (user buffers, symmetric "
        "windows; under Megatron FSDP its double buffers, which NCCL user buffers require, "
        "param_and_grad_buffer.py:2515-2519)",
        "--disable-symmetric-registration --gtp-remat-nccl-ub --gtp-expert-remat-nccl-ub",
    ),
    (
        UNPRICED + "Megatron FSDP's double buffers: two units' gathered weights and two "
        "units' gradient buckets taken from megatron's global memory buffer and kept between "
        "steps, the prefetch held to two units, other units allocated as without it "
        "(FixedPoolAllocator or MaxPoolAllocator, param_and_grad_buffer.py:647-885, "
        "2524-2560)",
        "--megatron-fsdp-max-pool-double-buffer --fsdp-db-use-persist-buf-on-alloc-fail",
    ),
    (
        UNPRICED + "Megatron FSDP's FP8 weights' transposes kept after each unit's backward "
        "(priced freed with the unit's gathered weights, megatron_fsdp.py:627-634)",
        "--keep-fp8-transpose-cache",
    ),
    (
        UNPRICED + "Megatron FSDP's hybrid sharding (outer data-parallel groups), or its "
        "all-gathers and reduce-scatters sized or split otherwise",
        "--outer-dp-sharding-strategy --enable-full-sharding-in-hsdp "
        "--suggested-communication-unit-size --megatron-fsdp-enable-fine-grained-param-gather",
    ),
    (
        UNPRICED + "weights sharded over more ranks than TP and gathered per layer (GTP "
        "weight rematerialisation)",
        "--tensor-parallel-num-weight-shards --expert-tensor-parallel-num-weight-shards "
        "--gtp-remat-opt-in-modules",
    ),
    (
        UNPRICED + "context parallelism over packed, per-batch sequence groups (the dynamic "
        "CP data schedule) or documents masked from each other (packed THD batches)",
        "--hybrid-context-parallel --max-seqlen-per-dp-cp-rank --dataloader-inter-document-masking",
    ),
    (
        UNPRICED + "the checkpointed layers' inputs distributed over the TP ranks",
        "--distribute-saved-activations",
    ),
    (
        UNPRICED + "the experts' activations stashed in pages",
        "--moe-paged-stash",
    ),
    (
        UNPRICED + "the MLP run in chunks of the sequence (transformer_layer.py)",
        "--mlp-chunks-for-training",
    ),
    (
        UNPRICED + "the fused elementwise functions run eagerly (core/jit.py:27-30: their "
        "intermediates saved for backward)",
        "--disable-jit-fuser",
    ),
    (
        UNPRICED + "the model's configs, inputs and logits dumped to files every forward "
        "(config_logger.py, gpt_model.py:833)",
        "--config-logger-dir",
    ),
    (
        UNPRICED + "the MTP layers in a pipeline stage of their own, their heads detached "
        "from the decoder's graph, or hidden states mixed over the data-parallel ranks",
        "--mtp-standalone --mtp-detach-heads --mtp-hsm",
    ),
    (
        UNPRICED + "weight gradients computed later, or tensors released earlier, around "
        "the expert-parallel all-to-all (the routed experts' weight gradients on a stream "
        "of their own after their input gradients, model_parallel_config.py:275-283 at "
        "4828d651; the attention's backward run before the other micro-batch's MoE forward, "
        "what it stores for backward_dw live across it, model_chunk_schedule_plan.py:274-275)",
        "--overlap-dispatch-backward-with-experts-wgrad "
        "--ep-overlap-early-attn-memory-release --high-priority-a2a-comm-stream",
    ),
    (
        UNPRICED + "an experimental attention variant (gated delta net, DSA: states and "
        "indexers of their own)",
        "--experimental-attention-variant",
    ),
    (
        UNPRICED + "the attention's output gate, QK L2 norm, QK clip or max-logit tracking "
        "(tensors and parameters of their own)",
        "--attention-output-gate --qk-l2-norm --qk-clip --log-max-attention-logit",
    ),
    (
        UNPRICED + "a FlashAttention generation pinned (FA3 and FA4 keep their own saved tensors)",
        "--flash-attention-version",
    ),
    (
        UNPRICED + "relative or multimodal position embeddings, RoPE skipped on some "
        "layers, or the legacy position flags that change the embedding type",
        "--relative-attention-num-buckets --relative-attention-max-distance --mrope-section "
        "--no-rope-freq --use-rotary-position-embeddings",
    ),
    (
        REJECTED + "--no-position-embedding without --position-embedding-type rope: "
        "RuntimeError('--no-position-embedding is deprecated, use "
        "--position-embedding-type') (arguments.py:1633-1634); beside rope it changes nothing "
        "(add_position_embedding is read nowhere else)",
        "--no-position-embedding",
    ),
    (
        UNPRICED + "a QKV bias without the other linear biases (parameters not priced)",
        "--add-qkv-bias",
    ),
    (UNPRICED + "the residual stream held in fp32", "--fp32-residual-connection"),
    (
        UNPRICED + "Transformer Engine's activation function in place of megatron-core's",
        "--use-te-activation-func",
    ),
    (
        UNPRICED + "an unfused bias + SwiGLU (the unfused op's saved tensors)",
        "--no-bias-swiglu-fusion",
    ),
    (
        UNPRICED + "the fused residual RMSNorm (a saved set of its own, not read)",
        "--fused-residual-rmsnorm",
    ),
    (
        UNPRICED + "hyper-connections (several residual streams per layer)",
        "--enable-mhc-connections",
    ),
    (
        UNPRICED + "MuP scaling (its multipliers on the embedding and the output)",
        "--use-mup --mup-width-mult --mup-base-hidden-size --mup-embedding-mult "
        "--mup-output-mult --mup-base-head-dim --mup-attn-scale-power",
    ),
    (
        UNPRICED + "batch-invariant kernels",
        "--batch-invariant-mode --batch-invariant-backend",
    ),
    (
        UNPRICED + "per-layer heterogeneous configs, or a layer spec of the user's",
        "--heterogeneous-layers-config-path --heterogeneous-layers-config-encoded-json",
    ),
    (
        UNPRICED + "the embedding's scattered output not cloned under sequence parallelism "
        "(the gathered buffer held instead)",
        "--no-clone-scatter-output-in-embedding --disable-clone-scatter-output-in-embedding",
    ),
    (
        UNPRICED + "logits and the loss in another dtype (fp16 cross entropy, the output "
        "layer's logit dtype)",
        "--fp16-lm-cross-entropy --output-logit-dtype",
    ),
    (UNPRICED + "the router's input jitter", "--moe-input-jitter-eps"),
    (
        UNPRICED + "biased or quantile load balancing (the router's own states and a "
        "routing cpmem does not model)",
        "--moe-router-force-biased --moe-router-quantile-balancing-ema",
    ),
    (
        UNPRICED + "a capacity per expert-parallel rank (its own dropping rule)",
        "--moe-expert-rank-capacity-factor",
    ),
    (
        UNPRICED + "the shared experts' gate (its [tokens, 1] sigmoid score and the gated "
        "product's saved output)",
        "--moe-shared-expert-gate",
    ),
    (
        UNPRICED + "the shared experts run on a side stream beside the dispatch: their "
        "linears' own sequence-parallel communication is turned off (shared_experts.py:150-"
        "161), so under SP fc1 saves the all-gathered [tokens, H] input (shared_experts.py:"
        "236) and fc2's un-scattered [tokens, H] output is made at the routed combine "
        "(token_dispatcher.py:846-848, shared_experts.py:316-330); and their backward is "
        "interleaved with the routed experts' by sequence number (shared_experts.py:301-"
        "313, _BackwardStreamWait), so which of the two backwards' gradients are live at "
        "once is not read",
        "--moe-shared-expert-overlap",
    ),
    (UNPRICED + "latent MoE projections", "--moe-latent-size"),
    (
        UNPRICED + "the experts' weights as grouped tensors or grouped GEMMs of other "
        "layers, interleaved GLU weights, probabilities applied on the input",
        "--moe-use-grouped-tensor --moe-single-grouped-weight --moe-single-grouped-bias "
        "--use-grouped-gemm-for-shared-expert --use-grouped-gemm-for-dense-mlp "
        "--moe-shared-expert-glu-interleave-size --moe-mlp-glu-interleave-size "
        "--moe-apply-probs-on-input",
    ),
    (
        UNPRICED + "the flex dispatcher's DeepEP backend (its handle and megatron's "
        "permutation after it), NCCL EP's dispatch dtypes, or HybridEP's inputs padded to "
        "the group's largest token count (a padded copy of the tokens, routing map and "
        "probabilities, token_dispatcher.py:1068-1094,1145-1149)",
        "--moe-enable-deepep --moe-dispatch-fwd-dtype --moe-combine-bwd-dtype "
        "--moe-hybridep-pad-uneven-dispatch-inputs",
    ),
    (UNPRICED + "a dense checkpoint upcycled into experts", "--moe-use-upcycling"),
    (
        UNPRICED + "the routing traced to files (the router's logits and hidden states "
        "kept for the trace)",
        "--moe-routing-trace-path --moe-routing-trace-max-training-iters "
        "--moe-routing-trace-capture-logits --moe-routing-trace-capture-hidden-states "
        "--moe-routing-trace-dump-weights",
    ),
    (
        UNPRICED + "the vocabulary given as is, not the tokenizer's size padded by "
        "--make-vocab-size-divisible-by x TP",
        "--padded-vocab-size",
    ),
    (
        UNPRICED + "special tokens added to the tokenizer's vocabulary (its size)",
        "--tokenizer-special-tokens --tiktoken-num-special-tokens",
    ),
    (
        UNPRICED + "a batch decreased during the run to divide micro-batch x DP",
        "--decrease-batch-size-if-needed",
    ),
    (
        UNPRICED + "tensors saved from the step (activation, gradient and token dumps by "
        "hooks; gradients all-reduced instead of reduce-scattered, training.py:3028-3043)",
        "--save-params-interval --save-activations-interval --save-tokens-per-expert-interval "
        "--save-wgrads-interval --save-dgrads-interval",
    ),
    (
        UNPRICED + "a distillation teacher held beside the student (its frozen weights, its "
        "forward's transients and the distillation loss's logits): Megatron-LM reads the "
        "teacher's architecture from model_config.yaml in the teacher's checkpoint directory, "
        "or from --export-kd-teacher-model-config (post_training/model_builder.py:49-80 at "
        "4828d651), a file the arguments name but do not hold",
        "--export-kd-teacher-load --export-kd-cfg",
    ),
    (
        UNPRICED + "ModelOpt's quantized or exported model (its quantizers, fake-quantized "
        "copies and exported layer specs)",
        "--export-te-mcore-model --export-quant-cfg "
        "--export-real-quant-cfg --export-kv-cache-quant --export-qk-l2-norm "
        "--export-moe-apply-probs-on-input --qad-train-target --freeze-base-for-mtp",
    ),
    (
        UNPRICED + "logits saved from the step or loaded beside it (logits distillation)",
        "--logits-save-dir --logits-load-dir",
    ),
    (
        UNPRICED + "parameters left without gradients (frozen layers: no gradient buffers "
        "or optimizer states for them)",
        "--freeze-all-layers",
    ),
    (
        UNPRICED + "steps rerun by the rerun state machine (the reruns and their saved "
        "results), or faults injected to make it rerun",
        "--rerun-mode --error-injection-rate --error-injection-type",
    ),
    (
        UNPRICED + "the run's arguments replaced from elsewhere (a YAML file, a "
        "checkpoint's saved arguments)",
        "--yaml-cfg --use-checkpoint-args --use-mp-args-from-checkpoint-args",
    ),
    (
        UNPRICED + "a run that trains no step cpmem prices (checkpoint conversion, skipped "
        "training, a fake process group, an RL step, SFT's packed datasets)",
        "--ckpt-convert-format --ckpt-convert-save --skip-train --fake-process-group "
        "--perform-rl-step --sft",
    ),
    (
        REJECTED + "a deprecated argument validate_args asserts unset or exits on "
        "(arguments.py:590-606: use --micro-batch-size, --lr-warmup-fraction, "
        "--tensor-model-parallel-size, --recompute-activations)",
        "--batch-size --warmup --model-parallel-size --checkpoint-activations",
    ),
    (
        UNPRICED + "the Mamba-2 mixer's unfused path (use_mamba_mem_eff_path off) or its "
        "inter-chunk SSM states kept in another dtype than the activations'",
        "--disable-mamba-mem-eff-path --mamba-training-ssm-states-dtype",
    ),
    (
        _family("BERT (examples/bert/pretrain_bert.py) or T5 (examples/t5/pretrain_t5.py)"),
        "--bert-no-binary-head --bert-load --decoder-num-layers --decoder-seq-length",
    ),
    (
        _family("the ICT / biencoder retriever (BERT-based)"),
        "--ict-head-size --biencoder-projection-dim --biencoder-shared-query-context-model "
        "--ict-load --titles-data-path --query-in-block-prob --use-one-sent-docs "
        "--evidence-data-path --retriever-report-topk-accuracies --retriever-score-scaling "
        "--block-data-path --embedding-path --indexer-batch-size --indexer-log-interval",
    ),
    (
        _family("vision and multimodal models (ViT, Swin, DINO, inpainting)"),
        "--num-classes --img-h --img-w --num-channels --patch-dim --classes-fraction "
        "--data-per-class-fraction --head-lr-mult --vision-pretraining --vision-pretraining-type "
        "--vision-backbone-type --swin-backbone-type --mask-type --mask-factor --iter-per-epoch "
        "--dino-local-img-size --dino-local-crops-number --dino-head-hidden-size "
        "--dino-bottleneck-size --dino-freeze-last-layer --dino-norm-last-layer "
        "--dino-warmup-teacher-temp --dino-teacher-temp --dino-warmup-teacher-temp-epochs",
    ),
)

HARMLESS_VALUES: dict[str, tuple[str, ...]] = {
    # rerun_state_machine.py:272-320: disabled skips the state machine's saved state and
    # reruns; validate_results is the default
    "--rerun-mode": ("disabled", "validate_results"),
}
"""Values of a refused flag that leave the run as the default's."""


def _on(given: Mapping[str, object], flag: str) -> bool:
    """Whether a switch is given on (``--flag: false`` in YAML leaves it out)."""
    return flag in given and given[flag] is not False


HARMLESS_WITH: dict[str, Callable[[Mapping[str, object]], bool]] = {
    # arguments.py:1204-1216: under --bf16, validate_args sets
    # accumulate_allreduce_grads_in_fp32 itself (False with --grad-reduce-in-bf16, else
    # True with the default fp32 main gradients): the flag given or not, the same run
    "--accumulate-allreduce-grads-in-fp32": lambda given: _on(given, "--bf16"),
    # arguments.py:1633-1634 rejects it unless the embedding is rope; add_position_embedding
    # is read nowhere else at the snapshot (git grep add_position_embedding)
    "--no-position-embedding": lambda given: (
        str(given.get("--position-embedding-type", "")) == "rope"
    ),
    # read only by TensorParallelMuon (optimizer_config.py muon_*): unread under Adam
    **dict.fromkeys(
        ("--muon-nesterov", "--muon-tp-mode", "--muon-fp32-matmul-prec", "--muon-no-split-qkv"),
        lambda given: str(given.get("--optimizer", "adam")) not in ("muon", "dist_muon"),
    ),
}
"""Refused flags that change nothing beside the other arguments named (the whole run's
flags as given): read as ignored there."""

REFUSED: Mapping[str, str] = groups_by_flag(REFUSED_GROUPS)
"""Flag -> why the run is refused (how it changes memory, or whose argument it is)."""

FLEXTRON_FLAGS = (
    "--distillation --distill-coeff --distill-only --flextron --binary-mask --slice "
    "--enable-router --add-skipping --no-attn-skip --lr-mult-router --flex-strict "
    "--is-flex-eval --freeze-router --freeze-model --flex-hetero-ffn --flex-hetero-mamba "
    "--flex-hetero-moe-expert --router-std --normalize-router-logits --soft-mask "
    "--budget-probs --prefill-chunk-size --mem-infer-seq-len --mem-batch-size "
    "--original-model-sample-prob --force-router-skip --force-mlp --force-mamba --force-emb "
    "--skip-num-attn-layer-constraint --skip-total-layer-constraint --disable-budget "
    "--curr-iteration --hard-sample-th --router-beta --loss-alpha --tau-init --tau-decay "
    "--router-inter-dim --linear-scaler-start --linear-scaler-end --override-selected-budget "
    "--router-gbs --budget-list --mamba-per-list --mlp-per-list --emb-per-list "
    "--moe-expert-per-list --mamba-int-list --mlp-int-list --emb-int-list "
    "--moe-expert-int-list --budget-type --memory-profile --memory-profile-path --bpe-params "
    "--bpe-kv-cache --bpe-ssm-cache --bpe-max-buffer --param-budget-target "
    "--layer-ranking-list --log-budgets --basemodel-type --flextron-config-file"
)
"""The arguments Flextron adds (``megatron/elastification/arguments.py`` at the snapshot,
the parser of ``megatron/elastification/pretrain_hybrid_flex.py``)."""

FOREIGN: Mapping[str, str] = dict.fromkeys(
    FLEXTRON_FLAGS.split(),
    "is Flextron's (megatron/elastification/pretrain_hybrid_flex.py, its own training "
    "script): a router that picks a budget's sub-network of every layer each step (the "
    "mask, its router and the budgets' slices of the weights) is not a training cpmem "
    "prices",
)
"""Flags of another Megatron-LM training script than ``pretrain_gpt.py``'s and
``pretrain_hybrid.py``'s parser, with why their run is refused."""
