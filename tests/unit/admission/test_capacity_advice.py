"""A refused MoE step's answer names the expert capacity that fits
(``cpmem.admission.suggest.capacity_advice``), and the default policy prices a stated
routing (``cpmem.pricing.registry.default_policy``).

The facts checked are admission's own contract, not figures the code computes: a
suggested capacity, stated, is admitted (``FIT``); the next factor up (one hundredth
more) is refused, so the suggestion is the largest; the balanced expectation beside it
is what ``estimate`` prices under ``balanced``; and the factor above which a dropping
capacity holds the worst case's rows is the hand count of megatron-core 0.16's
``get_capacity`` (``ceil(tokens x top-k / E x F)`` per expert and source rank).
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from cpmem.admission.admission import admit
from cpmem.admission.pricer import Pricer
from cpmem.admission.suggest import capacity_advice
from cpmem.api import estimate
from cpmem.model.presets import get_preset
from cpmem.step.describe import describe_step
from cpmem.step.routing import rows_per_token

MOE = "qwen3-30b-a3b"  # 128 experts, top-8
STEP = {"ep": 8, "device": "h100"}
LENGTHS = [8192]


def test_the_default_prices_a_stated_routing_on_an_moe_step() -> None:
    """ART's runtime prices a dense step with its published formula and an MoE step with
    ``tight``, which reads the routing: at EP 8 a capacity of 1 requires less than the
    worst case. The published formula, named, charges every routing alike."""
    assert estimate("qwen3-1.7b", [4096]).policy == "reference"
    worst = estimate(MOE, LENGTHS, **STEP)
    capped = estimate(MOE, LENGTHS, moe_routing="capacity:1.0", **STEP)
    assert worst.policy == capped.policy == "tight"
    assert capped.estimate_bytes < worst.estimate_bytes
    published = {
        routing: estimate(MOE, LENGTHS, moe_routing=routing, policy="reference", **STEP)
        for routing in ("concentrated", "capacity:1.0")
    }
    assert published["concentrated"].estimate_bytes == published["capacity:1.0"].estimate_bytes


def test_a_refused_moe_step_names_the_largest_capacity_that_fits() -> None:
    """Qwen3-30B-A3B at EP 8, 8,192 tokens, on an H100: the worst case (every token's 8
    copies on one rank's 16 experts) refuses; the advice names a capacity with dropping
    and with padding, each admitted when stated, each the largest (a hundredth more is
    refused), and the balanced expectation beside them."""
    refused = admit(MOE, LENGTHS, **STEP)
    assert refused.action == "refuse"
    advice = refused.capacity_advice
    assert advice is not None and advice.dropping is not None and advice.padding is not None
    for capacity in (advice.dropping, advice.padding):
        followed = admit(MOE, LENGTHS, moe_routing=capacity.routing, **STEP)
        assert followed.action == "fit", capacity.routing
        more = capacity.routing.replace(f"{capacity.factor:g}", f"{capacity.factor + 0.01:g}")
        assert admit(MOE, LENGTHS, moe_routing=more, **STEP).action == "refuse", more
    balanced = max(
        estimate(MOE, LENGTHS, moe_routing="balanced", step=kind, **STEP).whole_device_bytes(
            "forward"
        )
        for kind in ("first", "steady")
    )
    assert advice.balanced_bytes == balanced
    text = refused.suggestion or ""
    assert "a bound the runtime enforces" in text and "an expectation, not a bound" in text
    assert advice.dropping.routing in text and "--moe-expert-capacity-factor" in text
    said = refused.to_dict()["capacity_advice"]
    assert isinstance(said, dict) and said["dropping"]["moe_routing"] == advice.dropping.routing


def test_a_dropping_capacity_reaches_the_worst_case_at_the_searched_top() -> None:
    """The search stops at ``F = min(EP, E / top-k)``: there each of the EP sources keeps
    ``ceil(T x 8 x 8 / 128)`` = ``T / 2`` copies for each of the rank's 16 experts, 8 T in
    all, the worst case's ``min(8, 16)`` copies per token of each source; below it fewer."""
    g, t = get_preset(MOE), 8192
    worst = rows_per_token(g, 8, "concentrated", tp=1)
    assert worst == 8 * 8
    assert rows_per_token(g, 8, "capacity:8", tp=1, tokens=t) == worst
    assert rows_per_token(g, 8, "capacity:7.99", tp=1, tokens=t) < worst
    assert rows_per_token(g, 8, "capacity:1", tp=1, tokens=t) == Fraction(
        8 * 16 * (t * 8 // 128), t
    )


@pytest.mark.parametrize(
    ("model", "options"),
    [("qwen3-1.7b", {}), (MOE, {"policy": "reference"}), (MOE, {"moe_routing": "rows:4096"})],
)
def test_no_advice_where_a_capacity_moves_nothing(model: str, options: dict[str, str]) -> None:
    """No routed experts, a policy that prices no routing, or a stated row count."""
    policy = options.pop("policy", None)
    step = describe_step(model, LENGTHS, ep=8 if model == MOE else 1, device="h100", **options)
    assert capacity_advice(step, 0, Pricer(policy, whole_device=True)) is None
