"""Rank simulator: one CP/TP rank of a real model at real size under fake tensors.

It imports nothing from cpmem; it takes plain numbers (see README.md).
"""

SIM_VERSION = "0.1.0"
