# mypy: disable-error-code="no-untyped-call,no-any-return"
"""One rank of a megatron-core 0.16 MoE block (``MoELayer`` with the ``alltoall``
dispatcher, expert tensor parallel 1), written from torch ops and shape-only autograd
functions that mirror the installed megatron source's saved set.

megatron's own ``MoELayer`` is not run: its dispatcher reads the routing's counts back
to the host (``tokens_per_expert.tolist()``, the all-to-all split sizes) and sizes
buffers from them, which fake tensors cannot answer, and the routing is an input here
(``balanced`` / ``concentrated``), not the outcome of random router weights. Each step
below names the megatron function it restates (megatron/core/transformer/moe/):

- ``TopKRouter.gating`` -> ``RouterGatingLinearFunction``: fp32 logits (Qwen3.5-MoE
  routes in fp32), the function saves its bf16 input; the router weight is a bare
  parameter, not a Column/RowParallelLinear, so it carries no LoRA. ``topk_routing_with_
  score_function`` (softmax after top-k, which renormalises the top-k as Qwen3.5-MoE's
  ``norm_topk_prob`` does): top-k values and indices, the fp32 top-k softmax (saves its
  output), dense fp32 probs and the bool routing map (tokens x experts). No auxiliary
  load-balancing loss (a fine-tune's coefficient is not recorded).
- ``MoEAlltoAllTokenDispatcher``: ``permute`` (unfused: the transposed routing map, the
  sorted token indices, ``index_select`` of the local tokens to tokens x top-k rows, the
  probs' ``masked_select``), the EP all-to-all of rows and probs, ``sort_chunks_by_idxs``
  by local expert (split + cat: a fresh copy). ``MoELayer.forward``'s ``custom_forward``
  keeps the permuted tokens (``hidden_states``) and the all-to-all output
  (``dispatched_input``) until it returns; ``routed_experts_compute`` keeps the sorted
  rows and probs through ``combine_preprocess``'s un-sort. ``dispatch_preprocess`` stores
  ``self.probs``, ``self.routing_map`` and ``self.reversed_local_input_permutation_mapping``
  on the dispatcher, never cleared: each layer holds them after its forward.
- Experts: the local experts as one grouped op over all received rows (the sum of the
  per-expert saved sets of ``SequentialMLP``'s expert MLPs): frozen fc1/fc2 (megatron's
  ``LinearWithFrozenWeight``: no saved input) plus a rank-R LoRA per expert linear when
  ``experts`` is a LoRA target (saves its input, or its dropped copy and mask, and the
  R-wide activation); the probs-weighted SwiGLU is megatron's unfused
  GLU path in eager mode and one fused kernel under ``--compiled`` (``MoE.activation``).
- Combine: un-sort by expert (copy), the reverse all-to-all, ``unpermute`` (``scatter_add``
  into a zeroed tokens x hidden buffer; saves only the indices).
- ``SharedExpertMLP``: a dense SwiGLU MLP sharded by TP (SP gather in front of the
  column-parallel fc1, reduce-scatter after fc2; LoRA as the ``fc1`` / ``fc2`` targets say;
  its activation the dense MLP's, ``MLP.forward``: fused, or megatron's unfused GLU where
  the model's SwiGLU is not fused), and the Qwen3.5
  sigmoid gate ``output * sigmoid(linear(x, gate_weight))`` (the product saves the
  expert output and the gate score); added to the routed output.
- Selective recompute ``moe``: megatron's reentrant ``tensor_parallel.checkpoint`` around
  ``MoELayer.forward`` on the pre-MLP norm output (``moe_layer_recompute``).

Routing decides how many rows the simulated rank's experts receive (:func:`expert_rows`).
Every rank of the EP group is taken to route as many tokens as the simulated rank (TP x EP
under SP: the EP ranks are the TP ranks of one sequence).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from oracles.rank_sim.geometry import SimInputError, SimModel

BF16 = torch.bfloat16
F32 = torch.float32
ROUTINGS = ("balanced", "concentrated")


def check_routing(routing: str) -> str:
    if routing not in ROUTINGS:
        raise SimInputError("routing", routing, f"one of {', '.join(ROUTINGS)}")
    return routing


def expert_rows(model: SimModel, local_tokens: int, ep: int, routing: str) -> int:
    """Rows the simulated rank's local experts receive in one MoE layer.

    The EP group routes ``local_tokens * ep`` tokens, ``top_k`` copies each.
    ``balanced``: every expert gets tokens x top-k / experts (rounded up); the rank holds
    experts / EP of them. ``concentrated`` (the measured cells' ``concentrated_routing``
    and cpmem's safe assumption): every routed copy of the group lands on this rank's
    experts (at most one copy per token and local expert)."""
    check_routing(routing)
    copies = local_tokens * ep * model.moe_top_k
    local_experts = model.num_experts // ep
    if routing == "balanced":
        return -(-copies // model.num_experts) * local_experts
    return local_tokens * ep * min(model.moe_top_k, local_experts)


def _frozen(*shape: int, dtype: torch.dtype = BF16) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)


class RouterGating(torch.autograd.Function):
    """megatron's ``RouterGatingLinearFunction``: logits in the router dtype; saves the
    input and weight."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        return x.new_empty((x.shape[0], weight.shape[0]), dtype=F32)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        x, _w = ctx.saved_tensors
        return x.new_empty(x.shape), None


class Rows(torch.autograd.Function):
    """A data-dependent row movement with no saved activation: ``index_select`` /
    ``masked_select`` by precomputed indices, the EP all-to-all, ``sort_chunks_by_idxs``
    (split + cat). A fresh buffer of ``rows`` rows; backward a fresh buffer of the input's
    shape. The indices live in the caller (they are saved by ``unpermute``)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, rows: int) -> torch.Tensor:
        ctx.shape = x.shape
        return x.new_empty((rows, *x.shape[1:]))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return grad.new_empty(ctx.shape), None


class MaskedSelect(torch.autograd.Function):
    """``probs.T.contiguous().masked_select(routing_map.T)`` (megatron ``permute``): saves
    the mask for backward."""

    @staticmethod
    def forward(ctx: Any, probs_t: torch.Tensor, mask_t: torch.Tensor, rows: int) -> torch.Tensor:
        ctx.save_for_backward(mask_t)
        ctx.shape = probs_t.shape
        return probs_t.new_empty((rows,))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return grad.new_empty(ctx.shape), None, None


class Unpermute(torch.autograd.Function):
    """megatron ``unpermute`` (unfused, probs already applied by the experts): a zeroed
    (tokens, hidden) buffer ``scatter_add_``-ed from the rows; saves the indices only."""

    @staticmethod
    def forward(ctx: Any, rows: torch.Tensor, indices: torch.Tensor, tokens: int) -> torch.Tensor:
        ctx.save_for_backward(indices)
        ctx.rows = rows.shape
        return rows.new_empty((tokens, rows.shape[1]))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return grad.new_empty(ctx.rows), None, None


class GroupedLinear(torch.autograd.Function):
    """Every local expert's frozen linear over that expert's rows, without an adapter
    (``LinearWithFrozenWeight``: saves no input); backward allocates the input gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ctx.shape = x.shape
        return x.new_empty((x.shape[0], weight.shape[1]))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return grad.new_empty(ctx.shape), None


class GroupedLoRALinear(torch.autograd.Function):
    """Every local expert's frozen linear plus its rank-R adapter over that expert's rows,
    ``linear(x_e, W_e) + linear(linear(drop(x_e), A_e), B_e)``: the frozen part saves no
    input (``LinearWithFrozenWeight``); the adapter saves its input (the rows, views of
    one buffer, or ``xa``, their dropped copy, when adapter dropout is on) and the R-wide
    activation. Per expert the frozen and adapter outputs are summed at once, so only the
    summed rows outlive the op. Backward allocates the input gradient, the R-wide
    gradient and the adapter gradients (and, with dropout, the adapter input's gradient,
    which the dropout's backward folds into the rows' gradient)."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, weight: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
        rank: int = 1, xa: torch.Tensor | None = None,
    ) -> torch.Tensor:  # fmt: skip
        mid = x.new_empty((x.shape[0], rank))
        ctx.dropped = xa is not None
        ctx.save_for_backward(xa if xa is not None else x, mid, a, b)
        return x.new_empty((x.shape[0], weight.shape[1]))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        x, mid, a, b = ctx.saved_tensors
        dmid = mid.new_empty(mid.shape)
        da, db = a.new_empty(a.shape), b.new_empty(b.shape)
        dx = x.new_empty(x.shape)
        dxa = x.new_empty(x.shape) if ctx.dropped else None
        del dmid
        return dx, None, da, db, None, dxa


class WeightedSwiGLU(torch.autograd.Function):
    """megatron ``weighted_bias_swiglu_impl``: silu(h0) * h1 * prob per row; saves the
    gate-up input and the fp32 probs."""

    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(h, probs)
        return h.new_empty((h.shape[0], h.shape[1] // 2))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        h, probs = ctx.saved_tensors
        return h.new_empty(h.shape), probs.new_empty(probs.shape)


class MoE(nn.Module):
    """Pre-norm MoE sub-layer of one rank: norm, ``MoELayer`` (router, dispatch, local
    experts, combine, gated shared expert), residual add."""

    def __init__(self, ctx: Any, cfg: Any) -> None:
        super().__init__()
        from oracles.rank_sim.adapters import LoRAColumn, LoRARow

        m, t = ctx.model, ctx.layout.tp
        self.ctx = ctx
        self.ep = ctx.ep
        self.local_experts = m.num_experts // self.ep
        self.norm_w = _frozen(m.hidden)
        self.router_w = _frozen(m.num_experts, m.hidden)
        fe, h, el = m.expert_ffn, m.hidden, self.local_experts
        # weights laid out (in, out) per expert; sizes only matter
        self.fc1_w = _frozen(el * h, 2 * fe)
        self.fc2_w = _frozen(el * fe, h)
        spec = ctx.adapters
        self.adapted, self.rank, self.p = spec.on("experts"), spec.rank, spec.dropout
        if self.adapted:  # per expert: A (R x in), B (out x R); laid out (experts, R * width)
            r = spec.rank
            self.fc1_a = nn.Parameter(torch.empty(el, r * h, dtype=BF16))
            self.fc1_b = nn.Parameter(torch.empty(el, r * 2 * fe, dtype=BF16))
            self.fc2_a = nn.Parameter(torch.empty(el, r * fe, dtype=BF16))
            self.fc2_b = nn.Parameter(torch.empty(el, r * h, dtype=BF16))
        self.shared = m.shared_expert_ffn > 0
        self.dispatcher_state: tuple[torch.Tensor, ...] = ()
        if self.shared:
            self.sh_fc1 = LoRAColumn(h, 2 * m.shared_expert_ffn // t, cfg, t, spec, "fc1")
            self.sh_fc2 = LoRARow(m.shared_expert_ffn // t, h, cfg, ctx.layout, spec, "fc2")
            if m.shared_expert_gated:
                self.sh_gate_w = _frozen(1, h)
        # DeepSeek-V3's e_score_correction_bias (megatron's fp32 ``expert_bias`` buffer)
        self.score_bias = _frozen(m.num_experts, dtype=F32) if m.expert_score_bias else None
        # gpt-oss: each expert's fc2 bias, added after fc2 weighted by the row's prob
        self.fc2_bias = _frozen(el, h) if m.expert_bias else None

    def experts_linear(self, x: torch.Tensor, which: int) -> torch.Tensor:
        """The local experts' fc1 (``which`` 1) or fc2 (2), with or without adapters, or
        trained (full training: training.py)."""
        weight = self.fc1_w if which == 1 else self.fc2_w
        spec = self.ctx.adapters
        if spec.full:
            from oracles.rank_sim.training import TrainedGroupedLinear

            return TrainedGroupedLinear.apply(x, weight, self.local_experts, spec.wgrad_fusion)
        if not self.adapted:
            return GroupedLinear.apply(x, weight)
        a, b = (self.fc1_a, self.fc1_b) if which == 1 else (self.fc2_a, self.fc2_b)
        if self.p == 0.0:
            return GroupedLoRALinear.apply(x, weight, a, b, self.rank)
        xa = torch.native_dropout(x, self.p, True)[0]  # adapters.adapter_input
        return GroupedLoRALinear.apply(x, weight, a, b, self.rank, xa)

    def rows(self, local_tokens: int) -> int:
        return expert_rows(self.ctx.model, local_tokens, self.ep, self.ctx.routing)

    def shared_expert(self, hn: torch.Tensor) -> torch.Tensor:
        from oracles.rank_sim import kernels as K
        from oracles.rank_sim.layers import mlp_activation

        _held, up = self.sh_fc1.project(hn, keep_local=False)  # held until return
        # SharedExpertMLP.forward is MLP.forward: a gated model's shared expert takes the
        # dense MLP's activation path (fused or megatron's unfused GLU); the shared expert
        # of a model whose dense MLP is not gated is restated as a fused SwiGLU
        gated = self.ctx.model.mlp_gated
        act = mlp_activation(self.ctx, up) if gated else K.FusedSwiGLU.apply(up)
        del up
        out = self.sh_fc2(act)
        del act
        if not self.ctx.model.shared_expert_gated:  # DeepSeek's shared experts
            return out
        gate = torch.sigmoid(F.linear(hn, self.sh_gate_w))
        return out * gate

    def topk(self, scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``compute_topk`` in ``topk_routing_with_score_function``: ``torch.topk``, or
        ``group_limited_topk`` (moe_utils.py) when the model keeps ``router_group_topk``
        groups: each group scored by the sum of its top (top-k / kept groups) scores,
        the best groups kept as a mask over their experts (an fp32 tokens x experts
        copy of the expanded group mask, its bool negation), the other experts' scores
        filled with -inf (``masked_fill`` saves the bool mask while its output lives),
        then top-k."""
        m = self.ctx.model
        k, keep = m.moe_top_k, m.router_group_topk
        if not keep:
            return torch.topk(scores, k=k, dim=1)
        n, e, g = scores.shape[0], m.num_experts, m.router_groups
        group_scores = scores.view(n, g, -1).topk(k // keep, dim=-1)[0].sum(dim=-1)
        group_idx = torch.topk(group_scores, k=keep, dim=-1, sorted=False)[1]
        group_mask = torch.zeros_like(group_scores)
        group_mask.scatter_(1, group_idx, 1)
        score_mask = group_mask.unsqueeze(-1).expand(n, g, e // g).reshape(n, -1)
        masked = scores.masked_fill(~score_mask.bool(), float("-inf"))
        return torch.topk(masked, k=k, dim=-1)

    def route(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``topk_routing_with_score_function`` (moe_utils.py, unfused) on the fp32
        logits: the top-k probs and indices. softmax after top-k (Qwen3.5-MoE, gpt-oss,
        Qwen3-MoE with ``norm_topk_prob``; the fp32 top-k softmax saves its output);
        softmax over every expert before top-k (``router_pre_softmax``: saves the fp32
        tokens x experts scores); sigmoid (DeepSeek-V3: saves the fp32 tokens x experts
        scores), top-k on the scores plus the correction bias, the scores gathered at
        those indices and normalised by their sum (the division saves both). Then
        ``* routed_scaling`` (megatron's ``moe_router_topk_scaling_factor``)."""
        m = self.ctx.model
        if m.router_score == "sigmoid":
            scores = torch.sigmoid(logits)
            if self.score_bias is not None:
                top = self.topk(scores + self.score_bias)[1]
                picked = torch.gather(scores, dim=1, index=top)
            else:
                picked, top = self.topk(scores)
            del scores
            if m.moe_top_k > 1:
                picked = picked / (picked.sum(dim=-1, keepdim=True) + 1e-20)
            probs_k = picked
        elif m.router_pre_softmax:
            probs_k, top = self.topk(torch.softmax(logits, dim=-1, dtype=F32))
        else:
            scores_k, top = self.topk(logits)
            probs_k = torch.softmax(scores_k, dim=-1, dtype=F32)
        if m.routed_scaling:
            probs_k = probs_k * m.routed_scaling
        return probs_k, top

    def clamped_glu(self, h: torch.Tensor) -> torch.Tensor:
        """gpt-oss's clamped SwiGLU as megatron's unfused GLU runs it (experts.py
        ``glu`` with ``activation_func_clamp_value`` and ``glu_linear_offset`` 1, the
        activation ``quick_gelu``, x * sigmoid(1.702 x)): both clamps save their input (a
        view of the fc1 output); ``quick_gelu`` is ``@jit_fuser`` (torch.compile) and
        keeps its input, the clamped gate half; the product keeps quick_gelu's output
        and ``up + 1``."""
        from oracles.rank_sim.gpt_oss_kernels import QuickGeLU

        lim = self.ctx.model.swiglu_limit
        gate, up = torch.chunk(h, 2, dim=-1)
        gate = gate.clamp(min=None, max=lim)
        up = up.clamp(min=-lim, max=lim)
        return QuickGeLU.apply(gate) * (up + 1.0)

    def expert_fc2_bias(self, out: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
        """``TEGroupedMLP._apply_bias`` (fc2 built with ``skip_bias_add``): per local
        expert ``t + b * p`` over its rows (bf16 bias times fp32 probs: fp32), the pieces
        concatenated (fp32) and cast back to bf16. Nothing is saved (the bias is frozen;
        the product's gradient for the probs needs only the bias); the fp32 pieces and
        their concatenation are forward transients. The rows are split evenly over the
        local experts (the routing inputs' assumption)."""
        assert self.fc2_bias is not None
        rows, el = out.shape[0], self.local_experts
        sizes = [rows // el + (1 if e < rows % el else 0) for e in range(el)]
        # the list is torch.cat's argument alone (as in megatron), so it is freed before
        # the cast
        split = zip(torch.split(out, sizes), self.fc2_bias, torch.split(probs, sizes), strict=True)
        return torch.cat([t + b * p for t, b, p in split]).to(out.dtype)

    def activation(self, h: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
        """The experts' SwiGLU scaled by each row's routing prob (``MLP.forward`` with
        ``per_token_scale``). Eager: megatron's unfused GLU, ``silu(x0) * (x1 + offset)``,
        then ``* probs`` in fp32 and back to bf16 (silu saves the gate half, i.e. the fc1
        output; the GLU product saves silu(x0) and x1 + offset; the scaling saves the GLU
        output and the fp32 probs). Compiled: one fused kernel (``weighted_bias_swiglu``'s
        saved set: the fc1 output and the probs), as inductor fuses the unfused GLU."""
        if self.ctx.compiled:
            return WeightedSwiGLU.apply(h, probs)
        if self.ctx.model.expert_activation == "clamped_swiglu":
            glu = self.clamped_glu(h)
        else:
            x0, x1 = torch.chunk(h, 2, dim=-1)
            glu = F.silu(x0) * (x1 + 0.0)
        return (glu * probs).to(h.dtype)

    def layer(self, hn: torch.Tensor) -> torch.Tensor:
        """``MoELayer.forward``'s custom_forward on the (local) pre-MLP norm output."""
        m = self.ctx.model
        n, k = hn.shape[0], m.moe_top_k
        shared = self.shared_expert(hn) if self.shared else None
        # route
        logits = RouterGating.apply(hn, self.router_w)
        probs_k, top = self.route(logits)
        probs = torch.zeros_like(logits).scatter(1, top, probs_k)
        routing_map = torch.zeros_like(logits).int().scatter(1, top, 1).bool()
        del logits, probs_k
        # dispatch_preprocess: permute (unfused)
        map_t = routing_map.T.contiguous()
        indices = top.new_empty((n * k,))  # token ids, sorted by expert (masked_select)
        permuted = Rows.apply(hn, n * k)  # index_select
        permuted_probs = MaskedSelect.apply(probs.T.contiguous(), map_t, n * k)
        # MoEAlltoAllTokenDispatcher.dispatch_preprocess keeps ``self.probs``,
        # ``self.routing_map`` and ``self.reversed_local_input_permutation_mapping`` on the
        # dispatcher; nothing clears them, so they live until this layer's next forward
        # (its recompute in backward replaces them)
        self.dispatcher_state = (probs, routing_map, indices)
        del routing_map, top
        # token_dispatch: EP all-to-all
        rows = self.rows(n)
        dispatched = Rows.apply(permuted, rows)
        dispatched_probs = Rows.apply(permuted_probs, rows)
        # custom_forward's ``hidden_states`` still names the permuted tokens (preprocess's
        # result): they live until MoELayer.forward returns; the permuted probs do not
        # (``probs`` is rebound to the dispatched probs)
        del permuted_probs
        # routed_experts_compute: dispatch_postprocess sorts by local expert; its
        # ``dispatched_input`` and ``permuted_probs`` live until it returns, i.e. through
        # the experts and combine_preprocess's un-sort
        if self.local_experts > 1:
            x, p = Rows.apply(dispatched, rows), Rows.apply(dispatched_probs, rows)
        else:
            x, p = dispatched, dispatched_probs
        # experts (grouped): fc1 + LoRA, probs-weighted SwiGLU, fc2 + LoRA
        fc1 = self.experts_linear(x, 1)
        act = self.activation(fc1, p[:, None])
        del fc1
        out = self.experts_linear(act, 2)
        del act
        if self.fc2_bias is not None:
            out = self.expert_fc2_bias(out, p[:, None])
        # combine_preprocess: un-sort; then routed_experts_compute returns
        if self.local_experts > 1:
            out = Rows.apply(out, rows)
        del x, p
        # combine: reverse all-to-all, unpermute (combine_postprocess), shared expert add
        out = Rows.apply(out, n * k)
        out = Unpermute.apply(out, indices, n)
        out = out + shared if shared is not None else out
        del dispatched, dispatched_probs, permuted  # MoELayer.forward's frame ends here
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from oracles.rank_sim.layers import rmsnorm

        ctx = self.ctx
        with ctx.label("moe"):
            hn = rmsnorm(x, self.norm_w)
            if ctx.recompute.moe or ctx.recompute.mlp:
                return x + ctx.recompute.checkpoint(self.layer, hn)
            return x + self.layer(hn)
