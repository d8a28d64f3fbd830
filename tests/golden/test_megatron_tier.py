"""The gate's Megatron-LM tier over the recordings, and what it catches.

Expected outcomes: the recordings of ``golden/megatron/recordings.csv`` (measured on
Megatron-LM's CI) against the tier's checks, through the one step description and
``tight``'s layer kinds; the mutants are the shared model with one term removed (the
cross entropy's fp32 copy of the logits, Adam's moments, the routed experts' weights and
rows, flash-attn's copies, the pipeline's kept inputs), each of which a check must reject.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import replace
from fractions import Fraction

import pytest

import cpmem.gate.megatron_tier as tier_module
import cpmem.pricing.fsdp as fsdp_module
import cpmem.pricing.head as head_module
import cpmem.pricing.kinds.moe as moe_module
import cpmem.pricing.muon as muon_module
import cpmem.pricing.static as static_module
import cpmem.pricing.weights as weights_module
from cpmem.gate.megatron_misses import DECLARED_MISSES
from cpmem.gate.megatron_tier import (
    CHECKS,
    MegatronTier,
    price_recording,
    run_tier,
)
from cpmem.golden.files import default_golden_dir
from cpmem.golden.megatron import load_recordings
from cpmem.golden.megatron_history import load_recorded_images
from cpmem.megatron.args import read_megatron_args
from cpmem.pricing.fsdp_units import Tensor, unit_tensors
from cpmem.step.step import Step
from tests.golden.second_extraction import SECOND_EXTRACTION

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


@pytest.fixture(scope="module")
def adam_free() -> MegatronTier:
    """The tier of a model whose static bytes leave out Adam's two fp32 moments (under
    Muon too, which leaves its vectors, embedding and output layer to Adam)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(static_module.MOMENT_BYTES, "adam", 0)
        patch.setattr(muon_module, "ADAM_STATE_BYTES", 0)
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
    assert tier.count("static") > 0.9 * len(tier.rows)
    assert tier.count("covers") > 0.7 * len(tier.rows)
    assert tier.count("headroom") > 0.9 * len(tier.rows)


def test_every_recording_is_priced_by_tight_on_megatrons_runtime(tier: MegatronTier) -> None:
    for row in tier.rows:
        settings = row.step.settings
        assert row.estimate.policy == "tight"
        assert settings.runtime.name == "megatron-lm" and settings.training == "full"
        assert settings.rank == "last"


def test_auto_is_transformer_engines_pick_in_the_image_each_recording_ran_in(
    tier: MegatronTier,
) -> None:
    """Under auto each recording is priced in its CI image's container: NGC 24.01 (the lts
    environment until 2025-11-06) runs the deterministic A100 cases unfused, every later
    image flash or fused; never unfused under CP, in any container."""
    images = load_recorded_images(GOLDEN)
    auto = [r for r in tier.rows if r.step.settings.runtime.backend_asked == "auto"]
    assert auto
    old = []
    for row in auto:
        runtime = row.step.settings.runtime
        image = images[row.recording.recording_id].base_image
        if image == "nvcr.io/nvidia/pytorch:24.01-py3":
            old.append(row)
        else:
            assert runtime.attention_backend in ("flash", "fused"), row.recording.recording_id
        if row.step.plan.layout.cp > 1:
            assert runtime.attention_backend != "unfused" and "unfused" not in row.spread
    deterministic = [r for r in old if r.step.settings.runtime.deterministic]
    assert len(deterministic) > 40 and len(deterministic) < len(old)
    assert all(r.step.settings.runtime.attention_backend == "unfused" for r in deterministic)
    # priced unfused, they are covered; priced as a later image picks, most are not
    assert sum(r.passed("covers") for r in deterministic) > 0.8 * len(deterministic)
    later = [
        price_recording(r.recording, GOLDEN, image="nvcr.io/nvidia/pytorch:25.09-py3")
        for r in deterministic
    ]
    assert all(r.step.settings.runtime.attention_backend == "flash" for r in later)
    assert sum(r.passed("covers") for r in later) < 0.5 * len(later)


def test_refusals_name_a_refused_flag(tier: MegatronTier) -> None:
    assert tier.refused
    # the step's own refusals (FP8 on MoE layers, cpmem.step.fp8) name its setting
    assert all(
        message.startswith(("megatron_args=", "world_size=", "recording=", "fp8="))
        for message in tier.refused
    )
    assert sum(len(ids) for ids in tier.refused.values()) == len(tier.refusals)
    for refusal in tier.refusals:
        assert refusal.problems
        assert refusal.recording.recording_id in tier.refused[refusal.message]


PRICED_BY_FEATURE = {
    # FP8 (tensorwise, --fp8-param-gather) with --tp-comm-overlap: the weekly case; the
    # scoped CUDA graph cases (blockwise without param-gather, bf16 first and last layers,
    # MoE and MTP under a moe_act recompute); the DeepSeek FSDP proxies stay refused
    "fp8": {
        "gpt/gpt3_weekly_mcore_tp2_pp2_current_scaling_native_fp8_tp_pp_sp_tp_overlap/dev_dgx_gb200",
        "gpt/gpt3_weekly_mcore_tp2_pp2_current_scaling_native_fp8_tp_pp_sp_tp_overlap/dev_dgx_h100",
        "moe/gpt3_moe_mcore_te_tp4_ep2_etp2_pp2_scoped_cudagraph/dev_dgx_gb200",
        "moe/gpt3_moe_mcore_te_tp4_ep2_etp2_pp2_scoped_cudagraph/dev_dgx_gb200_2nd",
        "moe/gpt3_moe_mcore_te_tp4_ep2_etp2_pp2_scoped_cudagraph/dev_dgx_h100",
        "moe/gpt3_moe_mcore_te_tp4_ep2_etp2_pp2_scoped_cudagraph/dev_dgx_h100_2nd",
        "moe/gpt3_moe_mcore_te_tp4_ep2_etp2_pp2_scoped_cudagraph_1node/dev_dgx_gb200",
    },
    # per-layer CUDA graphs through Transformer Engine, their fused router and
    # global_aux_loss: every recording
    "cudagraph": {
        "moe/gpt3_moe_mcore_te_tp4_ep2_etp2_pp2_scoped_cudagraph/dev_dgx_gb200",
        "moe/gpt3_moe_mcore_te_tp4_ep2_etp2_pp2_scoped_cudagraph/dev_dgx_gb200_2nd",
        "moe/gpt3_moe_mcore_te_tp4_ep2_etp2_pp2_scoped_cudagraph/dev_dgx_h100",
        "moe/gpt3_moe_mcore_te_tp4_ep2_etp2_pp2_scoped_cudagraph/dev_dgx_h100_2nd",
        "moe/gpt3_moe_mcore_te_tp4_ep2_etp2_pp2_scoped_cudagraph_1node/dev_dgx_gb200",
    },
    # the layer stacks cpmem reads (the Mamba-2 hybrids, latent attention, MTP depths),
    # listed by hand from recordings.csv; the rest of each family refused for another flag
    "hybrid": {
        "hybrid/hybrid_mr_mcore_te_tp1_pp1_cp1_dgx_a100_1N8G/dev_dgx_h100",
        "hybrid/hybrid_mr_mcore_te_tp1_pp4_cp1_dgx_a100_1N8G/dev_dgx_a100",
        "hybrid/hybrid_mr_mcore_te_tp1_pp4_cp1_dgx_a100_1N8G/dev_dgx_h100",
        "hybrid/hybrid_mr_mcore_te_tp1_pp4_cp1_dgx_a100_1N8G/lts_dgx_a100",
        "hybrid/hybrid_mr_mcore_te_tp2_pp1_cp1_dgx_a100_1N8G/dev_dgx_h100",
        "nemotron/nemotron3_5_lightning_no_load_optim_tp1_pp1_cp1_ep4_dgx_gb200_1N4G/dev_dgx_gb200",
        # the nightly Nemotron 3 on the flex dispatcher's HybridEP backend, priced
        "nemotron/nemotron3_5_lightning_nightly_tp1_pp1_cp1_ep8_dgx_gb200/dev_dgx_gb200",
    },
    # Megatron FSDP of dense GPT layers (the zp_z3 fsdp_dtensor cases): every recording;
    # of the DeepSeek proxies' MoE and MLA layers the EP-overlap one, its delayed weight
    # gradients priced; the GB200 ones stay refused (FP8)
    "fsdp": {
        "gpt/gpt3_mcore_te_tp2_zp_z3_resume_fsdp_dtensor/dev_dgx_a100",
        "gpt/gpt3_mcore_te_tp2_zp_z3_resume_fsdp_dtensor/dev_dgx_gb200",
        "gpt/gpt3_mcore_te_tp2_zp_z3_resume_fsdp_dtensor/dev_dgx_h100",
        "gpt/gpt3_mcore_te_tp2_zp_z3_resume_fsdp_dtensor_1node/dev_dgx_gb200",
        "moe/deepseek_proxy_fsdp_ep2_fsdp2_ep_overlap/dev_dgx_h100",
    },
    # Muon (the ep8 cases, layer-wise distributed on --no-use-layer-wise-param-layout's
    # legacy path where --use-distributed-optimizer is given): every recording
    "muon": {
        "moe/gpt3_moe_mcore_te_ep8_resume_torch_dist_dist_muon/dev_dgx_gb200",
        "moe/gpt3_moe_mcore_te_ep8_resume_torch_dist_dist_muon/dev_dgx_h100",
        "moe/gpt3_moe_mcore_te_ep8_resume_torch_dist_dist_muon/dev_dgx_h100_2nd",
        "moe/gpt3_moe_mcore_te_ep8_resume_torch_dist_dist_muon_1node/dev_dgx_gb200",
        "moe/gpt3_moe_mcore_te_ep8_resume_torch_dist_muon/dev_dgx_gb200",
        "moe/gpt3_moe_mcore_te_ep8_resume_torch_dist_muon/dev_dgx_h100",
        "moe/gpt3_moe_mcore_te_ep8_resume_torch_dist_muon/dev_dgx_h100_2nd",
        "moe/gpt3_moe_mcore_te_ep8_resume_torch_dist_muon_1node/dev_dgx_gb200",
    },
    "mla": {
        "gpt/gpt3_mcore_te_tp2_pp2_mla/dev_dgx_a100",
        "gpt/gpt3_mcore_te_tp2_pp2_mla/dev_dgx_gb200",
        "gpt/gpt3_mcore_te_tp2_pp2_mla/dev_dgx_gb200_2nd",
        "gpt/gpt3_mcore_te_tp2_pp2_mla/dev_dgx_h100",
        "gpt/gpt3_mcore_te_tp2_pp2_mla/dev_dgx_h100_2nd",
        "gpt/gpt3_mcore_te_tp2_pp2_mla_1node/dev_dgx_gb200",
        # its layout string and recompute modules, read
        "moe/gpt3_mcore_te_tp2_pp2_ep4_etp1_selective_recompute_experimental/dev_dgx_h100",
        # fine-grained activation offloading (cpmem.pricing.offload), read
        "moe/gpt3_moe_mcore_te_tp2_pp2_ep4_etp1_fine_grained_offloading/dev_dgx_gb200",
        "moe/gpt3_moe_mcore_te_tp2_pp2_ep4_etp1_fine_grained_offloading/dev_dgx_h100",
        # Megatron FSDP under the EP overlap with --delay-wgrad-compute, read
        "moe/deepseek_proxy_fsdp_ep2_fsdp2_ep_overlap/dev_dgx_h100",
    },
    "mtp": {
        "moe/gpt3_moe_mcore_te_tp4_ep2_etp2_pp2_scoped_cudagraph/dev_dgx_gb200",
        "moe/gpt3_moe_mcore_te_tp4_ep2_etp2_pp2_scoped_cudagraph/dev_dgx_gb200_2nd",
        "moe/gpt3_moe_mcore_te_tp4_ep2_etp2_pp2_scoped_cudagraph/dev_dgx_h100",
        "moe/gpt3_moe_mcore_te_tp4_ep2_etp2_pp2_scoped_cudagraph/dev_dgx_h100_2nd",
        "moe/gpt3_moe_mcore_te_tp4_ep2_etp2_pp2_scoped_cudagraph_1node/dev_dgx_gb200",
        "nemotron/nemotron3_5_lightning_no_load_optim_tp1_pp1_cp1_ep4_dgx_gb200_1N4G/dev_dgx_gb200",
        # the nightly Nemotron 3 on the flex dispatcher's HybridEP backend, priced
        "nemotron/nemotron3_5_lightning_nightly_tp1_pp1_cp1_ep8_dgx_gb200/dev_dgx_gb200",
        "moe/gpt3_mcore_te_tp2_pp2_ep4_etp1_selective_recompute_experimental/dev_dgx_h100",
        # fine-grained activation offloading (cpmem.pricing.offload), read
        "moe/gpt3_moe_mcore_te_tp2_pp2_ep4_etp1_fine_grained_offloading/dev_dgx_gb200",
        "moe/gpt3_moe_mcore_te_tp2_pp2_ep4_etp1_fine_grained_offloading/dev_dgx_h100",
    },
    "offloading": {
        "moe/gpt3_moe_mcore_te_tp2_pp2_ep4_etp1_fine_grained_offloading/dev_dgx_gb200",
        "moe/gpt3_moe_mcore_te_tp2_pp2_ep4_etp1_fine_grained_offloading/dev_dgx_h100",
    },
}


def test_every_recording_of_a_feature_family_is_counted_with_its_reasons(
    tier: MegatronTier,
) -> None:
    """The recordings whose arguments turn on a feature family (hybrid, MLA, MTP, FP8,
    FSDP, Muon, offloading, CUDA graphs, the 15B release runs) each appear, priced or
    refused: the layer stacks cpmem reads are priced (``PRICED_BY_FEATURE``), every other
    recording refused with every reason; where a family cpmem does not price refuses it,
    the reasons name the family's flag (read by hand from the cases)."""
    featured = [r for r in tier.recordings if r.features]
    assert {f"{r.family}/{r.case}" for r in featured} >= set(SECOND_EXTRACTION)
    unpriced = {
        # the DeepSeek proxies' Megatron FSDP of MoE and latent attention, and FP8 in its
        # buffers and on both, and the EP-overlap one's --delay-wgrad-compute, are
        # priced: the GB200 ones' fp32 parameters beside FP8 (no --bf16) refuse them
        "fsdp": (
            "--use-megatron-fsdp",
            "fp32 parameters beside FP8",
        ),
        "release-15b": ("world_size=None: unknown",),
    }
    counts = {f.feature: f for f in tier.by_feature()}
    assert set(counts) == set(unpriced) | set(PRICED_BY_FEATURE)
    for feature, count in counts.items():
        refused = {f.recording.recording_id for f in count.refusals}
        assert set(count.priced) == PRICED_BY_FEATURE.get(feature, set()), feature
        assert refused == set(count.recordings) - set(count.priced), feature
        for refusal in count.refusals if feature in unpriced else ():
            assert any(text in refusal.message for text in unpriced[feature]), (feature, refusal)
    assert len(counts["release-15b"].recordings) == 5 and counts["hybrid"].cases == (
        "hybrid/hybrid_flextron_nightly_tp2_pp1_ep2_dgx_h100_1N8G",
        "hybrid/hybrid_mr_mcore_te_tp1_pp1_cp1_dgx_a100_1N8G",
        "hybrid/hybrid_mr_mcore_te_tp1_pp4_cp1_dgx_a100_1N8G",
        "hybrid/hybrid_mr_mcore_te_tp2_pp1_cp1_dgx_a100_1N8G",
        "nemotron/nemotron3_5_lightning_nightly_tp1_pp1_cp1_ep8_dgx_gb200",
        "nemotron/nemotron3_5_lightning_no_load_optim_tp1_pp1_cp1_ep4_dgx_gb200_1N4G",
    )


def test_a_file_recorded_for_two_cases_of_different_arguments_measures_neither(
    tier: MegatronTier,
) -> None:
    """The hybrid tp1/tp2 ``lts_dgx_a100`` recordings are one file (git blob dc393d0d) for
    two different runs (golden/megatron/README.md: a copy of a GPT case's): both refused;
    the resumed/frozen twins that share a file with the same arguments stay priced."""
    copied = {f.recording.recording_id for f in tier.refusals if f.message.startswith("recording=")}
    assert {
        "hybrid/hybrid_mr_mcore_te_tp1_pp1_cp1_dgx_a100_1N8G/lts_dgx_a100",
        "hybrid/hybrid_mr_mcore_te_tp2_pp1_cp1_dgx_a100_1N8G/lts_dgx_a100",
    } <= copied
    priced = {r.recording.recording_id for r in tier.rows}
    assert "gpt/gpt3_mcore_te_tp1_pp4_frozen_resume_torch_dist_swiglu/lts_dgx_a100" in priced


def test_every_declared_miss_explains_a_failing_recording(tier: MegatronTier) -> None:
    """No stale declaration: each is the first to explain at least one failing row."""
    unused = [
        (miss.check, miss.label)
        for miss in DECLARED_MISSES
        if not any(
            not row.passed(miss.check) and row.declared(miss.check) is miss for row in tier.rows
        )
    ]
    assert unused == []


def test_every_declared_miss_is_capped_in_bytes(tier: MegatronTier) -> None:
    """A declaration excuses at most its cap (absolute bytes, or what the run's own
    figures explain): never a term of the parameters' size."""
    for check in CHECKS:
        for row in tier.declared_failures(check):
            miss = row.declared(check)
            assert miss is not None and row.excess_bytes(check) <= miss.cap_bytes
    static = tier.declared_failures("static")
    assert static and all(r.excess_bytes("static") < 256 * MIB for r in static)


def test_a_model_without_the_fp32_logits_fails_covers() -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(head_module, "LOGIT_KEPT_BYTES", 0)
        patch.setattr(head_module, "LOGIT_BACKWARD_BYTES", 2)
        broken = run_tier(GOLDEN)
    assert not broken.passed
    # 4 B per logit on the last stage: most recordings peak above such a figure
    assert len(broken.failing("covers")) > len(broken.rows) // 2


def test_a_model_without_adams_moments_fails_static(adam_free: MegatronTier) -> None:
    assert not adam_free.passed
    # 8 B of every 18 (or of 6 + 12/d) per parameter: every recording is missed by more
    # than the 3% the check allows, and no declaration excuses it; but a rank of Muon's
    # layer-wise distributed optimizer, which steps whole tensors and whose share of Adam's
    # is a few norm vectors where the embedding went to another rank
    layer_wise = [r for r in adam_free.rows if r.step.settings.optimizer.label.startswith("muon (")]
    assert len(layer_wise) == 4
    assert all(not row.passed("static") for row in adam_free.rows if row not in layer_wise)
    missed = [row for row in adam_free.rows if not row.passed("static")]
    assert len(adam_free.failing("static")) == len(missed)


def test_a_model_without_the_expert_parameters_fails_static() -> None:
    """The experts hold most of an MoE run's parameters: dropping them (from megatron-core's
    buffers and Megatron FSDP's units) misses every MoE recording's static bytes by more
    than 3%."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(static_module, "stage_tensors", _without_experts)
        patch.setattr(fsdp_module, "unit_tensors", _units_without_experts)
        # and no expert weight among the FP8 ones either, as the experts are dropped
        patch.setattr(static_module, "expert_roles", lambda *a, **k: [])
        broken = run_tier(GOLDEN, "moe")
    assert not broken.passed
    assert all(not r.passed("static") for r in broken.rows)


def _units_without_experts(*args: object, **kwargs: object) -> list[Tensor]:
    return [t for t in unit_tensors(*args, **kwargs) if not t.expert]  # type: ignore[arg-type]


def _without_experts(*args: object, **kwargs: object) -> weights_module.StageTensors:
    whole = weights_module.stage_tensors(*args, **kwargs)  # type: ignore[arg-type]
    return replace(whole, experts=(), expert_matrices=(), expert_shapes=())


def test_a_model_without_the_routed_rows_fails_covers() -> None:
    """The routed experts' saved tensors are most of an MoE layer's activations: without
    them the peaks are missed."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(moe_module, "MOE_ROW_PLAIN_F", 0)
        patch.setattr(Step, "expert_rows_per_token", lambda self, tp=None, sp=None: Fraction(0))
        broken = run_tier(GOLDEN, "moe")
    assert not broken.passed
    assert len(broken.failing("covers")) > len(broken.rows) // 2


def test_a_model_without_the_pipelines_kept_inputs_fails_static() -> None:
    """megatron's TransformerBlock keeps each chunk's last received input and its
    gradient between steps: without them the pipeline recordings' static bytes fall
    short beyond what any declaration excuses."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(static_module, "RECEIVED_KEPT", 0)
        broken = run_tier(GOLDEN, "gpt")
    assert broken.failing("static")


def test_the_balanced_expectation_must_sit_near_each_moe_recording() -> None:
    """The MoE recordings' routers have no capacity: the worst case covers them, and the
    balanced expectation is checked within 10% of each. The old expectation, ceil(top-k /
    EP) rows per routed token (up to 4x the even share at EP 8, top-2), fails it."""
    from cpmem.step import step as step_module
    from cpmem.step.routing import expert_sources, rows_per_token

    def rounded_up(geometry, ep, routing, *, tp, sp, etp, tokens=None):  # type: ignore[no-untyped-def]
        if routing == "balanced":
            return -(-geometry.moe_top_k // ep) * expert_sources(ep, etp, tp, sp)
        return rows_per_token(geometry, ep, routing, tp=tp, sp=sp, etp=etp, tokens=tokens)

    tier = run_tier(GOLDEN, "moe")
    assert tier.passed and all(r.routing_bound for r in tier.rows)
    # every MoE row passes but the instances cases' two second processes, whose checkpoint
    # load sets their peak, and their EP 1 single-node run, whose worst case is the
    # expectation (each declared)
    declared = {
        r.recording.recording_id.split("/", 1)[1]: r
        for r in tier.rows
        if not (r.passed("covers") and r.passed("headroom"))
    }
    case = "gpt3_mcore_te_tp2_pp1_resume_torch_dist_te_8experts2parallel_multi_dist_optimizer_instances"
    assert sorted(declared) == [
        f"{case}/dev_dgx_gb200_2nd",
        f"{case}/dev_dgx_h100_2nd",
        f"{case}_1node/dev_dgx_gb200",
    ]
    labels = {k: (r.declared("covers"), r.declared("headroom")) for k, r in declared.items()}
    assert all(r.passed("covers") or r.declared("covers") for r in declared.values())
    assert all(r.passed("headroom") or r.declared("headroom") for r in declared.values())
    assert labels[f"{case}_1node/dev_dgx_gb200"][0] is not None
    assert labels[f"{case}_1node/dev_dgx_gb200"][0].label == "MoE at EP 1"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(step_module, "rows_per_token", rounded_up)
        broken = run_tier(GOLDEN, "moe")
    assert len(broken.failing("headroom")) > 10


def test_expert_tensor_parallelism_gathers_rows_of_a_slice_of_the_ffn() -> None:
    """Megatron-LM's ETP = TP default (TP2 ETP2 EP2 or EP1, TP4 ETP2 EP2: 79 recordings, the
    five scoped CUDA graph ones among them): each
    rank's experts receive the ETP group's gathered rows (``cpmem.step.routing``,
    ``EP x ETP / TP`` shards), each row's FFN tensors the rank's ``F_e / ETP`` slice
    (``moe.expert_shard``). Priced so, every balanced expectation is within 4% of its
    recording; the gathered rows with the whole ``F_e`` miss the 10% headroom, and the
    FFN slice without the gathered rows leaves recordings uncovered."""

    def etp_rows(r: object) -> bool:
        return r.step.plan.layout.etp > 1  # type: ignore[attr-defined]

    tier = run_tier(GOLDEN, "moe")
    rows = [r for r in tier.rows if etp_rows(r)]
    # the 79 less the instances case's two second processes, whose checkpoint load sets
    # their peak (declared: "resumed process, optimizer instances")
    loaded = [r for r in rows if r.declared("headroom")]
    assert len(loaded) == 2 and all(r.recording.second_recording for r in loaded)
    rows = [r for r in rows if r not in loaded]
    assert len(rows) == 77 and all(abs(r.headroom) <= 0.04 for r in rows)
    # the mutants are read on the rows that pass as priced (none declared)
    clean = {r.recording.recording_id for r in rows if r.passed("covers") and r.passed("headroom")}
    assert len(clean) == 76

    def clean_row(r: object) -> bool:
        return r.recording.recording_id in clean  # type: ignore[attr-defined]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(moe_module, "expert_shard", lambda g, etp: g.expert_ffn)
        whole = [r for r in run_tier(GOLDEN, "moe").rows if clean_row(r)]
    assert len(whole) == 76 and any(not r.passed("headroom") for r in whole)
    from cpmem.step import routing as routing_module

    with pytest.MonkeyPatch.context() as patch:
        sources = routing_module.expert_sources
        patch.setattr(
            routing_module, "expert_sources", lambda ep, etp, tp, sp: sources(ep, 1, tp, sp)
        )
        local = [r for r in run_tier(GOLDEN, "moe").rows if clean_row(r)]
    assert len(local) == 76 and any(not r.passed("covers") for r in local)


def test_the_kept_report_is_up_to_date() -> None:
    """golden/reports/megatron.md is what ``python -m cpmem.gate.megatron_report`` prints
    now, and what it reports is met (``--check`` exits 0)."""
    from pathlib import Path

    from cpmem.gate import megatron_report

    kept = Path(__file__).resolve().parents[2] / megatron_report.REPORT_PATH
    said: list[str] = []
    assert megatron_report.main(["--check", str(kept)], emit=said.append) == 0
    assert said[-1] == f"{kept} is up to date"
