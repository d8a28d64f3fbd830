"""The ``tight`` policy: structural forward and forward+backward peaks (docs/tight.md).

Unlike ``reference`` (calibrated envelopes times 1.10), ``tight`` prices each layer kind
with the saved sets the oracles and the rank simulator show, chosen by recompute setting
and execution mode (eager/compiled, fused/unfused SwiGLU), keeps every fixed cost as its
own component, prices the backward's first moment, and adds one small documented margin
(a factor and fixed allowances) fitted so that every measured rank-sample is covered.

- the layer kinds it composes are ``cpmem.pricing.kinds`` (one module each: the saved
  set, the peak without gradients, the backward, with their constants beside them);
- ``widths``: the widths of one model at one layout, which every kind reads;
- ``calibrated``: what was chosen from measured cells rather than counted, and the
  fitted ``MARGIN``, each with its evidence;
- ``compose``: the kinds composed over the model's layers and the step's phases;
- ``policy``: the margin applied, the figure per CP rank, the ``Estimate``.

Its targets, the margin fit, the leave-out studies and its report live in the suite
(``cpmem.gate``, ``cpmem.calibration``, ``cpmem.reports``).

Importing ``cpmem.pricing`` registers the policy (``policy``); this package's own
``__init__`` imports nothing, so a layer kind may read ``widths`` and ``calibrated``
without loading the policy.
"""
