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
  TP by default, ``arguments.py:587-588``). A layout keyword given beside the arguments
  (``LAYOUT_ARGS``: ``tp=2`` for ``--tensor-model-parallel-size 2``) replaces the
  argument before any of this is derived, so the world stays the one given and DP,
  the micro-batch count, the vocabulary's padding and the stage split follow it; a
  ``dp`` given must be the one the world leaves;
- the step: ``--micro-batch-size`` sequences of ``--seq-length`` tokens per micro-batch,
  ``global / (micro x DP)`` micro-batches, the CP ranks' load-balanced share (Megatron-LM's
  planner, ``StepSettings.step``), the output layer and cross entropy as its head, a
  steady step (Megatron-LM logs the peak from the second step on);
- the process (``Runtime.megatron_lm``) and full-parameter training with Adam or Muon
  (``--optimizer``, ``cpmem.megatron.optimizer_rules``), fp32 main gradients under
  ``--bf16`` (``--grad-reduce-in-bf16``: bf16), the distributed optimizer where asked
  (Muon's layer-wise one), in ``--num-distributed-optimizer-instances`` copies.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from cpmem.errors import InputError
from cpmem.megatron.args import MegatronArgs, is_pasted, read_megatron_args
from cpmem.megatron.batch_schedule import schedule_batch
from cpmem.megatron.cuda_graph_rules import megatron_cuda_graphs
from cpmem.megatron.delay_rules import delay_at_pp1
from cpmem.megatron.flex_rules import flex_dispatcher
from cpmem.megatron.fp8_rules import megatron_fp8
from cpmem.megatron.fsdp_rules import fsdp_buffers, fsdp_grad_element_size, fsdp_strategy
from cpmem.megatron.layout import stage_layer_counts, virtual_pipeline_size
from cpmem.megatron.offload_rules import offload
from cpmem.megatron.op_fuser_rules import expert_row_align
from cpmem.megatron.optimizer_rules import OPTIMIZER_KIND, layer_wise
from cpmem.megatron.recompute_modules import selective, selective_modules
from cpmem.megatron.rules import check_megatron_args
from cpmem.megatron.stack import kind_shapes, latent, megatron_stack
from cpmem.megatron.vocab import resolved_vocab_size
from cpmem.megatron.windows import megatron_windows
from cpmem.model.geometry import ModelGeometry
from cpmem.step.backend_choice import BackendChoice, container_named
from cpmem.step.describe import StepArguments, describe_step
from cpmem.step.device import Device, resolve_device
from cpmem.step.recompute import FullMethod, Mode, Recompute
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


def z_loss(args: MegatronArgs) -> bool:
    """Whether the router's z-loss runs: any ``--moe-z-loss-coeff`` (router.py:655 tests
    for None)."""
    return args.moe_z_loss_coeff is not None


def router_logit_element_size(args: MegatronArgs) -> int:
    """The bytes of one router logit: ``--moe-router-dtype`` fp32 or fp64, else the
    input's dtype, the run's parameters' (router.py:106-111)."""
    if args.moe_router_dtype in ("fp32", "fp64"):
        return 4 if args.moe_router_dtype == "fp32" else 8
    return 2 if args.bf16 or args.fp16 else 4


GLOBAL_AUX_LOSS_NOTE = (
    "global_aux_loss: two fp32 buffers per MoE layer's router, the tokens per expert "
    "summed over the global batch (num_experts elements) and its micro-batch count (one), "
    "registered under a positive --moe-aux-loss-coeff (router.py:204-220), not priced: "
    "1 KiB a layer in the allocator's 512-byte blocks up to 128 experts"
)


def _unpriced_parts(args: MegatronArgs, moe: bool) -> tuple[str, ...]:
    """What the model keeps that no term prices, named in every estimate of it."""
    out: list[str] = []
    if args.use_fused_weighted_squared_relu and args.squared_relu and moe:
        out.append(FUSED_SQUARED_RELU_NOTE)
    balancing = args.moe_router_load_balancing_type
    if moe and balancing == "global_aux_loss" and args.moe_aux_loss_coeff > 0:
        out.append(GLOBAL_AUX_LOSS_NOTE)
    return tuple(out)


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
        gated_mlp=args.swiglu or args.quick_geglu,
        activation_clamp=args.activation_func_clamp_value if args.quick_geglu else None,
        attention_sinks=args.softmax_type == "learnable",
        router_z_loss_bytes=router_logit_element_size(args) if moe and z_loss(args) else 0,
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
        windows=megatron_windows(args),
        vocab_multiple=args.make_vocab_size_divisible_by if args.pad_vocab_size else 1,
        family="megatron-gpt",
        max_position_embeddings=args.max_position_embeddings,
        unpriced_parts=_unpriced_parts(args, moe),
    )


def megatron_recompute(args: MegatronArgs) -> Recompute:
    """``--recompute-granularity``: ``selective`` with its ``--recompute-modules`` (the
    core attention by default; ``cpmem.megatron.recompute_modules``), ``full`` with its
    method and layers, or none."""
    if selective(args):
        return Recompute(Mode.SELECTIVE, selective_modules(args))
    if args.recompute_granularity == "full":
        method: FullMethod = "block" if args.recompute_method == "block" else "uniform"
        return Recompute(
            Mode.FULL, (), full_method=method, full_layers=args.recompute_num_layers or 1
        )
    return Recompute(Mode.NONE, ())


def megatron_runtime(args: MegatronArgs, choice: BackendChoice, container: str = "dev") -> Runtime:
    """The process Megatron-LM runs for ``args`` in ``container``, with the attention
    backend chosen."""
    return Runtime.megatron_lm(
        container=container,
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
        softmax_type=args.softmax_type,
        moe_dispatcher=flex_dispatcher(args),
        moe_grouped_gemm=args.moe_grouped_gemm,
        overlap_moe_comm=args.overlap_moe_expert_parallel_comm,
        delay_wgrad=args.delay_wgrad_compute,
        moe_router_fusion=args.moe_router_fusion,
        moe_row_align=expert_row_align(args),
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


def megatron_process(
    args: MegatronArgs, device: Device, asked: str | None, container: str
) -> Runtime:
    """The process the run runs in: with the backend the caller or the arguments name, or,
    under ``auto``, left for the step to resolve as every door's is
    (``StepSettings.with_backend_for``: Transformer Engine's pick for the step's model,
    layout, dtype, device and longest sequence in ``container``); ``auto`` needs the
    device's compute capability (an unknown one is refused here, not read as the measured
    runtime's H200)."""
    named = explicit_backend(args, asked)
    if named is not None:
        return megatron_runtime(args, BackendChoice(named, named, ()), container)
    if device.compute_capability is None:
        raise InputError(
            "device",
            device.name,
            "has no compute capability on record; Transformer Engine's choice under "
            "--attention-backend auto needs one (use a preset or name the backend)",
        )
    auto = BackendChoice(Runtime.megatron_lm().attention_backend, "auto", ())
    return megatron_runtime(args, auto, container).pending_auto(container)


FUNCTIONAL_TEST_CONFIG = "model_config.yaml"
"""The file every Megatron-LM functional test case keeps its arguments in, one per case
folder (``tests/functional_tests/test_cases/<model>/<case>/model_config.yaml``)."""


def run_name(source: str | Path) -> str:
    """The run's title: a functional test case's folder (its ``model_config.yaml`` is
    named alike in every case), any other arguments file by its own name, a pasted
    command line as such."""
    if is_pasted(source):
        return "command line"
    path = Path(source)
    if path.name == FUNCTIONAL_TEST_CONFIG and path.parent.name:
        return path.parent.name
    return path.name or str(source)


LAYOUT_ARGS = {
    "tp": "tensor_model_parallel_size",
    "pp": "pipeline_model_parallel_size",
    "cp": "context_parallel_size",
    "ep": "expert_model_parallel_size",
    "etp": "expert_tensor_parallel_size",
    "vpp": "num_virtual_stages_per_pipeline_rank",
    "first_stage_layers": "decoder_first_pipeline_num_layers",
    "last_stage_layers": "decoder_last_pipeline_num_layers",
}
"""``describe_step``'s layout keywords, as the Megatron-LM arguments they stand for
(``--tp 2`` beside ``--megatron-args`` is ``--tensor-model-parallel-size 2``)."""


def with_layout(
    args: MegatronArgs, overrides: dict[str, Any]
) -> tuple[MegatronArgs, dict[str, Any]]:
    """The arguments with the layout keywords among ``overrides`` written into them
    (``LAYOUT_ARGS``; a virtual pipeline size replaces ``--num-layers-per-virtual-
    pipeline-stage`` too), and the other keywords: a run's layout is derived from its
    arguments and its world (``megatron_run``), never set beside them."""
    changes = {LAYOUT_ARGS[k]: v for k, v in overrides.items() if k in LAYOUT_ARGS}
    if "vpp" in overrides:
        changes["num_layers_per_virtual_pipeline_stage"] = None
    rest = {k: v for k, v in overrides.items() if k not in LAYOUT_ARGS}
    return (replace(args, **changes) if changes else args), rest


def check_dp(run: MegatronRun, dp: object) -> None:
    """A data-parallel size given beside a run: the one its world leaves, else refused
    naming both."""
    if dp is None or dp == run.dp:
        return
    a = run.args
    tp, pp, cp = (
        a.tensor_model_parallel_size,
        a.pipeline_model_parallel_size,
        a.context_parallel_size,
    )
    asks = (
        f"world_size {tp * pp * cp * dp}"
        if isinstance(dp, int) and not isinstance(dp, bool) and dp > 0
        else "a positive DP"
    )
    raise InputError(
        "dp",
        dp,
        f"contradicts the world: world_size {run.world_size} / (TP {tp} x PP {pp} x CP {cp}) "
        f"is DP {run.dp}; give the world size the DP asks for ({asks}) or leave --dp out",
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
    container_named(container)  # refused by name, whether or not auto reads it
    check_megatron_args(args)  # the reader's rules, for arguments built in code too
    tp = args.tensor_model_parallel_size
    pp = args.pipeline_model_parallel_size
    cp = args.context_parallel_size
    if world_size % (tp * pp * cp):
        raise InputError(
            "world_size",
            world_size,
            f"is not divisible by TP x PP x CP = {tp} x {pp} x {cp} = {tp * pp * cp}",
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
    if gbs is None:
        gbs = schedule_batch(args)  # the first stage's (batch_schedule.py)
    if gbs is not None and gbs % (mbs * dp):
        raise InputError(
            "megatron_args",
            f"--global-batch-size {gbs}"
            if args.global_batch_size is not None
            else f"--step-batch-size-schedule's first batch {gbs}",
            f"is not divisible by micro-batch x DP = {mbs} x {dp} "
            "(Megatron-LM's micro-batch calculator asserts it)",
        )
    microbatches = 1 if gbs is None else gbs // (mbs * dp)
    if args.delay_wgrad_compute and pp == 1 and microbatches > 1:
        raise InputError("megatron_args", *delay_at_pp1(microbatches))
    geometry = megatron_geometry(args, run_name(name))
    resolved = resolve_device(device)
    assert resolved is not None
    process = megatron_process(args, resolved, attention_backend, container)
    vpp = virtual_pipeline_size(args) or 1
    dtype = "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32"
    grad_bytes = 4 if (args.bf16 and not args.grad_reduce_in_bf16) or dtype == "fp32" else 2
    if args.use_megatron_fsdp:
        grad_bytes = fsdp_grad_element_size(args)
    if args.use_torch_fsdp2:  # gradients in the parameters' dtype (no mixed-precision policy)
        grad_bytes = 2 if dtype == "bf16" else 4
    precomputed = layer_wise(args) and args.use_layer_wise_param_layout
    arguments: dict[str, Any] = {
        "lengths": [args.seq_length] * mbs,
        "tp": tp,
        "cp": cp,
        "sp": args.sequence_parallel and tp > 1,
        "ep": args.expert_model_parallel_size,
        # a dense model: the ETP its arguments state, named as unread where it is not 1
        "etp": etp if args.num_experts is not None else (args.expert_tensor_parallel_size or 1),
        "dp": dp,
        "pp": pp,
        "vpp": vpp,
        "microbatches": microbatches,
        "stage_layers": stage_layer_counts(args),
        "microbatch_group": args.microbatch_group_size_per_virtual_pipeline_stage,
        "deferred_wgrad": (
            args.wgrad_deferral_limit if args.defer_embedding_wgrad_compute else None
        ),
        "recompute": megatron_recompute(args),
        "offload": offload(args),
        "head": "fused" if args.cross_entropy_loss_fusion else "logits",
        "cp_comm": args.cp_comm_type,
        "step": "steady",
        "runtime": process,
        "training": "full",
        "optimizer": OPTIMIZER_KIND[args.optimizer],
        "distributed_optimizer": args.use_distributed_optimizer or layer_wise(args),
        "optimizer_instances": args.num_distributed_optimizer_instances,
        "muon_layout": (
            ("bucketed" if args.overlap_grad_reduce else "precomputed") if precomputed else "legacy"
        ),
        "fsdp": fsdp_strategy(args),
        "fsdp_buffers": fsdp_buffers(args),
        "dtype": dtype,
        "grad_bytes": grad_bytes,
        "device": resolved,
        "rank": rank,
        "moe_routing": megatron_routing(args),
        "fp8": megatron_fp8(args),
        "cuda_graphs": megatron_cuda_graphs(args),
        "tp_comm_overlap": args.tp_comm_overlap,
    }
    return MegatronRun(args, geometry, arguments, world_size)  # type: ignore[arg-type]


def megatron_routing(args: MegatronArgs) -> str:
    """The rows the run's experts receive (``cpmem.step.routing``): a capacity where
    ``--moe-expert-capacity-factor`` gives one (a negative factor is none,
    transformer_config.py), padded with ``--moe-pad-expert-input-to-capacity``; else,
    under ``--moe-router-force-load-balancing``, the balanced expectation: the router's
    logits are replaced by independent standard normal draws (router.py:861-863,
    ``RandomSTE``: ``logits.clone().normal_()``, moe_utils.py:1267-1278, at d98e8a64), so
    every token's top-k (group-limited or not) is a uniformly random set of experts and
    each expert's expected rows are ``tokens x top-k / E`` (an expert bias, where enabled,
    starts at zero and is stepped toward equal loads); else the worst case, the bound a
    router without capacity reaches."""
    factor = args.moe_expert_capacity_factor
    if factor is None or factor < 0:
        return "balanced" if args.moe_router_force_load_balancing else "concentrated"
    return f"capacity:{factor:g}" + (":pad" if args.moe_pad_expert_input_to_capacity else "")


LORA_KEYWORDS = ("lora_rank", "lora_dropout", "lora_targets")
MEGATRON_DTYPES = ("bf16", "fp16", "fp32")


def with_dtype(args: MegatronArgs, dtype: str) -> MegatronArgs:
    """``args`` with ``--bf16`` / ``--fp16`` (neither: fp32) set for ``dtype``, so its
    gradients' element and Transformer Engine's choice under ``auto`` follow Megatron-LM's
    own rules for that dtype (``megatron_run``)."""
    if dtype not in MEGATRON_DTYPES:
        raise InputError("dtype", dtype, f"must be one of {list(MEGATRON_DTYPES)}")
    return replace(args, bf16=dtype == "bf16", fp16=dtype == "fp16")


def layout_flags(overrides: dict[str, Any]) -> dict[str, str]:
    """The layout keywords among ``overrides`` as the flags they replace (``LAYOUT_ARGS``),
    for a reader that applies them before its rules."""
    return {
        "--" + LAYOUT_ARGS[k].replace("_", "-"): str(v)
        for k, v in overrides.items()
        if k in LAYOUT_ARGS and v is not None
    }


def megatron_run_with(
    megatron_args: str | Path | MegatronArgs,
    overrides: dict[str, Any],
    *,
    world_size: int | None = None,
    vocab_size: int | None = None,
    **run: Any,
) -> tuple[MegatronRun, dict[str, Any]]:
    """The run of ``megatron_args`` (a file, a command line or ``MegatronArgs``) with the
    layout keywords among ``overrides`` written into its arguments (``with_layout``; a
    file's are replaced before its rules are checked; ``dtype`` too, ``with_dtype``) and
    ``dp`` checked against its world (``check_dp``), and the remaining keywords.
    ``world_size`` None: the launch's (a script's torchrun); ``vocab_size`` replaces the
    arguments' ``--vocab-size``; ``run`` are ``megatron_run``'s."""
    if isinstance(megatron_args, MegatronArgs):
        args, name = megatron_args, "megatron-lm"
        if vocab_size is not None:
            args = replace(args, vocab_size=vocab_size)
    else:
        args = read_megatron_args(
            megatron_args,
            vocab_size=vocab_size,
            world_size=world_size,
            require_world=True,
            replace_flags=layout_flags(overrides),
        )
        name = str(megatron_args)
    world = world_size if world_size is not None else args.world_size
    if world is None:
        raise InputError("world_size", None, "give the run's world size (--world-size N)")
    args = replace(args, world_size=world)
    args, rest = with_layout(args, overrides)
    if "dtype" in rest:  # the run in another dtype, as its arguments would state it
        args = with_dtype(args, rest["dtype"])
    dp = rest.pop("dp", None)
    found = megatron_run(args, name=name, world_size=world, **run)
    check_dp(found, dp)
    return found, rest


def describe_megatron(
    megatron_args: str | Path | MegatronArgs,
    *,
    world_size: int | None = None,
    vocab_size: int | None = None,
    device: str | Device = "h100",
    rank: str | int = "busiest",
    attention_backend: str | None = None,
    container: str = "dev",
    **overrides: Any,
) -> Step:
    """The step of a Megatron-LM run, read from its arguments (a ``model_config.yaml``, a
    flags file, or ``MegatronArgs``), as ``describe_step`` builds it: ``overrides`` are
    ``describe_step``'s keywords over the arguments' (``lora_rank`` and the other adapter
    keywords price a LoRA run of the model: ``training="lora"`` unless given; the layout
    keywords are the arguments' own, ``with_layout``, and ``dp`` must be the world's)."""
    run, overrides = megatron_run_with(
        megatron_args,
        overrides,
        world_size=world_size,
        vocab_size=vocab_size,
        device=device,
        rank=rank,
        attention_backend=attention_backend,
        container=container,
    )
    arguments: dict[str, Any] = dict(run.arguments)
    given = overrides.get("runtime")
    if isinstance(given, str) and arguments["runtime"].is_runtime(given):  # the run's own
        overrides = {k: v for k, v in overrides.items() if k != "runtime"}
    if any(k in overrides for k in LORA_KEYWORDS) and "training" not in overrides:
        overrides = {**overrides, "training": "lora"}
    arguments.update(overrides)
    return describe_step(run.geometry, **arguments)
