# mypy: disable-error-code="no-untyped-call,no-any-return"
"""Live-storage accounting at dispatch level: what the CUDA caching allocator would
report as allocated bytes above the pre-forward baseline.

Every storage an op creates during the step is counted (rounded up to 512 bytes, as
the caching allocator rounds every block) until its last reference dies (a weakref
finaliser on the storage; torch keeps one Python object per storage, so it fires when
the storage is freed). Storages that existed before the step (parameters, the
baseline) are never seen, so never counted. Each storage carries the label of the
module that allocated it, so a peak can be split by component.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

BLOCK = 512


def rounded(nbytes: int) -> int:
    return -(-nbytes // BLOCK) * BLOCK


@dataclass
class PhasePeak:
    """The highest live total seen in a phase, and its split by label at that moment."""

    bytes: int = 0
    components: dict[str, int] = field(default_factory=dict)


class LiveBytesTracker(TorchDispatchMode):
    """Counts live bytes of storages created while active; ``label`` is set by callers."""

    def __init__(self, baseline: list[torch.Tensor] | tuple[torch.Tensor, ...] = ()) -> None:
        """``baseline``: tensors alive before the step (parameters); views of them made
        during the step are not new allocations."""
        super().__init__()
        self._baseline = {int(t.untyped_storage()._cdata) for t in baseline}
        self._pinned = [t.untyped_storage() for t in baseline]  # keep their keys unique
        self.label = "other"
        self.live = 0
        self.by_label: dict[str, int] = {}
        self._seen: dict[int, tuple[int, str]] = {}
        self.peaks: dict[str, PhasePeak] = {}
        self.phase = "forward"
        self.ops = 0

    def _free(self, key: int) -> None:
        nbytes, label = self._seen.pop(key)
        self.live -= nbytes
        self.by_label[label] -= nbytes

    def _add(self, st: torch.UntypedStorage) -> None:
        key = int(st._cdata)
        nbytes = st.nbytes()
        if key in self._seen or nbytes == 0 or key in self._baseline:
            return
        size = rounded(nbytes)
        self._seen[key] = (size, self.label)
        weakref.finalize(st, self._free, key)
        self.live += size
        self.by_label[self.label] = self.by_label.get(self.label, 0) + size
        peak = self.peaks.setdefault(self.phase, PhasePeak())
        if self.live > peak.bytes:
            peak.bytes = self.live
            peak.components = {k: v for k, v in self.by_label.items() if v}

    def set_phase(self, phase: str) -> None:
        """Start a phase; its peak starts at the live total carried into it."""
        self.phase = phase
        self.peaks[phase] = PhasePeak(self.live, {k: v for k, v in self.by_label.items() if v})

    def snapshot(self) -> PhasePeak:
        return PhasePeak(self.live, {k: v for k, v in self.by_label.items() if v})

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops += 1
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._add(t.untyped_storage())
        return out
