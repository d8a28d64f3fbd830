"""Gradient accumulation at one pipeline stage: micro-batches one after another.

Without pipeline stages (``pp = 1``) a step of ``M`` micro-batches runs each one's
forward and backward before the next one's forward (megatron-core's
``forward_backward_no_pipelining``): what a micro-batch keeps for its backward is freed
by that backward, so no two micro-batches' activations are live together. What persists
across them is the weights' gradient buffers (``main_grad``, accumulated in place), which
the static memory already holds (``cpmem.pricing.static``). So the step's figure is its
largest micro-batch's, forward and forward+backward each taken where it is largest.

With one request repeated (``Step.microbatches`` empty) the step is that request's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from cpmem.pricing.estimate import Estimate
from cpmem.step.step import Step

Policy = Callable[[Step], Estimate]


def price_accumulation(step: Step, policy: Policy) -> Estimate:
    """The largest micro-batch's estimate (its forward figure), with the largest
    forward+backward figure of any micro-batch where they differ, and a note naming each."""
    steps = step.microbatch_steps
    priced = [policy(s) for s in steps]
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
    return replace(est, layers_backward_bytes=at_layers, notes=(*est.notes, *notes))
