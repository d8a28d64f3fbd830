"""The help text of every ``cpmem`` flag, in one place (a test requires each option of
``estimate``, ``admit`` and ``models`` to have one)."""

from __future__ import annotations

from cpmem.pricing.registry import policy_names

HELP: dict[str, str] = {
    "--model": "preset name or recorded Hugging Face id (see `cpmem models`)",
    "--config": "path to a Hugging Face config.json (e.g. examples/qwen3-1.7b/config.json)",
    "--megatron-args": "a Megatron-LM GPT training run: a functional test's model_config.yaml "
    "(its MODEL_ARGS and ENV_VARS) or a text file of pretrain_gpt.py flags, read into the same "
    "step as --model/--config (full-parameter training, Megatron-LM's runtime) and priced by "
    "--policy tight unless named; every other flag given overrides the arguments' setting "
    "(--lora-rank N: a LoRA run on that model); with --world-size and --device (default h100) "
    "(docs/megatron-runtime.md)",
    "--world-size": "the GPUs the run uses: DP = world / (TP x PP x CP), after any "
    "--tp/--pp/--cp given; required with --megatron-args; with --model or --config in place "
    "of --dp (a --dp that contradicts it is refused; capacity, which searches layouts, takes "
    "--dp)",
    "--container": "the container the run's software is read from: Transformer Engine's "
    "attention choice under --attention-backend auto, and the PyTorch that compiles the fused "
    "cross entropy (--head fused): dev (NGC PyTorch 25.11, TE 2.11; default), ngc-24.10 "
    "(PyTorch 2.5) or ngc-24.01 (Megatron-LM's lts image until 2025-11-06, PyTorch 2.2, whose "
    "flash-attn TE does not use); another name is refused, and one that neither reads is "
    "listed as ignored",
    "--rank": "the rank answered: busiest (default: the stage and data-parallel rank where "
    "static memory and activations together peak), last (the last global rank, which "
    "Megatron-LM logs) or a global rank number in megatron's order (tp-cp-ep-dp-pp); it picks "
    "the pipeline stage and the distributed optimizer's slice, the activations are the busiest "
    "CP rank's (listed as ignored where no stage or slice differs)",
    "--attention-backend": "the core attention's kernel: fused (cuDNN), flash (flash-attn), "
    "unfused or local (s x s probabilities kept), or auto: the one Transformer Engine's "
    "selection picks for the run (never unfused under CP); default: the runtime's (ART: fused; "
    "--megatron-args: its own --attention-backend)",
    "--runtime": "the process: art (ART's LoRA trainer, the calibration harness golden/ measured; "
    "default) or megatron-lm (Megatron-LM's pretrain_gpt.py: its data loader's mask, its CP split, "
    "p2p CP comm, no fitted margin)",
    "--training": "what is trained: lora (adapters on a frozen base; default) or full (every "
    "parameter: bf16 weights, fp32 main gradients, Adam's master copy and moments)",
    "--etp": "expert tensor parallel size, MoE models (default 1: each routed expert whole on "
    "its EP rank, as the measured runtime runs them; --megatron-args and --runtime "
    "megatron-lm: TP); must divide the experts' FFN width, and be 1 for experts with biases "
    "(megatron-core's rules)",
    "--dtype": "the dtype of the parameters (frozen base, adapters, full training's "
    "weights) and activations: bf16 (default), fp16 or fp32; fp32 parameters have no fp32 "
    "master copy (megatron-core steps them in place), and Transformer Engine runs fp32 "
    "attention unfused (flash and fused are refused; the default backend is then auto)",
    "--fused-activation": "the runtime fuses the SwiGLU activation (default: by model family)",
    "--unfused-activation": "the runtime runs SwiGLU unfused",
    "--lengths": "sequence lengths of the request, comma-separated, e.g. 4096,4096",
    "--shared-prefix": "tokens every sequence shares at its start, stored once (default 0; "
    "two or more sequences share one)",
    "--tp": "tensor parallel size (default 1)",
    "--cp": "context parallel size (default 1)",
    "--ep": "expert parallel size, MoE models (default 1): must divide the routed experts "
    "(megatron-core's num_experts % EP == 0)",
    "--sp": "sequence parallel on (the default when --tp > 1)",
    "--no-sp": "sequence parallel off",
    "--recompute": "activation recompute: selective (checkpointed modules), none, full "
    "(every layer), no-grad (a forward without backward); default: the runtime's (selective for "
    "--runtime art, none for megatron-lm, Megatron-LM's own default)",
    "--modules": "modules selective recompute checkpoints, '+'-joined: core_attn, mlp, moe "
    "(default core_attn)",
    "--planner": "who owns which tokens under CP (default: chunked, the measured runtime's "
    "layout, for attention-only models; gdn-segments for hybrid). worst: the most tokens "
    "any planner puts on one rank, when the runtime's layout is unknown",
    "--allow-long": "price sequences longer than the model's max_position_embeddings (warns)",
    "--compiled": "the layers run under torch.compile (changes what attention and MLP keep; "
    "priced by --policy tight only, listed as ignored by the others)",
    "--moe-routing": "the rows each rank's experts receive: concentrated (the default, also "
    "accepted as worst: every token's top-k copies on this rank's experts as far as top-k "
    "allows, the bound a router without capacity reaches), balanced (the expectation; admission still "
    "decides on the worst), capacity:F or capacity:F:pad (Megatron-LM's "
    "--moe-expert-capacity-factor F, with --moe-pad-expert-input-to-capacity: a hard bound) "
    "or rows:N (an exact per-rank row count, a dispatcher's fixed capacity); priced by "
    "--policy tight, listed as ignored by the reference policies",
    "--step": "which step of the process: steady (default: any step after the first, the "
    "optimizer's moments and the kernel workspaces allocated) or first (a freshly started "
    "process: no moments yet, its kernel set-up paid in the activations; the measured "
    "harness's step); admit --device and capacity decide on the larger of the two",
    "--head": "what the forward ends with: logits (default: megatron's vocabulary-parallel "
    "output layer and cross entropy, a trainer's step), hidden (the hidden states returned, "
    "the measured harness), fused (megatron's fused vocabulary-parallel cross entropy: the same fp32 upcast and "
    "saved softmax as logits, so it prices as logits does), chunked:N "
    "(log-probs N tokens at a time, each chunk recomputed in backward), linear-ce (a fused "
    "linear cross entropy that never materialises the logits)",
    "--lora-rank": "LoRA adapter rank (default 1, the measured harness)",
    "--lora-dropout": "dropout on the adapters' input, in [0, 1) (default 0)",
    "--lora-targets": "projections with adapters: all (default), attention, mlp, or names "
    "joined by commas: qkv, proj, fc1, fc2, gdn_in, gdn_out, experts, mamba_in, mamba_out",
    "--cp-comm": "attention's CP communication: all_gather (K/V gathered, the measured "
    "runtime; ART's default), p2p (ring; Megatron-LM's default), a2a (Ulysses all-to-all "
    "over heads), a2a+p2p (Megatron-LM's hierarchical CP, priced as its p2p ring)",
    "--profiles": "JSON store of learned-profile floors (largest bytes per token observed "
    "for the step, recorded with `cpmem profile record`; priced by --policy reference and "
    "global, listed as ignored by tight)",
    "--logical-tokens": "explicit plan: sum of the sequence lengths",
    "--packed-tokens": "explicit plan: tokens after prefix sharing and TP padding",
    "--rank-tokens": "explicit plan: model tokens per CP rank, e.g. 4096,2868 (one per rank)",
    "--busiest-tokens": "explicit plan: model tokens on the busiest CP rank only",
    "--segments": "explicit plan: gradient-enabled prefix-tree segments (prefix + completions)",
    "--json": "print one JSON object instead of the table",
    "--peak-bytes": "profile record: the measured activation peak of the step's busiest rank "
    "(its peak allocated bytes in the forward less those allocated before it)",
    "--budget-gib": "the device's usable bytes per rank, in GiB: static memory and activations "
    "together, as --device weighs them (beside --device the smaller decides)",
    "--free-bytes": "a running process's free device bytes per rank (with the two flags below: "
    "what it has left once its static memory is allocated, free + reusable reserved - a 3%% "
    "reserve of the device total, for the activations alone)",
    "--reusable-reserved-bytes": "bytes the caching allocator holds and can reuse",
    "--device-total-bytes": "the device's total memory in bytes, as the runtime reports it "
    "(a device without a preset; with --free-bytes: the runtime's own budget rule)",
    "--device": "a device preset (a100-80gb, h100, h200, b200, mi300x): admit against what it "
    "leaves once the static memory is allocated; estimate reports that budget",
    "--pp": "pipeline stages (megatron's 1F1B; the busiest stage's figure, every stage's in "
    "stage_bytes)",
    "--vpp": "virtual stages per pipeline stage (megatron's interleaved 1F1B)",
    "--microbatches": "micro-batches per step, each the request given (default 1)",
    "--stage-layers": "layers per stage (pp counts) or per virtual stage (pp x vpp), "
    "comma-separated (default: even)",
    "--first-stage-layers": "layers on the first stage (megatron's "
    "num_layers_in_first_pipeline_stage; the other stages share the rest evenly)",
    "--last-stage-layers": "layers on the last stage (num_layers_in_last_pipeline_stage)",
    "--microbatch-lengths": "every micro-batch's sequence lengths: "
    "'4096,4096;2048;8192' (instead of --lengths)",
    "--microbatch-file": "a JSON list of the micro-batches' requests: [[4096, 4096], "
    '{"lengths": [2048, 2048], "shared_prefix": 512}]',
    "--dp": "data-parallel ranks (a distributed optimizer shards its states over them; "
    "default 1, or --world-size / (TP x CP x PP))",
    "--optimizer": "how the adapters are trained: adam (default), sgd, none (static memory)",
    "--distributed-optimizer": "megatron's distributed optimizer: master copy and moments / dp",
    "--figure": "admit on the forward peak or the whole step (forward_backward; policies "
    "that price it, e.g. tight)",
    "--layouts": "capacity: the TP x CP layouts to search, comma-separated TPxCP, e.g. "
    "1x1,2x1,1x2 (default: every TP x CP <= 8 of sizes 1, 2, 4, 8 the model's heads allow)",
    "--pack": "capacity: how many equal sequences the pack holds (default 2)",
    "capacity --figure": "capacity: fit the forward peak (default) or the whole step "
    "(forward_backward; policies that price it, e.g. tight)",
    "capacity --device": "a device preset (a100-80gb, h100, h200, b200, mi300x), or give "
    "--device-total-bytes; one is required: capacity fits what it leaves once each "
    "layout's static memory is allocated",
    "--plot": "capacity: also write a PNG of memory per rank against sequence length, one "
    "curve per layout, with the device's line (needs the report extra: matplotlib)",
}


def policy_help() -> str:
    """The policy list comes from the registry, so a new policy shows up here."""
    return (
        f"pricing policy: {', '.join(policy_names())} (default: the runtime's, reference for "
        "--runtime art and tight for megatron-lm; docs/pricing.md)"
    )
