"""The rows a rank's experts receive in one MoE layer: the step's routing, stated as an
expectation or as a bound.

A router without a capacity factor can send any share of the tokens to one rank's
experts, so what a rank holds is either an expectation or a bound, and the step says
which (``Step.moe_routing``):

- ``concentrated`` (also written ``worst``): every routed copy of the tokens that reach
  this rank's experts lands on them, at most one per token and local expert
  (``min(top-k, E/EP)`` per token): the bound a router without capacity can reach;
- ``balanced``: the expectation, every expert receiving ``tokens x top-k / E``;
- ``capacity:F``: Megatron-LM's ``--moe-expert-capacity-factor F``, a hard bound: each
  of the EP source ranks keeps at most ``ceil(T_s x top-k x F / E)`` copies per expert
  of its ``T_s`` router tokens (``get_capacity``, ``apply_router_token_dropping``,
  megatron-core 0.16 ``moe_utils.py``), the dropped ones never dispatched, and never
  more than ``concentrated``; ``capacity:F:pad``, with
  ``--moe-pad-expert-input-to-capacity``: every local expert receives exactly that many
  from each source, padded (``token_dispatcher.py``: ``capacity x tp_size x ep_size``
  per local expert), whatever the router picked: the count, not capped;
- ``rows:N``: an exact per-rank row count, what a dispatcher with a fixed capacity
  allocates (ART's HybridEP capacity), or the rows of a replayed batch.

Which tokens reach a rank's experts (``expert_sources``): the rank's experts receive the
routed copies of every rank of its expert group, the EP ranks times the expert-TP (ETP)
ranks, and each of those routes its own sequence shard (``T/s``: the CP rank's ``T``
tokens over TP under sequence parallelism, ``s`` = TP, else ``s`` = 1), priced at this
rank's count (the busiest's, an upper bound where the group spans other CP or
data-parallel ranks). megatron-core 0.16 (``token_dispatcher.py``): the ``alltoall``
dispatcher's all-to-all over the EP group then all-gathers over the ETP group
(``dispatch_postprocess``), the ``allgather`` dispatcher gathers over ETP x EP
(``tp_ep_group``) at once; both hand each rank the copies of ``ETP x EP`` shards. Per
token of the rank's own count that is ``EP x ETP / s`` shards, so the worst case is
``EP x ETP / s x min(top-k, E/EP)`` rows per token: at EP < TP with ETP 1 (ART's runtime)
fewer than top-k, since the rank routes only its shard. The rank simulator's
``expert_rows`` (oracles/rank_sim/moe.py, ETP 1: ``T/s x EP x min(top-k, E/EP)``)
routes the same.
"""

from __future__ import annotations

import math
from fractions import Fraction

from cpmem.errors import InputError
from cpmem.model.geometry import ModelGeometry

WORST = "concentrated"
ROUTING_KINDS = ("concentrated", "balanced", "capacity", "rows")
ALIASES = {"worst": WORST}
"""Other spellings a user may give: ``worst`` is ``concentrated`` (the default), the one
name the estimate, its ``routing_figures``, the help and the docs use."""
BOUNDS = ("concentrated", "capacity", "rows")
"""The routings that bound what a rank holds (``balanced`` is an expectation)."""


def routing_kind(routing: str) -> str:
    """``concentrated``, ``balanced``, ``capacity`` or ``rows``."""
    return routing.partition(":")[0]


def check_routing(routing: object) -> str:
    """The routing in its canonical spelling, or an InputError naming the field."""
    if not isinstance(routing, str):
        raise InputError("moe_routing", routing, "must be a string")
    routing = ALIASES.get(routing, routing)
    kind, sep, value = routing.partition(":")
    forms = (
        "concentrated (or worst), balanced, capacity:F or capacity:F:pad (a factor > 0) "
        "or rows:N (N > 0)"
    )
    if kind in ("concentrated", "balanced") and not sep:
        return routing
    if kind == "capacity" and sep:
        number, _, pad = value.partition(":")
        try:
            factor = float(number)
        except ValueError:
            factor = -1.0
        if factor > 0 and math.isfinite(factor) and pad in ("", "pad"):
            return f"capacity:{factor:g}" + (":pad" if pad else "")
    if kind == "rows" and sep and value.isdigit() and int(value) > 0:
        return f"rows:{int(value)}"
    raise InputError("moe_routing", routing, f"must be {forms}")


def is_bound(routing: str) -> bool:
    return routing_kind(routing) in BOUNDS


def expert_sources(ep: int, etp: int, tp: int, sp: bool) -> Fraction:
    """The sequence shards whose routed copies reach one rank's experts, in multiples of
    the rank's own token count: ``EP x ETP / s`` (module docstring)."""
    s = tp if sp and tp > 1 else 1
    return Fraction(max(ep, 1) * max(etp, 1), s)


def rows_per_token(
    geometry: ModelGeometry,
    ep: int,
    routing: str,
    *,
    tp: int,
    sp: bool = True,
    etp: int = 1,
    tokens: int | None = None,
) -> Fraction:
    """Expert rows one rank holds per token of its own (its CP rank's count, ``tokens``:
    the count priced, needed by ``capacity`` and ``rows``), under ``routing``, with
    attention TP ``tp`` (sequence parallel ``sp``) and expert TP ``etp``."""
    k, experts = geometry.moe_top_k, geometry.num_experts
    ep = max(ep, 1)
    sources = expert_sources(ep, etp, tp, sp)
    worst = min(k, experts // ep) * sources
    kind, _, value = routing.partition(":")
    if kind == "concentrated":
        return worst
    if kind == "balanced":
        return k * sources / ep
    if tokens is None or tokens <= 0:
        raise InputError("moe_routing", routing, "prices a count of rows: give the step's tokens")
    if kind == "rows":
        return Fraction(int(value), tokens)
    # capacity: each of the EP x ETP sources routes its shard, priced at this rank's
    # count (tokens x sources / (EP x ETP) = T/s), and keeps ceil(its copies x F / E)
    # per expert (``get_capacity``); every local expert receives that from each source
    number, _, pad = value.partition(":")
    factor = Fraction(number)
    senders = ep * max(etp, 1)
    shard = tokens * sources / senders
    per_source = math.ceil(shard * k * factor / experts)
    rows = Fraction((experts // ep) * senders * per_source, tokens)
    return rows if pad else min(worst, rows)


def padded_rows(total: int, local: int, align: int, per_expert: int | None = None) -> int:
    """The most rows ``local`` experts hold once each one's rows are padded up to a
    multiple of ``align`` (Transformer Engine's ``Fp8Padding``: ``(m + align - 1) // align
    * align`` per split, an empty split left empty; TE b9d690e0
    ``module/fp8_padding.py:120-123``), over every split of ``total`` rows with at most
    ``per_expert`` rows an expert (None: no such cap). Each non-empty split gains at most
    ``align - 1`` rows and at most ``min(local, total)`` splits are non-empty, so the
    padded count is at most ``total + (align - 1) x min(local, total)`` rounded down to
    the alignment, which ``min(local, total) - 1`` one-row splits and one holding the rest
    reach; with a cap it is also at most ``local`` splits of the cap rounded up."""
    if align <= 1 or total <= 0:
        return max(total, 0)
    nonempty = min(local, total)
    bound = (total + (align - 1) * nonempty) // align * align
    if per_expert is not None:
        bound = min(bound, local * -(-per_expert // align) * align)
    return bound


def pad_rows(
    geometry: ModelGeometry,
    rows: Fraction,
    routing: str,
    align: int,
    ep: int,
    etp: int,
    tp: int,
    sp: bool,
    tokens: int,
) -> Fraction:
    """``rows`` per token (``rows_per_token`` under ``routing`` at ``tokens``) as the
    grouped experts hold them where they pad each local expert's rows to a multiple of
    ``align`` (unchanged where ``align`` is 0 or 1):

    - ``balanced``: every local expert receives its even share, padded:
      ``local x ceil(share / align) x align`` (the expectation's own counts; a router's
      counts scatter about the share and pad by up to ``align - 1`` more each, which the
      bounds below hold);
    - ``capacity:F:pad``: every local expert receives exactly its padded capacity, padded
      again to the alignment;
    - ``concentrated``, ``capacity:F``, ``rows:N``: the most the padding can reach over any
      split of the rows among the local experts (``padded_rows``), each expert holding at
      most one copy of each source token (``concentrated``) or its capacity."""
    if align <= 1 or not rows:
        return rows
    local = geometry.num_experts // max(ep, 1)
    total = rows * tokens
    kind, _, value = routing.partition(":")
    if kind == "balanced" or (kind == "capacity" and value.endswith(":pad")):
        return Fraction(local * math.ceil(total / local / align) * align, tokens)
    cap: int | None = None
    if kind == "concentrated":  # at most one copy of each source token an expert
        cap = math.ceil(tokens * expert_sources(ep, etp, tp, sp))
    elif kind == "capacity":  # at most its capacity an expert
        full = rows_per_token(geometry, ep, routing + ":pad", tp=tp, sp=sp, etp=etp, tokens=tokens)
        cap = math.ceil(full * tokens / local)
    return Fraction(padded_rows(math.ceil(total), local, align, cap), tokens)
