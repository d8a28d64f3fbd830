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


def test_the_tier_passes_over_the_gpt_recordings(tier: MegatronTier) -> None:
    assert tier.passed
    assert all(tier.failing(check) == [] for check in CHECKS)
    assert tier.median_headroom <= 0.10
    gpt = load_recordings(GOLDEN, "gpt")
    refused = sum(len(ids) for ids in tier.refused.values())
    # every GPT recording is priced, refused, unnamed or empty: none is lost
    assert len(tier.rows) + refused + len(tier.unnamed_platform) + len(tier.no_values) == len(gpt)
    assert len(tier.rows) > 350
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
