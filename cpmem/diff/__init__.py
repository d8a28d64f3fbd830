"""``cpmem diff``: what an estimator change moves, a git revision against the working tree
(``cli``: comparing; ``checkout``: a revision's worktree and the subprocess pricing it;
``snapshot``: the script that prices one checkout; ``render``: the Markdown).

May import the gate and everything below it.
"""

# The suite reads golden/ as DataFrames: without the golden extra (pandas, pandera) this
# stops with one line naming it, before any of its modules is loaded.
import cpmem.golden  # noqa: F401
