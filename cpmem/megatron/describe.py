"""A Megatron-LM run read into the one step description: Megatron-LM's arguments as the
model, the layout, the recompute setting, the process and the request that
``describe_step`` takes from any door (``megatron_step_arguments``).

Nothing here prices: the run is priced by the policies, as a step from ``--model`` or
``--config`` is. What the arguments decide:

- the model (``ModelGeometry``): Megatron-LM's defaults where a flag is absent (FFN 4h, or
  ``int(8h/3 / 64) x 64`` with SwiGLU, ``arguments.py:1320-1329``; ``kv_channels`` h/heads;
  LayerNorm, linear biases, learned absolute positions, dropout 0.1, tied embeddings,
  ``cpmem.megatron.args``), the vocabulary padded to ``--make-vocab-size-divisible-by`` x
  TP (``arguments.py:2441``); the layer stack, its MTP depths and the shapes of its
  kinds (Mamba-2, latent attention, Gated DeltaNet) by ``cpmem.megatron.stack``;
- the layout: DP = world / (TP x PP x CP); sequence parallelism only at TP > 1
  (``arguments.py``); experts split over EP and ETP (``--expert-tensor-parallel-size``,
  TP by default, ``arguments.py:587-588``);
- the step: ``--micro-batch-size`` sequences of ``--seq-length`` tokens per micro-batch,
  ``global / (micro x DP)`` micro-batches, the CP ranks' load-balanced share (Megatron-LM's
  planner, ``StepSettings.step``), the output layer and cross entropy as its head, a
  steady step (Megatron-LM logs the peak from the second step on);
- the process (``Runtime.megatron_lm``) and full-parameter training with Adam, fp32 main
  gradients under ``--bf16`` (``--grad-reduce-in-bf16``: bf16), the distributed optimizer
  where asked.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cpmem.errors import InputError
from cpmem.megatron.args import MegatronArgs, read_megatron_args
from cpmem.megatron.layout import stage_layer_counts, virtual_pipeline_size
from cpmem.megatron.rules import check_megatron_args
from cpmem.megatron.stack import kind_shapes, latent, megatron_stack
from cpmem.megatron.vocab import resolved_vocab_size
from cpmem.model.geometry import ModelGeometry
from cpmem.step.backend_choice import BackendChoice, choose_backend
from cpmem.step.describe import StepArguments, describe_step
from cpmem.step.device import Device, resolve_device
from cpmem.step.recompute import FullMethod, Mode, Module, Recompute
from cpmem.step.runtime import ATTENTION_BACKENDS, AttentionBackend, Runtime
from cpmem.step.step import Step


@dataclass(frozen=True)
class MegatronRun:
    """A run read from Megatron-LM's arguments: its model and the keywords of its step."""

    args: MegatronArgs
    geometry: ModelGeometry
    arguments: StepArguments
    world_size: int

    @property
    def dp(self) -> int:
        a = self.args
        return self.world_size // (
            a.tensor_model_parallel_size * a.pipeline_model_parallel_size * a.context_parallel_size
        )


def megatron_ffn(args: MegatronArgs) -> int:
    """``--ffn-hidden-size``, else 4h, or int(8h/3 / 64) x 64 with SwiGLU."""
    if args.ffn_hidden_size is not None:
        return args.ffn_hidden_size
    h = args.hidden_size
    return int(4 * h * 2 / 3 / 64) * 64 if args.swiglu else 4 * h


def attention_shape(args: MegatronArgs) -> tuple[int, int, int, int]:
    """The attention's query heads, KV groups, query/key head dim and value head dim:
    latent attention's ``qk_head_dim + qk_pos_emb_head_dim`` and ``v_head_dim`` over every
    head, else ``--kv-channels`` (h / heads) over the query groups."""
    heads = args.num_attention_heads
    if latent(args):
        return heads, heads, args.qk_head_dim + args.qk_pos_emb_head_dim, args.v_head_dim
    groups = heads
    if args.group_query_attention and args.num_query_groups:
        groups = args.num_query_groups
    head_dim = args.kv_channels or args.hidden_size // heads
    return heads, groups, head_dim, head_dim


FUSED_SQUARED_RELU_NOTE = (
    "use_fused_weighted_squared_relu: the experts' squared ReLU fused with the routing "
    "weights (weighted_squared_relu, moe/experts.py:986-993) keeps its input and the "
    "probabilities; priced as the unfused experts' set, one F_e-wide tensor per routed row "
    "more (an upper bound)"
)


def megatron_geometry(args: MegatronArgs, name: str = "megatron-lm") -> ModelGeometry:
    """The model Megatron-LM builds from ``args``: a GPT (dense, MoE, or both by
    ``--moe-layer-freq``) or a hybrid stack, with any MTP depths (``cpmem.megatron.
    stack``)."""
    heads, groups, head_dim, _ = attention_shape(args)
    stack = megatron_stack(args)
    all_mlps = set(stack.mlps) | set(stack.mtp_mlps)
    moe = "moe" in all_mlps
    positions = {"rope": "rope", "learned_absolute": "learned", "none": "none"}
    position = positions[args.position_embedding_type]
    ffn = megatron_ffn(args)
    fused_relu = args.use_fused_weighted_squared_relu and args.squared_relu and moe
    return ModelGeometry(
        name=name,
        hidden=args.hidden_size,
        mixers=stack.mixers,
        mlps=stack.mlps,
        mtp_mixers=stack.mtp_mixers,
        mtp_mlps=stack.mtp_mlps,
        mtp_depths=stack.mtp_depths,
        mtp_shared=stack.mtp_shared,
        q_heads=heads,
        kv_groups=groups,
        head_dim=head_dim,
        vocab=resolved_vocab_size(args),
        ffn=ffn if "dense" in all_mlps else 0,
        num_experts=(args.num_experts or 0) if moe else 0,
        moe_top_k=args.moe_router_topk if moe else 0,
        expert_ffn=(args.moe_ffn_hidden_size or ffn) if moe else 0,
        shared_expert_ffn=(args.moe_shared_expert_intermediate_size or 0) if moe else 0,
        shared_expert_gate=False,
        router_scoring="sigmoid" if args.moe_router_score_function == "sigmoid" else "topk_softmax",
        **kind_shapes(args, stack),
        fused_swiglu=True,
        gated_mlp=args.swiglu,
        tied_embeddings=not args.untie_embeddings_and_output_weights,
        qk_norm=args.qk_layernorm,
        attention_bias=args.add_bias_linear,
        mlp_bias=args.add_bias_linear,
        router_bias=moe and args.add_bias_linear,
        norm="layernorm" if args.normalization == "LayerNorm" else "rmsnorm",
        positions=position,  # type: ignore[arg-type]
        learned_position_rows=(args.max_position_embeddings or args.seq_length)
        if position == "learned"
        else 0,
        hidden_dropout=args.hidden_dropout,
        attention_dropout=args.attention_dropout,
        vocab_multiple=args.make_vocab_size_divisible_by if args.pad_vocab_size else 1,
        family="megatron-gpt",
        max_position_embeddings=args.max_position_embeddings,
        unpriced_parts=(FUSED_SQUARED_RELU_NOTE,) if fused_relu else (),
    )


def megatron_recompute(args: MegatronArgs) -> Recompute:
    """``--recompute-granularity``: ``selective`` (the core attention, megatron's default
    ``--recompute-modules``), ``full`` with its method and layers, or none."""
    if args.recompute_granularity == "selective":
        return Recompute(Mode.SELECTIVE, (Module.CORE_ATTN,))
    if args.recompute_granularity == "full":
        method: FullMethod = "block" if args.recompute_method == "block" else "uniform"
        return Recompute(
            Mode.FULL, (), full_method=method, full_layers=args.recompute_num_layers or 1
        )
    return Recompute(Mode.NONE, ())


def megatron_runtime(args: MegatronArgs, choice: BackendChoice) -> Runtime:
    """The process Megatron-LM runs for ``args``, with the attention backend chosen."""
    return Runtime.megatron_lm(
        attention_backend=choice.backend,
        backend_asked=choice.asked,
        backend_spread=choice.spread,
        transformer_impl=args.transformer_impl,
        env=tuple(args.env.items()),
        deterministic=args.deterministic_mode,
        dataloader_attention_mask=args.create_attention_mask_in_dataloader,
        gradient_accumulation_fusion=args.gradient_accumulation_fusion,
        masked_softmax_fusion=args.masked_softmax_fusion,
        softmax_in_fp32=args.attention_softmax_in_fp32 or args.apply_query_key_layer_scaling,
        moe_dispatcher=args.moe_token_dispatcher_type,
        moe_grouped_gemm=args.moe_grouped_gemm,
        overlap_moe_comm=args.overlap_moe_expert_parallel_comm,
    )


def explicit_backend(args: MegatronArgs, asked: str | None) -> AttentionBackend | None:
    """The backend named by the caller or the arguments; None for ``auto``. The local
    transformer implementation has only its own attention."""
    if args.transformer_impl == "local":
        if asked not in (None, "local"):
            raise InputError(
                "attention_backend",
                asked,
                "the local transformer implementation has only its own attention",
            )
        return "local"
    chosen = asked or args.attention_backend
    if chosen == "auto":
        return None
    if chosen not in ATTENTION_BACKENDS:
        raise InputError(
            "attention_backend", chosen, f"must be one of {['auto', *ATTENTION_BACKENDS]}"
        )
    return chosen


def megatron_backend(
    args: MegatronArgs, device: Device, asked: str | None, container: str
) -> BackendChoice:
    """The backend priced: the one the caller or the arguments name, else (``auto``) the
    one Transformer Engine picks for the run under ``container``."""
    named = explicit_backend(args, asked)
    if named is not None:
        return BackendChoice(named, named, ())
    if device.compute_capability is None:
        raise InputError(
            "device",
            device.name,
            "has no compute capability on record; Transformer Engine's choice under "
            "--attention-backend auto needs one (use a preset or name the backend)",
        )
    heads, groups, head_dim, value_dim = attention_shape(args)
    dtype = "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32"
    return choose_backend(
        "auto",
        compute_capability=device.compute_capability,
        heads=heads,
        groups=groups,
        head_dim=head_dim,
        value_dim=value_dim,
        sequence=args.seq_length,
        tp=args.tensor_model_parallel_size,
        cp=args.context_parallel_size,
        cp_comm=args.cp_comm_type,
        dtype=dtype,
        attention_dropout=args.attention_dropout,
        deterministic=args.deterministic_mode,
        env=args.env,
        container=container,
    )


def megatron_run(
    args: MegatronArgs,
    *,
    world_size: int,
    device: str | Device = "h100",
    rank: str | int = "last",
    attention_backend: str | None = None,
    container: str = "dev",
    name: str | Path = "megatron-lm",
) -> MegatronRun:
    """The run of ``args`` on ``world_size`` GPUs of ``device``, answered for ``rank``, with
    the attention backend named (or the arguments', or under ``auto`` Transformer Engine's
    pick under ``container``)."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size <= 0:
        raise InputError("world_size", world_size, "must be a positive integer")
    check_megatron_args(args)  # the reader's rules, for arguments built in code too
    tp = args.tensor_model_parallel_size
    pp = args.pipeline_model_parallel_size
    cp = args.context_parallel_size
    if world_size % (tp * pp * cp):
        raise InputError(
            "world_size", world_size, f"is not divisible by TP x PP x CP = {tp * pp * cp}"
        )
    dp = world_size // (tp * pp * cp)
    etp = args.expert_tensor_parallel_size or tp
    ep = args.expert_model_parallel_size
    if args.num_experts is not None and world_size % (etp * ep * pp):
        raise InputError(
            "world_size",
            world_size,
            f"is not divisible by ETP x EP x PP = {etp} x {ep} x {pp} (the expert rank "
            "generator's layout, parallel_state.py)",
        )
    mbs, gbs = args.micro_batch_size, args.global_batch_size
    if gbs is not None and gbs % (mbs * dp):
        raise InputError(
            "megatron_args",
            f"--global-batch-size {gbs}",
            f"is not divisible by micro-batch x DP = {mbs} x {dp} "
            "(Megatron-LM's micro-batch calculator asserts it)",
        )
    microbatches = 1 if gbs is None else gbs // (mbs * dp)
    geometry = megatron_geometry(args, Path(name).parent.name or str(name))
    resolved = resolve_device(device)
    assert resolved is not None
    choice = megatron_backend(args, resolved, attention_backend, container)
    vpp = virtual_pipeline_size(args) or 1
    dtype = "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32"
    grad_bytes = 4 if (args.bf16 and not args.grad_reduce_in_bf16) or dtype == "fp32" else 2
    arguments: dict[str, Any] = {
        "lengths": [args.seq_length] * mbs,
        "tp": tp,
        "cp": cp,
        "sp": args.sequence_parallel and tp > 1,
        "ep": args.expert_model_parallel_size,
        "etp": etp if args.num_experts is not None else 1,
        "dp": dp,
        "pp": pp,
        "vpp": vpp,
        "microbatches": microbatches,
        "stage_layers": stage_layer_counts(args),
        "microbatch_group": args.microbatch_group_size_per_virtual_pipeline_stage,
        "recompute": megatron_recompute(args),
        "head": "fused" if args.cross_entropy_loss_fusion else "logits",
        "cp_comm": args.cp_comm_type,
        "step": "steady",
        "runtime": megatron_runtime(args, choice),
        "training": "full",
        "optimizer": "adam",
        "distributed_optimizer": args.use_distributed_optimizer,
        "dtype": dtype,
        "grad_bytes": grad_bytes,
        "device": resolved,
        "rank": rank,
        "moe_routing": megatron_routing(args),
    }
    return MegatronRun(args, geometry, arguments, world_size)  # type: ignore[arg-type]


def megatron_routing(args: MegatronArgs) -> str:
    """The rows the run's experts receive (``cpmem.step.routing``): a capacity where
    ``--moe-expert-capacity-factor`` gives one (a negative factor is none,
    transformer_config.py), padded with ``--moe-pad-expert-input-to-capacity``; else the
    worst case, the bound a router without capacity reaches."""
    factor = args.moe_expert_capacity_factor
    if factor is None or factor < 0:
        return "concentrated"
    return f"capacity:{factor:g}" + (":pad" if args.moe_pad_expert_input_to_capacity else "")


LORA_KEYWORDS = ("lora_rank", "lora_dropout", "lora_targets")


def describe_megatron(
    megatron_args: str | Path | MegatronArgs,
    *,
    world_size: int,
    device: str | Device = "h100",
    rank: str | int = "busiest",
    attention_backend: str | None = None,
    container: str = "dev",
    **overrides: Any,
) -> Step:
    """The step of a Megatron-LM run, read from its arguments (a ``model_config.yaml``, a
    flags file, or ``MegatronArgs``), as ``describe_step`` builds it: ``overrides`` are
    ``describe_step``'s keywords over the arguments' (``lora_rank`` and the other adapter
    keywords price a LoRA run of the model: ``training="lora"`` unless given)."""
    if isinstance(megatron_args, MegatronArgs):
        args, name = megatron_args, "megatron-lm"
    else:
        args, name = read_megatron_args(megatron_args), str(megatron_args)
    run = megatron_run(
        args,
        world_size=world_size,
        device=device,
        rank=rank,
        attention_backend=attention_backend,
        container=container,
        name=name,
    )
    arguments: dict[str, Any] = dict(run.arguments)
    if any(k in overrides for k in LORA_KEYWORDS) and "training" not in overrides:
        overrides = {**overrides, "training": "lora"}
    arguments.update(overrides)
    return describe_step(run.geometry, **arguments)
