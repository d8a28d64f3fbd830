"""Megatron-LM's own arguments, read as a Megatron user writes them.

A run is described by the flags of ``pretrain_gpt.py``: a functional test's
``model_config.yaml`` (its ``MODEL_ARGS`` mapping, and the ``ENV_VARS`` it launches
with) or a text file of flags (``--num-layers 12 --bf16 ...``, shell continuation lines
and ``#`` comments allowed). ``read_megatron_args`` returns ``MegatronArgs``: every
argument cpmem prices, with Megatron-LM's default where the run does not give it, the
arguments it read and changed nothing cpmem prices (``ignored``), and the environment.

Every flag is in exactly one of three tables:

- ``PRICED``: the flag changes what the run holds and cpmem prices it;
- ``IGNORED``: the flag changes nothing cpmem prices (logging, checkpoints, data paths,
  learning-rate schedule, ...), listed in the estimate's ``ignored_args``;
- anything else is refused with one line naming the flag: either it changes memory in a
  way cpmem does not model (``REFUSED`` says how), or cpmem does not know it.

Some priced flags leave every term as the default's, by the source: the CP comm type
(p2p, a2a, a2a+p2p keep the same elements for backward; the exchanged chunks are
transient), the overlap flags (the reduce-scatter and all-gather run in place in the
buffers), the fused cross entropy (the same fp32 copy kept), squared ReLU (the same
widths as GeLU).

Defaults are Megatron-LM's at the recordings' snapshot (``golden/megatron/README.md``;
``megatron/training/arguments.py`` and the config dataclasses its
``ArgumentGroupFactory`` turns into flags, ``megatron/core/transformer/
transformer_config.py``); each default below names its source line.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from cpmem.errors import InputError

ArgValue = bool | int | float | str


@dataclass(frozen=True)
class MegatronArgs:
    """The arguments of one Megatron-LM GPT run that cpmem prices (argparse names)."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    seq_length: int
    micro_batch_size: int
    global_batch_size: int | None = None  # None: micro_batch_size x DP (arguments.py)
    max_position_embeddings: int | None = None  # required (arguments.py, required_args)
    ffn_hidden_size: int | None = None  # None: 4h, or 8h/3 rounded down to 64 with swiglu
    kv_channels: int | None = None  # None: hidden / heads
    group_query_attention: bool = False
    num_query_groups: int | None = None  # None: the attention heads (MHA)
    swiglu: bool = False
    squared_relu: bool = False
    normalization: str = "LayerNorm"  # transformer_config.py:256
    add_bias_linear: bool = True  # transformer_config.py:212 (--disable-bias-linear)
    qk_layernorm: bool = False
    position_embedding_type: str = "learned_absolute"  # arguments.py:2397
    vocab_size: int | None = None
    tokenizer_type: str | None = None
    make_vocab_size_divisible_by: int = 128  # arguments.py:2441
    untie_embeddings_and_output_weights: bool = False  # arguments.py:2460
    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    context_parallel_size: int = 1
    cp_comm_type: str = "p2p"  # model_parallel_config.py
    sequence_parallel: bool = False
    num_layers_per_virtual_pipeline_stage: int | None = None
    microbatch_group_size_per_virtual_pipeline_stage: int | None = None  # None: PP
    use_distributed_optimizer: bool = False
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False
    overlap_param_gather_with_optimizer_step: bool = False
    bf16: bool = False
    fp16: bool = False
    grad_reduce_in_bf16: bool = False
    hidden_dropout: float = 0.1  # transformer_config.py:188
    attention_dropout: float = 0.1  # transformer_config.py:191
    attention_backend: str = "auto"  # transformer_config.py:151
    transformer_impl: str = "transformer_engine"  # transformer_config.py (via arguments.py)
    recompute_granularity: str | None = None
    recompute_method: str | None = None
    recompute_num_layers: int | None = None
    cross_entropy_loss_fusion: bool = False  # model_parallel_config.py:320-325
    gradient_accumulation_fusion: bool = True  # arguments.py:2944 (--no-gradient-...)
    create_attention_mask_in_dataloader: bool = True  # arguments.py:3332
    apply_query_key_layer_scaling: bool = False
    attention_softmax_in_fp32: bool = False  # arguments.py:3067
    masked_softmax_fusion: bool = True  # arguments.py:2887 (--no-masked-softmax-fusion)
    deterministic_mode: bool = False
    # mixture of experts (transformer_config.py and model_parallel_config.py at the
    # snapshot; the factory turns each field into its flag)
    num_experts: int | None = None  # arguments.py:3518 (None: a dense GPT)
    moe_layer_freq: int = 1  # arguments.py:3520 (every layer an MoE layer)
    moe_ffn_hidden_size: int | None = None  # None: --ffn-hidden-size (arguments.py:1650-1651)
    moe_router_topk: int = 2  # transformer_config.py:760
    moe_router_load_balancing_type: str = "aux_loss"  # arguments.py:3532-3534
    moe_aux_loss_coeff: float = 0.0  # arguments.py:3536
    moe_router_dtype: str | None = None  # transformer_config.py:811 (None: the params' dtype)
    moe_grouped_gemm: bool = False  # transformer_config.py:850
    moe_token_dispatcher_type: str = "allgather"  # transformer_config.py:891
    moe_shared_expert_intermediate_size: int | None = None  # transformer_config.py:701
    moe_permute_fusion: bool = False  # transformer_config.py:941
    overlap_moe_expert_parallel_comm: bool = False  # model_parallel_config.py:343
    expert_model_parallel_size: int = 1  # model_parallel_config.py:127
    expert_tensor_parallel_size: int | None = None  # None: TP (arguments.py:587-588)
    env: Mapping[str, str] = field(default_factory=dict, compare=False)
    ignored: tuple[str, ...] = field(default=(), compare=False)
    given: tuple[str, ...] = field(default=(), compare=False)


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


# flag -> (field, kind); kind "bool" is a store_true flag, "not" a store_false flag
# (``--no-X`` / ``--disable-X`` turning the field off), else the value's type.
PRICED: dict[str, tuple[str, str]] = {
    **{
        _flag(n): (n, k)
        for n, k in (
            ("num_layers", "int"),
            ("hidden_size", "int"),
            ("num_attention_heads", "int"),
            ("seq_length", "int"),
            ("micro_batch_size", "int"),
            ("global_batch_size", "int"),
            ("max_position_embeddings", "int"),
            ("ffn_hidden_size", "int"),
            ("kv_channels", "int"),
            ("group_query_attention", "bool"),
            ("num_query_groups", "int"),
            ("swiglu", "bool"),
            ("squared_relu", "bool"),
            ("normalization", "str"),
            ("qk_layernorm", "bool"),
            ("position_embedding_type", "str"),
            ("vocab_size", "int"),
            ("tokenizer_type", "str"),
            ("make_vocab_size_divisible_by", "int"),
            ("untie_embeddings_and_output_weights", "bool"),
            ("tensor_model_parallel_size", "int"),
            ("pipeline_model_parallel_size", "int"),
            ("context_parallel_size", "int"),
            ("cp_comm_type", "str"),
            ("sequence_parallel", "bool"),
            ("num_layers_per_virtual_pipeline_stage", "int"),
            ("microbatch_group_size_per_virtual_pipeline_stage", "int"),
            ("use_distributed_optimizer", "bool"),
            ("overlap_grad_reduce", "bool"),
            ("overlap_param_gather", "bool"),
            ("overlap_param_gather_with_optimizer_step", "bool"),
            ("bf16", "bool"),
            ("fp16", "bool"),
            ("grad_reduce_in_bf16", "bool"),
            ("hidden_dropout", "float"),
            ("attention_dropout", "float"),
            ("attention_backend", "str"),
            ("transformer_impl", "str"),
            ("recompute_granularity", "str"),
            ("recompute_method", "str"),
            ("recompute_num_layers", "int"),
            ("cross_entropy_loss_fusion", "bool"),
            ("apply_query_key_layer_scaling", "bool"),
            ("attention_softmax_in_fp32", "bool"),
            ("deterministic_mode", "bool"),
            ("num_experts", "int"),
            ("moe_layer_freq", "int"),
            ("moe_ffn_hidden_size", "int"),
            ("moe_router_topk", "int"),
            ("moe_router_load_balancing_type", "str"),
            ("moe_aux_loss_coeff", "float"),
            ("moe_router_dtype", "str"),
            ("moe_grouped_gemm", "bool"),
            ("moe_token_dispatcher_type", "str"),
            ("moe_shared_expert_intermediate_size", "int"),
            ("moe_permute_fusion", "bool"),
            ("overlap_moe_expert_parallel_comm", "bool"),
            ("expert_model_parallel_size", "int"),
            ("expert_tensor_parallel_size", "int"),
        )
    },
    "--disable-bias-linear": ("add_bias_linear", "not"),
    "--no-gradient-accumulation-fusion": ("gradient_accumulation_fusion", "not"),
    "--no-create-attention-mask-in-dataloader": ("create_attention_mask_in_dataloader", "not"),
    "--no-masked-softmax-fusion": ("masked_softmax_fusion", "not"),
    "--recompute-activations": ("recompute_granularity", "selective"),
}

IGNORED: frozenset[str] = frozenset(
    {
        # logging and timing: host-side, or 1-element tensors; the zero count's bool mask
        # of one gradient shard at the optimizer step stays below the backward's peak,
        # the parameters' norm reads the fp32 master copies in place (clip_grads.py,
        # common_utils.py)
        "--log-num-zeros-in-grad",
        "--log-params-norm",
        "--log-interval",
        "--log-timers-to-tensorboard",
        "--log-validation-ppl-to-tensorboard",
        "--log-memory-to-tensorboard",
        "--tensorboard-dir",
        "--timing-log-level",
        # checkpoints: written and read outside the logged steps' tensors
        "--save",
        "--load",
        "--save-interval",
        "--ckpt-format",
        "--dist-ckpt-strictness",
        "--async-save",
        "--async-strategy",
        "--async-ckpt-use-cpu-shm",
        "--use-persistent-ckpt-worker",
        "--no-ckpt-fully-parallel-save",
        "--ckpt-fully-parallel-save",
        "--ckpt-fully-parallel-load",
        "--ckpt-assume-constant-structure",
        "--auto-detect-ckpt-format",
        "--dist-ckpt-optim-fully-reshardable",
        "--use-checkpoint-opt_param-scheduler",
        "--verify-integrity",
        # data: paths, splits, file access, document masking of FIM (same shapes)
        "--data-path",
        "--data-cache-path",
        "--split",
        "--vocab-file",
        "--merge-file",
        "--no-mmap-bin-files",
        "--fim-data",
        "--fim-rate",
        "--fim-spm-rate",
        # schedule of the run and its evaluation (no evaluation runs before the last
        # logged step in these runs)
        "--train-iters",
        "--exit-interval",
        "--eval-interval",
        "--eval-iters",
        "--lr",
        "--min-lr",
        "--lr-decay-iters",
        "--lr-decay-style",
        "--lr-warmup-fraction",
        "--weight-decay",
        "--clip-grad",
        "--decoupled-lr",
        # the loss's normalisation and the collective's averaging (same tensors)
        "--calculate-per-token-loss",
        "--ddp-average-in-collective",
        # process groups, launch and rank order (the logging rank is still the last
        # stage's last TP, CP and DP rank)
        "--distributed-backend",
        "--disable-gloo-process-groups",
        "--use-tp-pp-dp-mapping",
        "--hierarchical-context-parallel-sizes",
        "--use-mcore-models",
        "--check-weight-hash-across-dp-replicas-interval",
        # rotary variants: same tensors (the frequencies are O(s))
        "--rotary-interleaved",
        "--rotary-percent",
        "--no-rope-fusion",
        # a LayerNorm kernel choice of the local implementation (same saved tensors)
        "--no-persist-layer-norm",
        # P2P warm-up/flush overlap (the same buffers, sent earlier)
        "--overlap-p2p-communication-warmup-flush",
        # the unfused bias add and GeLU keep the same fc1-wide tensor for backward as the
        # fused kernel (mlp.py: the activation's input), and no bias at all under
        # --disable-bias-linear
        "--no-bias-gelu-fusion",
        # the router's softmax before or after the top-k: the same [tokens, experts]
        # scores and probabilities are kept (router.py, moe_utils.topk_routing_with_
        # score_function)
        "--moe-router-pre-softmax",
        # the fused cross entropy's implementation: read only under
        # --cross-entropy-loss-fusion, where Megatron-LM asserts native (arguments.py:
        # "Transformer Engine cross entropy loss fusion is disabled")
        "--cross-entropy-fusion-impl",
        # host-side process settings and Adam's betas and the init's scale
        "--distributed-timeout-minutes",
        "--exit-duration-in-mins",
        "--log-throughput",
        "--logging-level",
        "--manual-gc",
        "--manual-gc-interval",
        "--no-check-for-nan-in-loss-and-grad",
        "--adam-beta1",
        "--adam-beta2",
        "--init-method-std",
        "--norm-epsilon",
        "--rotary-base",
        # real-time checks: the q/k-norm parameters of one module stacked and gathered
        # across ranks (attention.py, run_realtime_tests): O(head_dim) elements
        "--test-mode",
    }
)

REFUSED: dict[str, str] = {
    "--use-transformer-engine-op-fuser": "Transformer Engine's fused operations in the MLP "
    "(a saved set of its own, not read)",
    "--moe-expert-capacity-factor": "dropped and padded expert tokens",
    "--moe-pad-expert-input-to-capacity": "expert inputs padded to a capacity",
    "--moe-shared-expert-overlap": "the shared experts run beside the dispatch",
    "--moe-router-enable-expert-bias": "the router's expert bias and its token counts",
    "--moe-router-score-function": "the router's score function",
    "--moe-router-num-groups": "group-limited routing",
    "--moe-router-group-topk": "group-limited routing",
    "--moe-router-topk-scaling-factor": "the router's scaling of the top-k probabilities",
    "--moe-router-bias-update-rate": "the router's expert bias",
    "--moe-layer-recompute": "the MoE layer recomputed in backward",
    "--moe-use-upcycling": "a dense checkpoint upcycled into experts",
    "--moe-z-loss-coeff": "the router's z-loss",
    "--moe-input-jitter-eps": "the router's input jitter",
    "--moe-enable-deepep": "the flex dispatcher",
    "--moe-shared-expert-gate": "the shared experts' gate",
    "--moe-latent-size": "latent MoE projections",
    "--moe-router-fusion": "the fused router kernels' saved set",
    "--export-kd-teacher-load": "a distillation teacher model held beside the student",
    "--export-kd-cfg": "a distillation teacher model held beside the student",
    "--export-te-mcore-model": "ModelOpt's export of the model for distillation",
    "--num-distributed-optimizer-instances": "several distributed-optimizer instances",
    "--fp8-format": "FP8 weights and activations",
    "--fp8": "FP8 weights and activations",
    "--decoder-first-pipeline-num-layers": "an uneven first pipeline stage",
    "--decoder-last-pipeline-num-layers": "an uneven last pipeline stage",
    "--account-for-embedding-in-pipeline-split": "the embedding counted as a layer",
    "--account-for-loss-in-pipeline-split": "the loss counted as a layer",
    "--multi-latent-attention": "multi-latent attention",
    "--mtp-num-layers": "multi-token prediction layers",
    "--nccl-ub": "DDP buffers allocated from an NCCL memory pool",
    "--use-megatron-fsdp": "Megatron FSDP",
    "--cuda-graph-impl": "CUDA graphs",
    "--recompute-modules": "selective recompute of named modules",
    "--ddp-reduce-scatter-with-fp32-accumulation": "a scratch buffer per reduce-scatter",
    "--defer-embedding-wgrad-compute": "the output layer's inputs and gradients kept for "
    "every deferred micro-batch until the step's end",
    "--wgrad-deferral-limit": "the output layer's deferred weight gradients",
}

ENV_PRICED = (
    "CUBLAS_WORKSPACE_CONFIG",
    "PYTORCH_CUDA_ALLOC_CONF",
    "NVTE_FUSED_ATTN",
    "NVTE_FLASH_ATTN",
)


def _refuse(flag: str, value: object, why: str) -> InputError:
    return InputError("megatron_args", f"{flag} {value}".strip(), why)


def _convert(flag: str, kind: str, value: object) -> ArgValue | None:
    """A flag's value as the field's type; ``value`` None means the flag stood alone."""
    if kind in ("bool", "not", "selective"):
        if value is None or value is True:
            present = True
        elif value is False:
            present = False
        else:
            raise _refuse(flag, value, "is a switch: give it alone (or true/false in YAML)")
        if kind == "bool":
            return present
        if kind == "not":
            return not present
        return "selective" if present else None
    if value is None:
        raise _refuse(flag, "", "needs a value")
    text = str(value).strip()
    try:
        if kind == "int":
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            return int(float(text)) if isinstance(value, float) else int(text)
        if kind == "float":
            return float(text)
    except ValueError:
        raise _refuse(
            flag, value, f"must be {'an integer' if kind == 'int' else 'a number'}"
        ) from None
    return text


def _tokens_to_mapping(text: str) -> dict[str, object]:
    """``--flag value`` / ``--flag`` tokens of a flags file as a mapping (value None: a
    switch). Backslash line continuations and ``#`` comments are allowed."""
    tokens = shlex.split(text.replace("\\\n", " "), comments=True)
    out: dict[str, object] = {}
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if not tok.startswith("--"):
            if tok.endswith(".py") or tok in ("python", "python3", "torchrun"):
                i += 1  # the launcher and script before the flags
                continue
            raise InputError(
                "megatron_args", tok, "is not a --flag (a value with no flag before it)"
            )
        name, eq, inline = tok.partition("=")
        if eq:
            out[name] = inline
            i += 1
            continue
        nxt = tokens[i + 1] if i + 1 < len(tokens) else None
        if nxt is not None and (not nxt.startswith("--")):
            vals = [nxt]
            j = i + 2
            while j < len(tokens) and not tokens[j].startswith("--"):
                vals.append(tokens[j])  # a multi-valued flag (e.g. --hierarchical-...)
                j += 1
            out[name] = " ".join(vals)
            i = j
        else:
            out[name] = None
            i += 1
    return out


def parse_megatron_args(
    model_args: Mapping[str, object], env: Mapping[str, object] | None = None
) -> MegatronArgs:
    """``MODEL_ARGS`` (flag -> value; value None or true for a switch) as ``MegatronArgs``."""
    values: dict[str, Any] = {}
    ignored: list[str] = []
    given: list[str] = []
    recompute_activations = False
    for raw_flag, value in model_args.items():
        flag = str(raw_flag).strip()
        if not flag.startswith("--"):
            raise InputError("megatron_args", flag, "is not a --flag")
        if flag in PRICED:
            name, kind = PRICED[flag]
            converted = _convert(flag, kind, value)
            if kind in ("bool", "not", "selective") and value is False:
                continue  # ``--flag: false`` in YAML: the flag is not passed
            if kind == "selective":
                recompute_activations = True  # applied last, whatever the flags' order
                given.append(flag)
                continue
            values[name] = converted
            given.append(flag)
        elif flag in IGNORED:
            ignored.append(flag)
        elif flag in REFUSED:
            raise _refuse(
                flag,
                "" if value in (None, True) else value,
                f"changes memory cpmem does not price: {REFUSED[flag]}",
            )
        else:
            raise _refuse(
                flag,
                "" if value in (None, True) else value,
                "is not an argument cpmem knows; it may change memory, so the run is not priced",
            )
    if recompute_activations:
        # ``--recompute-activations`` makes the granularity selective whatever else is
        # given (arguments.py:607-608)
        values["recompute_granularity"] = "selective"
    for required in (
        "num_layers",
        "hidden_size",
        "num_attention_heads",
        "seq_length",
        "micro_batch_size",
        "max_position_embeddings",
    ):
        if required not in values:
            raise InputError(
                "megatron_args", _flag(required), "is required (Megatron-LM has no default for it)"
            )
    env_map = {str(k): str(v) for k, v in (env or {}).items()}
    return MegatronArgs(**values, env=env_map, ignored=tuple(sorted(ignored)), given=tuple(given))


def read_megatron_args(source: str | Path) -> MegatronArgs:
    """A functional test's ``model_config.yaml`` (``MODEL_ARGS`` and ``ENV_VARS``) or a
    text file of ``pretrain_gpt.py`` flags, as ``MegatronArgs``."""
    path = Path(source)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError("megatron_args", str(source), f"cannot be read: {exc.strerror}") from None
    if path.suffix in (".yaml", ".yml") or "MODEL_ARGS:" in text:
        import yaml

        try:
            doc = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        except yaml.YAMLError as exc:
            raise InputError("megatron_args", str(source), f"is not valid YAML: {exc}") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("MODEL_ARGS"), dict):
            raise InputError("megatron_args", str(source), "has no MODEL_ARGS mapping")
        env = doc.get("ENV_VARS") or {}
        if not isinstance(env, dict):
            raise InputError("megatron_args", str(source), "ENV_VARS is not a mapping")
        return parse_megatron_args(doc["MODEL_ARGS"], env)
    return parse_megatron_args(_tokens_to_mapping(text))


FIELD_NAMES = frozenset(f.name for f in fields(MegatronArgs))
