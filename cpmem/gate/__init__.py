"""The estimator gate: golden cells to priced inputs, checks, targets, power studies,
controls, fitting and reports.

May import everything above it (model, plan, pricing, admission, golden).
"""

# The gate reads golden/ as DataFrames: without the golden extra (pandas, pandera) this
# stops with one line naming it, before any gate module is loaded.
import cpmem.golden  # noqa: F401
