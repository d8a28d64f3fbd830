"""The device a step runs on: named presets by the total bytes the runtime reports.

``total_bytes`` is what ``torch.cuda.get_device_properties(i).total_memory`` (and
``torch.cuda.mem_get_info()[1]``) reports, the figure PyTorch's out-of-memory message
prints as "total capacity"; it is below the marketed capacity because the driver keeps
part of the memory. Each preset names its source. A device not listed is given by its
``total_bytes`` (``--device-total-bytes``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cpmem.errors import InputError


@dataclass(frozen=True)
class Device:
    """A device by the total bytes its runtime reports."""

    name: str
    total_bytes: int
    source: str = field(default="given", compare=False)
    compute_capability_major: int | None = field(default=None, compare=False)
    """The CUDA compute capability's major version, where the preset knows it: it sizes
    the kernel workspaces a process keeps (``cpmem.pricing.workspaces``)."""
    compute_capability_minor: int | None = field(default=None, compare=False)
    """The minor version, where the preset knows it: Transformer Engine's attention
    selection tells sm90 from sm89 and sm100 from sm103 (``cpmem.step.attention_backend``)."""

    @property
    def compute_capability(self) -> tuple[int, int] | None:
        """(major, minor), where the preset knows both."""
        major, minor = self.compute_capability_major, self.compute_capability_minor
        return None if major is None or minor is None else (major, minor)

    def __post_init__(self) -> None:
        if (
            isinstance(self.total_bytes, bool)
            or not isinstance(self.total_bytes, int)
            or self.total_bytes <= 0
        ):
            raise InputError("device_total_bytes", self.total_bytes, "must be a positive integer")

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "total_bytes": self.total_bytes, "source": self.source}


MIB = 1 << 20

DEVICES: dict[str, Device] = {
    d.name: d
    for d in (
        Device(
            "a100-80gb",
            84_987_740_160,
            "deviceQuery, NVIDIA A100-SXM4-80GB, CUDA 12.2: 81051 MBytes (84987740160 bytes); "
            "PyTorch OOM messages print 79.15 GiB; compute capability 8.0",
            8,
            0,
        ),
        Device(
            "h100",
            81_008 * MIB,
            "NVIDIA H100 80GB HBM3: torch total_memory=81008MB; vllm-project/vllm#27508: "
            "'GPU 0 has a total capacity of 79.11 GiB' (nvidia-smi 81559MiB); compute capability 9.0",
            9,
            0,
        ),
        Device(
            "h200",
            150_121_021_440,
            "the measured runtime's H200 snapshot (OpenPipe/ART trainer-rank unit test: "
            "total 150,121,021,440, reserve 4,503,630,643); vllm-project/vllm#34553: "
            "'total capacity of 139.81 GiB' (nvidia-smi 143771MiB); compute capability 9.0",
            9,
            0,
        ),
        Device(
            "b200",
            182_631 * MIB,
            "NVIDIA B200: torch total_memory=182631MB; PyTorch OOM messages print 178.35 GiB "
            "(pytorch/ao#4002: 'Total Global Memory: 178.35 GB'; nvidia-smi 183359MiB); "
            "compute capability 10.0",
            10,
            0,
        ),
        Device(
            "gb200",
            186_000_000_000,
            "NVIDIA GB200 NVL72 datasheet: 186 GB HBM3e per Blackwell GPU (the marketed "
            "capacity: no torch total_memory figure is on record, so give the device's own "
            "with --device-total-bytes for admission); compute capability 10.0",
            10,
            0,
        ),
        Device(
            "mi300x",
            206_141_652_992,
            "AMD Instinct MI300X: ROCm/ROCm#4203 total_memory=196592MB; rocm-smi 'VRAM Total "
            "Memory (B): 206141652992'; vllm-project/vllm#7951: 'total capacity of 191.98 GiB'",
        ),
    )
}
"""Each figure is what PyTorch reports on one driver; another driver reserves a little
more or less (H100: 79.11-79.19 GiB, A100 80GB: 79.14-79.26 GiB, H200 139.80-139.81 GiB),
so a planner that knows its device's figure should give it (``--device-total-bytes``)."""
RUNTIME_NAMES: dict[str, str] = {
    "nvidia a100-sxm4-80gb": "a100-80gb",
    "a100": "a100-80gb",
    "nvidia a100 80gb pcie": "a100-80gb",
    "nvidia h100 80gb hbm3": "h100",
    "nvidia h100": "h100",
    "nvidia h200": "h200",
    "nvidia b200": "b200",
    "amd instinct mi300x": "mi300x",
}
"""Names ``torch.cuda.get_device_name()`` returns (the golden cells' ``device``)."""


def resolve_device(device: str | Device | None, total_bytes: int | None = None) -> Device | None:
    """A preset by name (case-insensitive), a ``Device``, or a device of ``total_bytes``;
    None when neither is given."""
    if device is not None and total_bytes is not None:
        raise InputError(
            "device_total_bytes", total_bytes, "give a device preset or its total bytes, not both"
        )
    if total_bytes is not None:
        return Device("custom", total_bytes)
    if device is None or isinstance(device, Device):
        return device
    key = str(device).strip().lower()
    key = RUNTIME_NAMES.get(key, key)
    if key not in DEVICES:
        raise InputError("device", device, f"unknown device; use one of {sorted(DEVICES)}")
    return DEVICES[key]
