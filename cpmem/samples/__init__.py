"""The suite's samples: each golden cell and simulated grid row as the ``Step`` it was
measured or simulated at (``cells``, ``rows``), and the targets a policy declares over
them (``targets``, one type for both tiers).

May import everything of the estimator (model, plan, step, pricing) and ``golden``.
"""

# The suite reads golden/ as DataFrames: without the golden extra (pandas, pandera) this
# stops with one line naming it, before any of its modules is loaded.
import cpmem.golden  # noqa: F401
