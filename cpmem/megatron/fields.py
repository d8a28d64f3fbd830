"""The arguments of a Megatron-LM GPT run that cpmem prices: ``MegatronArgs`` (one
field per argument, named as argparse's ``dest``, with Megatron-LM's default at the
snapshot and its source line) and ``PRICED`` (each priced flag string and the field it
sets). The pipeline's split of the layers (``layout.py``) and the vocabulary
(``vocab.py``) are derived from these fields; the pricing reads them there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields

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
    step_batch_size_schedule: str | None = None  # batch_schedule.py
    max_position_embeddings: int | None = None  # required (arguments.py, required_args)
    ffn_hidden_size: int | None = None  # None: 4h, or 8h/3 rounded down to 64 with swiglu
    kv_channels: int | None = None  # None: hidden / heads
    group_query_attention: bool = False
    # None: the attention heads (MHA); 1 under --group-query-attention without
    # --num-query-groups (transformer_config.py:175, read by args.py)
    num_query_groups: int | None = None
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
    defer_embedding_wgrad_compute: bool = False  # model_parallel_config.py:410
    wgrad_deferral_limit: int = 0  # model_parallel_config.py:415 (0: every micro-batch)
    use_distributed_optimizer: bool = False
    optimizer: str = "adam"  # arguments.py:2913
    # arguments.py:3160 (--no-use-layer-wise-param-layout: Muon's legacy layer-wise path)
    use_layer_wise_param_layout: bool = True
    num_distributed_optimizer_instances: int = 1  # arguments.py:3216
    overlap_grad_reduce: bool = False
    # Megatron FSDP (arguments.py:3093, 3158, 3222, 3687-3695 at the snapshot; read by
    # fsdp_rules.py and describe.py)
    use_megatron_fsdp: bool = False
    megatron_fsdp_version: int = 1
    data_parallel_sharding_strategy: str = "optim_grads_params"
    megatron_fsdp_main_params_dtype: str = "fp32"
    megatron_fsdp_main_grads_dtype: str = "auto"
    megatron_fsdp_grad_comm_dtype: str = "auto"
    fsdp_double_buffer: bool = False  # arguments.py:3202 (--use-nccl-ub sets it, :1172-1176)
    # Torch FSDP2 (arguments.py:3093 and 3218 at the snapshot; fsdp_rules.py and describe.py)
    use_torch_fsdp2: bool = False
    torch_fsdp2_reshard_after_forward: bool = True  # --torch-fsdp2-no-reshard-after-forward
    nccl_ub: bool = False  # arguments.py:3171
    overlap_param_gather: bool = False
    overlap_param_gather_with_optimizer_step: bool = False
    bf16: bool = False
    fp16: bool = False
    grad_reduce_in_bf16: bool = False
    fp8: str | None = None  # --fp8-format, transformer_config.py:587 (None: no FP8)
    fp8_recipe: str = "delayed"  # transformer_config.py:594
    fp8_param_gather: bool = False
    reuse_grad_buf_for_mxfp8_param_ag: bool = False  # distributed_data_parallel_config.py:86
    fp8_amax_history_len: int = 1  # transformer_config.py:621
    first_last_layers_bf16: bool = False  # transformer_config.py:618 (at 4828d651)
    num_layers_at_start_in_bf16: int = 1  # transformer_config.py:621 (at 4828d651)
    num_layers_at_end_in_bf16: int = 1  # transformer_config.py:625 (at 4828d651)
    tp_comm_overlap: bool = False  # model_parallel_config.py:265
    hidden_dropout: float = 0.1  # transformer_config.py:188
    attention_dropout: float = 0.1  # transformer_config.py:191
    attention_backend: str = "auto"  # transformer_config.py:151
    transformer_impl: str = "transformer_engine"  # transformer_config.py (via arguments.py)
    recompute_granularity: str | None = None
    recompute_method: str | None = None
    recompute_num_layers: int | None = None
    # transformer_config.py:560 (None: core_attn), as written; read by recompute_modules.py
    recompute_modules: str | None = None
    moe_layer_recompute: bool = False  # transformer_config.py:938 (deprecated: adds moe)
    # fine-grained activation offloading (transformer_config.py:1162-1223; offload_rules.py)
    fine_grained_activation_offloading: bool = False
    offload_modules: str | None = None  # as written, read by offload_rules.read_modules
    min_offloaded_tensor_size: int = 1024 * 1024  # transformer_config.py:1180
    delta_offload_bytes_across_pp_ranks: int = 0  # transformer_config.py:1189
    activation_offload_fraction: float = 1.0  # transformer_config.py:1195
    delay_offload_until_cuda_graph: bool = False  # transformer_config.py:1183
    # whole-layer offloading (model_parallel_config.py:380-407; arguments.py:1730-1731)
    cpu_offloading_num_layers: int = 0
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
    # arguments.py:3520, moe_freq_type (arguments.py:327-350): an integer N (every Nth
    # layer an MoE layer, from the first), or a Python list expression of 0/1 per layer,
    # read by ``layer_freq.parse_layer_freq``
    moe_layer_freq: int | tuple[int, ...] = 1
    # transformer_config.py:247-258: the sliding window (left, right) given to every
    # windowed layer's Transformer Engine attention, and which layers are windowed
    # (moe_freq_type; ``cpmem.megatron.windows``); None: no window
    window_size: tuple[int, ...] | None = None
    window_attn_skip_freq: int | tuple[int, ...] | None = None
    moe_ffn_hidden_size: int | None = None  # None: --ffn-hidden-size (arguments.py:1650-1651)
    moe_router_topk: int = 2  # transformer_config.py:760
    moe_router_load_balancing_type: str = "aux_loss"  # arguments.py:3532-3534
    moe_aux_loss_coeff: float = 0.0  # arguments.py:3536
    moe_router_dtype: str | None = None  # transformer_config.py:811 (None: the params' dtype)
    moe_grouped_gemm: bool = False  # transformer_config.py:850
    moe_token_dispatcher_type: str = "allgather"  # transformer_config.py:891
    moe_flex_dispatcher_backend: str = "deepep"  # transformer_config.py:898
    moe_shared_expert_intermediate_size: int | None = None  # transformer_config.py:701
    moe_permute_fusion: bool = False  # transformer_config.py:941
    moe_router_fusion: bool = False  # transformer_config.py:944
    # Transformer Engine's op fuser: the grouped experts as te.ops (transformer_config.py:501;
    # read by op_fuser_rules.py and describe.py)
    use_transformer_engine_op_fuser: bool = False
    # CUDA graphs (read by cuda_graph_rules.py): transformer_config.py:1049, 1071, 1075;
    # the modules as written (arguments.py:2050) and the deprecated scope (arguments.py:2047)
    cuda_graph_impl: str = "none"
    enable_cuda_graph: bool = False
    external_cuda_graph: bool = False
    cuda_graph_modules: str | None = None
    cuda_graph_scope_deprecated: str | None = None
    moe_expert_capacity_factor: float | None = None  # transformer_config.py:917 (None: none)
    moe_pad_expert_input_to_capacity: bool = False  # transformer_config.py:921
    moe_router_force_load_balancing: bool = False  # transformer_config.py:833
    overlap_moe_expert_parallel_comm: bool = False  # model_parallel_config.py:343
    delay_wgrad_compute: bool = False  # model_parallel_config.py:348
    expert_model_parallel_size: int = 1  # model_parallel_config.py:127
    moe_router_score_function: str = "softmax"  # transformer_config.py:808
    moe_router_enable_expert_bias: bool = False  # transformer_config.py:816
    moe_router_num_groups: int | None = None  # transformer_config.py:780
    moe_router_group_topk: int | None = None  # transformer_config.py:796
    use_fused_weighted_squared_relu: bool = False  # transformer_config.py:516
    # the router's z-loss (transformer_config.py:880; None: off; any value turns it on,
    # router.py's apply_z_loss tests for None)
    moe_z_loss_coeff: float | None = None
    # quick GeGLU (arguments.py:2452: a gated MLP of quick_gelu, argument_utils.py:322-325)
    # with the offset added to its linear half and the clamp of both halves
    # (transformer_config.py:231, 235)
    quick_geglu: bool = False
    glu_linear_offset: float = 0.0
    activation_func_clamp_value: float | None = None
    # Transformer Engine's softmax: vanilla, off-by-one or learnable (a sink logit per
    # head; transformer_config.py:170)
    softmax_type: str = "vanilla"
    # a hybrid (Mamba-2) stack: the pattern (arguments.py:3652; the deprecated
    # --hybrid-override-pattern, arguments.py:3660, is copied into it, arguments.py:
    # 743-755), read by ``hybrid_pattern.parse_hybrid_pattern``; the layer spec module
    # (--spec, arguments.py:3645, nargs='*': its words joined by a space)
    hybrid_layer_pattern: str | None = None
    hybrid_override_pattern: str | None = None
    # the deprecated MTP pattern, turned into the pattern's '/' depths where
    # --mtp-num-layers is given (arguments.py:757-785)
    mtp_hybrid_override_pattern: str | None = None
    spec: str | None = None
    # Mamba-2 (transformer_config.py:1259-1268): None heads is hidden x 2 // head_dim
    # (MambaMixer's expand=2, ssm/mamba_mixer.py:181, 218, 245-251)
    mamba_state_dim: int = 128
    mamba_head_dim: int = 64
    mamba_num_groups: int = 8
    mamba_num_heads: int | None = None
    # multi-latent attention (transformer_config.py:288; the ranks' and dims' argparse
    # defaults, arguments.py:3548-3557, override MLATransformerConfig's own: None is a
    # plain query projection)
    multi_latent_attention: bool = False
    q_lora_rank: int | None = None
    kv_lora_rank: int = 32
    qk_head_dim: int = 128
    qk_pos_emb_head_dim: int = 64
    v_head_dim: int = 128
    # Gated DeltaNet layers of a hybrid pattern (transformer_config.py:370-382)
    linear_conv_kernel_dim: int = 4
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_num_key_heads: int = 16
    linear_num_value_heads: int = 32
    # multi-token prediction (transformer_config.py:68, 82): depths, one set of weights
    mtp_num_layers: int | None = None
    mtp_use_repeated_layer: bool = False
    expert_tensor_parallel_size: int | None = None  # None: TP (arguments.py:587-588)
    # the pipeline's layer split (layout.py: virtual_pipeline_size, stage_layer_counts)
    num_virtual_stages_per_pipeline_rank: int | None = None  # arguments.py:3116 (None: 1)
    decoder_first_pipeline_num_layers: int | None = None  # arguments.py:3095 (None: even)
    decoder_last_pipeline_num_layers: int | None = None  # arguments.py:3099 (None: even)
    account_for_embedding_in_pipeline_split: bool = False  # transformer_config.py:137
    account_for_loss_in_pipeline_split: bool = False  # transformer_config.py:141
    # arguments.py:3103, as written; read by pipeline_layout.py
    pipeline_model_parallel_layout: str | None = None
    # the vocabulary (vocab.py: resolved_vocab_size)
    pad_vocab_size: bool = True  # training_config.py:686 (--no-pad-vocab-size)
    env: Mapping[str, str] = field(default_factory=dict, compare=False)
    ignored: tuple[str, ...] = field(default=(), compare=False)
    given: tuple[str, ...] = field(default=(), compare=False)
    flag_values: Mapping[str, ArgValue] = field(default_factory=dict, compare=False)
    """Every flag read, priced or ignored, with its value as the snapshot's type reads it
    (a switch: True); the combination rules read the ignored ones from here."""
    left_to_caller: Mapping[str, tuple[str, ...]] = field(default_factory=dict, compare=False)
    """Flags read as ignored whose value a launch script leaves to its caller (flag ->
    what the value is built from): a reader that needs one (the tokenizer's files,
    ``vocab.py``) names them."""
    world_size: int | None = field(default=None, compare=False)
    """The world the launch gives (``--nproc_per_node`` x ``--nnodes``), or the one the
    caller gave beside the arguments; None where neither says."""


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


# flag -> (field, kind); kind "bool" is a store_true flag, "not" a store_false flag
# (``--no-X`` / ``--disable-X`` turning the field off), "selective" --recompute-
# activations, "freq" --moe-layer-freq and --window-attn-skip-freq (an integer or a per-layer list
# expression), "window" --window-size (Megatron-LM's tuple_type), "raw"
# a value kept as written (a hybrid pattern), else the value's type.
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
            ("step_batch_size_schedule", "str"),
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
            ("defer_embedding_wgrad_compute", "bool"),
            ("wgrad_deferral_limit", "int"),
            ("use_distributed_optimizer", "bool"),
            ("optimizer", "str"),
            ("num_distributed_optimizer_instances", "int"),
            ("overlap_grad_reduce", "bool"),
            ("use_megatron_fsdp", "bool"),
            ("megatron_fsdp_version", "int"),
            ("data_parallel_sharding_strategy", "str"),
            ("megatron_fsdp_main_params_dtype", "str"),
            ("megatron_fsdp_main_grads_dtype", "str"),
            ("megatron_fsdp_grad_comm_dtype", "str"),
            ("fsdp_double_buffer", "bool"),
            ("use_torch_fsdp2", "bool"),
            ("overlap_param_gather", "bool"),
            ("overlap_param_gather_with_optimizer_step", "bool"),
            ("bf16", "bool"),
            ("fp16", "bool"),
            ("grad_reduce_in_bf16", "bool"),
            ("fp8_recipe", "str"),
            ("fp8_param_gather", "bool"),
            ("reuse_grad_buf_for_mxfp8_param_ag", "bool"),
            ("fp8_amax_history_len", "int"),
            ("first_last_layers_bf16", "bool"),
            ("num_layers_at_start_in_bf16", "int"),
            ("num_layers_at_end_in_bf16", "int"),
            ("tp_comm_overlap", "bool"),
            ("hidden_dropout", "float"),
            ("attention_dropout", "float"),
            ("attention_backend", "str"),
            ("transformer_impl", "str"),
            ("recompute_granularity", "str"),
            ("recompute_method", "str"),
            ("recompute_num_layers", "int"),
            ("recompute_modules", "raw"),
            ("moe_layer_recompute", "bool"),
            ("fine_grained_activation_offloading", "bool"),
            ("offload_modules", "raw"),
            ("min_offloaded_tensor_size", "int"),
            ("delta_offload_bytes_across_pp_ranks", "int"),
            ("activation_offload_fraction", "float"),
            ("delay_offload_until_cuda_graph", "bool"),
            ("cpu_offloading_num_layers", "int"),
            ("cross_entropy_loss_fusion", "bool"),
            ("apply_query_key_layer_scaling", "bool"),
            ("attention_softmax_in_fp32", "bool"),
            ("deterministic_mode", "bool"),
            ("num_experts", "int"),
            ("moe_layer_freq", "freq"),
            ("window_size", "window"),
            ("window_attn_skip_freq", "freq"),
            ("moe_ffn_hidden_size", "int"),
            ("moe_router_topk", "int"),
            ("moe_router_load_balancing_type", "str"),
            ("moe_aux_loss_coeff", "float"),
            ("moe_router_dtype", "str"),
            ("moe_grouped_gemm", "bool"),
            ("moe_token_dispatcher_type", "str"),
            ("moe_flex_dispatcher_backend", "str"),
            ("moe_shared_expert_intermediate_size", "int"),
            ("moe_permute_fusion", "bool"),
            ("moe_router_fusion", "bool"),
            ("use_transformer_engine_op_fuser", "bool"),
            ("cuda_graph_impl", "str"),
            ("enable_cuda_graph", "bool"),
            ("external_cuda_graph", "bool"),
            ("cuda_graph_modules", "raw"),
            ("moe_expert_capacity_factor", "float"),
            ("moe_pad_expert_input_to_capacity", "bool"),
            ("moe_router_force_load_balancing", "bool"),
            ("overlap_moe_expert_parallel_comm", "bool"),
            ("delay_wgrad_compute", "bool"),
            ("expert_model_parallel_size", "int"),
            ("moe_router_score_function", "str"),
            ("moe_router_enable_expert_bias", "bool"),
            ("moe_router_num_groups", "int"),
            ("moe_router_group_topk", "int"),
            ("use_fused_weighted_squared_relu", "bool"),
            ("moe_z_loss_coeff", "float"),
            ("quick_geglu", "bool"),
            ("glu_linear_offset", "float"),
            ("activation_func_clamp_value", "float"),
            ("softmax_type", "str"),
            ("hybrid_layer_pattern", "raw"),
            ("hybrid_override_pattern", "raw"),
            ("mtp_hybrid_override_pattern", "raw"),
            ("spec", "str"),
            ("mamba_state_dim", "int"),
            ("mamba_head_dim", "int"),
            ("mamba_num_groups", "int"),
            ("mamba_num_heads", "int"),
            ("multi_latent_attention", "bool"),
            ("q_lora_rank", "int"),
            ("kv_lora_rank", "int"),
            ("qk_head_dim", "int"),
            ("qk_pos_emb_head_dim", "int"),
            ("v_head_dim", "int"),
            ("linear_conv_kernel_dim", "int"),
            ("linear_key_head_dim", "int"),
            ("linear_value_head_dim", "int"),
            ("linear_num_key_heads", "int"),
            ("linear_num_value_heads", "int"),
            ("mtp_num_layers", "int"),
            ("mtp_use_repeated_layer", "bool"),
            ("expert_tensor_parallel_size", "int"),
            ("num_virtual_stages_per_pipeline_rank", "int"),
            ("decoder_first_pipeline_num_layers", "int"),
            ("decoder_last_pipeline_num_layers", "int"),
            ("account_for_embedding_in_pipeline_split", "bool"),
            ("account_for_loss_in_pipeline_split", "bool"),
            ("pipeline_model_parallel_layout", "raw"),
        )
    },
    # validate_args reads these as --num-layers and --seq-length where those are not given
    # (arguments.py:1305-1311, 1346-1351)
    "--encoder-num-layers": ("num_layers", "int"),
    "--encoder-seq-length": ("seq_length", "int"),
    "--fp8-format": ("fp8", "str"),
    "--use-nccl-ub": ("nccl_ub", "bool"),
    "--cuda-graph-scope": ("cuda_graph_scope_deprecated", "raw"),  # arguments.py:2047
    "--no-pad-vocab-size": ("pad_vocab_size", "not"),
    "--disable-pad-vocab-size": ("pad_vocab_size", "not"),
    "--disable-bias-linear": ("add_bias_linear", "not"),
    "--no-use-layer-wise-param-layout": ("use_layer_wise_param_layout", "not"),
    "--no-gradient-accumulation-fusion": ("gradient_accumulation_fusion", "not"),
    "--torch-fsdp2-no-reshard-after-forward": ("torch_fsdp2_reshard_after_forward", "not"),
    "--no-create-attention-mask-in-dataloader": ("create_attention_mask_in_dataloader", "not"),
    "--no-masked-softmax-fusion": ("masked_softmax_fusion", "not"),
    "--recompute-activations": ("recompute_granularity", "selective"),
}


FIELD_NAMES = frozenset(f.name for f in fields(MegatronArgs))
