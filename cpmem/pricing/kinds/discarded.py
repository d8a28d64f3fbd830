"""What megatron-core's output-discarding checkpoints drop from a layer's saved set: the
``layernorm``, ``moe_act`` and ``mla_up_proj`` entries of ``--recompute-modules``, in
elements per token of the rank, read by the attention and feed-forward kinds' specs
(``shared_experts``, a plain checkpoint of the shared experts, is the MoE kind's own).

megatron-core at the recordings' snapshot runs each of them under
``tensor_parallel.CheckpointWithoutOutput``: the module's forward runs without
gradients (it saves nothing), the checkpoint keeps the module's inputs, and once the
module's consumer has run, ``discard_output_and_register_recompute`` frees its output's
storage (every view of it included: what the consumer saved of it goes too) and hooks the
recompute to the consumer's output gradient, so the layer's backward rebuilds the module,
with its saved set, before it needs them (tensor_parallel/random.py,
``CheckpointWithoutOutput``). What a module drops is therefore its own saved set and its
output; its inputs stay.

- ``layernorm`` (transformer_layer.py:475-530): the input norm and the pre-MLP norm where
  each is a module of its own, not ``IdentityOp``: Transformer Engine's layer spec fuses
  a dense layer's norms into the next linear (``TELayerNormColumnParallelLinear``) and
  keeps them as modules for latent attention's input norm and an MoE layer's pre-MLP norm
  (models/gpt/gpt_layer_specs.py:296-313, ``get_gpt_layer_with_transformer_engine_
  submodules``); the local spec keeps every norm a module (gpt_layer_specs.py:416-433).
  The norm's input (the residual stream) stays; its output (``H/s`` on the rank's
  sequence shard) is dropped.
- ``moe_act`` (moe/experts.py:1019-1030): the routed experts' activation with the
  probabilities' scaling; its input, fc1's output, stays; every tensor it made (its saved
  set and the scaled output fc2 saves) is dropped.
- ``mla_up_proj`` (multi_latent_attention.py:983-988, 455-457): the query's and the KV's
  up projections and the rope; its inputs (the compressed query, the KV down projection's
  output and the rope key) stay; the up projections' saved inputs beyond those (their
  norms' outputs and the SP-gathered copies) and the query, key and value the core
  attention takes are dropped. The core attention's output is the output projection's
  input, outside the checkpoint: it stays.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Literal

from cpmem.model.geometry import ModelGeometry
from cpmem.pricing.widths import sp_divisor
from cpmem.step.recompute import Module
from cpmem.step.step import Step

Sublayer = Literal["attention", "dense", "moe"]


def norm_is_module(geometry: ModelGeometry, step: Step, sublayer: Sublayer) -> bool:
    """Whether the sub-layer's input norm is a module of its own (a ``layernorm``
    checkpoint covers it): always under the local spec; under Transformer Engine's, latent
    attention's input norm and an MoE layer's pre-MLP norm (the others are fused into the
    next linear). A model without pre-norms has none."""
    if not geometry.pre_norms:
        return False
    if step.settings.runtime.transformer_impl == "local":
        return True
    return sublayer == "moe" or (sublayer == "attention" and geometry.is_mla)


def layernorm_dropped(geometry: ModelGeometry, step: Step, tp: int, sublayer: Sublayer) -> int:
    """What a ``layernorm`` checkpoint drops of the sub-layer: its norm's output on the
    rank's sequence shard (``H/s``), where the norm is a module of its own."""
    if not step.recompute.checkpoints(Module.LAYERNORM):
        return 0
    if not norm_is_module(geometry, step, sublayer):
        return 0
    return geometry.hidden // sp_divisor(tp, step.plan.layout.sp and tp > 1)


def mla_up_proj_dropped(geometry: ModelGeometry, step: Step, tp: int) -> int:
    """What an ``mla_up_proj`` checkpoint drops of a latent attention layer: the core's
    query and key (``heads x (d_nope + d_rope)`` each) and value (``heads x d_v``), sharded
    by TP, and the up projections' saved norm outputs (``r_kv/s``, ``r_q/s``) with their
    SP-gathered copies (``r_kv``, ``r_q``): the parts of ``widths.mla_core_width`` beyond
    the checkpoint's inputs and the core's output."""
    g = geometry
    if not g.is_mla or not step.recompute.checkpoints(Module.MLA_UP_PROJ):
        return 0
    s = sp_divisor(tp, step.plan.layout.sp and tp > 1)
    gathered = s > 1
    width = g.q_heads * (2 * g.head_dim + g.v_head_dim) // tp
    width += g.kv_lora_rank // s + (g.kv_lora_rank if gathered else 0)
    if g.q_lora_rank:
        width += g.q_lora_rank // s + (g.q_lora_rank if gathered else 0)
    return width


def moe_act_dropped(
    geometry: ModelGeometry, step: Step, rows: Fraction, row_f: int, fe: int
) -> int:
    """What a ``moe_act`` checkpoint drops of an MoE layer: per routed row (``rows`` per
    token) the ``row_f`` F_e-wide tensors the row keeps (``fe``: the rank's slice of
    ``F_e``) but fc1's output, the activation's input the checkpoint keeps (``2F_e``
    gated, ``F_e`` plain)."""
    if not geometry.is_moe or not step.recompute.checkpoints(Module.MOE_ACT):
        return 0
    kept = 2 if geometry.gated_mlp else 1
    return math.ceil(rows * (row_f - kept) * fe)
