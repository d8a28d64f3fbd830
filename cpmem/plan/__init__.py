"""Who owns which tokens: requests (prefix trees), the parallel layout, plans, planners.

May import ``cpmem.model``; nothing that prices.
"""
