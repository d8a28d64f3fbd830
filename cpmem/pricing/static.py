"""Static memory: what one rank holds before and between its steps, whatever its tokens.

The activations a step's forward and backward add are priced by the policies; this
module prices what sits under them on the device, from the geometry, the layout and
how the adapters are trained (``StepSettings.optimizer``), each term named:

- ``base_weights``: the frozen bf16 base (``cpmem.pricing.weights``);
- ``adapter_params``: the LoRA ``A`` and ``B`` of every adapted projection, bf16;
- ``adapter_grads``: their fp32 gradients, megatron's ``main_grad`` buffers, allocated
  when the model is wrapped for data parallelism (before the first forward);
- ``optimizer_states``: the fp32 master copy of every trainable parameter, made when
  megatron's mixed-precision optimizer is built (before the first forward), and the
  optimizer's moments (Adam: two, SGD: momentum), made at the first optimizer step;
  both divided over the data-parallel x context-parallel ranks under the distributed
  optimizer (megatron-core shards it over ``intra_dp_cp_group``:
  ``megatron/core/optimizer/__init__.py``, ``distrib_optimizer.py`` cuts each buffer into
  ``d = dp x cp`` slices). Megatron-LM's distributed-optimizer guide: 18 B per parameter
  for bf16 parameters with fp32 gradients, ``6 + 12/d`` with the distributed optimizer;
- ``kernel_workspaces``: what a process keeps once its first step has run (cuBLAS
  workspaces): 96 MiB, the step every measured process's baseline takes after its first
  repetition (``WARM_WORKSPACES``); priced on a warm step only, since a cold step's
  activation figure already holds its kernel set-up (``cold_setup``);

The measured runtime's baselines (its own rank-8 adapters, trained by megatron's
optimizer, never stepped, beside the harness's rank-1 slot) are checked against this
module by ``cpmem.gate.static_check``: every recorded baseline within 3%.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache

from cpmem.model.geometry import ModelGeometry
from cpmem.plan.layout import ParallelLayout
from cpmem.pricing.weights import rank_weights
from cpmem.step.step import StepSettings
from cpmem.step.trainer import Adapter, Optimizer
from cpmem.units import MIB

ADAPTER_PARAM_BYTES = 2
"""bf16 adapter parameters (the base's dtype)."""
GRAD_BYTES = 4
"""fp32 gradients (megatron's ``main_grad``)."""
MASTER_BYTES = 4
"""The fp32 master copy of a bf16 trainable parameter."""
MOMENT_BYTES = {"adam": 8, "sgd": 4, "none": 0}
"""The optimizer's fp32 moments per trainable parameter: Adam's two, SGD's momentum
(Megatron-LM, docs "Distributed Optimizer": master + moments = 12 B for Adam)."""
WARM_WORKSPACES = 96 * MIB
"""What a process's allocated bytes gain from its first step and keep: every measured
process whose first cell recorded both baselines rose by 96 MiB (+1 KiB) between its
first and second repetition (golden cells: Qwen3.5-27B TP2/TP4/TP8, Qwen3.5-4B TP2,
Qwen3-1.7B TP2); three cuBLAS workspaces of 32 MiB, PyTorch's Hopper default."""


class StaticComponent(StrEnum):
    """Where static bytes go."""

    BASE_WEIGHTS = "base_weights"
    ADAPTER_PARAMS = "adapter_params"
    ADAPTER_GRADS = "adapter_grads"
    OPTIMIZER_STATES = "optimizer_states"
    KERNEL_WORKSPACES = "kernel_workspaces"


SOURCES: dict[StaticComponent, str] = {
    StaticComponent.BASE_WEIGHTS: "geometry x megatron-core 0.16 sharding (cpmem.pricing.weights)",
    StaticComponent.ADAPTER_PARAMS: "LoRA A (r x in) and B (out x r) per adapted projection, bf16",
    StaticComponent.ADAPTER_GRADS: "fp32 main_grad per trainable parameter",
    StaticComponent.OPTIMIZER_STATES: "fp32 master (built with the optimizer) + moments (first step)",
    StaticComponent.KERNEL_WORKSPACES: "measured: baselines after a process's first step",
}


@dataclass(frozen=True)
class StaticMemory:
    """One rank's static bytes by component (they add up to ``total``)."""

    components: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.components.values())

    def to_dict(self) -> dict[str, object]:
        return {"static_bytes": self.total, "static_components": dict(self.components)}


def adapter_parameters(
    geometry: ModelGeometry,
    adapter: Adapter,
    layout: ParallelLayout,
    layers: Sequence[int] | None = None,
) -> int:
    """Trainable parameters of one rank's adapters: per adapted projection ``r`` times
    its input and output widths on the rank. A column-parallel base (QKV, fc1, GDN's in
    projection) shards ``B``'s output over TP and holds ``A`` whole; a row-parallel one
    (the output projections, fc2) shards ``A``'s input and holds ``B`` whole; a routed
    expert's two linears are adapted once per expert on the rank (``experts``), the
    shared expert's as an MLP's (``fc1``, ``fc2``). ``layers``: the layers the rank
    holds (all by default)."""
    held = tuple(range(geometry.layers) if layers is None else layers)
    return _adapter_parameters(geometry, adapter, layout, held)


@lru_cache(maxsize=1024)
def _adapter_parameters(
    geometry: ModelGeometry, adapter: Adapter, layout: ParallelLayout, held: tuple[int, ...]
) -> int:
    """``adapter_parameters`` over the ``held`` layers (cached: every estimate prices its
    static memory)."""
    g, tp, r = geometry, layout.tp, adapter.rank
    h = g.hidden
    gdn_out = 2 * g.gdn_key_width + 2 * g.gdn_value_width + 2 * g.gdn_value_heads
    per_kind: dict[str, dict[str, int]] = {
        "attention": _attention_adapters(g, tp),
        "gdn": {"gdn_in": h + gdn_out // tp, "gdn_out": g.gdn_value_width // tp + h},
        "dense": {"fc1": h + 2 * g.ffn // tp, "fc2": g.ffn // tp + h},
    }
    total = 0
    for mixer, mlp in ((g.mixers[i], g.mlps[i]) for i in held):
        for target, width in per_kind[mixer].items():
            total += r * width if adapter.adapts(target) else 0
        if mlp == "dense":
            total += sum(r * w for t, w in per_kind["dense"].items() if adapter.adapts(t))
            continue
        shared = g.shared_expert_ffn
        for target, width in (("fc1", h + 2 * shared // tp), ("fc2", shared // tp + h)):
            total += r * width if shared and adapter.adapts(target) else 0
        if adapter.adapts("experts"):
            local = g.num_experts // layout.ep
            total += local * r * ((h + 2 * g.expert_ffn) + (g.expert_ffn + h))
    return total


def _attention_adapters(g: ModelGeometry, tp: int) -> dict[str, int]:
    """Per attention target: the (in + out) widths of its adapters' factors on one rank.
    ``qkv`` is one fused projection, or under MLA the query's and KV's down and up
    projections (the down projections replicated, the up projections' outputs sharded);
    ``proj`` the output projection."""
    h = g.hidden
    proj = g.attention_output_width // tp + h
    if not g.is_mla:
        q_out = g.q_width * (2 if g.attention_output_gate else 1) + 2 * g.kv_width
        return {"qkv": h + q_out // tp, "proj": proj}
    heads = g.q_heads
    kv_up = g.kv_lora_rank + heads * (g.qk_nope_head_dim + g.v_head_dim) // tp
    kv = (h + g.kv_lora_rank + g.qk_rope_head_dim) + kv_up
    if g.q_lora_rank:
        q = (h + g.q_lora_rank) + (g.q_lora_rank + heads * g.head_dim // tp)
    else:
        q = h + heads * g.head_dim // tp
    return {"qkv": q + kv, "proj": proj}


def static_memory(
    settings: StepSettings, *, stepped: bool | None = None, stage: int = 0
) -> StaticMemory:
    """One rank's static bytes for a step run under ``settings``, on pipeline ``stage``
    (its layers; the embedding on the first, the output layer on the last). ``stepped``:
    whether an optimizer step has run before it (by default: the step is warm), which
    decides whether the optimizer's moments exist yet."""
    g, layout, opt = settings.geometry, settings.layout, settings.optimizer
    pipe = settings.pipeline
    layers = [i for c in range(pipe.vpp) for i in pipe.chunk_layers(g.layers, stage, c)]
    trainable = adapter_parameters(g, settings.adapter, layout, layers)
    trains = opt.kind != "none"
    stepped = (not settings.cold) if stepped is None else stepped
    states = trainable * (MASTER_BYTES if trains else 0)
    states += trainable * MOMENT_BYTES[opt.kind] if stepped else 0
    components = {
        StaticComponent.BASE_WEIGHTS: rank_weights(
            g, layout, layers, first=stage == 0, last=stage == pipe.pp - 1
        ).total,
        StaticComponent.ADAPTER_PARAMS: trainable * ADAPTER_PARAM_BYTES,
        StaticComponent.ADAPTER_GRADS: trainable * GRAD_BYTES if trains else 0,
        StaticComponent.OPTIMIZER_STATES: _sharded(states, optimizer_shards(layout), opt),
        StaticComponent.KERNEL_WORKSPACES: 0 if settings.cold else WARM_WORKSPACES,
    }
    return StaticMemory({str(k): int(v) for k, v in components.items()})


def optimizer_shards(layout: ParallelLayout) -> int:
    """The ranks megatron's distributed optimizer shards a parameter's state over: its
    data-parallel x context-parallel group (``intra_dp_cp_group``, one optimizer
    instance), since CP ranks hold the same parameters as data-parallel ones."""
    return layout.dp * layout.cp


def _sharded(states: int, shards: int, opt: Optimizer) -> int:
    return -(-states // shards) if opt.distributed else states
