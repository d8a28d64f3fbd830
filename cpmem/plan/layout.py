"""The parallel layout a step runs under: tensor, sequence, context and expert parallelism,
and the rules a model puts on its expert layout (``expert_problems``)."""

from __future__ import annotations

from dataclasses import dataclass

from cpmem.errors import InputError, require_positive_int
from cpmem.model.geometry import ModelGeometry


@dataclass(frozen=True)
class ParallelLayout:
    """TP x CP ranks price one request; SP shards activations outside the TP region."""

    tp: int = 1
    cp: int = 1
    sp: bool = False
    ep: int = 1
    dp: int = 1
    etp: int = 1
    """Expert tensor parallelism: each routed expert's linears split over ``etp`` ranks
    (megatron's ``--expert-tensor-parallel-size``); the measured runtime's experts are
    whole on their EP rank (1)."""
    """Data-parallel replicas: they price nothing of a step's activations; a distributed
    optimizer shards its states over them (``cpmem.pricing.static``)."""

    def __post_init__(self) -> None:
        require_positive_int("tp", self.tp)
        require_positive_int("cp", self.cp)
        require_positive_int("ep", self.ep)
        require_positive_int("dp", self.dp)
        require_positive_int("etp", self.etp)

    @property
    def sp_active(self) -> bool:
        """Sequence parallelism only changes shapes when TP > 1."""
        return self.sp and self.tp > 1


def data_parallel(world: int, tp: int, cp: int, pp: int, dp: int | None = None) -> int:
    """The data-parallel ranks of a world of ``world`` ranks: world / (TP x CP x PP),
    refused where it does not divide, or where a ``dp`` given says otherwise (both values
    named)."""
    require_positive_int("world_size", world)
    if world % (tp * cp * pp):
        raise InputError(
            "world_size", world, f"is not divisible by TP x CP x PP = {tp} x {cp} x {pp}"
        )
    derived = world // (tp * cp * pp)
    if dp is not None and dp != derived:
        raise InputError(
            "dp",
            dp,
            f"contradicts --world-size {world}: DP = world / (TP x CP x PP) = "
            f"{world} / ({tp} x {cp} x {pp}) = {derived}",
        )
    return derived


def round_up(value: int, multiple: int) -> int:
    """Smallest multiple of ``multiple`` that is >= ``value``."""
    return -(-value // multiple) * multiple


EP_RULE = (
    "megatron-core gives each EP rank num_experts / EP experts and asserts num_experts % EP "
    "== 0 (BaseMoELayer, transformer/moe/moe_layer.py:101 in 0.16.1; Megatron-LM's "
    "validate_args asserts the same, arguments.py:1657-1658)"
)
ETP_RULE = (
    "megatron-core splits each routed expert's fc1 output and fc2 input over ETP with "
    "divide(), which asserts it (TELinear and TEGroupedLinear, "
    "extensions/transformer_engine.py:614-617 and 1524-1527 in 0.16.1)"
)
ETP_BIAS_RULE = (
    'megatron-core builds biased experts at ETP 1 only ("Bias in Moe is only supported when '
    'ETP==1", transformer/transformer_config.py:1588-1591 in 0.16.1)'
)


def divisors(n: int) -> list[int]:
    """Every positive divisor of ``n``, ascending."""
    return [d for d in range(1, n + 1) if n % d == 0]


def expert_problems(geometry: ModelGeometry, layout: ParallelLayout) -> list[InputError]:
    """Every rule ``layout``'s expert parallelism breaks on ``geometry`` (Megatron-LM's and
    megatron-core's own), each an ``InputError`` naming the setting, with the reason and
    the values that would hold: EP must divide the routed experts (so never exceed them),
    ETP must divide each expert's FFN width, and experts with biases run at ETP 1. A model
    without routed experts breaks none (``ep`` and ``etp`` are named there as changing
    nothing: ``cpmem.pricing.registry.inapplicable_options``)."""
    g = geometry
    if not g.is_moe:
        return []
    out: list[InputError] = []
    experts, ep, etp = g.num_experts, layout.ep, layout.etp
    if experts % ep:
        share = (
            f"exceeds the {experts} routed experts of {g.name}"
            if ep > experts
            else f"does not divide the {experts} routed experts of {g.name} "
            f"({experts} / {ep} = {experts / ep:.1f} experts a rank)"
        )
        out.append(
            InputError(
                "ep",
                ep,
                f"{share}: {EP_RULE}; the EP sizes that divide {experts}: {divisors(experts)}",
            )
        )
    if g.expert_ffn % etp:
        out.append(
            InputError(
                "etp",
                etp,
                f"does not divide the routed experts' FFN width ({g.expert_ffn}) of {g.name}: "
                f"{ETP_RULE}",
            )
        )
    if g.mlp_bias and etp != 1:
        out.append(
            InputError(
                "etp",
                etp,
                f"{g.name}'s experts have biases: {ETP_BIAS_RULE}; give --etp 1 (Megatron-LM's "
                "default ETP is TP)",
            )
        )
    return out
