# mypy: disable-error-code="no-untyped-call,no-any-return"
"""Run one rank's step under fake tensors and a fake process group, and account it.

World = TP x CP over torch's ``fake`` backend (FakeStore); megatron's parallel_state is
initialised over it with the simulated rank's coordinates (TP fastest, then CP, as
megatron orders ranks). The model is built under ``FakeTensorMode`` (no memory), then
one step runs inside the live-storage tracker: embedding output, every layer, then the
head: by default the calibration harness (the returned hidden states gathered over SP
and CP and unpacked to the logical tokens, the mean-square loss), otherwise an LM head
and its loss on the rank's own tokens (``head.py``; labels allocated with the batch);
and backward. The adapters (rank, dropout, targets: ``adapters.py``) and the CP
attention communication (``cp_comm.py``) are inputs too; their defaults are the harness.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode

from oracles.rank_sim import kernels as K
from oracles.rank_sim.adapters import AdapterSpec
from oracles.rank_sim.cp_comm import check_cp_comm
from oracles.rank_sim.geometry import SimInputError, SimModel
from oracles.rank_sim.head import HeadSpec
from oracles.rank_sim.layers import RankContext, _config, build_layers, gather_sp
from oracles.rank_sim.layout import RankLayout
from oracles.rank_sim.recompute import Recompute
from oracles.rank_sim.tracker import LiveBytesTracker, PhasePeak

BF16 = torch.bfloat16


@dataclass
class RankResult:
    """Incremental bytes above the pre-forward baseline (no cold set-up added)."""

    rank: int
    attention_tokens: int
    gdn_tokens: int
    forward_peak_bytes: int
    forward_backward_peak_bytes: int
    retained_bytes: int
    components: dict[str, dict[str, int]] = field(default_factory=dict)
    seconds: float = 0.0
    ops: int = 0
    gdn_kernel: str = field(default_factory=lambda: K.GDN_KERNEL)  # the kernel in use now
    expert_rows: int = 0  # rows the rank's local experts receive per MoE layer (MoE models)
    step: dict[str, Any] = field(default_factory=dict)  # head, adapters, cp_comm simulated

    @property
    def tokens(self) -> int:
        return max(self.attention_tokens, self.gdn_tokens)

    def as_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "tokens": self.tokens,
            "attention_tokens": self.attention_tokens,
            "gdn_tokens": self.gdn_tokens,
            "forward_peak_bytes": self.forward_peak_bytes,
            "forward_backward_peak_bytes": self.forward_backward_peak_bytes,
            "retained_bytes": self.retained_bytes,
            "components": self.components,
            "gdn_kernel": self.gdn_kernel,
            **({"expert_rows": self.expert_rows} if self.expert_rows else {}),
            **({"step": self.step} if self.step else {}),
            "seconds": round(self.seconds, 2),
        }


def init_groups(tp: int, cp: int, cp_rank: int, tp_rank: int = 0) -> Any:
    """(Re)initialise the fake world and megatron's groups; returns the CP group."""
    from megatron.core import parallel_state
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from oracles.saved_tensors import install_megatron_cpu_shim

    install_megatron_cpu_shim()
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()
    world = tp * cp
    dist.init_process_group(
        "fake", store=FakeStore(), rank=cp_rank * tp + tp_rank, world_size=world
    )
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=tp, context_parallel_size=cp, create_gloo_process_groups=False
    )
    return parallel_state.get_context_parallel_group() if cp > 1 else None


def release_groups() -> None:
    """Tear the fake world down again, so that later users of torch.distributed or
    megatron's parallel_state in the same process (the saved-tensor oracle) start clean."""
    from megatron.core import parallel_state

    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()


def _count(layout: RankLayout, kind: str) -> int:
    """Tokens a layer of ``kind`` runs on: the GDN layout's for GDN, else attention's
    (Mamba's all-to-all starts from the attention layout; see ``_stream_count`` for a
    layer without a mixer)."""
    return layout.gdn_local if kind == "gdn" else layout.attn_local


def _stream_count(layout: RankLayout, kinds: tuple[str, ...]) -> int:
    """Tokens of the residual stream after ``kinds``: the last mixer's layout (an MLP-
    or MoE-only layer keeps whatever layout it is handed)."""
    mixers = [k for k in kinds if k]
    return _count(layout, mixers[-1] if mixers else "attention")


def _tables(model: SimModel, mtp: bool = False) -> bool:
    """Whether the step makes rope tables: an attention layer (of the decoder, or of the
    MTP depths where they run) that rotates q and k."""
    from oracles.rank_sim.mtp import depth_stack

    kinds = model.kinds + (depth_stack(model)[0] if mtp else ())
    return model.rope and "attention" in kinds


def simulate_rank(
    model: SimModel,
    layout: RankLayout,
    recompute: Recompute,
    *,
    compiled: bool = False,
    ep: int = 1,
    routing: str = "concentrated",
    head: str | HeadSpec = "hidden",
    lora_rank: int = 1,
    lora_dropout: float = 0.0,
    lora_targets: str | tuple[str, ...] = "all",
    cp_comm: str = "all_gather",
    micro_batch: int = 1,
    training: str = "lora",
    wgrad_fusion: bool = True,
    mtp_depths: int | None = None,
    mtp_shared: bool | None = None,
) -> RankResult:
    """Forward (+ backward unless no-grad) of one rank; peaks per phase and component.
    ``ep`` and ``routing`` apply to MoE models (oracles/rank_sim/moe.py); ``head``
    (hidden | logits | fused | chunked:N | linear-ce, head.py), the adapters
    (``lora_rank``, ``lora_dropout``, ``lora_targets``: adapters.py) and ``cp_comm``
    (all_gather | p2p | a2a: cp_comm.py) default to the calibration harness.
    ``micro_batch``: the rows of megatron's [s, b, h] the rank's tokens form, read by
    Mamba layers (mamba.py; 1: one packed row). ``training`` "full": every weight trains,
    no adapters, with or without gradient accumulation fusion (``wgrad_fusion``;
    adapters.py, training.py). ``mtp_depths``: MTP depths after the last layer (mtp.py;
    None: the model's own, 0 without), ``mtp_shared`` one layer for every depth (None:
    the model's)."""
    from oracles.rank_sim.moe import check_routing, expert_rows
    from oracles.rank_sim.mtp import check_mtp, depth_stack

    layout.check(model.gdn_layers > 0)
    model.check_tp(layout.tp)
    head_spec = HeadSpec.parse(head)
    adapters = AdapterSpec.parse(lora_rank, lora_dropout, lora_targets, training, wgrad_fusion)
    depths = model.mtp_depths if mtp_depths is None else mtp_depths
    shared = model.mtp_shared if mtp_shared is None else bool(mtp_shared)
    check_mtp(model, depths, head_spec, (layout.attn_local, layout.gdn_local))
    mtp_kinds = depth_stack(model)[0] if depths else ()
    check_micro_batch(model, layout, micro_batch, mtp_kinds)
    model.check_ep(ep, layout.tp * layout.cp)
    check_routing(routing)
    check_cp_comm(cp_comm, model, layout.tp, layout.cp)
    lookup = adapters.full or depths > 0  # the embedding's lookup runs (embedding.py)
    if lookup and model.vocab < 1:
        field_name, value = ("training", training) if adapters.full else ("mtp_depths", depths)
        raise SimInputError(
            field_name, value, f"{model.name} has no vocabulary size (the embedding's lookup)"
        )
    started = time.perf_counter()
    cp_group = init_groups(layout.tp, layout.cp, layout.rank, layout.tp_rank)
    tracker: LiveBytesTracker

    def set_label(name: str) -> str:
        previous, tracker.label = tracker.label, name
        return previous

    try:
        with FakeTensorMode(allow_non_fake_inputs=True):
            ctx = RankContext(
                model, layout, recompute, compiled, cp_group, set_label, ep=ep, routing=routing,
                adapters=adapters, cp_comm=cp_comm, micro_batch=micro_batch,
            )  # fmt: skip
            layers = build_layers(ctx)
            params = list(layers.parameters())
            lm_head = None
            if not head_spec.harness:
                from oracles.rank_sim.head import Head

                lm_head = Head(ctx, _config(model, layout), head_spec)
                params += list(lm_head.parameters())
            extra = _Extras()
            if lookup:
                extra.embedding = _embedding(ctx)
                params.append(extra.embedding.weight)
            if depths:
                from oracles.rank_sim.mtp import MTPBlock

                extra.mtp = MTPBlock(ctx, _config(model, layout), extra.embedding, depths, shared)
                params += list(extra.mtp.parameters())
            if adapters.full:
                from oracles.rank_sim.training import prepare

                extra.grad_accumulators = prepare(params)
            tracker = LiveBytesTracker(params)
            first = _count(layout, model.kinds[0])
            longest = max(layout.attn_local, layout.gdn_local)
            with tracker, _training(ctx, set_label):
                result = _step(ctx, layers, tracker, first, longest, lm_head, extra)
    finally:
        release_groups()
    result.seconds = time.perf_counter() - started
    result.ops = tracker.ops
    result.step = {"head": head_spec.label, **adapters.as_dict(), "cp_comm": cp_comm}
    if micro_batch != 1:
        result.step["micro_batch"] = micro_batch
    if depths:
        result.step.update(mtp_depths=depths, mtp_shared=shared)
    if model.moe:
        rows = {expert_rows(model, ctx.local(_count(layout, k)), ep, routing) for k in model.kinds}
        result.expert_rows = max(rows)
    return result


@dataclass
class _Extras:
    """The step's modules beyond the layers and the head: the embedding's lookup
    (embedding.py) and the MTP depths (mtp.py)."""

    embedding: Any = None
    mtp: Any = None
    grad_accumulators: Any = None  # full training: DDP's hooked accumulators (training.py)


def _embedding(ctx: RankContext) -> Any:
    """The rank's word embedding table, trainable under full training."""
    from oracles.rank_sim.embedding import Embedding
    from oracles.rank_sim.head import padded_vocab

    m, lay = ctx.model, ctx.layout
    emb = Embedding(padded_vocab(m.vocab, lay.tp) // lay.tp, m.hidden, lay.tp, lay.sp)
    emb.weight.requires_grad_(ctx.adapters.full)
    return emb


def _training(ctx: RankContext, set_label: Any) -> Any:
    """Full training's step-wide pieces (training.py), or nothing."""
    if not ctx.adapters.full:
        return contextlib.nullcontext()
    from oracles.rank_sim.training import full_training

    return full_training(set_label)


def check_micro_batch(
    model: SimModel, layout: RankLayout, micro_batch: int, mtp_kinds: tuple[str, ...] = ()
) -> None:
    """The micro-batch rows must split every Mamba layer's tokens; megatron's Mamba
    asserts (head and group counts, CP) as input errors (mamba.py). ``mtp_kinds``: the
    MTP depths' mixers, where they run."""
    if isinstance(micro_batch, bool) or not isinstance(micro_batch, int) or micro_batch < 1:
        raise SimInputError("micro_batch", micro_batch, "must be an integer >= 1")
    if not model.mamba_layers and "mamba" not in mtp_kinds:
        return
    from oracles.rank_sim.mamba import check_mamba

    check_mamba(model, layout.tp, layout.cp, layout.attention_tokens)
    if layout.attn_local % micro_batch:
        raise SimInputError(
            "micro_batch", micro_batch, f"does not divide the rank's {layout.attn_local} tokens"
        )


def _needs_input_grad(ctx: RankContext) -> bool:
    from oracles.rank_sim.adapters import TARGETS

    rc = ctx.recompute
    return not rc.no_grad and ctx.adapters.targets != TARGETS and (rc.mlp or rc.moe)


def _step(
    ctx: RankContext,
    layers: Any,
    tracker: LiveBytesTracker,
    first: int,
    longest: int,
    lm_head: Any = None,
    extra: _Extras | None = None,
) -> RankResult:
    model, layout, rc = ctx.model, ctx.layout, ctx.recompute
    extra = extra or _Extras()
    grad = torch.no_grad() if rc.no_grad else torch.enable_grad()
    labels = ids = positions = loss_mask = None
    if lm_head is not None:  # the batch's labels: one int64 per token the rank's head sees
        last = _stream_count(layout, model.kinds)
        with ctx.label("labels"):
            labels = torch.empty((last,), dtype=torch.int64)
            if extra.mtp is not None:  # MTP rolls the positions and the loss mask
                positions = torch.empty((last,), dtype=torch.int64)
                loss_mask = torch.empty((last,), dtype=torch.float32)
    if extra.embedding is not None:  # the token ids the embedding looks up
        with ctx.label("labels"):
            ids = torch.empty((first,), dtype=torch.int64)
    with grad:
        with ctx.label("embedding"):
            if ctx.adapters.full:  # the trained table's lookup (embedding.py)
                emb = extra.embedding(ids)
            else:
                emb = torch.empty((first, model.hidden), dtype=BF16)
                if layout.sp:  # vocab-parallel partial sums reduce-scattered over the sequence
                    from megatron.core.tensor_parallel import mappings

                    emb = mappings.reduce_scatter_to_sequence_parallel_region(emb)
            if model.embed_scale:  # Gemma: the lookup times sqrt(hidden), a fresh tensor
                emb = emb * model.hidden**0.5
            x = emb
            if rc.full and not rc.no_grad and not x.requires_grad:
                # megatron's reentrant checkpoint needs an input that requires grad
                x = x.detach().requires_grad_(True)
            elif _needs_input_grad(ctx):
                # adapters behind a checkpointed region whose inputs carry no grad (e.g.
                # only the experts adapted): make the embedding output require grad, as
                # PEFT's enable_input_require_grads does, or megatron's reentrant
                # checkpoint would give them none
                x = x.detach().requires_grad_(True)
            del emb
        if _tables(model, extra.mtp is not None):
            with ctx.label("rope"):
                tables = (torch.empty((longest, model.rope_width), dtype=BF16),) * 2
                ctx.rope = (tables[0], torch.empty_like(tables[1]))
                del tables
        count = first
        for layer in layers:
            want = _count(layout, layer.kind)
            if layer.kind and want != count:
                with ctx.label("relayout"):
                    x = K.Relayout.apply(x, ctx.local(want))
                count = want
            x = layer(x)
        if lm_head is None:
            with ctx.label("output"):
                out = gather_sp(x, layout)
                if layout.cp > 1:
                    counts = (
                        layout.attention_tokens if count == layout.attn_local else layout.gdn_tokens
                    )
                    out = K.GatherTokens.apply(out, counts, ctx.cp_group)
                # unpack the packed row to the logical tokens (shared prefixes repeated)
                out = _unpack(out, layout.logical_tokens)
                loss = out.square().mean()
        elif extra.mtp is not None:
            loss = _mtp_head(lm_head, extra.mtp, x, (ids, positions, labels, loss_mask))
            out = None
        else:
            loss = lm_head(x, labels)
            out = None
        # the head's input (its final norm saves it anyway): backward's hook point
        body_out = x if lm_head is not None else None
        del x
    forward = tracker.peaks["forward"]
    retained = tracker.snapshot()
    fb_peak = forward
    head_bwd: list[PhasePeak] = []
    if not rc.no_grad:
        tracker.set_phase("backward")
        tracker.label = "backward"
        if body_out is not None and body_out.requires_grad:
            # the head's backward runs first; it ends when the body output's grad is made
            tracker.label = "head_backward"

            def _head_done(grad: torch.Tensor) -> None:
                peak = tracker.peaks["backward"]
                head_bwd.append(PhasePeak(peak.bytes, dict(peak.components)))
                tracker.label = "backward"

            body_out.register_hook(_head_done)
        del body_out
        loss.backward()
        fb = tracker.peaks["backward"]
        fb_peak = fb if fb.bytes > forward.bytes else forward
    else:
        del body_out
    ctx.rope = None  # the rope tables live through backward (recompute reads them)
    del loss, out, labels, ids, positions, loss_mask
    return RankResult(
        rank=layout.rank,
        attention_tokens=layout.attn_local,
        gdn_tokens=layout.gdn_local,
        forward_peak_bytes=forward.bytes,
        forward_backward_peak_bytes=fb_peak.bytes,
        retained_bytes=retained.bytes,
        components={
            "forward_peak": forward.components,
            "forward_backward_peak": fb_peak.components,
            "retained": retained.components,
            **({"head_backward_peak": head_bwd[0].components} if head_bwd else {}),
        },
    )


def _mtp_head(head: Any, mtp: Any, x: torch.Tensor, batch: tuple[Any, ...]) -> torch.Tensor:
    """``GPTModel._postprocess`` with MTP (mtp.py): the final norm, the MTP block, the
    depths' losses, then the main loss on chunk 0; the concatenation lives until the main
    loss is made (the frame's ``hidden_states``)."""
    from oracles.rank_sim.mtp import mtp_loss

    ids, positions, labels, loss_mask = batch
    h = head.norm(x)
    del x
    cat = mtp(ids, positions, h)
    del h
    hidden = mtp_loss(head, cat, labels, loss_mask, mtp.depths)
    return head.loss(hidden, labels)


class _Unpack(torch.autograd.Function):
    """index_select of the packed row into the logical sequences (a fresh buffer)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, logical: int) -> torch.Tensor:
        ctx.rows = x.shape[0]
        return x.new_empty((logical, *x.shape[1:]))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return grad.new_empty((ctx.rows, *grad.shape[1:])), None


def _unpack(x: torch.Tensor, logical: int) -> torch.Tensor:
    return _Unpack.apply(x, logical)
