"""The gate's Megatron-LM tier over the recordings, and what it catches.

Expected outcomes: the recordings of ``golden/megatron/recordings.csv`` (measured on
Megatron-LM's CI) against the tier's checks; the mutants are the estimator with one
term of the step removed (the cross entropy's fp32 copy of the logits, Adam's moments),
each of which a check must reject.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator

import pytest

import cpmem.gate.megatron_tier as tier_module
import cpmem.megatron.activations as activations_module
import cpmem.megatron.estimate as estimate_module
from cpmem.gate.megatron_tier import CHECKS, DECLARED_MISSES, MegatronTier, run_tier
from cpmem.golden.files import default_golden_dir
from cpmem.golden.megatron import load_recordings
from cpmem.megatron.args import read_megatron_args
from cpmem.megatron.run import MegatronRun

GOLDEN = default_golden_dir()
MIB = 1 << 20


@pytest.fixture(scope="module", autouse=True)
def _each_case_read_once() -> Iterator[None]:
    """The cases' arguments read once for the module's tiers (PyYAML's reader is most of
    a tier's time; the arguments are immutable and no mutant here changes them)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tier_module, "read_megatron_args", functools.cache(read_megatron_args))
        yield


@pytest.fixture(scope="module")
def tier() -> MegatronTier:
    return run_tier(GOLDEN)


def _without(parts: Callable[..., dict[str, int]], name: str) -> Callable[..., dict[str, int]]:
    """``parts`` with the component ``name`` left out."""

    def mutant(run: MegatronRun, *args: object) -> dict[str, int]:
        out = dict(parts(run, *args))
        del out[name]
        return out

    return mutant


@pytest.fixture(scope="module")
def adam_free() -> MegatronTier:
    """The tier of an estimator whose static bytes leave out Adam's two fp32 moments."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            estimate_module,
            "static_components",
            _without(estimate_module.static_components, "adam_moments"),
        )
        return run_tier(GOLDEN)


def test_the_tier_passes_over_the_gpt_and_moe_recordings(tier: MegatronTier) -> None:
    assert tier.passed
    assert all(tier.failing(check) == [] for check in CHECKS)
    assert tier.median_headroom <= 0.10
    every = load_recordings(GOLDEN)
    refused = sum(len(ids) for ids in tier.refused.values())
    # every recording is priced, refused, unnamed or empty: none is lost
    assert len(tier.rows) + refused + len(tier.unnamed_platform) + len(tier.no_values) == len(every)
    assert sum(r.recording.family == "gpt" for r in tier.rows) > 350
    # 99 of the 116 MoE recordings name a platform and are priced (recordings.csv)
    assert sum(r.recording.family == "moe" for r in tier.rows) > 90
    # each check passes on most rows by itself, not by declaration
    assert tier.count("static") > len(tier.rows) // 2
    assert tier.count("covers") > 0.95 * len(tier.rows)
    assert tier.count("headroom") > 0.85 * len(tier.rows)


def test_refusals_name_a_refused_flag(tier: MegatronTier) -> None:
    assert tier.refused
    assert all("changes memory cpmem does not price" in message for message in tier.refused)


def test_every_declared_miss_explains_a_failing_recording(tier: MegatronTier) -> None:
    """No stale declaration: each is the first to explain at least one failing row."""
    unused = [
        (miss.check, miss.case, miss.platform)
        for miss in DECLARED_MISSES
        if not any(
            not row.passed(miss.check) and row.declared(miss.check) is miss for row in tier.rows
        )
    ]
    assert unused == []


def test_every_declared_static_miss_is_within_200_mib(tier: MegatronTier) -> None:
    """The declarations explain buffers of MiB (the largest: a resumed process's 100-200
    MiB of checkpoint-load buffers), never a term of the parameters' size."""
    declared = tier.declared_failures("static")
    assert declared
    assert all(abs(r.estimate.static_bytes - r.measured_static) < 200 * MIB for r in declared)


def test_an_estimator_without_the_fp32_logits_fails_covers() -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            activations_module,
            "head_components",
            _without(activations_module.head_components, "cross_entropy_fp32_logits"),
        )
        broken = run_tier(GOLDEN)
    assert not broken.passed
    # 4 B per logit on the last stage: most recordings peak above such a figure
    assert len(broken.failing("covers")) > len(broken.rows) // 2


def test_an_estimator_without_adams_moments_fails_static(adam_free: MegatronTier) -> None:
    assert not adam_free.passed
    assert adam_free.failing("static")
    # 8 B of every 18 (or of 6 + 12/d) per parameter: every recording is missed by more
    # than the 3% the check allows
    assert all(not row.passed("static") for row in adam_free.rows)


def test_no_declaration_excuses_a_missing_optimizer_term(adam_free: MegatronTier) -> None:
    missed = [row for row in adam_free.rows if not row.passed("static")]
    assert len(adam_free.failing("static")) == len(missed)


def test_every_moe_recording_is_covered_and_its_static_within_4_percent(tier: MegatronTier) -> None:
    """The MoE recordings' static bytes (the experts' own buffers over the expert DP
    group, the grouped GEMM's stream workspaces) within 4% of the measured, and every
    peak covered by the worst-case routing priced."""
    moe = [r for r in tier.rows if r.recording.family == "moe"]
    assert moe
    assert all(abs(r.static_error) < 0.04 for r in moe)
    assert all(r.passed("covers") for r in moe)


def test_an_estimator_without_the_expert_parameters_fails_static() -> None:
    """The experts hold most of an MoE run's parameters: dropping them misses every MoE
    recording's static bytes by more than 3%."""
    import cpmem.megatron.static as static_module

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(static_module, "expert_layer_tensors", lambda run: [])
        broken = run_tier(GOLDEN, "moe")
    assert not broken.passed
    assert all(not r.passed("static") for r in broken.rows)


def test_an_estimator_without_the_routed_rows_fails_covers() -> None:
    """The routed experts' saved tensors (fc1's input, outputs and the activation) are
    most of an MoE layer's activations: without them the peaks are missed."""
    with pytest.MonkeyPatch.context() as patch:
        for name in ("expert_inputs", "expert_mlp"):
            patch.setattr(
                activations_module,
                "moe_components",
                _without(activations_module.moe_components, name),
            )
        broken = run_tier(GOLDEN, "moe")
    assert not broken.passed
    assert len(broken.failing("covers")) > len(broken.rows) // 2
