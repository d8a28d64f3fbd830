"""The estimator gate: a policy (or an external estimator) checked against the measured
tier (golden cells: coverage, conformance to recorded estimates, refusals, controls,
power, targets, the request path) and the simulated tier (the rank simulator's grid).

May import everything of the estimator, ``golden``, ``samples``, ``calibration`` and
``reports``.
"""

# The gate reads golden/ as DataFrames: without the golden extra (pandas, pandera) this
# stops with one line naming it, before any gate module is loaded.
import cpmem.golden  # noqa: F401
