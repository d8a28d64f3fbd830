# mypy: disable-error-code="no-untyped-call,no-any-return"
"""Multi-token prediction (MTP) depths on the last pipeline stage, restating Megatron-LM
at the recordings' snapshot (NVIDIA/Megatron-LM d98e8a64,
megatron/core/transformer/multi_token_prediction.py; megatron-core 0.16's copy has the
same training path) on the simulator's layers; megatron's own ``roll_tensor`` and
``MTPLossAutoScaler`` (installed) run as they are.

After the decoder's final layernorm (``TransformerBlock.final_layernorm``), in
``GPTModel._postprocess``, before the main loss:

1. ``MultiTokenPredictionBlock.forward``: per depth k = 1..D, the
   ``MultiTokenPredictionLayer`` (``mtp_use_repeated_layer``, ``shared`` here: one
   layer run D times):

   - ``_get_embeddings``: ``roll_tensor`` of the token ids and position ids (shift -1,
     each a new int64 tensor; the previous depth's are dropped), the shared embedding's
     lookup of the rolled ids (embedding.py);
   - ``_concat_embeddings``: ``enorm`` on the embedding output, ``hnorm`` on the
     previous depth's hidden states (the decoder's normed output at depth 1), each a
     norm that saves its input; ``torch.cat((e, h), -1)``: 2H; ``eh_proj``, megatron's
     ``ColumnParallelLinear`` 2H -> H/TP (a trained one saves the 2H concatenation, its
     local shard under SP; a frozen one saves nothing); ``gather_from_tensor_model_
     parallel_region`` (an all-gather along the last dim: H wide); under SP
     ``scatter_to_sequence_parallel_region``, whose ``_split_along_first_dim`` returns a
     view of the gathered tensor (``input_[offset:offset + n].contiguous()`` of a
     contiguous slice), so whatever keeps the depth's layer input keeps the whole
     gathered ``[tokens, H]``;
   - the depth's layer(s): Megatron GPT's ``get_gpt_mtp_block_spec`` takes the decoder's
     last layer spec (here: one attention layer, the model's attention, with the
     feed-forward of the decoder's last layer); a hybrid pattern's ``/`` part is the
     depth's layers (hybrid.py);
   - ``_postprocess``: the depth's own final layernorm;
   - under ``recompute_granularity == "full"`` (uniform, 1) the whole of
     ``_proj_and_transformer_layer`` (concatenation, projection, layers, final norm) is
     one reentrant checkpoint on the previous hidden states and the embedding output.

   Then ``torch.cat`` of the decoder's output and every depth's output along the
   sequence: one new ``[(1 + D) tokens, H]`` tensor.
2. ``process_mtp_loss``: ``torch.chunk`` of it (views); ``labels.clone()``; per depth
   the output layer on its chunk (the shared head), ``roll_tensor`` of the labels and of
   the loss mask, the cross entropy, ``loss_mask * loss`` (keeps the rolled fp32 mask),
   the logged loss and the acceptance counts (no grad: an argmax over the vocabulary
   shards), and ``MTPLossAutoScaler.apply(hidden, scale * loss / tokens)``, which keeps
   the per-token fp32 scaled loss until backward. Each depth's bf16 logits stay alive
   until the next depth's output layer returns (the loop's one variable).
3. The main output layer and loss on chunk 0 (through the autoscalers); the
   concatenation lives as long as ``GPTModel._postprocess``'s frame.

Batch tensors of an MTP step (label ``labels``, with the labels): the token ids, the
position ids (int64) and the fp32 loss mask, one each per token of the rank.

Packed rows roll as one sequence (megatron's ``_roll_tensor_packed_seq`` rolls each
sequence with buffers of the same sizes); MTP's logging tracker (three ``num_layers``
fp32 tensors, kept across steps) is not allocated.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from torch import nn

from oracles.rank_sim.geometry import SimInputError, SimModel

BF16, F32 = torch.bfloat16, torch.float32
MTP_LOSS_SCALE = 0.1  # megatron's mtp_loss_scaling_factor default (TransformerConfig)


def depth_stack(model: SimModel) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """One depth's layers: (mixers, feed-forwards). A hybrid pattern's ``/`` part where
    the model has one; else Megatron GPT's rule, one layer of the decoder's last kind,
    taken as the model's attention (a full-attention layer: the last layer of every
    family here that has MTP) with the decoder's last feed-forward."""
    if model.mtp_kinds:
        return model.mtp_kinds, model.mtp_mlp_kinds
    return ("attention",), (model.mlp_kind(model.layers - 1),)


def depth_model(model: SimModel) -> SimModel:
    """The model whose layers are one depth's (full attention, no pipeline segments)."""
    kinds, mlps = depth_stack(model)
    return replace(model, kinds=kinds, mlp_kinds=mlps, windows=(), pipeline_segments=())


def check_mtp(model: SimModel, depths: int, head: Any, counts: tuple[int, int]) -> None:
    """MTP's inputs as errors naming the field: a count >= 0; the LM head megatron's
    (its output layer computes every depth's loss); the depth's layers readable; the
    head's tokens those of the depth's layers (``counts``: the rank's attention and GDN
    token counts, which must agree)."""
    if isinstance(depths, bool) or not isinstance(depths, int) or depths < 0:
        raise SimInputError("mtp_depths", depths, "must be an integer >= 0")
    if not depths:
        return
    if head.kind not in ("logits", "fused"):
        raise SimInputError(
            "mtp_depths", depths,
            f"MTP losses run megatron's output layer: give head logits or fused, not {head.label}",
        )  # fmt: skip
    if not model.mtp_kinds and model.family in ("megatron_hybrid", "nemotron_h"):
        raise SimInputError(
            "mtp_depths", depths, "a hybrid stack's MTP layers come from '/' in its pattern"
        )
    if counts[0] != counts[1]:
        raise SimInputError(
            "mtp_depths", depths, "MTP needs equal attention and GDN token counts on the rank"
        )
    # imported outside the fake-tensor mode: MTPLossAutoScaler's class attribute (the main
    # loss's backward scale) is a real tensor made at import
    import megatron.core.transformer.multi_token_prediction  # noqa: F401


class MTPDepth(nn.Module):
    """One ``MultiTokenPredictionLayer``: enorm, hnorm, eh_proj, the depth's layers, the
    final layernorm (module docstring)."""

    def __init__(self, ctx: Any, cfg: Any, embedding: Any) -> None:
        super().__init__()
        from megatron.core.tensor_parallel.layers import ColumnParallelLinear

        from oracles.rank_sim.layers import _frozen, build_layers

        m = ctx.model
        self.ctx, self.embedding = ctx, [embedding]  # shared, not this module's parameter
        self.enorm_w, self.hnorm_w, self.final_w = (_frozen(m.hidden) for _ in range(3))
        self.eh_proj = ColumnParallelLinear(
            2 * m.hidden, m.hidden, config=cfg, init_method=nn.init.zeros_, bias=False,
            gather_output=False, skip_bias_add=False,
        )  # fmt: skip
        full = ctx.adapters.full
        self.eh_proj.gradient_accumulation_fusion = full and ctx.adapters.wgrad_fusion
        ctx.model = depth_model(m)
        try:
            self.layers = build_layers(ctx)
        finally:
            ctx.model = m
        for name, p in self.named_parameters():
            if not name.startswith("layers."):
                p.requires_grad_(full)

    def proj_and_layers(self, hidden: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        """``_proj_and_transformer_layer``: concatenation, projection, layers, final norm."""
        from megatron.core.tensor_parallel import mappings

        from oracles.rank_sim.layers import rmsnorm

        ctx = self.ctx
        with ctx.label("mtp"):
            e = rmsnorm(emb, self.enorm_w)
            h = rmsnorm(hidden, self.hnorm_w)
            x = torch.cat((e, h), -1)
            del e, h
            x, _ = self.eh_proj(x)
            x = mappings.gather_from_tensor_model_parallel_region(x)
            if ctx.layout.sp:
                x = mappings.scatter_to_sequence_parallel_region(x)
        prefix, ctx.prefix = ctx.prefix, "mtp."  # the depth's layers: labels "mtp.<kind>"
        try:
            for layer in self.layers:  # inside the depth's checkpoint under full recompute
                x = layer.body(x) if ctx.recompute.full else layer(x)
        finally:
            ctx.prefix = prefix
        with ctx.label("mtp"):
            return rmsnorm(x, self.final_w)

    def forward(
        self, ids: torch.Tensor, positions: torch.Tensor, hidden: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        from megatron.core.transformer.multi_token_prediction import roll_tensor

        ctx = self.ctx
        with ctx.label("mtp"):
            ids, _ = roll_tensor(ids, shifts=-1, dims=-1, cp_group=ctx.cp_group)
            positions, _ = roll_tensor(positions, shifts=-1, dims=-1, cp_group=ctx.cp_group)
            emb = self.embedding[0](ids)
        if ctx.recompute.full and not ctx.recompute.no_grad:
            out = ctx.recompute.checkpoint(self.proj_and_layers, hidden, emb)
        else:
            out = self.proj_and_layers(hidden, emb)
        return out, ids, positions


class MTPBlock(nn.Module):
    """``MultiTokenPredictionBlock``: D depths (one shared layer when ``shared``)."""

    def __init__(self, ctx: Any, cfg: Any, embedding: Any, depths: int, shared: bool) -> None:
        super().__init__()
        self.depths = depths
        self.layers = nn.ModuleList(
            MTPDepth(ctx, cfg, embedding) for _ in range(1 if shared else depths)
        )

    def forward(
        self, ids: torch.Tensor, positions: torch.Tensor, hidden: torch.Tensor
    ) -> torch.Tensor:
        outs = [hidden]
        for k in range(self.depths):
            hidden, ids, positions = self.layers[k % len(self.layers)](ids, positions, hidden)
            outs.append(hidden)
        del hidden, ids, positions
        with self.layers[0].ctx.label("mtp"):
            return torch.cat(outs, dim=0)


def _acceptance(logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor, tp: int) -> None:
    """``_compute_mtp_acceptance_counts`` under no_grad: the (vocab-parallel) argmax and
    the match counts; every tensor transient."""
    with torch.no_grad():
        if tp > 1:  # _vocab_parallel_argmax
            values, index = logits.max(dim=-1)
            vals = torch.stack([torch.empty_like(values) for _ in range(tp)], dim=0)
            idx = torch.stack([torch.empty_like(index) for _ in range(tp)], dim=0)
            del values, index
            rank = vals.argmax(dim=0)
            local = torch.gather(idx, 0, rank.unsqueeze(0)).squeeze(0)
            del vals, idx
            preds = rank * logits.shape[-1] + local
            del rank, local
        else:
            preds = torch.argmax(logits, dim=-1)
        valid = mask.bool()
        ((preds == labels) & valid).sum().float()
        valid.sum().float()


def mtp_loss(
    head: Any, cat: torch.Tensor, labels: torch.Tensor, loss_mask: torch.Tensor, depths: int
) -> torch.Tensor:
    """``process_mtp_loss`` (module docstring): the depths' losses folded into chunk 0 of
    ``cat``, which it returns (through ``MTPLossAutoScaler``)."""
    from megatron.core.transformer.multi_token_prediction import MTPLossAutoScaler, roll_tensor

    ctx = head.ctx
    with ctx.label("mtp_head"):
        chunks = torch.chunk(cat, 1 + depths, dim=0)
        hidden = chunks[0]
        mtp_labels = labels.clone()
        loss_mask.sum()  # original_num_tokens (per-token loss off: unused)
        mtp_logits: Any = None
        for k in range(depths):
            mtp_logits = head.logits(chunks[k + 1])
            mtp_labels, _ = roll_tensor(mtp_labels, shifts=-1, dims=-1, cp_group=ctx.cp_group)
            loss_mask, num_tokens = roll_tensor(
                loss_mask, shifts=-1, dims=-1, cp_group=ctx.cp_group
            )
            loss = head.cross_entropy(mtp_logits, mtp_labels)
            loss = loss_mask * loss
            if not ctx.recompute.no_grad:  # is_training: the logged loss, acceptance
                (torch.sum(loss) * (num_tokens > 0).to(loss.dtype)) / num_tokens.clamp(min=1)
                _acceptance(mtp_logits, mtp_labels, loss_mask, ctx.layout.tp)
            scale = MTP_LOSS_SCALE / depths
            hidden = MTPLossAutoScaler.apply(hidden, scale * loss / num_tokens.clamp(min=1))
        return hidden  # mtp_logits, the last depth's, lives until here
