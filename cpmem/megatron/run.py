"""One Megatron-LM GPT training run on one named rank: the description every caller
prices (``describe_megatron_run``).

From ``MegatronArgs``, the world size, the rank asked for and the device, it derives
what the pricing reads: the parallel sizes (DP = world / (TP x PP x CP)), the rank's
coordinates in Megatron-LM's default rank order (tp-cp-ep-dp-pp, ``megatron/core/
parallel_state.py``: TP fastest, PP slowest), the layers and virtual chunks of its
pipeline stage, the micro-batches of a step, the model's shapes with Megatron-LM's
defaults (FFN 4h, or 8h/3 rounded down to 64 with SwiGLU, ``arguments.py:1320-1329``;
the vocabulary padded to a multiple of ``--make-vocab-size-divisible-by`` x TP,
``arguments.py:2441``), and the attention backend priced.

``rank``: ``last`` (the rank Megatron-LM logs memory on: the writer exists only where
``rank == world_size - 1``, ``megatron/training/global_vars.py``; in this rank order the
last pipeline stage, which holds the output layer and the loss), ``busiest`` (the stage
whose peak is largest, chosen by the pricing), or a global rank number.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from cpmem.errors import InputError
from cpmem.megatron.args import MegatronArgs
from cpmem.step.device import Device, resolve_device

GPT2_BPE_VOCAB = 50_257
"""GPT-2's BPE vocabulary: ``pretrain_gpt.py`` defaults ``--tokenizer-type`` to
``GPT2BPETokenizer`` where the run gives ``--vocab-file`` / ``--merge-file``; the one
NullTokenizer case of the family states ``--vocab-size 50257``."""

ATTENTION_BACKENDS = ("flash", "fused", "unfused", "local")
"""What ``--attention-backend`` names (``AttnBackend`` in megatron-core) and cpmem
prices; ``auto`` leaves the choice to Transformer Engine."""
AUTO_COVERING_BACKEND = "unfused"
"""Priced for ``--attention-backend auto``: Transformer Engine picks among flash, fused
and unfused per container, and the unfused backend (``s x s`` scores per head) holds
the most; the estimate also reports the flash figure (the spread)."""


@dataclass(frozen=True)
class MegatronRun:
    """A Megatron-LM GPT training run priced on one global rank."""

    args: MegatronArgs
    world_size: int
    rank: int
    device: Device
    attention_backend: str
    rank_asked: str
    routing: str = "worst"
    """The MoE routing priced: ``worst`` (every token's copies on this rank's experts as
    far as ``k`` distinct experts allow, the covering figure) or ``balanced`` (each
    expert ``k / E`` of the tokens)."""

    # --- parallel layout -------------------------------------------------------------
    @property
    def tp(self) -> int:
        return self.args.tensor_model_parallel_size

    @property
    def pp(self) -> int:
        return self.args.pipeline_model_parallel_size

    @property
    def cp(self) -> int:
        return self.args.context_parallel_size

    @property
    def dp(self) -> int:
        return self.world_size // (self.tp * self.pp * self.cp)

    @property
    def sp(self) -> bool:
        """Sequence parallelism: Megatron-LM turns it off at TP 1 (arguments.py)."""
        return self.args.sequence_parallel and self.tp > 1

    @property
    def coordinates(self) -> dict[str, int]:
        """The rank's (tp, cp, dp, pp) ranks in the tp-cp-ep-dp-pp order."""
        r = self.rank
        tp_rank, r = r % self.tp, r // self.tp
        cp_rank, r = r % self.cp, r // self.cp
        dp_rank, pp_rank = r % self.dp, r // self.dp
        return {"tp": tp_rank, "cp": cp_rank, "dp": dp_rank, "pp": pp_rank}

    # --- experts -----------------------------------------------------------------------
    @property
    def moe(self) -> bool:
        """Whether the layers are mixture-of-experts layers (``--num-experts``)."""
        return self.args.num_experts is not None

    @property
    def num_experts(self) -> int:
        return self.args.num_experts or 0

    @property
    def ep(self) -> int:
        return self.args.expert_model_parallel_size

    @property
    def etp(self) -> int:
        """The experts' TP size: ``--expert-tensor-parallel-size``, else TP."""
        return self.args.expert_tensor_parallel_size or self.tp

    @property
    def edp(self) -> int:
        """The expert data-parallel size, world / (ETP x EP x PP): Megatron-LM's expert
        ``RankGenerator`` (``parallel_state.py``) folds CP into it."""
        return self.world_size // (self.etp * self.ep * self.pp)

    @property
    def local_experts(self) -> int:
        return self.num_experts // self.ep

    @property
    def moe_ffn(self) -> int:
        """An expert's FFN width: ``--moe-ffn-hidden-size``, else the dense FFN width."""
        return self.args.moe_ffn_hidden_size or self.ffn

    @property
    def expert_coordinates(self) -> dict[str, int]:
        """The rank's (etp, ep, edp, pp) ranks in the experts' tp-ep-dp-pp order (TP
        fastest; the same PP rank as the dense order, both keep PP slowest)."""
        r = self.rank
        etp_rank, r = r % self.etp, r // self.etp
        ep_rank, r = r % self.ep, r // self.ep
        edp_rank, pp_rank = r % self.edp, r // self.edp
        return {"etp": etp_rank, "ep": ep_rank, "edp": edp_rank, "pp": pp_rank}

    @property
    def stage(self) -> int:
        return self.coordinates["pp"]

    @property
    def first_stage(self) -> bool:
        return self.stage == 0

    @property
    def last_stage(self) -> bool:
        return self.stage == self.pp - 1

    @property
    def virtual_chunks(self) -> int:
        """Model chunks per pipeline rank (``--num-layers-per-virtual-pipeline-stage``)."""
        per = self.args.num_layers_per_virtual_pipeline_stage
        if per is None:
            return 1
        return self.args.num_layers // (self.pp * per)

    @property
    def stage_layers(self) -> int:
        """Transformer layers on this rank (every stage even: arguments.py asserts it)."""
        return self.args.num_layers // self.pp

    @property
    def chunk_layers(self) -> int:
        return self.stage_layers // self.virtual_chunks

    @property
    def microbatches(self) -> int:
        """Micro-batches per step: global batch / (micro-batch x DP)."""
        gbs = self.args.global_batch_size
        mbs = self.args.micro_batch_size
        return 1 if gbs is None else gbs // (mbs * self.dp)

    # --- shapes ------------------------------------------------------------------------
    @property
    def heads(self) -> int:
        return self.args.num_attention_heads

    @property
    def head_dim(self) -> int:
        return self.args.kv_channels or self.args.hidden_size // self.heads

    @property
    def kv_groups(self) -> int:
        if self.args.group_query_attention and self.args.num_query_groups:
            return self.args.num_query_groups
        return self.heads

    @property
    def ffn(self) -> int:
        """``--ffn-hidden-size``, else 4h, or int(8h/3 / 64) x 64 with SwiGLU."""
        if self.args.ffn_hidden_size is not None:
            return self.args.ffn_hidden_size
        h = self.args.hidden_size
        return int(4 * h * 2 / 3 / 64) * 64 if self.args.swiglu else 4 * h

    @property
    def gated(self) -> bool:
        return self.args.swiglu

    @property
    def vocab(self) -> int:
        if self.args.vocab_size is not None:
            return self.args.vocab_size
        return GPT2_BPE_VOCAB

    @property
    def padded_vocab(self) -> int:
        multiple = self.args.make_vocab_size_divisible_by * self.tp
        return -(-self.vocab // multiple) * multiple

    @property
    def dtype_bytes(self) -> int:
        """bf16 and fp16 hold 2 bytes per element; fp32 (neither flag) 4."""
        return 2 if (self.args.bf16 or self.args.fp16) else 4

    @property
    def grad_bytes(self) -> int:
        """The DDP gradient buffer's element: fp32 under ``--bf16`` unless
        ``--grad-reduce-in-bf16`` (arguments.py:1204-1216), the parameters' own dtype
        otherwise (``--fp16``: fp16 gradients, ``param_and_grad_buffer.py:924``)."""
        if self.args.bf16 and not self.args.grad_reduce_in_bf16:
            return 4
        return self.dtype_bytes

    @property
    def tokens(self) -> int:
        """Tokens of one micro-batch on this rank: s x b / CP (each CP rank holds
        2 of the 2 x CP load-balanced chunks of every sequence)."""
        return self.args.seq_length * self.args.micro_batch_size // self.cp

    def with_rank(self, rank: int) -> MegatronRun:
        return replace(self, rank=rank)

    def stage_rank(self, stage: int) -> int:
        """The global rank of ``stage`` with this rank's tp, cp and dp coordinates."""
        c = self.coordinates
        return c["tp"] + self.tp * (c["cp"] + self.cp * (c["dp"] + self.dp * stage))


def _check_positive(name: str, value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or value <= 0):
        raise InputError(
            "megatron_args", f"--{name.replace('_', '-')} {value}", "must be a positive integer"
        )


def _check(args: MegatronArgs, world_size: int) -> None:
    for name in (
        "num_layers",
        "hidden_size",
        "num_attention_heads",
        "seq_length",
        "micro_batch_size",
        "tensor_model_parallel_size",
        "pipeline_model_parallel_size",
        "context_parallel_size",
        "global_batch_size",
        "num_query_groups",
        "num_layers_per_virtual_pipeline_stage",
        "num_experts",
        "moe_router_topk",
        "moe_ffn_hidden_size",
        "moe_shared_expert_intermediate_size",
        "expert_model_parallel_size",
        "expert_tensor_parallel_size",
    ):
        _check_positive(name, getattr(args, name))
    model_parallel = (
        args.tensor_model_parallel_size
        * args.pipeline_model_parallel_size
        * args.context_parallel_size
    )
    if world_size % model_parallel:
        raise InputError(
            "world_size",
            world_size,
            f"is not divisible by TP x PP x CP = {model_parallel}",
        )
    if args.max_position_embeddings is not None and args.max_position_embeddings < args.seq_length:
        raise InputError(
            "megatron_args",
            f"--max-position-embeddings {args.max_position_embeddings}",
            f"is below --seq-length {args.seq_length} (Megatron-LM asserts it is not)",
        )
    dp = world_size // model_parallel
    if args.global_batch_size is not None and args.global_batch_size % (args.micro_batch_size * dp):
        raise InputError(
            "megatron_args",
            f"--global-batch-size {args.global_batch_size}",
            f"is not divisible by micro-batch x DP = {args.micro_batch_size} x {dp} "
            "(Megatron-LM's micro-batch calculator asserts it)",
        )
    cp = args.context_parallel_size
    if cp > 1 and args.seq_length % (2 * cp):
        raise InputError(
            "megatron_args",
            f"--seq-length {args.seq_length}",
            f"is not divisible by 2 x CP = {2 * cp} (the load-balanced CP split)",
        )
    if args.bf16 and args.fp16:
        raise InputError("megatron_args", "--bf16 --fp16", "name two parameter dtypes; give one")
    if args.num_layers % args.pipeline_model_parallel_size:
        raise InputError(
            "megatron_args",
            f"--num-layers {args.num_layers}",
            f"does not split evenly over {args.pipeline_model_parallel_size} pipeline stages",
        )
    per = args.num_layers_per_virtual_pipeline_stage
    if per is not None and (args.num_layers // args.pipeline_model_parallel_size) % per:
        raise InputError(
            "megatron_args",
            f"--num-layers-per-virtual-pipeline-stage {per}",
            "does not divide each stage's layers",
        )
    if args.num_attention_heads % args.tensor_model_parallel_size:
        raise InputError(
            "megatron_args",
            f"--num-attention-heads {args.num_attention_heads}",
            f"is not divisible by TP {args.tensor_model_parallel_size}",
        )
    if args.normalization not in ("LayerNorm", "RMSNorm"):
        raise InputError(
            "megatron_args", f"--normalization {args.normalization}", "must be LayerNorm or RMSNorm"
        )
    if args.position_embedding_type not in ("learned_absolute", "rope", "none"):
        raise InputError(
            "megatron_args",
            f"--position-embedding-type {args.position_embedding_type}",
            "must be learned_absolute, rope or none",
        )
    if args.transformer_impl not in ("transformer_engine", "local"):
        raise InputError(
            "megatron_args",
            f"--transformer-impl {args.transformer_impl}",
            "must be transformer_engine or local",
        )
    if args.attention_backend not in ("auto", *ATTENTION_BACKENDS):
        raise InputError(
            "megatron_args",
            f"--attention-backend {args.attention_backend}",
            f"must be one of {['auto', *ATTENTION_BACKENDS]}",
        )
    if args.recompute_granularity not in (None, "full", "selective"):
        raise InputError(
            "megatron_args",
            f"--recompute-granularity {args.recompute_granularity}",
            "must be full or selective",
        )
    if args.recompute_granularity == "full" and args.recompute_method not in ("uniform", "block"):
        raise InputError(
            "megatron_args",
            f"--recompute-method {args.recompute_method}",
            "full recompute needs --recompute-method uniform or block",
        )
    _check_experts(args, world_size)
    if args.cp_comm_type not in ("p2p", "a2a", "all_gather", "a2a+p2p"):
        raise InputError(
            "megatron_args",
            f"--cp-comm-type {args.cp_comm_type}",
            "must be p2p, a2a, all_gather or a2a+p2p",
        )


MOE_DISPATCHERS = ("allgather", "alltoall")
"""The token dispatchers priced (``--moe-token-dispatcher-type``); ``flex`` (DeepEP,
HybridEP) keeps buffers of its own and is refused."""
MOE_LOAD_BALANCING = ("aux_loss", "seq_aux_loss", "sinkhorn", "none")
"""The router's load-balancing types priced: each keeps [tokens, experts] scores."""


def _check_experts(args: MegatronArgs, world_size: int) -> None:
    """Megatron-LM's own assertions on the expert layout (``arguments.py``,
    ``parallel_state.py``), and what cpmem prices of MoE."""
    moe_only = {
        "--expert-model-parallel-size": args.expert_model_parallel_size != 1,
        "--moe-ffn-hidden-size": args.moe_ffn_hidden_size is not None,
        "--moe-shared-expert-intermediate-size": args.moe_shared_expert_intermediate_size
        is not None,
    }
    if args.num_experts is None:
        for flag, given in moe_only.items():
            if given:
                raise InputError(
                    "megatron_args", flag, "needs --num-experts (Megatron-LM asserts it)"
                )
        return
    experts, ep = args.num_experts, args.expert_model_parallel_size
    etp = args.expert_tensor_parallel_size or args.tensor_model_parallel_size
    if experts % ep:
        raise InputError(
            "megatron_args",
            f"--expert-model-parallel-size {ep}",
            f"does not divide --num-experts {experts} (Megatron-LM asserts it)",
        )
    expert_parallel = etp * ep * args.pipeline_model_parallel_size
    if world_size % expert_parallel:
        raise InputError(
            "world_size",
            world_size,
            f"is not divisible by ETP x EP x PP = {etp} x {ep} x "
            f"{args.pipeline_model_parallel_size} (the expert rank generator's layout)",
        )
    if args.moe_router_topk > experts:
        raise InputError(
            "megatron_args",
            f"--moe-router-topk {args.moe_router_topk}",
            f"is above --num-experts {experts}",
        )
    if args.moe_layer_freq != 1:
        raise InputError(
            "megatron_args",
            f"--moe-layer-freq {args.moe_layer_freq}",
            "dense layers between the MoE layers are not priced (only every layer an MoE layer)",
        )
    if args.moe_token_dispatcher_type not in MOE_DISPATCHERS:
        raise InputError(
            "megatron_args",
            f"--moe-token-dispatcher-type {args.moe_token_dispatcher_type}",
            f"is not priced (priced: {', '.join(MOE_DISPATCHERS)})",
        )
    if args.moe_router_load_balancing_type not in MOE_LOAD_BALANCING:
        raise InputError(
            "megatron_args",
            f"--moe-router-load-balancing-type {args.moe_router_load_balancing_type}",
            f"is not priced (priced: {', '.join(MOE_LOAD_BALANCING)})",
        )
    if args.moe_router_dtype not in (None, "fp32", "fp64"):
        raise InputError(
            "megatron_args",
            f"--moe-router-dtype {args.moe_router_dtype}",
            "must be fp32 or fp64",
        )
    if args.tensor_model_parallel_size > 1 and not args.sequence_parallel:
        raise InputError(
            "megatron_args",
            "--num-experts with --tensor-model-parallel-size > 1",
            "needs --sequence-parallel (MoELayer raises without it in training)",
        )


def _attention_backend(args: MegatronArgs, asked: str | None) -> str:
    """The backend priced: the one asked for, else the arguments', else (``auto``) the
    covering one. The local implementation has its own attention (``local``)."""
    if args.transformer_impl == "local":
        if asked not in (None, "local"):
            raise InputError(
                "attention_backend",
                asked,
                "the local transformer implementation has only its own attention",
            )
        return "local"
    chosen = asked or args.attention_backend
    if chosen not in ("auto", *ATTENTION_BACKENDS):
        raise InputError("attention_backend", chosen, f"must be one of {list(ATTENTION_BACKENDS)}")
    if chosen == "local":
        return "local"
    return AUTO_COVERING_BACKEND if chosen == "auto" else chosen


def describe_megatron_run(
    args: MegatronArgs,
    *,
    world_size: int,
    rank: str | int = "last",
    device: str | Device = "h100",
    attention_backend: str | None = None,
) -> MegatronRun:
    """The run of ``args`` on ``world_size`` GPUs, priced on ``rank`` of ``device``.

    ``busiest`` is described here as the last rank; the pricing then compares every
    stage (``price_megatron``)."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size <= 0:
        raise InputError("world_size", world_size, "must be a positive integer")
    _check(args, world_size)
    resolved = resolve_device(device)
    assert resolved is not None
    backend = _attention_backend(args, attention_backend)
    if rank in ("last", "busiest"):
        number = world_size - 1
    else:
        try:
            number = int(rank)
        except (TypeError, ValueError):
            raise InputError(
                "rank", rank, "must be last, busiest or a global rank number"
            ) from None
        if not 0 <= number < world_size:
            raise InputError("rank", rank, f"must be in 0..{world_size - 1}")
    return MegatronRun(
        args=args,
        world_size=world_size,
        rank=number,
        device=resolved,
        attention_backend=backend,
        rank_asked=str(rank),
    )
