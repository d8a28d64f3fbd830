"""What is priced: one description of a step (``Step``: settings + plan + request) and
the one function that builds it from user-level arguments (``describe_step``).

May import ``cpmem.model`` and ``cpmem.plan``; nothing that prices.
"""
