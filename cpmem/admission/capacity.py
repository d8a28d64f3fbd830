"""Capacity: the longest sequence, and the largest pack of equal sequences, that fit a
device, for each TP x CP layout.

For each layout, two searches on the estimator: the longest single sequence, and the
longest length ``L`` of ``n`` equal sequences (no shared prefix) that fit, for the step
the settings describe (recompute, head, adapters, optimizer, ...). Every probe is a step
``describe_step`` builds and ``cpmem.pricing.registry.price`` prices, exactly what
``cpmem.api.estimate`` returns for the same arguments, so a length reported here is one
``estimate`` (and ``admit``'s cost-optimal layout) fits. The figure is the forward peak
or the whole step (``figure``), against what the device leaves once the layout's static
memory is allocated (``Estimate.device_budget``): the budget differs per layout, since
TP shards the weights.

The search (doubling, then bisection on integer lengths) assumes that the figure never
decreases as the length grows, for a fixed layout and count of sequences. That holds
for the hybrid models' ``gdn-segments`` layout and for every planner without CP
(``tests/unit/admission/test_capacity.py`` holds it as a property), but not exactly for
the ``chunked`` layout under CP (the default for attention-only models): its cost model
moves rank boundaries by whole 512-token chunks, so the busiest rank's tokens, and the
figure, can drop by a chunk or two as the sequences grow (a pack of 2 x 43,008 tokens
on qwen3-1.7b at CP 2, one sequence per rank exactly, fits while 2 x 41,834..43,007 do
not). So every answer is guarded: ``GUARD_SAMPLES`` lengths spread over the last
``1 / GUARD_DIVISOR`` below it must fit too, else the search goes on below the shortest
that does not (``Fit.guard_lowered`` counts how often). The answer then fits, the next
length does not, and no sampled shorter length fails; it is a sampled check, not a
proof that every shorter length fits. Lengths a planner refuses (a CP rank left empty,
which happens only for short requests) are skipped: the search never reports one, and a
refusal is never read as the memory running out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Unpack

from cpmem.admission.pricer import FIGURES, Figure, Pricer
from cpmem.errors import InputError, require_positive_int
from cpmem.model.geometry import ModelGeometry
from cpmem.model.load import load_model
from cpmem.pricing.device_budget import device_budget
from cpmem.pricing.estimate import Estimate
from cpmem.pricing.static import StaticMemory
from cpmem.step.describe import SettingsArguments, describe_settings, describe_step
from cpmem.step.device import Device, resolve_device

MAX_RANKS = 8
"""Default layouts: TP x CP <= 8 ranks (one node)."""
SIZES = (1, 2, 4, 8)
"""TP and CP sizes of the default layouts."""
CAP = 1 << 26
"""The longest length searched (67,108,864 tokens); a layout that still fits there is
reported as ``at_cap`` (it fits at least that much)."""
DEFAULT_PACK = 2
GUARD_SAMPLES = 16
GUARD_DIVISOR = 16
"""The guard checks ``GUARD_SAMPLES`` lengths over the last ``1 / GUARD_DIVISOR`` of the
range below an answer (``_guard``)."""
_OWN = ("tp", "cp", "allow_long")
"""Settings capacity sets itself: the layout (``layouts``), long sequences allowed."""


@dataclass(frozen=True)
class Fit:
    """The longest ``length`` of ``sequences`` equal sequences that fits one layout.

    ``length`` None: not even the shortest plannable request fits. ``at_cap``: it still
    fits at the search's cap (``CAP``), so the layout fits at least that much.
    ``beyond_positions``: ``length`` exceeds the model's ``max_position_embeddings``
    (priced as ``--allow-long`` prices it)."""

    sequences: int
    length: int | None
    required_bytes: int | None
    """The figure at ``length`` (None where nothing fits)."""
    at_cap: bool = False
    beyond_positions: bool = False
    probes: int = 0
    guard_lowered: int = 0
    """How often a shorter length than the bisection's answer did not fit, so the search
    went on below it (the figure is not monotone there: ``_guard``)."""

    @property
    def tokens(self) -> int:
        return 0 if self.length is None else self.sequences * self.length

    def to_dict(self) -> dict[str, object]:
        return {
            "sequences": self.sequences,
            "length": self.length,
            "tokens": self.tokens,
            "required_bytes": self.required_bytes,
            "at_cap": self.at_cap,
            "beyond_positions": self.beyond_positions,
            "guard_lowered": self.guard_lowered,
        }


@dataclass(frozen=True)
class LayoutCapacity:
    """One layout's answers and the budget they were found against."""

    tp: int
    cp: int
    sp: bool
    planner: str
    budget_bytes: int
    """What the device leaves the activations (total less the reserve, the memory
    outside PyTorch and ``static_bytes``)."""
    static_bytes: int
    step_kind: str
    """The step kind (``first`` or ``steady``) that holds more on the device at the
    longest single sequence: the one the budget and static columns are of."""
    single: Fit
    pack: Fit

    @property
    def label(self) -> str:
        return f"{self.tp}x{self.cp}"

    @property
    def longest_sequence(self) -> int | None:
        return self.single.length

    @property
    def pack_length(self) -> int | None:
        return self.pack.length

    @property
    def pack_tokens(self) -> int:
        return self.pack.tokens

    @property
    def required_at_longest(self) -> int | None:
        return self.single.required_bytes

    @property
    def beyond_positions(self) -> bool:
        return self.single.beyond_positions or self.pack.beyond_positions

    def to_dict(self) -> dict[str, object]:
        return {
            "tp": self.tp,
            "cp": self.cp,
            "sp": self.sp,
            "planner": self.planner,
            "budget_bytes": self.budget_bytes,
            "static_bytes": self.static_bytes,
            "step": self.step_kind,
            "longest_sequence": self.single.to_dict(),
            "pack": self.pack.to_dict(),
        }


@dataclass(frozen=True)
class Excluded:
    """A default layout the model (or the settings) cannot run, and why."""

    tp: int
    cp: int
    reason: str

    def to_dict(self) -> dict[str, object]:
        return {"tp": self.tp, "cp": self.cp, "reason": self.reason}


@dataclass(frozen=True)
class Capacity:
    """Every layout's capacity on one device, for one policy, figure and settings."""

    model: str
    device: Device
    policy: str
    figure: Figure
    pack: int
    cap: int
    max_position_embeddings: int | None
    layouts: tuple[LayoutCapacity, ...]
    excluded: tuple[Excluded, ...] = ()
    usable_bytes: int = 0
    """The device's total less the runtime's reserve and the memory outside PyTorch: what
    static memory and a step's figure share (each layout's budget is this less its static)."""
    reserve_bytes: int = 0
    non_torch_bytes: int = 0
    recompute: str = ""
    head: str = ""
    adapter: str = ""
    """The step's recompute, head and adapters, as its estimates label them."""
    geometry: ModelGeometry | None = field(default=None, compare=False, repr=False)
    settings: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    """The settings every probe was described with (for ``required``)."""

    @property
    def probes(self) -> int:
        return sum(lay.single.probes + lay.pack.probes for lay in self.layouts)

    def required(self, tp: int, cp: int, lengths: Sequence[int]) -> int | None:
        """The figure of ``lengths`` under layout ``tp`` x ``cp`` and these settings (None:
        the planner refuses the request), priced as every search probe is."""
        pricer = Pricer(self.policy, self.figure, whole_device=True)
        est = _estimate(self._model(), tp, cp, lengths, pricer, self.settings)
        return None if est is None else est.device_required(self.figure)[0]

    def _model(self) -> ModelGeometry:
        if self.geometry is None:
            raise InputError("model", self.model, "this Capacity holds no geometry to price")
        return self.geometry

    def to_dict(self) -> dict[str, object]:
        return {
            "model": self.model,
            "device": self.device.to_dict(),
            "policy": self.policy,
            "figure": self.figure,
            "pack": self.pack,
            "cap": self.cap,
            "max_position_embeddings": self.max_position_embeddings,
            "recompute": self.recompute,
            "head": self.head,
            "adapter": self.adapter,
            "usable_bytes": self.usable_bytes,
            "reserve_bytes": self.reserve_bytes,
            "non_torch_bytes": self.non_torch_bytes,
            "layouts": [lay.to_dict() for lay in self.layouts],
            "excluded": [e.to_dict() for e in self.excluded],
        }


def parse_layouts(text: str) -> list[tuple[int, int]]:
    """``1x1,2x1,1x2`` as (tp, cp) pairs; anything else names ``layouts``."""
    items = text.split(",")
    out = []
    for i, item in enumerate(items):
        parts = item.strip().lower().split("x")
        if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
            raise InputError("layouts", text, f"item {i + 1} ({item!r}) is not TPxCP, e.g. 2x4")
        tp, cp = (int(p) for p in parts)
        if tp < 1 or cp < 1:
            raise InputError("layouts", text, f"item {i + 1} ({item!r}): sizes must be >= 1")
        out.append((tp, cp))
    return out


def default_layouts(
    geometry: ModelGeometry, **settings: Unpack[SettingsArguments]
) -> tuple[list[tuple[int, int]], list[Excluded]]:
    """Every TP x CP <= 8 (TP, CP in 1, 2, 4, 8) the model's heads allow
    (``ModelGeometry.check_tp``) and the settings can run (e.g. ``cp_comm="a2a"`` needs
    the heads per TP rank divisible by CP); the others, with the reason."""
    kept: list[tuple[int, int]] = []
    excluded: list[Excluded] = []
    for tp in SIZES:
        for cp in SIZES:
            if tp * cp > MAX_RANKS:
                continue
            reason = _layout_refusal(geometry, tp, cp, settings)
            if reason is None:
                kept.append((tp, cp))
            else:
                excluded.append(Excluded(tp, cp, reason))
    return kept, excluded


def _layout_refusal(
    geometry: ModelGeometry, tp: int, cp: int, settings: Mapping[str, Any]
) -> str | None:
    """Why the layout cannot run the model under ``settings`` (None: it can). Only the
    layout's own refusals (``tp``, ``cp``, ``cp_comm``) count; any other bad setting raises."""
    try:
        geometry.check_tp(tp)
        describe_settings(geometry, tp=tp, cp=cp, **settings)
    except InputError as exc:
        if exc.field in ("tp", "cp", "cp_comm"):
            return str(exc)
        raise
    return None


def capacity(
    model: str | ModelGeometry | None = None,
    *,
    layouts: Iterable[tuple[int, int]] | str | None = None,
    pack: int = DEFAULT_PACK,
    policy: str | None = None,
    figure: Figure = "forward",
    cap: int = CAP,
    **settings: Unpack[SettingsArguments],
) -> Capacity:
    """For each TP x CP layout (``layouts``: pairs or ``"1x1,2x4"``; default: every
    TP x CP <= 8 the model's heads allow, ``default_layouts``), the longest single
    sequence and the longest length of ``pack`` equal sequences whose ``figure``
    (``forward``: ``estimate_bytes``; ``forward_backward``: the whole step, for the
    policies that price it) fits what the settings' ``device`` (a preset or a
    ``Device``, or ``device_total_bytes``; one is required) leaves once the layout's
    static memory is allocated.

    ``settings`` are ``describe_settings``'s keywords (device, recompute, modules, head,
    lora_rank, lora_dropout, lora_targets, cp_comm, optimizer, dp, distributed_optimizer,
    compiled, planner, cold, sp, ep, config, ...), passed to every probe unchanged; the
    layout (``tp``, ``cp``) is capacity's own, and lengths past the model's positions are
    priced (``allow_long``) and flagged (``Fit.beyond_positions``).

    The search: from the shortest request a planner accepts (``ceil(cp / n)`` tokens per
    sequence, so each rank holds one), double the length until it does not fit (up to
    ``cap``), bisect on integers, then check the answer against shorter lengths
    (``_guard``): the figure is assumed never to decrease with the length, which the
    chunked planner under CP does not hold exactly (module docstring)."""
    args: dict[str, Any] = dict(settings)
    given = [k for k in _OWN if k in args]
    if given:
        raise InputError(given[0], args[given[0]], "capacity sets it itself (give layouts)")
    if figure not in FIGURES:
        raise InputError("figure", figure, f"must be one of {list(FIGURES)}")
    require_positive_int("pack", pack)
    require_positive_int("cap", cap)
    dev = resolve_device(args.pop("device", None), args.pop("device_total_bytes", None))
    if dev is None:
        raise InputError(
            "device", None, "give a device preset (--device NAME) or --device-total-bytes N"
        )
    geometry = load_model(
        model, config=args.pop("config", None), fused_swiglu=args.pop("fused_swiglu", None)
    )
    args["device"] = dev
    args["allow_long"] = True
    if geometry.positions == "learned":  # no position beyond a learned table's rows
        cap = min(cap, geometry.learned_position_rows)

    excluded: list[Excluded] = []
    if layouts is None:
        pairs, excluded = default_layouts(geometry, **args)
        if not pairs:
            raise InputError(
                "layouts", None, f"no TP x CP <= {MAX_RANKS} layout can run {geometry.name}"
            )
    else:
        pairs = parse_layouts(layouts) if isinstance(layouts, str) else list(layouts)
        if not pairs:
            raise InputError("layouts", pairs, "name at least one TPxCP layout")
        for tp, cp in pairs:
            reason = _layout_refusal(geometry, tp, cp, args)
            if reason is not None:
                raise InputError("layouts", f"{tp}x{cp}", reason)

    pricer = Pricer(policy, figure, whole_device=True)
    searched = [_layout(geometry, tp, cp, pack, pricer, cap, args) for tp, cp in pairs]
    found = tuple(lay for lay, _ in searched)
    est = searched[0][1]
    whole = device_budget(dev, StaticMemory({}))
    return Capacity(
        model=geometry.name,
        device=dev,
        policy=est.policy,
        figure=figure,
        pack=pack,
        cap=cap,
        max_position_embeddings=geometry.max_position_embeddings,
        layouts=found,
        excluded=tuple(excluded),
        recompute=est.recompute,
        head=est.head.label,
        adapter=est.trained,
        usable_bytes=whole.budget_bytes,
        reserve_bytes=whole.reserve_bytes,
        non_torch_bytes=whole.non_torch_bytes,
        geometry=geometry,
        settings=args,
    )


def _estimate(
    geometry: ModelGeometry,
    tp: int,
    cp: int,
    lengths: Sequence[int],
    pricer: Pricer,
    settings: Mapping[str, Any],
) -> Estimate | None:
    """The step ``cpmem.api.estimate(geometry, lengths, tp=tp, cp=cp, **settings)`` prices,
    at the larger of its first and its steady step on the device (``Pricer.whole_device``);
    None where the planner refuses the request (a CP rank left empty)."""
    try:
        step = describe_step(geometry, list(lengths), tp=tp, cp=cp, **settings)
    except InputError as exc:
        if exc.field == "cp":
            return None
        raise
    return pricer.estimate(step)


@dataclass
class _Search:
    """One layout's probes: the whole-device figure (static memory + activations, at the
    step kind that holds more) of ``n`` sequences of ``L``, against what the device
    leaves them (``usable``)."""

    geometry: ModelGeometry
    tp: int
    cp: int
    pricer: Pricer
    settings: Mapping[str, Any]
    usable: int
    probes: int = 0
    last: Estimate | None = None
    seen: dict[tuple[int, int], Estimate | None] = field(default_factory=dict)

    def estimate(self, n: int, length: int) -> Estimate | None:
        if (n, length) not in self.seen:
            self.probes += 1
            est = _estimate(
                self.geometry, self.tp, self.cp, [length] * n, self.pricer, self.settings
            )
            self.last = est or self.last
            self.seen[(n, length)] = est
        return self.seen[(n, length)]

    def required(self, n: int, length: int) -> int | None:
        """The whole-device bytes of ``n`` sequences of ``length`` (None: refused)."""
        est = self.estimate(n, length)
        return None if est is None else self.pricer.required(est)

    def activations(self, n: int, length: int) -> int | None:
        """The figure's activations at ``length`` (beside its static memory)."""
        est = self.estimate(n, length)
        return None if est is None else est.device_required(self.pricer.figure)[0]

    def longest_fit(self, n: int, below: int) -> int:
        """The longest length of ``n`` sequences probed so far that fits, under ``below``."""
        return max(
            length
            for (m, length) in list(self.seen)
            if m == n and length < below and self.fits(n, length)
        )

    def fits(self, n: int, length: int) -> bool | None:
        """True / False, or None where the request is refused by the planner."""
        need = self.required(n, length)
        return None if need is None else need <= self.usable


def _layout(
    geometry: ModelGeometry,
    tp: int,
    cp: int,
    pack: int,
    pricer: Pricer,
    cap: int,
    settings: Mapping[str, Any],
) -> tuple[LayoutCapacity, Estimate]:
    usable = device_budget(settings["device"], StaticMemory({})).budget_bytes
    search = _Search(geometry, tp, cp, pricer, settings, usable)
    single = _longest(search, 1, cap)
    hint = None if single.length is None else single.length // pack
    packed = _longest(search, pack, cap, hint)
    # the static memory and budget of the step at the longest single sequence (its step
    # kind, its pipeline stage): what the table's budget and static columns show
    at_longest = None if single.length is None else search.estimate(1, single.length)
    est = at_longest or search.last
    assert est is not None and est.device_budget is not None and est.static is not None
    found = LayoutCapacity(
        tp=tp,
        cp=cp,
        sp=est.sp,
        planner=est.planner,
        budget_bytes=est.device_budget.budget_bytes,
        static_bytes=est.static.total,
        step_kind=est.step_kind,
        single=single,
        pack=packed,
    )
    return found, est


def _longest(search: _Search, n: int, cap: int, hint: int | None = None) -> Fit:
    """The longest length of ``n`` equal sequences that fits (``capacity``'s search):
    doubling, bisection, then the guard (``_guard``); a length the planner refuses reads
    as "not out of memory" while searching, and an answer it refuses is walked down to
    the nearest length it accepts. ``hint``: a length to bracket from (the pack's search
    starts from the longest single sequence over ``n``), which saves the doubling."""
    before = search.probes
    limit = search.geometry.max_position_embeddings

    def done(length: int | None, at_cap: bool = False, lowered: int = 0) -> Fit:
        need = None if length is None else search.activations(n, length)
        beyond = length is not None and limit is not None and length > limit
        return Fit(n, length, need, at_cap, beyond, search.probes - before, lowered)

    low = _shortest(search, n, cap)
    if not search.fits(n, low):
        return done(None)
    good, bad = low, cap + 1
    if hint is not None and low < hint <= cap:
        if search.fits(n, hint) is False:
            bad = hint
        else:
            good = hint
    while bad > cap:  # double until it does not fit
        if good >= cap:
            return done(good, at_cap=True)
        probe = min(cap, 2 * good)
        if search.fits(n, probe) is False:
            bad = probe
        else:
            good = probe
    lowered = 0
    while True:
        good = _bisect(search, n, good, bad)
        failing = _guard(search, n, good, low)
        if failing is None:
            return done(good, lowered=lowered)
        lowered += 1  # not monotone here: search again below the shorter length
        bad, good = failing, search.longest_fit(n, below=failing)


def _shortest(search: _Search, n: int, cap: int) -> int:
    """The shortest request the planner accepts: doubling from one token per CP rank."""
    low = max(1, -(-search.cp // n))
    while search.fits(n, low) is None:
        if low >= cap:
            raise InputError(
                "cp",
                search.cp,
                f"no request of {n} sequences up to {cap:,} tokens each can be planned",
            )
        low = min(cap, 2 * low)
    return low


def _bisect(search: _Search, n: int, good: int, bad: int) -> int:
    """Between a fitting ``good`` and a not-fitting ``bad``: a length that fits whose
    next one does not (or whose next ones the planner refuses, up to one that does not)."""
    while bad - good > 1:
        mid = (good + bad) // 2
        if search.fits(n, mid) is False:
            bad = mid
        else:
            good = mid
    while search.fits(n, good) is None:  # a length the planner refuses: the next one down
        good -= 1
    return good


def _guard(search: _Search, n: int, good: int, low: int) -> int | None:
    """The shortest of the guard's lengths below ``good`` that does not fit (``good - 1``
    and ``GUARD_SAMPLES`` spread evenly over the last ``1 / GUARD_DIVISOR`` of the range),
    or None where all fit or are refused by the planner: where the figure is not
    monotone (the chunked planner under CP), a length can fit while shorter ones do not."""
    window = max(1, good // GUARD_DIVISOR)
    lengths = {good - 1} | {
        good - -(-window * k // GUARD_SAMPLES) for k in range(1, GUARD_SAMPLES + 1)
    }
    failing = [
        length for length in sorted(lengths) if length >= low and search.fits(n, length) is False
    ]
    return failing[0] if failing else None
