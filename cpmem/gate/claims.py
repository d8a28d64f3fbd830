"""Conformance claims: the recorded estimates each policy reproduces to the byte."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from cpmem.calibration.variant import as_recorded, without_segment_states
from cpmem.golden.cells import MeasuredCell
from cpmem.model.load import load_model
from cpmem.pricing.reference import ReferenceStructure

RecordedColumn = Literal["recorded_estimate_bytes", "recorded_old_estimate_bytes"]


def _is_moe(cell: MeasuredCell) -> bool:
    return load_model(cell.model).is_moe


@dataclass(frozen=True)
class Claim:
    """A set of recorded estimates a policy reproduces to the byte.

    ``variant`` changes the reference structure to the estimator that recorded the rows:
    every recorded estimate charged the cold allowance on every step (``as_recorded``),
    and the ``before_segment_states`` rows priced no segment states.
    """

    name: str
    description: str
    selects: Callable[[MeasuredCell], bool]
    column: RecordedColumn = "recorded_estimate_bytes"
    variant: Callable[[ReferenceStructure], ReferenceStructure] | None = as_recorded


_CP_FINAL = Claim(
    "cp-final",
    "CP file, recorded estimate (busiest-rank pricing)",
    lambda c: c.cp > 1 and c.phase == "final",
)
_TP_DENSE = Claim(
    "tp-dense",
    "TP file, dense final and eager_control rows",
    lambda c: c.cp == 1 and c.phase in ("final", "eager_control") and not _is_moe(c),
)
_BEFORE_SEGMENT_STATES = Claim(
    "before-segment-states",
    "TP file, before_segment_states rows, priced without segment states",
    lambda c: c.phase == "before_segment_states",
    variant=lambda structure: as_recorded(without_segment_states(structure)),
)
_CP_OLD = Claim(
    "cp-old",
    "CP file, recorded old estimate (every rank charged the packed count)",
    lambda c: c.cp > 1 and c.recorded_old_estimate_bytes is not None,
    column="recorded_old_estimate_bytes",
)

# Which recorded estimates each policy claims to reproduce. A policy that is not
# listed claims none; a new policy (e.g. "tight") may say so explicitly with ().
CONFORMANCE_CLAIMS: dict[str, tuple[Claim, ...]] = {
    "reference": (_CP_FINAL, _TP_DENSE, _BEFORE_SEGMENT_STATES),
    "global": (_CP_OLD,),
    "tight": (),  # calibrated to the measurements: reproduces no recorded estimate
}


def claims_for(policy: str) -> tuple[Claim, ...]:
    return CONFORMANCE_CLAIMS.get(policy, ())
