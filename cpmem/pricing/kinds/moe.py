"""The mixture-of-experts block (routed experts, a router, shared experts): its
parameters and adapters, the reference's width, and in ``tight`` megatron-core 0.16's
``MoELayer`` with the ``alltoall`` dispatcher, as the rank simulator restates it
(oracles/rank_sim/moe.py; oracles/rank_sim/README.md "MoE"): its saved set per routed row
and per token, and what its forward holds beyond it while it dispatches and combines
(``MOE``, its spec). Every per-row term of the experts counts the rows they hold: the
routed rows, each local expert's padded where the runtime pads them
(``cpmem.pricing.kinds.moe_padding``)."""

from __future__ import annotations

import math
from fractions import Fraction

from cpmem.model.geometry import ModelGeometry
from cpmem.plan.layout import ParallelLayout
from cpmem.pricing import adapters
from cpmem.pricing.kinds.discarded import layernorm_dropped, moe_act_dropped
from cpmem.pricing.kinds.fp8 import moe_fp8_width, shared_fp8_bytes
from cpmem.pricing.kinds.linears import moe_linears
from cpmem.pricing.kinds.mlp import mlp_norms, swiglu_saved
from cpmem.pricing.kinds.moe_dispatch import after_forward_rows, saved_beyond_alltoall
from cpmem.pricing.kinds.moe_padding import grouped_rows
from cpmem.pricing.kinds.spec import MlpSpec, TightContext, TrainedTensors
from cpmem.pricing.layer_parameters import (
    LayerParameters,
    Linear,
    fc1_width,
    sublayer_norm_tensors,
)
from cpmem.pricing.tight.calibrated import MOE_COMPILED_ROW_FP32_F
from cpmem.pricing.tight.widths import LORA_SUM_COPIES, TightWidths
from cpmem.pricing.widths import (
    LayerWidths,
    common_width,
    moe_rows_per_token,
    moe_width,
    sp_divisor,
)
from cpmem.step.recompute import Module, Recompute
from cpmem.step.step import Step
from cpmem.step.trainer import Adapter

MOE_ROW_EAGER_F = 6
"""F_e-multiples one routed expert row keeps in eager mode beside its H-wide input
(megatron-core 0.16's unfused probs-weighted GLU, ``bias_activation_fusion`` off, as the
rank simulator restates it in oracles/rank_sim/moe.py ``MoE.activation``): the fc1
output (``2F_e``, which ``silu`` saves), ``silu(x0)`` and ``x1 + 0`` (the GLU product's
inputs), the GLU output (saved by the fp32 probs scaling) and the scaled bf16 output
(fc2's LoRA input): ``H + 6·F_e`` per row. Simulator, Qwen3.5-35B-A3B TP4 EP4
``core_attn``, 4,096 and 8,192 tokens: concentrated minus balanced is 5,124 elements per
six rows per token and layer (``H + 6·F_e + MOE_ROW_SMALL``). It validates on the measured
eager concentrated ``core_attn`` cells within 0.978-1.011 (oracles/rank_sim/README.md,
"MoE"); the reference's ``2H + c·F_e`` keeps a second H-wide copy megatron's code does
not (7-8% over those cells in the simulator)."""

CLAMPED_GLU_ROW_F = 1
"""F_e-multiples gpt-oss's clamped GLU (``swiglu_limit``: the gate clamped above, the
linear part both ways, ``(up + 1) * gate * sigmoid(alpha * gate)``) keeps per routed row
beyond the eager GLU: torch's ``clamp`` saves its input, a view of the fc1 output the
row keeps anyway, so only the shifted ``up + 1`` factor is new. Rank simulator
(oracles/rank_sim/README.md "MoE families", gpt-oss-20b TP4 EP4 SP, 8,192 tokens):
``H + 7·F_e + 2`` per row where the SwiGLU experts keep ``H + 6·F_e + 2``. Compiled, the
fused kernel keeps the same set as without the clamp."""

MOE_ROW_PLAIN_F = 3
"""F_e-multiples one routed row of a plain (GeLU) expert MLP keeps beside its H-wide
input: fc1's output (the activation's input), the activation's output (kept by the
multiplication with the row's probability) and the weighted product (fc2's input):
``H + 3·F_e`` (megatron-core 0.16 ``experts.py`` with ``moe_apply_probs_on_input`` off;
Megatron-LM's MoE recordings)."""

MOE_ROW_COMPILED_F = 3
"""F_e-multiples one routed expert row keeps under torch.compile: the fused
``weighted_bias_swiglu`` saved set, the fc1 output (``2F_e``), and the activation output
fc2's LoRA saves (``F_e``): ``H + 3·F_e`` (the simulator's ``--compiled``; 3,588 elements
per row with ``MOE_ROW_SMALL``)."""

MOE_ROW_SMALL = 4
"""bf16-equivalent elements per expert row besides the H and F_e-wide tensors: the row's
fp32 routing prob (2; saved by the probs scaling) and the two rank-1 LoRA activations
(fc1's and fc2's adapters, 1 each). Simulator (above): 5,124 = H + 6·F_e + 4."""

MOE_ROUTER_PER_TOPK = 10
"""bf16-equivalent elements per local token and routed slot the router and ``permute``
keep (megatron ``topk_routing_with_score_function`` and the unfused ``permute``, as the
simulator restates them): the fp32 top-k softmax output (2), the int64 top-k indices (4,
saved by ``topk`` and the probs ``scatter``) and the int64 sorted token indices
(``unpermute`` saves them, 4). With the transposed bool routing map (``masked_select``
saves it: ``E`` bytes, ``E/2`` elements) per local token."""

ROUTER_ALL_SCORES_FP32 = 2
"""bf16-equivalent elements per expert and local token a router keeps where it scores
every expert before the top-k: the fp32 softmax over all router logits (Qwen3-MoE,
transformers' ``Qwen3MoeSparseMoeBlock``; megatron's ``moe_router_pre_softmax``) or the
fp32 sigmoid scores (DeepSeek-V3's ``DeepseekV3TopkRouter``), which the gather of the
chosen experts' weights saves for backward."""


def z_loss_width(geometry: ModelGeometry, s: int) -> int:
    """bf16-equivalent elements per token one MoE layer's router z-loss keeps on the rank
    (0 without it): ``torch.logsumexp`` saves its input, the rank's ``[tokens / s, E]``
    router logits, and its ``[tokens / s]`` result, which ``torch.square`` saves again
    (megatron-core 0.16 moe_utils.py:152-153, ``z_loss_func``, called by router.py:484-487
    in training with gradients), each element ``router_z_loss_bytes`` wide. Nothing else
    keeps the logits: the gating saves its input, the top-k its indices, the aux loss its
    own softmax."""
    if not geometry.router_z_loss_bytes:
        return 0
    return (geometry.num_experts + 1) * geometry.router_z_loss_bytes // 2 // s


FUSED_ROUTER_DROPS_PER_TOPK = 6
"""bf16-equivalent elements per local token and routed slot of ``MOE_ROUTER_PER_TOPK``
the fused router (``--moe-router-fusion``) does not keep: the unfused top-k's fp32
probabilities (the top-k softmax's output, or under sigmoid the normalising division's
numerator) and its int64 indices (saved by ``gather`` / ``scatter``; megatron-core
moe_utils.py:900-955 at the snapshot), 4 + 8 bytes. Transformer Engine's
``FusedTopkScoreFunction`` (b9d690e0, pytorch/router.py:59) saves only the routing map
(the bool map the dispatcher keeps anyway, ``dispatch_preprocess``) and one fp32
``[tokens, experts]`` intermediate, the score function's output (csrc/extensions/
router.cpp: ``intermediate_output``, ``at::kFloat``) whatever the score function:
``ROUTER_ALL_SCORES_FP32`` per expert, which the unfused router keeps only where it
scores every expert. The permutation's int64 sorted indices stay (4 of the 10)."""

MOE_DISPATCH_ROW_H = 3
"""H-multiples per expert row an MoE layer holds at its forward peak beyond its saved set
(megatron's ``MoELayer.forward`` as oracles/rank_sim/moe.py restates it): during the
combine the experts' fc2 output, its un-sorted copy (``sort_chunks_by_idxs``) and the
dispatched all-to-all output, which ``MoELayer.forward``'s frame keeps until the layer
returns; with the dispatched fp32 probs (2 elements per row). Per local token the dense
fp32 probs (``2E``) and one H-wide buffer (the shared expert's output). Simulator,
Qwen3.5-35B-A3B TP4 EP4 SP ``core_attn``, 8,192 tokens: forward peak minus the saved
sets is 49,808 elements per token concentrated (8 rows) and 12,932 balanced (2 rows),
eager and compiled alike = ``rows·(3H + 2) + (H + 2E)/s``."""


def kept_width(geometry: ModelGeometry, tp: int, sp: bool) -> int:
    """Elements per token an MoE sub-layer keeps outside its ``MoELayer`` (all a ``moe``
    checkpoint keeps of it): its pre-MLP norm's input and output (``2H/s``; the norm
    output is the checkpoint's input and the router's, which the router's gating linear
    saves). No SP-gathered copy: the router and the ``alltoall`` dispatcher take the
    rank's sequence shard (megatron-core 0.16 ``MoELayer.forward``;
    ``MoEAlltoAllTokenDispatcher`` at expert TP 1 gathers nothing over TP), and a shared
    expert's gathered input (``shared_width``) is recomputed inside the checkpoint. Rank
    simulator (tests/oracle/test_tight_simulated_facts.py): per local token the same at
    TP1 and TP2 SP, with and without a shared expert; gpt-oss-20B TP8 EP8 SP
    ``core_attn+moe``: 717 elements per token and MoE layer retained (``2H/8`` = 720)
    where a dense layer's norm/LoRA input (``common_width``) would add ``H``. The
    measured Qwen3.5-35B-A3B ``core_attn+moe`` cells (TP4 SP, a shared expert) are
    covered with it at +0.5% to +11.3% forward."""
    return common_width(geometry, tp, sp, lora=False)


def shared_width(geometry: ModelGeometry, tp: int, sp: bool, compiled: bool, lora: bool) -> int:
    """Elements per token a shared expert keeps (the harness's adapters on its ``fc1``
    and ``fc2``; ``cpmem.pricing.adapters`` adds or gives back the step's): its SwiGLU's
    saved set (``c·F_s/t``), the SP-gathered input its ``fc1`` adapter saves (``H``, under
    SP with LoRA: a trained ``fc1`` saves its own shard, the norm output), and a gated
    product's saved expert output (``H`` per local token). 0 without a shared expert."""
    if not geometry.shared_expert_ffn:
        return 0
    s = sp_divisor(tp, sp)
    width = swiglu_saved(geometry, compiled) * geometry.shared_expert_ffn // tp
    width += geometry.hidden if s > 1 and lora else 0
    return width + (geometry.hidden // s if geometry.shared_expert_gate else 0)


def expert_shard(geometry: ModelGeometry, etp: int) -> int:
    """The width of a routed expert's FFN on one rank: ``F_e / ETP``. megatron-core
    0.16's experts (``experts.py``) build fc1 column-parallel and fc2 row-parallel over
    the expert TP group, so each gathered row's fc1 output and activations are the
    rank's slice; the rows themselves are the ETP group's (``cpmem.step.routing``)."""
    return geometry.expert_ffn // max(etp, 1)


def row_f(geometry: ModelGeometry, compiled: bool) -> int:
    """The F_e-wide tensors one routed row keeps (``saved_width``): eager, compiled, a
    clamped GLU's, a plain MLP's."""
    if not geometry.gated_mlp:
        return MOE_ROW_PLAIN_F
    if compiled:
        return MOE_ROW_COMPILED_F + MOE_COMPILED_ROW_FP32_F
    clamp = CLAMPED_GLU_ROW_F if geometry.activation_clamp is not None else 0
    return MOE_ROW_EAGER_F + clamp


def act_dropped(geometry: ModelGeometry, w: TightWidths, step: Step) -> int:
    """What the ``layernorm``, ``moe_act`` and ``shared_experts`` checkpoints drop of an
    MoE layer (``cpmem.pricing.kinds.discarded``; a ``shared_experts`` checkpoint keeps
    its input, the norm's output, and drops the shared expert's saved set,
    ``shared_width``, under FP8 with its FP8 part, ``shared_fp8_bytes``); none beside a
    ``moe`` checkpoint, which drops all of it but its norm's input and output."""
    layernorm = layernorm_dropped(geometry, step, w.tp, "moe")
    rc = step.recompute
    if rc.checkpoints(Module.MOE):
        return layernorm
    rows = grouped_rows(step, w.tp)
    fe = expert_shard(geometry, step.plan.layout.etp)
    act = moe_act_dropped(geometry, step, rows, row_f(geometry, step.compiled), fe)
    shared = 0
    if rc.checkpoints(Module.SHARED_EXPERTS):
        sp = step.plan.layout.sp and w.tp > 1
        lora = step.settings.training == "lora"
        shared = shared_width(geometry, w.tp, sp, step.compiled, lora)
        # under FP8 the shared expert's saved set is its FP8 one; what the checkpoint
        # drops is rounded down (towards more memory kept)
        shared += math.floor(shared_fp8_bytes(step, w.tp, sp)) // step.dtype_bytes
    return layernorm + act + shared


def saved_width(
    geometry: ModelGeometry,
    tp: int,
    sp: bool,
    rows: Fraction,
    compiled: bool,
    lora: bool = True,
    etp: int = 1,
    fused_router: bool = False,
) -> int:
    """Elements per (global) token one MoE layer keeps:

    - the norm's input and output (``2H/s``, ``kept_width``);
    - per routed row (``rows`` per token: ``moe_padding.grouped_rows``, the routing
      the caller states, padded where the experts pad) its
      ``H``-wide dispatched input plus ``MOE_ROW_EAGER_F·F_e`` eager or
      ``(MOE_ROW_COMPILED_F + MOE_COMPILED_ROW_FP32_F)·F_e`` compiled, and
      ``MOE_ROW_SMALL``;
    - the router per local token: ``MOE_ROUTER_PER_TOPK·top_k + E/2`` (``router_width``,
      fused or not), and its z-loss's logits and logsumexp (``z_loss_width``);
    - the shared expert (``shared_width``).

    The reference's ``moe_width`` keeps ``2H + c·F_e`` per row (a second H-wide copy the
    simulator's megatron code has not).
    Simulator, Qwen3.5-35B-A3B TP4 EP4 SP, eager: 45,001.2 elements per token and layer
    concentrated, 14,257.2 balanced (this: 45,012 and 14,268). Under expert tensor
    parallelism (``etp``) each row's ``F_e``-wide tensors are the rank's ``F_e/ETP``
    slice (``expert_shard``)."""
    if not geometry.is_moe:
        return 0
    s = sp_divisor(tp, sp)
    h, fe = geometry.hidden, expert_shard(geometry, etp)
    routed = math.ceil(rows * (h + row_f(geometry, compiled) * fe + MOE_ROW_SMALL))
    router = router_width(geometry, s, fused_router)
    shared = shared_width(geometry, tp, sp, compiled, lora)
    return kept_width(geometry, tp, sp) + routed + router + shared


def router_width(geometry: ModelGeometry, s: int, fused: bool) -> int:
    """Elements per (global) token the router and the permutation's indices keep, over
    the sequence-parallel divisor ``s``: ``MOE_ROUTER_PER_TOPK·top_k + E/2`` per local
    token, and ``ROUTER_ALL_SCORES_FP32·E`` where the router scores every expert before
    the top-k; fused (``FUSED_ROUTER_DROPS_PER_TOPK``), the fp32 intermediate over every
    expert always, and ``FUSED_ROUTER_DROPS_PER_TOPK`` less per routed slot; and the z-loss's
    logits and logsumexp where it runs (``z_loss_width``, fused or not)."""
    per_topk = MOE_ROUTER_PER_TOPK - (FUSED_ROUTER_DROPS_PER_TOPK if fused else 0)
    router = (per_topk * geometry.moe_top_k + geometry.num_experts // 2) // s
    if fused or geometry.router_scoring != "topk_softmax":
        router += ROUTER_ALL_SCORES_FP32 * geometry.num_experts // s
    return router + z_loss_width(geometry, s)


def dispatch_width(geometry: ModelGeometry, w: TightWidths, step: Step) -> int:
    """Elements per token the last MoE layer holds at its forward peak beyond its saved
    set (``MOE_DISPATCH_ROW_H``): ``rows·(3H + 2) + (H + 2E)/s``, with the padded rows'
    fc2 output beside them where the experts pad (``moe_padding``: its unpadded copy is
    made while the padded one lives). Priced where the MoE layers keep their saved sets
    (no ``moe`` checkpoint); a checkpointed MoE's forward is priced by its saved set
    (``checkpointed_width``)."""
    layout = step.plan.layout
    tp, sp = w.tp, layout.sp and w.tp > 1
    rows = step.expert_rows_per_token(tp)
    h = geometry.hidden
    padding = grouped_rows(step, tp) - rows
    routed = math.ceil(rows * (MOE_DISPATCH_ROW_H * h + 2) + padding * h)
    return routed + (h + 2 * geometry.num_experts) // sp_divisor(tp, sp)


MOE_GLU_BACKWARD_F = 6
"""F_e-multiples per expert row the backward of megatron-core 0.16's eager probs-weighted
GLU holds at its peak beyond the recomputed saved set: the fp32 gradients of the scaled
product and of the GLU output and their bf16 casts (``MLP.forward`` with
``per_token_scale``, as oracles/rank_sim/moe.py ``MoE.activation`` runs it through torch's
own backward), 7 ``F_e`` a row, less the scaled output fc2's adapter saved, which fc2's
backward has freed (1 ``F_e``). Rank simulator, Moonlight-16B-A3B TP1 EP1 full recompute,
4,096 tokens, 6 rows a token: at the forward+backward peak, in the first MoE layer's GLU
backward, the backward's ``mul`` and ``_to_copy`` outputs are 59,136 elements per token
(9,856 = 7 x 1,408 per row), the same under selective ``core_attn+moe``; at TP2 CP2 EP1 (3
rows) the recomputed layer holds 38,510 of its 42,746-element saved set there, 4,224 (3 x
1,408) less. The
compiled GLU's fused backward forms only the fc1 output's gradient, within the combine's
moment (``backward_row_width``). Qwen3-30B-A3B (``F_e`` 768) and gpt-oss-20b peak in
the combine's backward instead, and the clamped GLU's backward holds
``CLAMPED_GLU_BACKWARD_F`` beside it (their ``core_attn+moe`` rows at TP1 EP1: the
backward's row buffers at the peak, no 7 ``F_e``-wide gradients)."""

ACCUMULATED_INPUT_GRADS = 1
"""Layer-input-wide tensors (``H/s``) each MoE layer already through its backward keeps
under full recompute until the step ends: megatron's ``dispatch_preprocess`` stores the
router's ``probs`` on the dispatcher (``self.probs``), and the recomputed forward's
``probs`` holds its graph back to the checkpoint's detached input, a leaf whose
``.grad`` the checkpoint's backward fills (``CheckpointFunction.backward``); the graph,
the leaf and its gradient live until the layer's next forward replaces ``self.probs``
(the leaf shares its storage with the kept layer input, already priced). So the last MoE
layer backward visits holds ``(MoE layers - 1) x H/s`` such gradients. Rank simulator,
full recompute, at the forward+backward peak: Qwen3-30B-A3B 48 MoE layers, 8,192 tokens,
TP1: the backward's ``add`` outputs are 96,256 elements per token = 47 x 2,048; at TP2
SP 48,178 (47 x 1,024 and the rest); Moonlight-16B-A3B (26 MoE layers, TP1): 51,200 =
25 x 2,048. A dense model's MLP keeps no graph, and holds none (Qwen3-1.7B: 3 H-wide
``add`` outputs at the peak, 28 layers)."""

DISPATCHER_STATE_E = 2.5
"""bf16-equivalent elements per expert and local token each MoE layer holds after its
forward whatever the recompute: megatron's ``dispatch_preprocess`` stores the dense fp32
probs (2) and the bool routing map (0.5) on the layer's dispatcher
(``self.probs``, ``self.routing_map``) and never clears them (oracles/rank_sim/moe.py).
With gradients the saved set holds them already (``saved_width``); under full recompute
and without gradients they stay beside the layer inputs. Rank simulator, Qwen3-30B-A3B
TP1 full recompute, 8,192 tokens: 117,504 elements per token retained = 48 layer inputs
(98,304) + 48 x 320 (2.5 x 128 experts) + the embedding's and the rope tables'."""


def dispatcher_state_width(geometry: ModelGeometry, w: TightWidths, step: Step) -> int:
    """Elements per token every MoE layer's dispatcher keeps after its forward
    (``DISPATCHER_STATE_E``), over the MoE layers."""
    return geometry.moe_layers * MOE.after_forward(geometry, w, step)


def full_backward_width(geometry: ModelGeometry, w: TightWidths, step: Step) -> int:
    """Elements per token an MoE layer holds beside its saved set under full recompute,
    at the larger of its two moments: its recomputed forward's dispatch
    (``dispatch_width``) or its backward (``backward_row_width`` per row); beside
    either, the gradients the MoE layers already through their backward keep
    (``ACCUMULATED_INPUT_GRADS``)."""
    rows = grouped_rows(step, w.tp)
    backward = math.ceil(rows * backward_row_width(geometry, step))
    moment = max(dispatch_width(geometry, w, step), backward)
    earlier = max(0, geometry.moe_layers - 1)
    return moment + earlier * ACCUMULATED_INPUT_GRADS * w.layer_input


MOE_CHECKPOINT_BACKWARD_ROW_H = 3
"""H-multiples per expert row the last MoE layer's backward holds beside the saved set its
``moe`` checkpoint recomputed, at that backward's peak: three fresh ``[rows, H]`` row
buffers (the gradients of the combine's all-to-all and un-sort and of the
experts' output) are live at once beside the recomputed dispatched input and the expert
GLU's saved set. Rank simulator (tests/oracle/test_tight_simulated_facts.py): four
[rows, H] buffers at that peak at EP > TP (TP1 CP2 EP2) and at EP = TP (TP2 EP2 SP);
Qwen3-30B-A3B TP1 CP8 EP8 (4 layers, 1,024 tokens a rank, 65,536 rows): four [rows, H],
the fc1 output [rows, 2F_e] and four [rows, F_e]. Without the term the grid's
``core_attn+moe`` rows fall short of the simulator's forward+backward peak by up to 19.2%
at EP > TP (gpt-oss-20B TP1 CP8 EP8) and 13.5% at EP = TP (gpt-oss-20B TP8 EP8). The
measured Qwen3.5-35B-A3B ``core_attn+moe`` cells (TP4 EP4) are covered with it at +1.1%
to +12.4% forward+backward; their backward rises less above the forward peak than the
simulator's (139/182/357 MiB measured, 172/296/593 simulated: oracles/rank_sim/README.md),
so the term is the simulator's bound there, not a measured figure. No Megatron-LM
recording runs a ``moe`` checkpoint."""

CLAMPED_GLU_BACKWARD_F = 3
"""F_e-multiples per expert row a clamped GLU's backward (gpt-oss's interleaved clamped
SwiGLU, ``activation_clamp``) holds beside its recomputed saved set: the gradients of the
gate and the linear halves and of their product (the rank simulator's gpt-oss-20B TP1
CP8 EP8, 4 layers, 4,096 tokens a rank: ten [rows, F_e]-wide tensors at the backward's
peak against the seven of the eager saved set)."""


def backward_row_width(geometry: ModelGeometry, step: Step) -> int:
    """Elements per expert row an MoE layer's backward holds beside its recomputed saved
    set at its peak: the larger of the combine's moment (``MOE_CHECKPOINT_BACKWARD_ROW_H``
    fresh ``[rows, H]`` buffers; a clamped GLU's ``CLAMPED_GLU_BACKWARD_F`` gradients
    beside them) and, for megatron's eager unclamped GLU, its own backward
    (``MOE_GLU_BACKWARD_F``). Which is larger is the model's: Qwen3-30B-A3B (``F_e`` 768)
    and gpt-oss-20b peak in the combine's backward in the rank simulator, Moonlight-16B-A3B
    (``F_e`` 1,408, ``H`` 2,048) in the GLU's."""
    fe = expert_shard(geometry, step.plan.layout.etp)
    combine = MOE_CHECKPOINT_BACKWARD_ROW_H * geometry.hidden
    if step.compiled or not geometry.gated_mlp:
        return combine
    if geometry.activation_clamp is not None:
        return combine + CLAMPED_GLU_BACKWARD_F * fe
    return max(combine, MOE_GLU_BACKWARD_F * fe)


def checkpoint_backward_width(geometry: ModelGeometry, w: TightWidths, step: Step) -> int:
    """Elements per token the last MoE layer's backward holds beside the saved set its
    ``moe`` checkpoint recomputed (``backward_row_width`` per row, at the padded rows)."""
    rows = grouped_rows(step, w.tp)
    return math.ceil(rows * backward_row_width(geometry, step))


def nograd_width(geometry: ModelGeometry, w: TightWidths, step: Step) -> int:
    """One MoE layer's peak in a pass without gradients (full recompute's forward, a
    no-grad forward), beside the kept layer inputs: per routed row the dispatch's three
    H-wide buffers (``MOE_DISPATCH_ROW_H``: the permuted rows, the all-to-all's output,
    the sorted copy) and the experts' fc1 output formed as base + LoRA delta + sum
    (``LORA_SUM_COPIES x 2F_e``); the shared expert's own such moment (``3 x 2F_s/t``);
    the norm output and the dense probs per token. A shared expert's SP-gathered input is
    freed once its fc1 has run, before the routed rows peak: not added. Rank simulator,
    Qwen3-30B-A3B TP2 EP2 SP full recompute, 8,192 tokens: the forward's MoE rise beside
    the layer inputs is 78,912 elements per token at 8 rows (this: 8 x 10,752 + 1,152);
    Moonlight-16B-A3B (shared experts) at TP2-8 full recompute: within 15% over the
    simulator without the gathered copy, up to 24% with it."""
    layout = step.plan.layout
    tp, sp = w.tp, layout.sp and w.tp > 1
    rows = grouped_rows(step, tp)
    h = geometry.hidden
    fe = expert_shard(geometry, layout.etp)
    per_row = MOE_DISPATCH_ROW_H * h + LORA_SUM_COPIES * 2 * fe
    s = sp_divisor(tp, sp)
    shared = LORA_SUM_COPIES * 2 * geometry.shared_expert_ffn // tp
    per_token = (2 * geometry.num_experts) // s
    return math.ceil(rows * per_row) + shared + w.moe_kept - w.layer_input + per_token


def checkpointed_width(w: TightWidths) -> int:
    """What a ``moe`` checkpoint drops and its recompute (or its no-grad forward) holds
    again: the layer's saved set beyond its norm's input and output (``kept_width``)."""
    return w.of("moe") - w.moe_kept


def checkpointed_forward_width(geometry: ModelGeometry, w: TightWidths, step: Step) -> int:
    """Elements per token a checkpointed MoE layer's forward holds beside the kept set:
    the forward runs without gradients (megatron's reentrant ``tensor_parallel.checkpoint``),
    so its peak is the no-grad pass's (``nograd_width``, less the norm output the
    checkpoint keeps), or its saved set where wider (the recompute in backward forms it;
    compiled runs keep fewer tensors per row than eager ones). The measured
    Qwen3.5-35B-A3B ``core_attn+moe`` cells (TP4 EP4, concentrated): forward peak minus
    retained is 18.0-18.4 KB per expert row (oracles/rank_sim/README.md, "Forward
    transient"), the no-grad pass's ``3H + 6·F_e`` = 9,216 elements = 18.4 KB, where the
    saved set's ``H + 6·F_e + 4`` is 10.2 KB; priced that way the six cells are covered
    at +0.2% to +11.3% forward, and the rank simulator's Moonlight TP1 CP8 EP8 row (two
    [rows, H], two [rows, 2F_e] and two [rows, F_e] live at its forward peak) is covered
    too."""
    nograd = nograd_width(geometry, w, step) - (w.moe_kept - w.layer_input)
    return max(checkpointed_width(w), nograd)


class MoeSpec(MlpSpec):
    """The mixture-of-experts block (``cpmem.pricing.kinds.spec``)."""

    name = "moe"

    def parameters(self, g: ModelGeometry) -> LayerParameters:
        """The routed experts over EP (fc1 and fc2 each, their biases where the model has
        them), the shared expert sharded over TP, the router (``H x E`` and its bias),
        the shared expert's sigmoid gate (``H -> 1``, none on DeepSeek-V3's) and the norms
        replicated."""
        h = g.hidden
        shared = (fc1_width(g, g.shared_expert_ffn) + g.shared_expert_ffn) * h
        gate = h if g.shared_expert_ffn and g.shared_expert_gate else 0
        fc1 = fc1_width(g, g.expert_ffn)
        per_expert = (fc1 + g.expert_ffn) * h + (fc1 + h if g.mlp_bias else 0)
        router = h * g.num_experts + (g.num_experts if g.router_bias else 0)
        return LayerParameters(shared, g.num_experts * per_expert, mlp_norms(g) + router + gate)

    def linears(self, g: ModelGeometry) -> tuple[Linear, ...]:
        return moe_linears(g)

    def trained_tensors(self, g: ModelGeometry, tp: int) -> TrainedTensors:
        """The router's ``[E, H]`` weight, the shared expert's gate and MLP, the pre-MLP
        norm, the biases (the router's, the shared expert's; fc2's whole)."""
        h, f = g.hidden, g.shared_expert_ffn
        weights = [g.num_experts * h]
        shapes = [(g.num_experts, h)]
        biases = [g.num_experts] if g.router_bias else []
        if f and g.shared_expert_gate:
            weights.append(h)
        if f:
            weights += [fc1_width(g, f) * h // tp, h * f // tp]
            shapes += [(fc1_width(g, f) // tp, h), (h, f // tp)]
            biases += [fc1_width(g, f) // tp, h] if g.mlp_bias else []
        if f and g.shared_expert_gate:
            # shared_experts.py: gate_weight [1, H], registered after its MLP's linears
            shapes.append((1, h))
        return TrainedTensors(
            tuple(weights), sublayer_norm_tensors(g), tuple(biases), shapes=tuple(shapes)
        )

    def expert_tensors(self, g: ModelGeometry, ep: int, etp: int) -> list[int]:
        """``E / EP`` local experts, each an MLP of ``expert_ffn`` whose linears are split
        over ETP (megatron's ``SequentialMLP`` and ``TEGroupedMLP`` hold the same
        elements)."""
        h = g.hidden
        f, fc1 = g.expert_ffn, fc1_width(g, g.expert_ffn)
        one = [fc1 * h // etp, h * f // etp]
        if g.mlp_bias:
            one += [fc1 // etp, h]
        return one * (g.num_experts // ep)

    def expert_matrix_flags(self, g: ModelGeometry, ep: int, etp: int) -> list[bool]:
        """Each expert's fc1 and fc2 weights are matrices, their biases vectors."""
        one = [True, True] + ([False, False] if g.mlp_bias else [])
        return one * (g.num_experts // ep)

    def expert_shapes(self, g: ModelGeometry, ep: int, etp: int) -> list[tuple[int, int]]:
        """Each local expert's fc1 ``[fc1 / ETP, H]`` and fc2 ``[H, F / ETP]``: one weight
        per expert (``TEGroupedMLP``'s ``weight<i>``, ``SequentialMLP``'s linears)."""
        h, f = g.hidden, g.expert_ffn
        return [(fc1_width(g, f) // etp, h), (h, f // etp)] * (g.num_experts // ep)

    def adapter_parameters(self, g: ModelGeometry, adapter: Adapter, layout: ParallelLayout) -> int:
        """The shared expert's fc1 and fc2 as a dense MLP's; every local routed expert's
        two linears once each (``experts``)."""
        h, tp, r = g.hidden, layout.tp, adapter.rank
        shared = g.shared_expert_ffn
        total = 0
        for target, width in (("fc1", h + 2 * shared // tp), ("fc2", shared // tp + h)):
            total += r * width if shared and adapter.adapts(target) else 0
        if adapter.adapts("experts"):
            local = g.num_experts // layout.ep
            total += local * r * ((h + 2 * g.expert_ffn) + (g.expert_ffn + h))
        return total

    def reference_width(
        self, g: ModelGeometry, layout: ParallelLayout, adapter: Adapter, core_kept: bool
    ) -> int:
        tp, sp, ep = layout.tp, layout.sp, layout.ep
        rows = moe_rows_per_token(g, ep, tp=tp)
        extra = adapters.extra_width(g, adapter, tp, "expert", sp=sp)
        return moe_width(g, tp, sp, ep) + rows * extra

    def reference_dropped(self, widths: LayerWidths, recompute: Recompute, layers: int) -> int:
        # the router/dispatch input stays (common width); one layer recomputes
        if not recompute.checkpoints(Module.MOE):
            return 0
        return (layers - 1) * (widths.of(self.name) - widths.common)

    def tight_widths(self, ctx: TightContext) -> dict[str, int]:
        g, step, tp, sp = ctx.geometry, ctx.step, ctx.tp, ctx.sp
        rows = grouped_rows(step, tp, sp)
        etp = step.plan.layout.etp
        fused = step.settings.runtime.moe_router_fusion
        width = saved_width(g, tp, sp, rows, step.compiled, ctx.lora, etp, fused) + ctx.sandwich
        width += saved_beyond_alltoall(g, step, tp, sp)
        expert = adapters.extra_width(g, step.adapter, tp, "expert", sp=sp)
        width += math.ceil(rows * expert)
        if g.shared_expert_ffn:
            width += adapters.extra_width(g, step.adapter, tp, "shared", sp=sp)
        width += moe_fp8_width(ctx)
        return {self.name: width, "moe_kept": kept_width(g, tp, sp) + ctx.sandwich}

    def checkpoint_dropped(self, w: TightWidths, step: Step) -> int:
        moe = checkpointed_width(w) if step.recompute.checkpoints(Module.MOE) else 0
        return moe + act_dropped(step.geometry, w, step)

    def after_forward(self, g: ModelGeometry, w: TightWidths, step: Step) -> int:
        layout = step.plan.layout
        s = sp_divisor(w.tp, layout.sp and w.tp > 1)
        return int(DISPATCHER_STATE_E * g.num_experts) // s + after_forward_rows(step, w.tp)

    def nograd_width(self, g: ModelGeometry, w: TightWidths, step: Step) -> int:
        return nograd_width(g, w, step)

    def forward_transient(self, g: ModelGeometry, w: TightWidths, step: Step) -> int:
        if step.recompute.checkpoints(Module.MOE):
            return checkpointed_forward_width(g, w, step)
        return dispatch_width(g, w, step)

    def full_backward_buffers(self, g: ModelGeometry, w: TightWidths, step: Step) -> int:
        return full_backward_width(g, w, step)

    def backward_phase(self, g: ModelGeometry, w: TightWidths, step: Step) -> int:
        # what output-discarding checkpoints dropped is rebuilt in the layer's backward
        rebuilt = act_dropped(g, w, step)
        if not step.recompute.checkpoints(Module.MOE):
            return rebuilt
        return rebuilt + checkpointed_width(w) + checkpoint_backward_width(g, w, step)


MOE = MoeSpec()
