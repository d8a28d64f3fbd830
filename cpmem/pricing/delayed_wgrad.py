"""What ``--delay-wgrad-compute`` keeps through a layer's backward: Transformer Engine's
weight-gradient store.

Under it each Transformer Engine GEMM of a layer computes its input gradient in the
backward and puts its weight gradient's operands in its ``WeightGradStore`` until
megatron-core calls ``backward_dw``: a linear's saved input and its output gradient
(``wgrad_store.put([inputmat_total, grad_output], wgrad_gemm)``, linear.py:1164-1175 at
Transformer Engine b9d690e0), a grouped linear's inputs and output gradients per expert
(grouped_linear.py:1112-1113). The saved inputs are what the layer keeps for its
backward, priced in the retained set until the layer's backward ends; the output
gradients are what the delay adds: without it each is freed with its own GEMM's backward.

When ``backward_dw`` runs (megatron-core's combined 1F1B step, the only schedule that
allows the flag: ``transformer_config.py:2597-2601`` at 4828d651): in a layer's step the
``mlp`` node's (a dense layer's MLP, an MoE layer's routed experts) right after its input
gradients, before the dispatch's backward (``model_chunk_schedule_plan.py:271``); the
``attn`` node's (the attention, and an MoE layer's shared experts,
``fine_grained_callables.py:426-433``) at the step's end, after the other micro-batch's
MoE forward and combine (``:295``), the chunk's first layer's once the step has run its
communication (``:579``), before the other micro-batch's head and this one's embedding.
So a layer's backward holds one node's output gradients at a time: the larger of the two
nodes' is priced beside the layers' backward moment, the widest layer's (a bound: the
layer's own backward transient already holds some of them while its GEMMs run).

Each output gradient per token of the rank (the full sequence under TP): a
column-parallel linear's ``rows / TP``, a row-parallel one's ``hidden`` whole (its
gradient all-gathered over the sequence under SP before the GEMMs), a replicated one's
(latent attention's down projections) ``rows`` on the rank's sequence shard; a routed
expert's per row it holds (``Step.expert_rows_per_token``), its up projections split
over ETP. The router is not a Transformer Engine GEMM (``router.py``): nothing delayed.
"""

from __future__ import annotations

import math
from fractions import Fraction

from cpmem.model.geometry import ModelGeometry
from cpmem.pricing.kinds.linears import attention_linears, mlp_linears
from cpmem.pricing.layer_parameters import Linear
from cpmem.pricing.widths import sp_divisor
from cpmem.step.step import Step


def _grad_width(linear: Linear, tp: int, s: int) -> Fraction:
    """Output-gradient elements per token of one linear on a rank of ``tp`` (sequence
    shards ``s``): ``count`` alike for the routed experts is the caller's."""
    if linear.placement == "replicated":
        return Fraction(linear.rows, s)
    if linear.split == "cols":  # row-parallel: the whole hidden, the sequence gathered
        return Fraction(linear.rows)
    return Fraction(linear.rows, tp)


def attn_node_width(g: ModelGeometry, tp: int, s: int, moe: bool) -> Fraction:
    """The ``attn`` node's output gradients per token: the attention's linears, and an
    MoE layer's shared experts'."""
    linears = attention_linears(g)
    if moe and g.shared_expert_ffn:
        linears = (*linears, *mlp_linears(g, g.shared_expert_ffn, "shared_expert"))
    return sum((_grad_width(lin, tp, s) for lin in linears), Fraction(0))


def mlp_node_width(
    g: ModelGeometry, tp: int, s: int, moe: bool, rows: Fraction, etp: int
) -> Fraction:
    """The ``mlp`` node's output gradients per token: a dense MLP's, or the routed
    experts' per row held (``rows`` per token), their up projections over ETP."""
    if not moe:
        return sum((_grad_width(lin, tp, s) for lin in mlp_linears(g, g.ffn, "mlp")), Fraction(0))
    per_row = sum(
        (_grad_width(lin, etp, 1) for lin in mlp_linears(g, g.expert_ffn, "experts", 1)),
        Fraction(0),
    )
    return rows * per_row


def delayed_wgrad_width(step: Step) -> int:
    """Elements per token the weight-gradient store holds at most through one layer's
    backward (the larger node of the widest layer); 0 without ``--delay-wgrad-compute``."""
    if not step.settings.runtime.delay_wgrad:
        return 0
    g, layout = step.geometry, step.plan.layout
    tp, s = layout.tp, sp_divisor(layout.tp, layout.sp)
    rows = step.expert_rows_per_token() if g.is_moe else Fraction(0)
    widest = Fraction(0)
    for mixer, mlp in set(zip(g.mixers, g.mlps, strict=True)):
        moe = mlp == "moe"
        attn = attn_node_width(g, tp, s, moe) if mixer == "attention" else Fraction(0)
        node = mlp_node_width(g, tp, s, moe, rows, layout.etp) if mlp != "none" else Fraction(0)
        widest = max(widest, attn, node)
    return math.ceil(widest)


def delayed_wgrad_bytes(step: Step, tokens: int) -> int:
    """Bytes the weight-gradient store holds at most through a layer's backward on the
    rank holding ``tokens``, in the step's activation dtype."""
    return tokens * step.dtype_bytes * delayed_wgrad_width(step)
