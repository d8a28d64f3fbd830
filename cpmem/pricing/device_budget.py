"""The budget a device leaves a step's activations, and the whole step against it.

The measured runtime's rule (``runtime_budget``): what it can still allocate (free bytes
plus reserved-but-unused bytes of PyTorch's caching allocator) less a reserve of 3% of
the device's total. Before the job starts a planner has neither figure; on a device of
``total`` bytes they are what is left after the memory PyTorch does not manage (the CUDA
context and the communicators' buffers, ``NON_TORCH_BYTES``) and what PyTorch has
allocated (the static memory, ``cpmem.pricing.static``), so

    budget = total - 3% total - NON_TORCH_BYTES - static.

``cpmem.gate.static_check`` holds both forms to every recorded ``available_bytes``.
"""

from __future__ import annotations

from dataclasses import dataclass

from cpmem.errors import InputError, require_bytes
from cpmem.pricing.static import StaticMemory
from cpmem.step.device import Device

RESERVE_FRACTION = 0.03
"""The runtime's reserve: 3% of the device's total (docs/pricing.md, "Admission")."""
NON_TORCH_BYTES = 2_793_275_904
"""Device memory outside PyTorch's allocator on the measured runtime (the CUDA context,
NCCL's communicators), about 2.6 GiB: what its Qwen3-1.7B TP2 process left unaccounted,
the H200's 150,121,021,440 B less the 3% reserve less the recorded available and
baseline (142,824,114,893 B together). The other processes' cells, Qwen3.5-4B and -27B
at TP2/4/8 and Qwen3.5-35B-A3B at TP4 EP4, are its check (``cpmem.gate.static_check``);
the CP processes left about 0.5 GB more."""


def runtime_budget(
    free_bytes: float, reusable_reserved_bytes: float, device_total_bytes: float
) -> int:
    """free + reusable reserved - 3% of the device's total: the budget a running process
    computes from what its allocator reports (no GPU query here)."""
    for name, value in (
        ("free_bytes", free_bytes),
        ("reusable_reserved_bytes", reusable_reserved_bytes),
        ("device_total_bytes", device_total_bytes),
    ):
        require_bytes(name, value)
    usable = free_bytes + reusable_reserved_bytes - RESERVE_FRACTION * device_total_bytes
    return max(0, int(usable))  # less than nothing usable is still nothing


@dataclass(frozen=True)
class DeviceBudget:
    """A device's bytes on one rank: what the runtime reserves, what sits outside
    PyTorch, the static memory, and the budget left for a step's activations."""

    device: Device
    reserve_bytes: int
    non_torch_bytes: int
    static: StaticMemory

    @property
    def budget_bytes(self) -> int:
        left = self.device.total_bytes - self.reserve_bytes - self.non_torch_bytes
        return max(0, left - self.static.total)

    def to_dict(self) -> dict[str, object]:
        return {
            "device": self.device.to_dict(),
            "reserve_bytes": self.reserve_bytes,
            "non_torch_bytes": self.non_torch_bytes,
            **self.static.to_dict(),
            "budget_bytes": self.budget_bytes,
        }


def device_budget(device: Device, static: StaticMemory) -> DeviceBudget:
    """What ``device`` leaves a step's activations once ``static`` is allocated."""
    if not isinstance(device, Device):
        raise InputError("device", device, "must be a Device")
    reserve = int(RESERVE_FRACTION * device.total_bytes)
    return DeviceBudget(device, reserve, NON_TORCH_BYTES, static)
