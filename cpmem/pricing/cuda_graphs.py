"""What per-layer CUDA graphs keep allocated (``StepSettings.cuda_graphs``, megatron-core's
``TECudaGraphHelper`` capturing through Transformer Engine's ``make_graphed_callables``):
the static memory ``cpmem.pricing.static`` adds as ``cuda_graph_buffers``.

Sources: Megatron-LM d98e8a64 ``megatron/core/transformer/cuda_graphs.py``,
``transformer_layer.py``, ``module.py``; Transformer Engine b9d690e0 ``pytorch/graph.py``.

- **The graphs' static inputs** (kept for every replay, allocated before the capture by
  megatron-core, so PyTorch counts them): per graphed layer and captured micro-batch a
  ``hidden_states`` of ``[s/cp/(tp under SP), b, h]`` in bf16 (module.py:256-272), and
  where the layer's attention is in the scope its causal mask, ``[b, 1, s/cp, s]`` bool
  (transformer_layer.py:1212-1233). Every micro-batch is captured under pipeline
  parallelism, one otherwise (cuda_graphs.py:2597-2603); a micro-batch's buffers are
  reused by a later forward once its backward has run, in the pipeline's order
  (``_get_sample_arguments``, cuda_graphs.py:2322-2565): the buffers are as many as the
  most graphed layer-forwards in flight at once on the rank, per signature.
- **The static output gradients**: one set per output signature (graph.py:669-684,
  ``_reuse_graph_input_output_buffers``, which megatron-core sets from TE 2.7,
  cuda_graphs.py:2684-2686), an ``empty_like`` of each output that needs a gradient: a
  layer's ``[s', b, h]`` output; an MoE layer captured to its router
  (transformer_layer.py:1263-1318, moe_utils.py:1550-1590) its norm's output (or under
  ``moe_preprocess`` the permuted ``top_k`` rows per token and their fp32 probabilities),
  the fp32 router probabilities over every expert, the shared experts' output and the
  residual.

What the graphs compute lives in their private memory pool: the forward outputs and
input gradients are released to it after capture (graph.py:720-751, weak references),
the saved activations when each backward's capture ends, so PyTorch's allocated bytes do
not count them once the graphs replay; the step's eager warm-up iterations before the
capture (``--cuda-graph-warmup-steps``) hold them as the eager step does, which is the
peak the activations price. Not priced: the last backward graph's input and parameter
gradients, kept strong (one layer's, graph.py:733-751).
"""

from __future__ import annotations

from cpmem.model.geometry import ModelGeometry
from cpmem.step.cuda_graphs import CudaGraphs
from cpmem.step.pipeline import Pipeline
from cpmem.step.step import Step, StepSettings

STATIC_INPUT_BYTES = 2
"""Bytes per element of a graph's static ``hidden_states``: bf16 whatever the run's dtype
(module.py:266-271, ``dtype=torch.bfloat16``)."""
MASK_BYTES = 1
"""Bytes per element of the static causal mask (bool, transformer_layer.py:1228-1232)."""
ROUTER_PROBS_BYTES = 4
"""Bytes per element of the router's probabilities in a captured MoE layer's outputs:
fp32, as the router's saved set prices them (``kinds.moe.MOE_ROUTER_PER_TOPK``)."""

Layer = tuple[str, str]
"""A graphed callable's mixer and MLP kinds."""


def graphable(graphs: CudaGraphs, layer: Layer) -> bool:
    """``_layer_is_graphable`` (cuda_graphs.py:2134-2174): a layer whose attention, Mamba
    mixer, dense MLP or MoE router is in the scope (every layer without modules)."""
    mixer, mlp = layer
    return (
        not graphs.modules
        or (mixer == "attention" and graphs.captures("attn"))
        or (mixer == "mamba" and graphs.captures("mamba"))
        or (mlp == "dense" and graphs.captures("mlp"))
        or (mlp == "moe" and (graphs.names("moe") or graphs.captures("moe_router")))
    )


def input_signature(graphs: CudaGraphs, layer: Layer) -> bool:
    """Whether the layer's static inputs hold the causal mask besides ``hidden_states``
    (its attention in the scope, transformer_layer.py:1222-1232)."""
    return layer[0] == "attention" and graphs.captures("attn")


def output_signature(graphs: CudaGraphs, layer: Layer) -> str:
    """The layer's graph outputs: ``moe_preprocess`` or ``moe_router`` for an MoE layer
    captured to its router, else its ``[s', b, h]`` output (``hidden``)."""
    if layer[1] == "moe" and graphs.modules and graphs.captures("moe_router"):
        return "moe_preprocess" if graphs.captures("moe_preprocess") else "moe_router"
    return "hidden"


def chunk_callables(settings: StepSettings, stage: int) -> list[list[Layer]]:
    """The graphed layers of each of ``stage``'s model chunks, in order: its decoder
    layers, then on the chunk that holds the loss the MTP depths' layers
    (``_discover_layers``, cuda_graphs.py:2228-2301)."""
    g, pipe, graphs = settings.geometry, settings.pipeline, settings.cuda_graphs
    assert graphs is not None
    out: list[list[Layer]] = []
    for chunk in range(pipe.vpp):
        layers: list[Layer] = [
            (g.mixers[i], g.mlps[i]) for i in pipe.chunk_layers(g.layers, stage, chunk)
        ]
        if pipe.is_last(stage, chunk):
            one = list(zip(g.mtp_mixers, g.mtp_mlps, strict=True))
            layers += one * g.mtp_depths
        out.append([layer for layer in layers if graphable(graphs, layer)])
    return out


def static_input_sets(settings: StepSettings, stage: int) -> dict[bool, int]:
    """How many static input sets ``stage`` allocates per signature (with the mask or
    not): megatron-core's reuse over the pipeline's order (``_get_sample_arguments``),
    every micro-batch captured under pipeline parallelism, one otherwise."""
    graphs, pipe = settings.cuda_graphs, settings.pipeline
    assert graphs is not None
    callables = chunk_callables(settings, stage)
    captured = pipe.microbatches if pipe.active else 1
    order = Pipeline(pipe.pp, pipe.vpp, captured, pipe.layers, pipe.group).schedule(stage)
    waiting: dict[int, list[bool]] = {c: [] for c in range(pipe.vpp)}
    free: dict[bool, int] = {}
    allocated: dict[bool, int] = {}
    for op in order:
        if op.kind == "forward":
            for layer in callables[op.chunk]:
                key = input_signature(graphs, layer)
                if free.get(key, 0):
                    free[key] -= 1
                else:
                    allocated[key] = allocated.get(key, 0) + 1
                waiting[op.chunk].append(key)
        else:
            done = waiting[op.chunk][: len(callables[op.chunk])]
            waiting[op.chunk] = waiting[op.chunk][len(done) :]
            for key in done:
                free[key] = free.get(key, 0) + 1
    return allocated


def _output_grad_bytes(g: ModelGeometry, kind: str, rows: int, dtype_bytes: int) -> int:
    """One output signature's gradient buffers (``rows`` local tokens)."""
    hidden = rows * g.hidden * dtype_bytes
    if kind == "hidden":
        return hidden
    shared = hidden if g.shared_expert_ffn else 0
    dense_probs = rows * g.num_experts * ROUTER_PROBS_BYTES
    if kind == "moe_router":  # the norm's output, the probabilities, the residual
        return hidden + dense_probs + shared + hidden
    routed = rows * g.moe_top_k
    permuted = routed * g.hidden * dtype_bytes + routed * ROUTER_PROBS_BYTES
    return permuted + dense_probs + shared + hidden


def sequence_tokens(step: Step) -> int:
    """The sequence length the static mask spans (``--seq-length``: a micro-batch's
    longest sequence); a step planned from counts alone, without its sequences, spans the
    whole request (its logical tokens: a bound)."""
    if step.request is None:
        return step.plan.logical_tokens
    return max(tree.tokens for tree in step.request.trees)


def cuda_graph_bytes(settings: StepSettings, stage: int, step: Step | None) -> int:
    """The bytes per-layer CUDA graphs keep allocated on ``stage`` (the module's
    docstring): their static inputs and output gradients; 0 without graphs or a step
    (the static inputs are sized by its micro-batch)."""
    graphs = settings.cuda_graphs
    if graphs is None or step is None:
        return 0
    g, layout = settings.geometry, step.plan.layout
    tokens = step.plan.busiest_tokens  # b x s / cp
    rows = tokens // (layout.tp if layout.sp_active else 1)
    longest = sequence_tokens(step)
    per_set = {False: rows * g.hidden * STATIC_INPUT_BYTES}
    per_set[True] = per_set[False] + tokens * longest * MASK_BYTES
    inputs = sum(n * per_set[key] for key, n in static_input_sets(settings, stage).items())
    kinds = {
        output_signature(graphs, layer)
        for chunk in chunk_callables(settings, stage)
        for layer in chunk
    }
    outputs = sum(_output_grad_bytes(g, k, rows, settings.dtype_bytes) for k in kinds)
    return inputs + outputs
