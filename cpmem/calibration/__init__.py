"""Calibration of a fitted policy (``tight``): its margin fitted on the measured samples
(``fitting``), cross-validated by fold (``crossval``), the policies with fitted constants
and the checks that keep a fit honest (``fitted``), the held-out misses declared with
their reasons (``misses``), and the policies' variants the power study refits
(``variant``).

May import ``samples`` and everything below it.
"""

# The suite reads golden/ as DataFrames: without the golden extra (pandas, pandera) this
# stops with one line naming it, before any of its modules is loaded.
import cpmem.golden  # noqa: F401
