"""Gradient accumulation at one pipeline stage: micro-batches one after another, or,
under megatron-core's combined 1F1B step, each forward beside the previous backward.

Without pipeline stages (``pp = 1``) a step of ``M`` micro-batches runs each one's
forward and backward before the next one's forward (megatron-core's
``forward_backward_no_pipelining``): what a micro-batch keeps for its backward is freed
by that backward, so no two micro-batches' activations are live together. What persists
across them is the weights' gradient buffers (``main_grad``, accumulated in place), which
the static memory already holds (``cpmem.pricing.static``). So the step's figure is its
largest micro-batch's, forward and forward+backward each taken where it is largest.

Under ``--overlap-moe-expert-parallel-comm`` (the runtime's ``overlap_moe_comm``) with
several micro-batches, megatron-core runs ``combined_1f1b_schedule_for_no_pipelining``
(combined_1f1b.py:35-137 at 4828d651): micro-batch 0's forward alone, then each
micro-batch ``b``'s forward beside micro-batch ``a = b - 1``'s backward, then the last
backward alone. Each combined step (``TransformerModelChunkSchedulePlan.run``,
model_chunk_schedule_plan.py:502-600) runs ``b``'s embedding, then ``a``'s head backward,
then for ``k`` in ``0..L-1`` ``b``'s layer ``k`` beside ``a``'s layer ``L-1-k`` (node by
node on two streams; ``a``'s layer state is released after its step), then ``b``'s head
forward, then ``a``'s embedding backward. So the moments of a combined step are bounded by:

- ``a``'s head backward: ``a``'s forward+backward figure and ``b``'s embedding output
  (one layer input);
- layer step ``k``: the forward+backward figure of ``a``'s layers ``0..L-1-k`` as a chunk
  and the gradient it receives (one layer input), beside the forward figure of ``b``'s
  layers ``0..k`` as a chunk and the output it passes on (one layer input); both layers'
  transients are summed, the streams' interleaving within a layer not being determined;
- ``b``'s head forward: ``b``'s forward figure and ``a``'s input gradient for its
  embedding backward (one layer input).

Every such moment runs a forward and a backward: it counts in both figures. The other
micro-batch's bytes at a moment are ``pipeline_in_flight``.

With one request repeated (``Step.microbatches`` empty) each micro-batch is that request.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from cpmem.pricing.components import Component
from cpmem.pricing.estimate import Estimate
from cpmem.pricing.pipeline import layers_step, stage_activation
from cpmem.step.step import Step

Policy = Callable[[Step], Estimate]


def runs_combined(step: Step) -> bool:
    """Whether a step without pipeline stages runs the combined 1F1B schedule over two or
    more micro-batches (megatron-core's ``forward_backward_no_pipelining`` hands the
    overlap to ``combined_1f1b_schedule_for_no_pipelining``)."""
    return (
        step.settings.runtime.overlap_moe_comm
        and not step.settings.pipeline.active
        and step.settings.pipeline.microbatches > 1
    )


def price_accumulation(step: Step, policy: Policy) -> Estimate:
    """The largest micro-batch's estimate (its forward figure), with the largest
    forward+backward figure of any micro-batch where they differ, and a note naming each;
    under the combined 1F1B schedule, the combined steps' moments where they are larger."""
    steps = step.microbatch_steps
    once: dict[int, Estimate] = {}
    for s in steps:
        if id(s) not in once:
            once[id(s)] = policy(s)
    priced = [once[id(s)] for s in steps]
    count = len(priced)
    fwd = max(range(count), key=lambda i: priced[i].estimate_bytes)
    est = priced[fwd]
    notes = [f"gradient accumulation: micro-batch {fwd + 1} of {count} is the largest forward"]
    if est.forward_backward_bytes is not None:
        fb = max(range(count), key=lambda i: priced[i].forward_backward_bytes or 0)
        if fb != fwd:
            est = replace(
                est,
                forward_backward_bytes=priced[fb].forward_backward_bytes,
                forward_backward_components=priced[fb].forward_backward_components,
            )
            notes.append(f"micro-batch {fb + 1} of {count} is the largest forward+backward")
    # each micro-batch's layers' backward is a moment of the step: the largest stands
    layers = [p.layers_backward_bytes for p in priced]
    at_layers = None if any(v is None for v in layers) else max(v or 0 for v in layers)
    est = replace(est, layers_backward_bytes=at_layers, notes=(*est.notes, *notes))
    if not runs_combined(step):
        return est
    # the combined step's moments are backward moments: a policy pricing the overlap
    # prices a forward+backward figure (only tight prices megatron-core's runtime)
    assert est.forward_backward_bytes is not None, "the combined 1F1B step needs a backward"
    return _with_combined(step, list(steps), priced, est, policy)


def _with_combined(
    step: Step, steps: list[Step], priced: list[Estimate], est: Estimate, policy: Policy
) -> Estimate:
    """``est`` with the combined 1F1B steps' moments (the module's bounds) where one is
    larger than its forward or forward+backward figure."""
    n = step.geometry.layers
    prefixes: dict[int, list[Estimate]] = {}  # per micro-batch: its layers 0..j as a chunk
    for s in steps:
        if id(s) not in prefixes:
            prefixes[id(s)] = [
                policy(layers_step(step, s, range(j + 1), first=True, last=False)) for j in range(n)
            ]
    # (bytes, the estimate whose components stand, its figure, the other's bytes, what)
    moments: list[tuple[int, Estimate, str, int, str]] = []
    layer_moments: list[int] = []
    for a in range(len(steps) - 1):
        b = a + 1
        act_a, act_b = _activation(steps[a]), _activation(steps[b])
        fb_a = priced[a].forward_backward_bytes or 0
        what = f"combined 1F1B: micro-batch {b + 1}'s forward beside micro-batch {a + 1}'s"
        moments.append(
            (fb_a + act_b, priced[a], "forward_backward", act_b, what + " head backward")
        )
        for k in range(n):
            below = prefixes[id(steps[a])][n - 1 - k]
            above = prefixes[id(steps[b])][k]
            other = above.estimate_bytes + act_b
            total = (below.forward_backward_bytes or 0) + act_a + other
            layer_moments.append(total)
            moments.append((total, below, "forward_backward", other + act_a, what + " layers"))
        moments.append(
            (priced[b].estimate_bytes + act_a, priced[b], "forward", act_a, what + " backward")
        )
    top = max(moments, key=lambda m: m[0])
    total, base, figure, other, what = top
    components = dict(
        base.forward_backward_components or base.components
        if figure == "forward_backward"
        else base.components
    )
    key = str(Component.PIPELINE_IN_FLIGHT)
    components[key] = components.get(key, 0) + other
    # the base's components add up to the figure the moment starts from
    assert sum(components.values()) == total, f"{what}: components do not add up"
    out = est
    if total > est.estimate_bytes:
        grown = total - est.estimate_bytes
        out = replace(
            out,
            estimate_bytes=total,
            components=components,
            per_rank_bytes=tuple(v + grown for v in est.per_rank_bytes),
        )
    if total > (est.forward_backward_bytes or 0):
        out = replace(out, forward_backward_bytes=total, forward_backward_components=components)
    at_layers = max(layer_moments)
    if out.layers_backward_bytes is not None and at_layers > out.layers_backward_bytes:
        out = replace(out, layers_backward_bytes=at_layers)
    if out is est:
        return est
    return replace(out, notes=(*out.notes, f"{what} is the largest moment"))


def _activation(microbatch: Step) -> int:
    """One layer input of the micro-batch on its busiest CP rank (an embedding's output,
    a layer's output passed on, or the gradient of one)."""
    cp = microbatch.plan.layout.cp
    return max(stage_activation(microbatch, r) for r in range(cp))
