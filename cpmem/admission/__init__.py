"""Fit / split / refuse, agreed across ranks (local or torch.distributed communicators).

May import ``cpmem.model``, ``cpmem.plan`` and ``cpmem.pricing``.
"""
