"""The arguments of the snapshot's ``pretrain_gpt.py`` that change nothing cpmem
prices (``IGNORED``), each group with its reason, decided by reading what the flag does
in Megatron-LM's source at the snapshot (``data/arguments.tsv``).

An ignored flag changes no tensor the logged steps hold on the device (a host-side
setting, a path, a schedule, a kernel choice with the same saved tensors), or is read
only by a feature that is itself refused (``refused.py``: the run is refused by that
feature's flag), or is read nowhere at the snapshot.
"""

from __future__ import annotations

from collections.abc import Mapping

from cpmem.megatron.fp8_rules import FP8_ONLY

# (reason, flags) -- every flag string of the snapshot in exactly one group of one table
IGNORED_GROUPS: tuple[tuple[str, str], ...] = (
    (
        "read only by ModelOpt's model builder (megatron/post_training/model_builder.py:298, "
        "YaRN RoPE settings on its config), which pretrain_gpt.py uses only when a ModelOpt "
        "checkpoint is loaded or a distillation teacher given (post_training/utils.py:13-30, "
        "pretrain_gpt.py:529-533); a run priced here builds GPTModelBuilder, which never "
        "reads it",
        "--enable-gpt-oss",
    ),
    (
        "read only by Megatron FSDP (mcore_fsdp_adapter.py:213) and Torch FSDP2 "
        "(training.py:1796-1802): the parameters initialised on the meta device before "
        "they are sharded, a start-up moment outside the step's figure",
        "--init-model-with-meta-device",
    ),
    (
        "logging, timing and monitoring: host-side, or 1-element tensors; the zero count's "
        "mask of one gradient shard at the optimizer step stays below the backward's peak, "
        "the parameters' norm reads the fp32 master copies in place (clip_grads.py, "
        "common_utils.py)",
        "--log-num-zeros-in-grad --log-params-norm --log-interval --log-timers-to-tensorboard "
        "--log-validation-ppl-to-tensorboard --log-memory-to-tensorboard --tensorboard-dir "
        "--timing-log-level --timing-log-option --log-throughput --logging-level --log-progress "
        "--tensorboard-log-interval --tensorboard-queue-size --no-log-loss-scale-to-tensorboard "
        "--disable-log-loss-scale-to-tensorboard --log-memory-interval --log-device-memory-used "
        "--no-barrier-with-level-1-timing --log-world-size-to-tensorboard --wandb-project "
        "--wandb-exp-name --wandb-save-dir --wandb-entity --log-energy --otel-enabled "
        "--otel-service-name --otel-span-groups --log-straggler --straggler-ctrlr-port "
        "--straggler-minmax-count --disable-straggler-on-startup --run-workload-inspector-server "
        "--no-one-logger --one-logger-project --one-logger-run-name --one-logger-async "
        "--app-tag-run-name --app-tag-run-version --moe-per-layer-logging "
        "--check-for-large-grads --check-for-spiky-loss",
    ),
    (
        "profiling: host-side traces, NVTX ranges and the allocator's history "
        "(training.py); no tensor of the step",
        "--profile --profile-step-start --profile-step-end --use-pytorch-profiler "
        "--pytorch-profiler-collect-shapes --pytorch-profiler-collect-callstack "
        "--pytorch-profiler-collect-chakra --profile-ranks --record-memory-history "
        "--memory-snapshot-path --record-shapes --nvtx-ranges",
    ),
    (
        "checkpoints: written and read outside the logged steps' tensors (the state loaded "
        "is the state the run builds)",
        "--save --load --save-interval --persistent-save-interval --ckpt-format "
        "--dist-ckpt-strictness --async-save --async-strategy --async-ckpt-use-cpu-shm "
        "--use-persistent-ckpt-worker --no-ckpt-fully-parallel-save --ckpt-fully-parallel-save "
        "--ckpt-fully-parallel-load --ckpt-assume-constant-structure --auto-detect-ckpt-format "
        "--dist-ckpt-optim-fully-reshardable --use-checkpoint-opt_param-scheduler "
        "--use-checkpoint-opt-param-scheduler --verify-integrity --save-retain-interval "
        "--load-main-params-from-ckpt --non-persistent-save-interval --non-persistent-ckpt-type "
        "--non-persistent-global-ckpt-dir --non-persistent-local-ckpt-dir "
        "--non-persistent-local-ckpt-algo --finetune --pretrained-checkpoint --ckpt-step "
        "--no-use-tokenizer-model-from-checkpoint-args "
        "--disable-use-tokenizer-model-from-checkpoint-args --exit-on-missing-checkpoint "
        "--ckpt-convert-update-legacy-dist-opt-format --async-ckpt-cpu-priority "
        "--async-ckpt-io-priority --ckpt-fully-parallel-load-exchange-algo "
        "--ckpt-fully-parallel-load-per-rank-objects --ckpt-fully-parallel-save-process-group "
        "--ckpt-fully-parallel-load-process-group --ckpt-pg-tensors-cache-path "
        "--ckpt-pg-tensors-cache-create --no-ckpt-load-validate-sharding-integrity "
        "--disable-ckpt-load-validate-sharding-integrity --no-strict-fsdp-dtensor-load "
        "--disable-strict-fsdp-dtensor-load --dist-ckpt-save-pre-mcore-014 "
        "--distrib-optim-fully-reshardable-mem-efficient --no-save-tokenizer-assets "
        "--disable-save-tokenizer-assets --replication --replication-jump --replication-factor "
        "--no-save-optim --no-save-rng --no-load-optim --no-load-rng --override-ckpt-iteration "
        "--use-dist-ckpt --dist-ckpt-format --dist-ckpt-workers --ckpt-drop-redundant-extra-state "
        "--enable-msc --disable-msc",
    ),
    (
        "data: paths, splits, workers, caches and the document masks of the samples (the "
        "same [b, s] token, label, mask and position tensors)",
        "--data-path --data-cache-path --split --vocab-file --merge-file --no-mmap-bin-files "
        "--fim-data --fim-rate --fim-spm-rate --fim-split-sample --fim-fragment-rate "
        "--fim-no-prefix --fim-prefix-token --fim-middle-token --fim-suffix-token --fim-pad-token "
        "--fim-eod-token --mock-data --num-workers --train-data-path --valid-data-path "
        "--test-data-path --data-args-path --per-split-data-args-path --per-dataset-sequences-path "
        "--dataloader-fast-cache-load --dataloader-defer-npy-index-mmap --dataloader-type "
        "--num-dataset-builder-threads --object-storage-cache-path --mid-level-dataset-surplus "
        "--allow-ambiguous-pad-tokens --reset-position-ids --reset-attention-mask --eod-mask-loss "
        "--phase-transition-iterations --no-data-sharding --tokenizer-model --tokenizer-metadata --tiktoken-pattern "
        "--tokenizer-sentencepiece-legacy --no-tokenizer-sentencepiece-ignore-extra-whitespaces "
        "--disable-tokenizer-sentencepiece-ignore-extra-whitespaces --tokenizer-hf-no-use-fast "
        "--tokenizer-hf-no-include-special-tokens --trust-remote-code --null-tokenizer-eod-id "
        "--null-tokenizer-pad-id --chat-template --use-gigatoken --vocab-extra-ids",
    ),
    (
        "the schedule of the run, its learning rate and its evaluation (no evaluation runs "
        "before the last logged step in these runs; the learning rate is a host-side number)",
        "--train-iters --train-samples --exit-interval --eval-interval --eval-iters "
        "--start-eval-at-iter --eval-global-batch-size --eval-micro-batch-size --lr --min-lr --lr-decay-iters --lr-decay-samples --lr-decay-style "
        "--lr-wsd-decay-style --lr-wsd-decay-iters --lr-wsd-decay-samples --lr-warmup-fraction "
        "--lr-warmup-iters --lr-warmup-samples --lr-warmup-init --override-opt_param-scheduler "
        "--override-opt-param-scheduler --weight-decay --start-weight-decay --end-weight-decay "
        "--weight-decay-incr-style --clip-grad --decoupled-lr --decoupled-min-lr "
        "--apply-wd-to-qk-layernorm --no-weight-decay-cond-type --iterations-to-skip "
        "--result-rejected-tracker-filename --full-validation --multiple-validation-sets "
        "--validation-set-names --exit-signal-handler --exit-signal "
        "--exit-signal-handler-for-dataloader --exit-signal-handler-for-training",
    ),
    (
        "the initialization, the seeds, the optimizer's hyper-parameters and fp16's loss scaler "
        "(values, not tensors: the same parameters and states)",
        "--seed --data-parallel-random-init --init-method-xavier-uniform --adam-beta1 --adam-beta2 --adam-eps --init-method-std --embedding-init-method-std "
        "--loss-scale --initial-loss-scale --min-loss-scale --loss-scale-window --hysteresis "
        "--norm-epsilon --rotary-base --no-initialization "
        "--disable-bf16-reduced-precision-matmul",
    ),
    (
        "the loss's normalisation, the collectives' averaging, and the points the gradient "
        "reduce-scatter and the parameter all-gather are launched at (in place in the "
        "buffers; the same tensors)",
        "--calculate-per-token-loss --ddp-average-in-collective --no-align-grad-reduce "
        "--disable-align-grad-reduce --no-align-param-gather",
    ),
    (
        "real-time checks: the q/k-norm parameters of one module stacked and gathered across "
        "ranks (attention.py, run_realtime_tests): O(head_dim) elements",
        "--test-mode",
    ),
    (
        "process groups, launch, timeouts and rank order (the logging rank is still the last "
        "stage's last TP, CP and DP rank); NCCL's own buffers are outside the allocator "
        "cpmem prices",
        "--distributed-backend --disable-gloo-process-groups --use-tp-pp-dp-mapping "
        "--hierarchical-context-parallel-sizes --use-mcore-models "
        "--check-weight-hash-across-dp-replicas-interval --distributed-timeout-minutes "
        "--exit-duration-in-mins --manual-gc --manual-gc-interval --no-manual-gc-eval "
        "--disable-manual-gc-eval --no-check-for-nan-in-loss-and-grad --local-rank "
        "--lazy-mpu-init --nccl-communicator-config-path --use-sharp --sharp-enabled-group "
        "--high-priority-stream-groups --distributed-timeout-seconds-after-init "
        "--flight-recorder-dump-path --flight-recorder-trace-buffer-size "
        "--no-flight-recorder-dump-on-timeout --disable-flight-recorder-dump-on-timeout "
        "--flight-recorder-include-stack-trace --no-flight-recorder-include-only-active "
        "--disable-flight-recorder-include-only-active --no-flight-recorder-extra-dump-on-exec "
        "--disable-flight-recorder-extra-dump-on-exec --pipeline-model-parallel-comm-backend "
        "--gpu-sniff-test-interval --train-sync-interval --te-rng-tracker "
        "--inference-rng-tracker --adlr-autoresume --adlr-autoresume-interval --inprocess-restart "
        "--inprocess-max-iterations --inprocess-monitor-thread-interval "
        "--inprocess-monitor-process-interval --inprocess-progress-watchdog-interval "
        "--inprocess-heartbeat-interval --inprocess-soft-timeout --inprocess-hard-timeout "
        "--inprocess-heartbeat-timeout --inprocess-barrier-timeout --inprocess-completion-timeout "
        "--inprocess-last-call-wait --inprocess-termination-grace-time --inprocess-granularity "
        "--inprocess-active-world-size --inprocess-empty-cuda-cache --enable-ft-package "
        "--calc-ft-timeouts --ft-num-warmup-iters --empty-unused-memory-level "
        "--use-cpu-initialization",
    ),
    (
        "rotary variants: the same tensors (the frequencies are O(s))",
        "--rotary-interleaved --rotary-percent --no-rope-fusion --use-rope-scaling "
        "--rope-scaling-factor --rotary-seq-len-interpolation-factor",
    ),
    (
        "a kernel choice with the same saved tensors: the persistent LayerNorm of the local "
        "implementation, the unfused bias + GeLU (mlp.py keeps the fc1-wide activation input "
        "either way), LayerNorm's weight read as 1 + gamma in Transformer Engine's kernel "
        "(zero_centered_gamma), the router's softmax before or after the top-k (the same "
        "[tokens, experts] scores, router.py), the unfused bias + dropout + add (eager, "
        "fused_bias_dropout.py:39-58: the bias add and the residual add save nothing, the "
        "dropout keeps its bool mask, the one priced; at probability 0 it returns its input)",
        "--no-persist-layer-norm --no-bias-gelu-fusion --apply-layernorm-1p "
        "--moe-router-pre-softmax --no-bias-dropout-fusion",
    ),
    (
        "the pipeline's sends and receives overlapped, batched or by ring exchange (the same "
        "received tensors, posted earlier or later; a run without the overlap holds no more "
        "than the default's)",
        "--overlap-p2p-communication-warmup-flush --no-overlap-p2p-communication "
        "--use-ring-exchange-p2p",
    ),
    (
        "read only by the fused cross entropy, where Megatron-LM rejects te "
        "(arguments.py:1706-1711, a rule of rules.py)",
        "--cross-entropy-fusion-impl",
    ),
    (
        "which GEMMs overlap their TP communication through Transformer Engine's "
        "userbuffers under --tp-comm-overlap, and how the userbuffers are set up: the "
        "userbuffers are device memory outside PyTorch's allocator (cuMemCreate/cudaMalloc, "
        "TE comm_gemm_overlap.cpp:326,703), and their GEMMs' workspace is priced whenever "
        "--tp-comm-overlap is on (an upper bound where every overlap is disabled)",
        "--no-tp-comm-bulk-wgrad --disable-tp-comm-bulk-wgrad --no-tp-comm-bulk-dgrad "
        "--disable-tp-comm-bulk-dgrad --no-tp-comm-overlap-ag --disable-tp-comm-overlap-ag "
        "--no-tp-comm-overlap-rs --disable-tp-comm-overlap-rs --tp-comm-overlap-rs-dgrad "
        "--no-tp-comm-split-ag --disable-tp-comm-split-ag --no-tp-comm-split-rs "
        "--disable-tp-comm-split-rs --tp-comm-bootstrap-backend --tp-comm-overlap-cfg",
    ),
    (
        "the rope type of latent attention (YaRN, its default in MLATransformerConfig, or "
        "rope: the same cos/sin tables; other attention asserts rope, argument_utils.py) and "
        "YaRN's scaling constants (values, not shapes); an inference cache of the latents; "
        "a fused down projection of the same weights",
        "--rotary-scaling-factor --mscale --mscale-all-dim --cache-mla-latents "
        "--mla-down-proj-fusion --yarn-original-max-position-embeddings --yarn-beta-fast "
        "--yarn-beta-slow --yarn-correction-range-round-to-int "
        "--no-yarn-correction-range-round-to-int --rope-type",
    ),
    (
        "read only by --experimental-attention-variant's layers (refused)",
        "--dsa-indexer-n-heads --dsa-indexer-head-dim --dsa-indexer-topk --dsa-indexer-topk-freq "
        "--dsa-indexer-skip-topk-offset --dsa-indexer-loss-coeff --dsa-indexer-use-sparse-loss "
        "--dsa-kernel-backend --dsa-indexer-rope-interleaved --no-dsa-indexer-rotate-activation "
        "--disable-dsa-indexer-rotate-activation --no-dsa-indexer-scoring-relu "
        "--disable-dsa-indexer-scoring-relu --dsa-indexer-k-norm-epsilon "
        "--dsa-indexer-k-norm-fp32 --linear-attention-freq",
    ),
    (
        "read only by the Gated Delta Product stack (--spec gated_delta_product_stack_spec, "
        "refused) or by inference's Mamba state caches",
        "--gdp-num-householder --gdp-cutedsl-kernel --gdp-num-chunk-states-to-recompute "
        "--mamba-inference-conv-states-dtype --mamba-inference-ssm-states-dtype",
    ),
    (
        "set from --hybrid-layer-pattern anyway (argument_utils.py:345-346); it changes only "
        "the output layers' initial scale (transformer_config.py:2596-2610)",
        "--is-hybrid-model",
    ),
    (
        "read only by the optimizers cpmem refuses (SGD, Lion: --optimizer) or by the "
        "CPU-offloaded optimizer (--optimizer-cpu-offload, refused)",
        "--sgd-momentum --lion-beta1 --lion-beta2 --optimizer-offload-fraction "
        "--use-torch-optimizer-for-cpu-offload --overlap-cpu-optimizer-d2h-h2d "
        "--no-pin-cpu-grads --no-pin-cpu-params",
    ),
    (
        "Muon's momentum factor, scales, and Newton-Schulz coefficients and step count: "
        "numbers the step multiplies by, and how many iterations run, each holding the same "
        "tensors (cpmem.pricing.muon_step); the SYRK kernel forms the same s x s products "
        "(Emerging-Optimizers 0.3.0, pinned at the snapshot, rejects it: "
        "emerging_optimizers.py:52-56, 202-207)",
        "--muon-momentum --muon-scale-mode --muon-coefficient-type --muon-num-ns-steps "
        "--muon-use-syrk --muon-extra-scale-factor",
    ),
    (
        "delayed scaling's margin and amax reduction (max or most recent of the history): "
        "scalars its fused update reads, no tensor (TE quantization.py:668-675); "
        "--fp8-interval is ignored by Transformer Engine since 1.8 (Megatron-LM "
        "transformer_engine.py:3033-3034)",
        "--fp8-margin --fp8-interval --fp8-amax-compute-algo",
    ),
    (
        "read only by the FP8 recipe cpmem refuses (the custom recipe's quantizer factory), "
        "by FP4 training (--fp4-format, refused) or by MoE routing under FP8 (the router's "
        "padding, refused where Megatron-LM reads it: cpmem.megatron.fp8_rules)",
        "--fp8-quantizer-factory --fp4-recipe "
        "--fp4-quantizer-factory --moe-router-padding-for-quantization "
        "--moe-router-padding-for-fp8",
    ),
    (
        "read only under --fp8-format, where cpmem refuses them (cpmem.megatron.fp8_rules: "
        "weight gradients in high precision and the inputs kept for them)",
        " ".join(FP8_ONLY),
    ),
    (
        "which of Megatron FSDP's NCCL user buffers are registered by hand "
        "(--fsdp-manual-registration: the same buffers, registered once); or Megatron "
        "FSDP's gradient scaling fused into its reduction or not (in place: no tensor, "
        "gradient_reduce_preprocessing, param_and_grad_buffer.py:4740-4762) "
        "and its all-gathers on a process group of their own (a communicator, no tensor)",
        "--fsdp-manual-registration --no-gradient-reduce-div-fusion --create-all-gather-group",
    ),
    (
        "which tokens a capacity drops (by probability or by position), not how many: the "
        "capacity's rows are the same (apply_router_token_dropping, moe_utils.py)",
        "--moe-token-drop-policy",
    ),
    (
        "the flex token dispatcher's SMs and thread blocks (no tensor), or HybridEP's "
        "permutation fused into its dispatch kernel, whose output rows and handle are "
        "allocated the same either way (DeepEP hybrid-ep 17cfb81 hybrid_ep.cu:312-317); or "
        "read only by the DeepEP and NCCL EP backends (refused, cpmem.megatron.flex_rules)",
        "--moe-permute-fusion-into-hybridep --moe-flex-dispatcher-num-sms "
        "--moe-deepep-num-sms --moe-hybridep-num-sms --moe-hybridep-num-blocks-permute "
        "--moe-hybridep-num-blocks-unpermute --moe-hybridep-num-sms-preprocessing "
        "--moe-ncclep-zero-copy",
    ),
    (
        "keeps whole-layer offloading's pinned host buffers from one iteration to the next "
        "(Transformer Engine cpu_offload.py release_all_memory): host memory, outside the "
        "figure",
        "--cpu-offloading-retain-pinned-cpu-buffers",
    ),
    (
        "paces fine-grained offloading's copies to the host (the main stream waits on older "
        "ones, fine_grained_activation_offload.py _drain_offload_pending): no tensor kept",
        "--fine-grained-offloading-max-inflight-offloads",
    ),
    (
        "read only by CUDA graphs (the eager iterations before the capture: the eager "
        "step's memory, which the peak prices) or the paged stash (--moe-paged-stash, "
        "refused)",
        "--cuda-graph-warmup-steps --moe-paged-stash-page-size "
        "--moe-paged-stash-buffer-size-factor-cuda --moe-paged-stash-buffer-size-factor-cpu",
    ),
    (
        "read only by the QK-clip or the hyper-connections they go with (--qk-clip, "
        "--enable-mhc-connections, refused)",
        "--qk-clip-alpha --qk-clip-threshold --mhc-num-residual-streams --mhc-sinkhorn-iterations "
        "--mhc-init-gating-factor --mhc-recompute-layer-num",
    ),
    (
        "the MTP losses' weight in the total loss: a scalar",
        "--mtp-loss-scaling-factor",
    ),
    (
        "the router's top-k probabilities scaled by a constant (moe_utils.py "
        "topk_routing_with_score_function: probs * scaling_factor, a product that keeps no "
        "input for backward)",
        "--moe-router-topk-scaling-factor",
    ),
    (
        "read only where a refused feature runs: the routing map padded for FP8 or FP4 "
        "(token_dispatcher.py:649-653) and the flex dispatcher's fused permutation "
        "(token_dispatcher.py:1415-1425); no experimental_fn or experimental_cls is applied "
        "in megatron/ at the snapshot",
        "--enable-experimental",
    ),
    (
        "read only by MoE upcycling (--moe-use-upcycling, refused), or the rate the "
        "router's expert bias is updated at (a scalar)",
        "--moe-upcycling-granularity --moe-router-bias-update-rate",
    ),
    (
        "read only by inference (dynamic batching, the text-generation server, KV caches, "
        "inference CUDA graphs, the inference-optimized layers): a training step builds none",
        "--inference-batch-times-seqlen-threshold --max-tokens-to-oom --use-legacy-static-engine "
        "--inference-max-requests --inference-max-seq-length --inference-dynamic-batching "
        "--inference-dynamic-batching-buffer-size-gb "
        "--inference-dynamic-batching-paused-buffer-size-gb "
        "--inference-dynamic-batching-mamba-memory-ratio --inference-dynamic-batching-block-size "
        "--inference-dynamic-batching-max-requests --inference-dynamic-batching-max-tokens "
        "--inference-dynamic-batching-num-cuda-graphs "
        "--inference-dynamic-batching-track-paused-request-events "
        "--inference-dynamic-batching-track-generated-token-events --decode-only-cuda-graphs "
        "--inference-cuda-graph-all-prefills --inference-cuda-graph-max-tokens "
        "--inference-dynamic-batching-unified-memory-level --enable-chunked-prefill "
        "--num-speculative-tokens --inference-dynamic-batching-prefix-caching "
        "--no-inference-dynamic-batching-prefix-caching "
        "--inference-dynamic-batching-prefix-caching-eviction-policy "
        "--inference-dynamic-batching-prefix-caching-coordinator-policy "
        "--inference-dynamic-batching-prefix-caching-routing-alpha "
        "--inference-dynamic-batching-prefix-caching-mamba-gb "
        "--inference-dynamic-batching-cuda-graph-mixed-prefill-count "
        "--inference-dynamic-batching-cuda-graph-sizing-distribution "
        "--inference-dynamic-batching-sampling-backend --use-same-sampling-seed-across-dp-ranks "
        "--inference-dynamic-batching-async-sched-mode --inference-dynamic-batching-logprobs-mode "
        "--inference-logging-step-interval --inference-text-gen-server-logging "
        "--no-inference-text-gen-server-logging --inference-wandb-logging "
        "--no-inference-wandb-logging --inference-coordinator-port "
        "--inference-use-synchronous-zmq-collectives "
        "--no-inference-use-synchronous-zmq-collectives --inference-disable-ep-consensus "
        "--no-inference-disable-ep-consensus --inference-shards --inference-cuda-graph-scope "
        "--flash-decode --nccl-all-reduce-for-prefill --inference-fuse-tp-communication "
        "--inference-disable-triton-nvls-kernels --inference-grouped-gemm-backend "
        "--inference-moe-disable-fused-quant-kernels --inference-moe-token-dispatcher-type "
        "--moe-pad-experts-for-cuda-graph-inference --moe-enable-routing-replay "
        "--mlp-chunks-for-prefill --output-bert-embeddings --bert-embedder-type "
        "--symmetric-ar-type",
    ),
    (
        "read only by reinforcement learning (--perform-rl-step, refused)",
        "--rl-prompts-per-eval --grpo-prompts-per-step --grpo-group-size --rl-generation-lag "
        "--rl-max-inflight-requests --rl-submission-granularity --rl-consumption-granularity "
        "--rl-durable-rollout-bank --rl-rollout-bank-dir --rl-rollout-bank-max-bytes "
        "--grpo-iterations --grpo-clamp-eps-lower --grpo-clamp-eps-upper --grpo-kl-beta "
        "--grpo-entropy-term-weight --grpo-filter-groups-with-same-reward --langrl-env-config "
        "--rl-default-temperature --rl-default-top-p --rl-default-top-k "
        "--rl-offload-optimizer-during-inference --rl-kv-cache-management-mode "
        "--rl-persist-cuda-graphs --no-rl-persist-cuda-graphs --rl-partial-rollouts "
        "--no-rl-partial-rollouts --rl-inference-logprobs-is-correction "
        "--no-rl-inference-logprobs-is-correction --rl-importance-sampling-truncation-coef "
        "--rl-use-sequence-packing --no-rl-use-sequence-packing "
        "--rl-sequence-packing-max-sequences-per-bin --rl-sequence-packing-algo "
        "--rl-training-cuda-graphs --no-rl-training-cuda-graphs "
        "--rl-inference-tensor-model-parallel-size --rl-inference-pipeline-model-parallel-size "
        "--rl-inference-expert-model-parallel-size "
        "--rl-inference-expert-tensor-model-parallel-size "
        "--rl-inference-model-unified-memory-level --rl-offload-inference-model-weights-when-idle "
        "--no-rl-offload-inference-model-weights-when-idle --refit-method "
        "--rl-verify-model-weights-swap --no-rl-verify-model-weights-swap --rl-skip-bos-token "
        "--no-rl-skip-bos-token --rl-profile --rl-profile-dir --rl-inference-parsers",
    ),
    (
        "read only by ModelOpt's export, quantization and distillation set-up (refused: "
        "--export-te-mcore-model, --export-kd-teacher-load, --export-quant-cfg, ...) or "
        "by its fine-tuning datasets",
        "--export-model-type --export-legacy-megatron --export-default-te-spec "
        "--export-force-local-attention --export-kd-teacher-model-config "
        "--export-kd-teacher-ckpt-format --finetune-hf-dataset --finetune-data-split "
        "--finetune-data-files --export-offline-model --modelopt-enabled",
    ),
    (
        "read only by logits distillation's saving or loading (--logits-save-dir, "
        "--logits-load-dir, refused)",
        "--logits-save-top-k --logits-save-top-p --logits-save-top-p-min-k --logits-save-dtype "
        "--logits-load-decode-threads --logits-load-prefetch-factor "
        "--logits-load-msc-prefetch-depth --logits-load-kd-loss-alpha "
        "--logits-load-ignore-errors",
    ),
    (
        "read only by SFT's tokenizer and dataset (--sft, refused) or by the fault "
        "injector, which kills or delays ranks (host-side)",
        "--sft-tokenizer-prompt-format --fault-injector-ranks --fault-injector-num-ranks "
        "--fault-injector-fault-types --fault-injector-fault-probabilities "
        "--fault-injector-fault-delay --fault-injector-delay-start-iteration "
        "--fault-injector-mtti-seconds --fault-injector-offset-seconds --fault-injector-seed",
    ),
    (
        "read nowhere at the snapshot (a deprecated or unwired argument)",
        "--apply-residual-connection-post-layernorm --openai-gelu --onnx-safe --use-flash-attn "
        "--rampup-batch-size --mask-prob --short-seq-prob --sample-rate",
    ),
)


def groups_by_flag(groups: tuple[tuple[str, str], ...]) -> dict[str, str]:
    """Flag -> the reason of its group (the first group naming it)."""
    out: dict[str, str] = {}
    for reason, flags in groups:
        for flag in flags.split():
            out.setdefault(flag, reason)
    return out


IGNORED_REASONS: Mapping[str, str] = groups_by_flag(IGNORED_GROUPS)
"""Flag -> why it changes nothing cpmem prices."""
IGNORED: frozenset[str] = frozenset(IGNORED_REASONS)
