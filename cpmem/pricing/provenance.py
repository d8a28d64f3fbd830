"""What an estimate rests on: where each term's bytes were checked, and what it assumes.

Every non-zero component of an estimate (its activations' and its static memory's) gets
one ``Source``, read off one table (``TERMS``) by the facts of the step that decide which
measured tier exercised it (``Facts``, taken from the step by ``facts_of`` when a policy
builds its ``Estimate``):

- ``measured (art)``: ART's golden cells (golden/cells.csv) ran this model, layout and
  recompute (``ART_MEASURED``), with the harness's adapters and ART's fused attention, and
  their peaks (forward, forward+backward) or baselines hold the term: a measured peak that
  includes it is covered by the gate. A cell measures a total, not a term: "measured"
  says the term sits inside a measured figure of this kind of step.
- ``measured (megatron-lm)``: Megatron-LM's functional-test recordings
  (golden/megatron/) exercise it: full training of a GPT or MoE model Megatron-LM builds
  (no Gated DeltaNet, latent attention, sliding windows, sandwich norms, sinks or
  soft-capping), a steady step (its peak and the static memory after the optimizer
  update), the LM head and loss, pipeline schedules, CP over p2p or a2a+p2p, no, selective
  (core attention) or full recompute (golden/reports/megatron.md, "The terms against the
  recordings").
- ``measured (profile)``: the learned-profile floor, the caller's own recorded peak.
- ``fitted (art)``: a constant fitted to ART's golden cells (tight's margin).
- ``carried (art)``: a value ART's cells measured (the first step's kernel set-up),
  charged on a step no tier measured.
- ``structure (simulator)``: priced by structure, the step's figure checked by the rank
  simulator's grid (golden/simulated/): ART's runtime, a family the grid simulates.
- ``structure (published)``: a term of ART's published formula (its 10% factor, its
  legacy floor).
- ``structure (source)``: priced by structure only, from hand counts of the libraries'
  source, no tier checks it for this step.

``assumptions`` states, one line each, what an estimate takes for granted where it
matters: the CP layout's planner, how experts are split (MoE only), how a quantized
checkpoint's weights are held, where the step's kernel set-up is charged.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Literal

from cpmem.model.geometry import ModelGeometry
from cpmem.model.presets import MEASURED, PRESETS
from cpmem.step.recompute import Mode
from cpmem.step.step import Step
from cpmem.units import MIB

Kind = Literal["measured", "fitted", "carried", "structure"]

ART_MEASURED: frozenset[tuple[str, int, int, bool, int, str, bool]] = frozenset(
    {
        ("qwen3-1.7b", 1, 2, False, 1, "selective(core_attn)", False),
        ("qwen3-1.7b", 2, 1, True, 1, "selective(core_attn)", False),
        ("qwen3-1.7b", 2, 1, True, 1, "selective(core_attn)", True),
        ("qwen3.5-27b", 1, 2, False, 1, "selective(core_attn)", False),
        ("qwen3.5-27b", 2, 1, True, 1, "selective(core_attn)", False),
        ("qwen3.5-27b", 4, 1, True, 1, "none", True),
        ("qwen3.5-27b", 4, 1, True, 1, "selective(core_attn)", False),
        ("qwen3.5-27b", 4, 1, True, 1, "selective(core_attn)", True),
        ("qwen3.5-27b", 4, 1, True, 1, "selective(core_attn+mlp)", True),
        ("qwen3.5-27b", 8, 1, True, 1, "none", True),
        ("qwen3.5-27b", 8, 1, True, 1, "selective(core_attn)", True),
        ("qwen3.5-35b-a3b", 4, 1, True, 4, "selective(core_attn)", False),
        ("qwen3.5-35b-a3b", 4, 1, True, 4, "selective(core_attn)", True),
        ("qwen3.5-35b-a3b", 4, 1, True, 4, "selective(core_attn+moe)", False),
        ("qwen3.5-35b-a3b", 4, 1, True, 4, "selective(core_attn+moe)", True),
        ("qwen3.5-4b", 1, 2, False, 1, "none", False),
        ("qwen3.5-4b", 1, 2, False, 1, "selective(core_attn)", False),
        ("qwen3.5-4b", 1, 2, False, 1, "selective(core_attn+mlp)", False),
        ("qwen3.5-4b", 2, 1, True, 1, "selective(core_attn+mlp)", True),
    }
)
"""(model, TP, CP, SP, EP, recompute, compiled) of every golden cell: what ART's runtime
was measured at (a test derives the set from golden/cells.csv)."""

SIMULATED_FAMILIES: frozenset[str] = frozenset(
    {
        "qwen3_5_text",
        "llama",
        "qwen3",
        "qwen3_next",
        "qwen3_moe",
        "gpt_oss",
        "gemma3_text",
        "gemma2",
        "deepseek_v3",
    }
)
"""The Hugging Face families of the simulated grid's models beside the measured presets
(a test derives the set from golden/simulated/rows.csv and its configs)."""

MEGATRON_RECOMPUTES = frozenset({Mode.NONE, Mode.FULL})
"""Recompute the recordings ran beside selective core attention (Megatron-LM's default
``--recompute-modules``)."""
MEGATRON_CP_COMMS = frozenset({"p2p", "a2a+p2p"})
"""The CP communication the recordings ran (``--cp-comm-type``)."""


@dataclass(frozen=True)
class Source:
    """Where one term's bytes were checked (the module docstring names each)."""

    kind: Kind
    by: str
    detail: str

    @property
    def label(self) -> str:
        return f"{self.kind} ({self.by})"

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "by": self.by, "detail": self.detail}


@dataclass(frozen=True)
class Facts:
    """What about a step decides which tier measured its terms, and what it assumes."""

    runtime: str = "art"
    evidence: str = "art_cells"
    """Whose measurements check the step's runtime (``Runtime.evidence``)."""
    answers_peak: bool = False
    """Whether the runtime's answer leads with the device's peak (``Runtime.answers_peak``)."""
    first: bool = False
    measured_model: str | None = None
    """The measured preset whose shapes the model has (None: none)."""
    art_cells: bool = False
    """ART's golden cells ran this step's model, layout and recompute (``ART_MEASURED``)
    with the harness's adapters, ART's fused attention, bf16, no pipeline and one
    micro-batch."""
    art_baselines: bool = False
    """The golden cells recorded this model's static memory at its TP and EP."""
    simulated: bool = False
    """ART's LoRA runtime, fused attention and bf16 on a family the simulated grid runs."""
    megatron: bool = False
    """A steady step the Megatron-LM recordings exercise (the module docstring)."""
    is_moe: bool = False
    moe_routing: str = "concentrated"
    base_weights: str = ""
    """How a quantized checkpoint's weights are held, in words (``base_weights_held``);
    empty for a checkpoint of one float dtype."""
    weights_dtype: str = ""
    """The dtype the weights are priced in, in words (``weights_dtype``): every answer
    names it, so a weight's bytes read back to its parameter count."""
    layer_offload: bool = False
    """Whole-layer activation offloading (``Offload.layers``): no recording runs it, so
    the retained activations it takes bytes off are read from the source."""
    layer_wise_layout: bool = False
    """Muon's layer-wise distributed optimizer with its precomputed layout
    (``cpmem.pricing.layer_wise_layout``): its buffers and shards are read from source,
    no recording runs them (the recordings' Muon runs take the legacy path)."""


@lru_cache(maxsize=256)
def measured_preset(geometry: ModelGeometry) -> str | None:
    """The measured preset whose shapes ``geometry`` has, under any name (None: none)."""
    for name in MEASURED:
        if replace(geometry, name=name) == PRESETS[name]:
            return name
    return None


def megatron_built(geometry: ModelGeometry) -> bool:
    """A layer Megatron-LM's GPT and MoE recordings build (every other kind cpmem prices
    is no recording's)."""
    return (
        geometry.all_mixers <= {"attention"}
        and not geometry.mtp_depths
        and geometry.kv_lora_rank == 0
        and not any(geometry.windows)
        and not geometry.sandwich_norms
        and not geometry.attention_sinks
        and geometry.final_logit_softcap is None
        and not geometry.attention_output_gate
    )


def facts_of(step: Step) -> Facts:
    settings, layout, rc = step.settings, step.plan.layout, step.recompute
    g, runtime = step.geometry, settings.runtime
    measured = measured_preset(g)
    art_lora = runtime.evidence == "art_cells" and settings.training == "lora"
    plain_art = art_lora and runtime.attention_backend == "fused" and step.dtype_bytes == 2
    key = (measured, layout.tp, layout.cp, layout.sp, layout.ep, rc.label, step.compiled)
    cells = (
        plain_art
        and key in ART_MEASURED
        and step.adapter.is_harness
        and (layout.cp == 1 or step.cp_comm == "all_gather")
        and not settings.pipeline.active
        and settings.pipeline.microbatches == 1
    )
    baselines = art_lora and any(
        (m, tp, ep) == (measured, layout.tp, layout.ep)
        for m, tp, cp, _, ep, _, _ in ART_MEASURED
        if cp == 1
    )
    recompute_recorded = rc.mode in MEGATRON_RECOMPUTES or rc.label == "selective(core_attn)"
    megatron = (
        runtime.evidence == "megatron_recordings"
        and settings.training == "full"
        and megatron_built(g)
        and not settings.cold
        and step.dtype_bytes == 2
        and recompute_recorded
        and (layout.cp == 1 or step.cp_comm in MEGATRON_CP_COMMS)
    )
    return Facts(
        runtime=runtime.name,
        evidence=runtime.evidence,
        answers_peak=runtime.answers_peak,
        first=settings.cold,
        measured_model=measured,
        art_cells=cells,
        art_baselines=baselines,
        simulated=plain_art and (measured is not None or g.family in SIMULATED_FAMILIES),
        megatron=megatron,
        is_moe=g.is_moe,
        moe_routing=step.moe_routing,
        base_weights=base_weights_held(step),
        weights_dtype=weights_dtype(step),
        layer_offload=settings.offload.layers > 0,
        layer_wise_layout=settings.optimizer.kind == "muon"
        and settings.optimizer.distributed
        and settings.optimizer.muon_layout != "legacy",
    )


DTYPE_NAMES = {1: "fp8", 2: "bf16", 4: "fp32"}
"""The name of a step's ``dtype_bytes`` (2 B: bf16, the runtimes' dtype; fp16's 2 B are
priced the same)."""


def weights_dtype(step: Step) -> str:
    """The dtype a checkpoint of one float dtype is priced in: the step's (a config's
    ``torch_dtype`` is how the checkpoint is stored, not how the runtime holds it), with
    the FP8 layers' linear weights in ``uint8`` where FP8 parameters are gathered; empty
    for a quantized checkpoint, whose ``base_weights_held`` line says it."""
    if step.geometry.quantization is not None:
        return ""
    n = step.dtype_bytes
    text = f"{DTYPE_NAMES.get(n, f'{n}-byte')}, {n} B per parameter (the step's dtype)"
    fp8 = step.settings.fp8
    if fp8 is not None and fp8.param_gather:
        text += "; the FP8 layers' linear weights as FP8, 1 B (--fp8-param-gather)"
    return text


def base_weights_held(step: Step) -> str:
    """How the step holds a quantized checkpoint's weights: as stored (the format, the
    roles converted) or dequantized to the step's dtype, the default; empty where the
    checkpoint is not quantized."""
    q = step.geometry.quantization
    if q is None:
        return ""
    dtype = {2: "bf16", 4: "fp32"}.get(step.dtype_bytes, f"{step.dtype_bytes}-byte")
    if step.settings.quantized_weights == "stored":
        roles = ", ".join(r.replace("_", " ") for r in sorted(q.converted))
        return f"the checkpoint's {roles} linears as stored, {q.label}; the rest in {dtype}"
    held = f"dequantized to {dtype} from the checkpoint's {q.label}, as Megatron-Bridge imports it"
    if step.settings.training == "full":
        return f"{held}: full training trains the dequantized weights"
    return f"{held} (--quantized-weights stored prices it as stored)"


ArtTier = Literal["cells", "baselines", "baselines_first", "process", "none"]


@dataclass(frozen=True)
class Term:
    """Which tier measures one component: ``art`` the condition under which ART's golden
    cells hold it (``cells``: the step's activations; ``baselines``: the static memory
    recorded before the forward; ``baselines_first``: the same, on a first step only;
    ``process``: any step of ART's runtime, the term's bytes the process's own, not the
    model's; ``none``), ``megatron`` whether Megatron-LM's recordings hold it, and
    ``static`` whether it is static memory (never the simulator's: its peaks are the
    activations')."""

    art: ArtTier
    megatron: bool
    static: bool = False
    carried: bool = False
    """Not measured, the value ART's cells measured charged all the same."""


_ACTIVATION = Term("cells", True)
TERMS: dict[str, Term] = {
    "retained_activations": _ACTIVATION,
    "segment_states": _ACTIVATION,
    "cp_gathered_kv": _ACTIVATION,
    "rope_tables": _ACTIVATION,
    "attention_scores": Term("none", True),  # an unfused core: not ART's measured backend
    "embedding": _ACTIVATION,
    "dataloader_mask": Term("none", True),
    "outputs": _ACTIVATION,
    "gathered_outputs": _ACTIVATION,
    "layer_transient": _ACTIVATION,
    "head_kept": Term("none", True),  # the harness returns hidden states: no LM head
    "head": Term("none", True),
    "backward_transient": _ACTIVATION,
    "forward_peak_excess": _ACTIVATION,
    "cold_setup": Term("cells", False, carried=True),
    "cold_backward_setup": Term("cells", False, carried=True),
    "pipeline_in_flight": Term("none", True),
    "pipeline_inputs": Term("none", True),
    "pipeline_buffers": Term("none", True),
    "fsdp_in_flight": Term("none", True),
    "optimizer_step_excess": Term("none", True),
    "deferred_wgrad": Term("none", True),
    "mtp": Term("none", False),  # no recording priced yet runs MTP depths
    # static memory
    "base_weights": Term("baselines", False, static=True),
    "adapter_params": Term("baselines", False, static=True),
    "adapter_grads": Term("baselines", False, static=True),
    # ART's optimizer never stepped: the moments a steady step holds were never measured
    "optimizer_states": Term("baselines_first", True, static=True),
    "weights": Term("none", True, static=True),
    "gradient_buffer": Term("none", True, static=True),
    "master_gradients": Term("none", True, static=True),
    "cublas_workspaces": Term("process", True, static=True),
    "te_cublaslt_workspace": Term("process", True, static=True),
    "te_grouped_gemm_workspaces": Term("none", True, static=True),
    "te_userbuffer_workspace": Term("none", True, static=True),
    "fp8_weight_cache": Term("none", False, static=True),  # no recording runs FP8 without
    # --fp8-param-gather under tensorwise or delayed scaling
    "fp8_transposes": Term("none", True, static=True),
    "fp8_scale_inverses": Term("none", True, static=True),
    "fp8_scaling_state": Term("none", False, static=True),  # no recording runs delayed FP8
    "global_memory_buffer": Term("none", True, static=True),
    "pipeline_received": Term("none", True, static=True),
    "dummy_wgrad": Term("none", True, static=True),
    "fsdp_double_buffer": Term("none", False, static=True),  # no recording runs it
    "fsdp_kept_gathered": Term("none", True, static=True),  # the A100 custom-FSDP file holds it
    # the five scoped CUDA-graph recordings hold it
    "cuda_graph_buffers": Term("none", True, static=True),
}
"""Every component name, activation and static, and the tier that measures it."""

LAYER_WISE_TERMS = frozenset({"weights", "gradient_buffer", "optimizer_states", "master_gradients"})
"""The static terms Muon's precomputed layer-wise layout lays out: its buffers (the
weights and their gradients) and the rank's shard of what the optimizer keeps."""

REFERENCE_POLICIES = frozenset({"reference", "global"})
MARGINS: dict[str, Source] = {
    "published": Source(
        "structure",
        "published",
        "the published formula's factor on the sum of its terms (docs/pricing.md)",
    ),
    "fitted": Source(
        "fitted",
        "art",
        "tight's margin for ART's runtime, fitted on ART's golden cells (calibrated.MARGIN, "
        "docs/tight.md)",
    ),
}
"""The margins' sources: the reference's published factor, tight's fitted margin (the
one ART's runtime is priced with; Megatron-LM's runs carry none)."""


def source_of(name: str, facts: Facts, policy: str) -> Source:
    """The one source of component ``name`` on a step with ``facts``, priced by ``policy``."""
    if name in ("margin_factor", "margin_allowance"):
        return MARGINS["published" if policy in REFERENCE_POLICIES else "fitted"]
    if name == "static_floor":
        return Source("structure", "published", "the published formula's legacy floor")
    if name == "profile_floor":
        return Source("measured", "profile", "the learned profile's recorded peak (--profiles)")
    term = TERMS[name]
    if facts.layer_wise_layout and name in LAYER_WISE_TERMS:
        return Source(
            "structure",
            "source",
            "Muon's precomputed layer-wise layout, read from Megatron-LM's source "
            "(layer_wise_optimizer.py at d98e8a64); no recording runs it",
        )
    if facts.layer_offload and name == "retained_activations":
        return Source(
            "structure",
            "source",
            "whole-layer activation offloading, read from megatron-core's and Transformer "
            "Engine's source (cpu_offload.py at b9d690e0); no recording runs it",
        )
    if facts.megatron and term.megatron:
        return Source("measured", "megatron-lm", "Megatron-LM's functional-test recordings")
    if facts.evidence == "art_cells" and _art_holds(term, facts):
        model = facts.measured_model or "the model"
        where = "baselines" if term.static else "peaks"
        return Source("measured", "art", f"ART's golden cells' {where} of {model}")
    if term.carried:
        return Source("carried", "art", "the first step's set-up ART's golden cells measured")
    if facts.simulated and not term.static:
        return Source("structure", "simulator", "the rank simulator's grid (golden/simulated/)")
    return Source("structure", "source", "hand counts from the libraries' source")


def _art_holds(term: Term, facts: Facts) -> bool:
    if term.art == "cells":
        return facts.art_cells
    if term.art == "baselines":
        return facts.art_baselines
    if term.art == "baselines_first":
        return facts.art_baselines and facts.first
    return term.art == "process"


def provenance(names: Iterable[str], facts: Facts, policy: str) -> dict[str, Source]:
    """The source of every named component (each once, in order)."""
    return {name: source_of(name, facts, policy) for name in dict.fromkeys(names)}


PLANNER_LAYOUTS: dict[str, str] = {
    "chunked": "the measured runtime's chunk planner, one contiguous range of 512-token "
    "chunks per rank",
    "balanced": "Megatron-LM's zigzag, 2 x CP slabs, rank r takes slabs r and 2 x CP - 1 - r",
    "gdn-segments": "prefix-tree segments whole on the least-loaded rank, Gated DeltaNet "
    "states with their segment",
    "attention-work": "contiguous ranges balancing causal attention work",
    "explicit": "the runtime's own per-rank counts, as given",
}
"""What each planner lays out under CP (docs/layout.md)."""


def assumptions(
    facts: Facts,
    *,
    planner: str,
    cp: int,
    ep: int,
    etp: int,
    workspace_bytes: int,
    unpriced: frozenset[str] = frozenset(),
) -> dict[str, str]:
    """One line for each assumption that matters for the step: the CP layout (CP > 1),
    how the experts are split (a MoE model), how a quantized checkpoint is held or the
    weights' dtype, where the kernel set-up is charged. Each
    states what was priced: where the policy does not price the planner or the MoE
    routing on the step (``unpriced``, the options named as such), the line says what it
    charges instead, never the option's value."""
    out: dict[str, str] = {}
    if cp > 1:
        if "planner" in unpriced:
            out["cp_layout"] = (
                "every CP rank charged the packed tokens: no CP layout priced (the "
                f"{planner} planner's is not read)"
            )
        else:
            layout = PLANNER_LAYOUTS.get(planner, planner)
            out["cp_layout"] = f"{planner}: {layout} (--planner names another)"
    if facts.is_moe:
        if ep > 1 and etp == 1:
            split = f"experts split over EP {ep} only (ETP 1: each expert whole on its rank)"
        elif etp > 1:
            split = f"experts split over EP {ep} and their weights over ETP {etp}"
        else:
            split = "every expert on every rank (EP 1, ETP 1)"
        out["experts"] = f"{split}; {priced_routing(facts.moe_routing, unpriced)} routing"
    if facts.base_weights:
        out["base_weights"] = facts.base_weights
    if facts.weights_dtype:
        out["weights"] = facts.weights_dtype
    if facts.first:
        out["setup"] = (
            "first step of its process: its kernel set-up charged in the activations "
            "(cold_setup), no kernel workspaces in static memory yet"
        )
    else:
        out["setup"] = (
            "steady step: the kernel set-up paid, its workspaces held in static memory "
            f"({workspace_bytes / MIB:g} MiB), none in the activations"
        )
    return out


def priced_routing(routing: str, unpriced: frozenset[str]) -> str:
    """The MoE routing a step was priced under: its own, or ``concentrated`` where the
    routing is not priced (the reference charges every expert row concentrated; at EP 1
    every routed copy lands on the rank's experts whatever the routing)."""
    return "concentrated" if "moe_routing" in unpriced else routing
