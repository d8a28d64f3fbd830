"""The ``tight`` policy: structural forward and forward+backward peaks (docs/tight.md).

Unlike ``reference`` (calibrated envelopes times 1.10), ``tight`` prices each layer kind
with the saved sets the oracles and the rank simulator show, chosen by recompute setting
and execution mode (eager/compiled, fused/unfused SwiGLU), keeps every fixed cost as its
own component, prices the backward's first moment, and adds one small documented margin
(a factor and fixed allowances) fitted so that every measured rank-sample is covered.

- ``attention``, ``gdn``, ``mlp``, ``moe``: one layer kind each: its saved set, its peak
  without gradients, its backward, with their constants beside them;
- ``widths``: the widths of one model at one layout, which every kind reads;
- ``calibrated``: what was chosen from measured cells rather than counted, and the
  fitted ``MARGIN``, each with its evidence;
- ``compose``: the kinds composed over the model's layers and the step's phases;
- ``policy``: the margin applied, the figure per CP rank, the ``Estimate``.

Its targets, the margin fit, the leave-out studies and its report live in the suite
(``cpmem.gate``, ``cpmem.calibration``, ``cpmem.reports``).
"""

from cpmem.pricing.tight import policy  # noqa: F401  (registers "tight")
