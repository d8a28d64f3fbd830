"""What an admission decision is taken against: a device, a given budget, or a running
process's own figures, and one rule for each.

- **a device** (``device=`` / ``--device``, ``--device-total-bytes``): its total less the
  runtime's 3% reserve and the memory outside PyTorch (``cpmem.pricing.device_budget``)
  is what the step's static memory and its activations share; the decision compares
  the two together with it.
- **a budget** (``usable_bytes=`` / ``--budget-gib``): the bytes a device can give the
  step, stated instead of derived: the same comparison, static memory and activations
  together, with nothing taken off it (a budget is already what is usable, after any
  reserve and memory outside PyTorch). A budget is a device whose usable bytes are
  given (``given_budget``).
- **the runtime's figures** (``budget_bytes=`` / ``--free-bytes``,
  ``--reusable-reserved-bytes``, ``--device-total-bytes``): what a running process can
  still allocate once its static memory is allocated (free + reusable reserved - 3% of
  the total, ``runtime_budget``, the rule of the measured runtime, whose recorded
  ``available_bytes`` are such figures); it is compared with the activations alone,
  since the static memory it would hold is already out of it.

A budget and a device given together are two budgets: the smaller decides, and the
decision names which (``Budget.decided_by``, with both figures in ``Budget.usable``).
The runtime's figures are of a process already running on its device, so a device or a
budget beside them is refused (one of them would be ignored).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from cpmem.errors import InputError, require_bytes
from cpmem.pricing.device_budget import DeviceBudget, device_budget
from cpmem.pricing.static import StaticMemory
from cpmem.step.device import Device
from cpmem.step.step import Step
from cpmem.units import GIB

Source = Literal["budget", "device", "runtime"]

BUDGET_DEVICE = "budget"
"""The name of the device a given budget stands for (``given_budget``)."""


def given_budget(usable_bytes: int, static: StaticMemory) -> DeviceBudget:
    """A budget of ``usable_bytes`` as a device: the bytes static memory and activations
    share, with no reserve or memory outside PyTorch taken off them."""
    device = Device(BUDGET_DEVICE, usable_bytes, "given: the device's usable bytes")
    return DeviceBudget(device, 0, 0, static)


@dataclass(frozen=True)
class Budget:
    """What a decision is taken against: ``available_bytes`` this rank can give the step
    (static memory and activations together, or the activations alone for the runtime's
    figures), and where it came from."""

    available_bytes: int
    decided_by: Source
    device: Device | None = None
    """The step's device where it was weighed as a budget (None: no device, or one that
    only chose the step's kernels)."""
    usable: tuple[tuple[Source, int], ...] = ()
    """Every whole-device budget weighed, by source: the given budget's bytes, the
    device's total less its reserve and the memory outside PyTorch."""

    @property
    def whole_device(self) -> bool:
        """Whether the step's static memory counts against the budget (all but the
        runtime's figures, which are left after it)."""
        return self.decided_by != "runtime"

    def device_budget(self, static: StaticMemory) -> DeviceBudget | None:
        """The deciding budget with ``static`` allocated under the activations (None for
        the runtime's figures)."""
        if self.decided_by == "device":
            assert self.device is not None
            return device_budget(self.device, static)
        if self.decided_by == "budget":
            return given_budget(self.available_bytes, static)
        return None

    def to_dict(self) -> dict[str, object]:
        return {
            "decided_by": self.decided_by,
            "usable_bytes": dict(self.usable),
            "device": None if self.device is None else self.device.name,
        }


def gib_budget(field: str, gib: float) -> int:
    """A budget given in GiB (``--budget-gib``), in bytes: a finite number above 0."""
    if isinstance(gib, bool) or not isinstance(gib, int | float) or not 0 < gib < float("inf"):
        raise InputError(field, gib, "must be a finite number of GiB > 0")
    return int(gib * GIB)


def step_budget(
    step: Step,
    budget_bytes: float | None = None,
    usable_bytes: float | None = None,
    *,
    use_device: bool = True,
) -> Budget:
    """This rank's budget for ``step`` (module docstring): the runtime's ``budget_bytes``,
    a given ``usable_bytes``, the step's device (where ``use_device``: False where the
    device only chose the step's kernels, as the Megatron-LM door assumes an H100 where
    none is given), or the smaller of a budget and the device."""
    device = step.settings.device if use_device else None
    if budget_bytes is not None:
        others = [] if usable_bytes is None else ["a budget (usable_bytes)"]
        others += [] if device is None else [f"a device ({device.name})"]
        if others:
            raise InputError(
                "budget_bytes",
                budget_bytes,
                "the runtime's figures are what is left after its static memory; give "
                f"them or {' and '.join(others)}, not both",
            )
        require_bytes("budget_bytes", budget_bytes)
        return Budget(int(budget_bytes), "runtime")
    usable: list[tuple[Source, int]] = []
    if usable_bytes is not None:
        require_bytes("usable_bytes", usable_bytes)
        if int(usable_bytes) <= 0:
            raise InputError("usable_bytes", usable_bytes, "must be > 0 bytes")
        usable.append(("budget", int(usable_bytes)))
    if device is not None:
        usable.append(("device", device_budget(device, StaticMemory({})).budget_bytes))
    if not usable:
        raise InputError(
            "budget_bytes",
            None,
            "give a budget (usable_bytes= / --budget-gib), a device (device= / --device) "
            "or the runtime's figures (budget_bytes= / --free-bytes ...)",
        )
    source, available = min(usable, key=lambda pair: pair[1])  # the budget on a tie
    return Budget(available, source, device, usable=tuple(usable))
