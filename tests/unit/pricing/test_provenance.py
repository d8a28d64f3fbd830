"""Every answer says what checked each of its terms (``cpmem.pricing.provenance``).

Expected outcomes come from the measured and simulated data themselves: which steps ART's
golden cells ran (golden/cells.csv), which families the rank simulator's grid runs
(golden/simulated/rows.csv and its configs), and which kinds of layer Megatron-LM's
recordings build (GPT and MoE models: no Gated DeltaNet, latent attention or windows).
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from cpmem.cli import main
from cpmem.model.hf_config import load_config
from cpmem.model.presets import MEASURED, PRESETS
from cpmem.pricing.components import Component
from cpmem.pricing.provenance import ART_MEASURED, SIMULATED_FAMILIES, TERMS
from cpmem.pricing.registry import price
from cpmem.pricing.static import StaticComponent
from cpmem.reports.cli_render import render_estimate
from cpmem.step.describe import describe_step

GOLDEN = Path(__file__).resolve().parents[3] / "golden"
HARNESS = {"head": "hidden", "step": "first", "lora_rank": 1}


def _preset_of(model: str) -> str:
    return next(n for n, g in PRESETS.items() if model == n or model in g.aliases)


def test_the_art_measured_steps_are_the_golden_cells_that_ran() -> None:
    """Each (model, TP, CP, SP, EP, recompute, compiled) of a golden cell with a measured
    forward peak, read from golden/cells.csv, and nothing else."""
    with (GOLDEN / "cells.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if r["forward_peak_bytes"]]
    ran = {
        (
            _preset_of(r["model"]),
            int(r["tp"]),
            int(r["cp"]),
            r["sequence_parallel"] == "True",
            int(r["ep"]),
            "none" if r["mode"] == "none" else f"{r['mode']}({r['modules']})",
            r["compiled"] == "True",
        )
        for r in rows
    }
    assert ran == ART_MEASURED


def test_the_simulated_families_are_the_grids() -> None:
    """The families of the configs the simulated grid ran beside the measured presets."""
    with (GOLDEN / "simulated" / "rows.csv").open() as f:
        sources = {(r["model"], r["model_source"]) for r in csv.DictReader(f)}
    families = {
        load_config(GOLDEN / "simulated" / src).family for _, src in sources if src != "preset"
    }
    assert families == SIMULATED_FAMILIES
    # the grid's presets are the measured ones, simulated under their own names
    assert {m for m, src in sources if src == "preset"} <= set(MEASURED)


def test_every_component_has_one_source() -> None:
    named = set(TERMS) | {"margin_factor", "margin_allowance", "static_floor", "profile_floor"}
    assert {c.value for c in Component} | {c.value for c in StaticComponent} == named


def test_a_measured_cell_step_is_measured_by_art_and_its_head_is_not() -> None:
    """Qwen3-1.7B at TP2 with SP, selective core attention, the harness's adapters: the
    golden cells' step. Its retained activations sit inside a measured peak; a logits
    head the harness never ran is only simulated."""
    est = price(describe_step("qwen3-1.7b", [4096], tp=2, **HARNESS), "tight")
    assert est.provenance["retained_activations"].label == "measured (art)"
    with_head = price(describe_step("qwen3-1.7b", [4096], tp=2, head="logits"), "tight")
    assert with_head.provenance["head"].label == "structure (simulator)"
    # a layout no cell ran (TP 4) is the simulator's, not a measurement
    other = price(describe_step("qwen3-1.7b", [4096], tp=4, **HARNESS), "tight")
    assert other.provenance["retained_activations"].label == "structure (simulator)"


def test_an_unmeasured_family_is_priced_by_structure_and_names_no_harness() -> None:
    step = describe_step("gemma-2-9b", [4096], tp=2)
    est = price(step, "tight")
    activations = {n for n, b in est.components.items() if b and not n.startswith("margin")}
    assert activations
    assert all(est.provenance[n].kind == "structure" for n in activations)
    assert "measured" not in render_estimate(est, step.plan).split("static memory")[0]
    # the grid simulates Gemma 2; it runs no Kimi K2 (its own family)
    assert est.provenance["retained_activations"].label == "structure (simulator)"
    kimi = price(describe_step("kimi-k2", [4096], tp=8, ep=8), "tight")
    assert kimi.provenance["retained_activations"].label == "structure (source)"


@pytest.mark.parametrize(
    ("model", "extra", "measured"),
    [
        ("qwen3-1.7b", {}, True),
        ("qwen3-30b-a3b", {"ep": 4}, True),
        # the recordings are steady steps: a first step's terms are no recording's
        ("qwen3-1.7b", {"step": "first"}, False),
    ],
)
def test_megatron_lm_measures_the_steps_its_recordings_run(
    model: str, extra: dict[str, object], measured: bool
) -> None:
    """Full training under Megatron-LM's runtime: a GPT or MoE layer's steady step is
    what its recordings run."""
    step = describe_step(
        model,
        [4096],
        tp=1,
        runtime="megatron-lm",
        training="full",
        attention_backend="flash",
        **extra,  # type: ignore[arg-type]
    )
    label = price(step).provenance["retained_activations"].label
    assert label == ("measured (megatron-lm)" if measured else "structure (source)")


def test_assumptions_are_stated_where_they_apply() -> None:
    cp = price(describe_step("qwen3-1.7b", [4096, 4096], tp=2, cp=2), "tight")
    assert cp.assumptions["cp_layout"].startswith(f"{cp.planner}:")
    assert "experts" not in cp.assumptions
    assert "none in the activations" in cp.assumptions["setup"]
    first = price(describe_step("qwen3-1.7b", [4096], tp=2, step="first"), "tight")
    assert "cp_layout" not in first.assumptions and "cold_setup" in first.assumptions["setup"]
    moe = price(describe_step("qwen3-30b-a3b", [4096], tp=2, ep=4, etp=2), "tight")
    assert "ETP 2" in moe.assumptions["experts"]
    whole = price(describe_step("qwen3-30b-a3b", [4096], tp=2, ep=4, etp=1), "tight")
    assert "ETP 1" in whole.assumptions["experts"]


def test_every_answer_names_the_dtype_its_weights_are_priced_in() -> None:
    """A weight's bytes read back to its parameter count only with the dtype beside them:
    Qwen3-1.7B's config (tied embeddings, 28 layers of H 2048, F 6144, 16 heads of 128, 8
    KV heads, q/k norms, vocabulary 151,936) counts 1,720,574,976 parameters by hand:
    151,936 x 2048 + 28 x (2048 x (2048 + 1024 + 1024) + 2048 x 2048 + 3 x 2048 x 6144
    + 2 x 2048 + 2 x 128) + 2048 (the model card's 1.7B, 1.4B of them not the embedding);
    at bf16's 2 B each, 3,441,149,952 B."""
    bf16 = price(describe_step("qwen3-1.7b", [4096]), "tight")
    assert bf16.assumptions["weights"].startswith("bf16, 2 B per parameter")
    assert bf16.static is not None
    assert bf16.static.components["base_weights"] == 2 * 1_720_574_976
    fp32 = price(describe_step("qwen3-1.7b", [4096], dtype="fp32"), "tight")
    assert fp32.assumptions["weights"].startswith("fp32, 4 B per parameter")
    fp8 = describe_step(
        "qwen3-1.7b", [4096], training="full", runtime="megatron-lm", fp8="tensorwise:param-gather"
    )
    assert "FP8, 1 B" in price(fp8, "tight").assumptions["weights"]
    quantized = load_config(
        Path(__file__).resolve().parents[3] / "examples/deepseek-v3/config.json"
    )
    q = price(describe_step(quantized, [4096], tp=8, ep=32), "tight")
    assert "weights" not in q.assumptions and "dequantized to bf16" in q.assumptions["base_weights"]


def test_the_text_names_the_harness_only_for_a_measured_model(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The trailing line prices the calibration harness's step beside the trainer's only
    where golden/ measured the model; the margin is explained in one line."""
    assert main(["estimate", "--model", "qwen3-1.7b", "--tp", "2", "--lengths", "4096"]) == 0
    measured = capsys.readouterr().out
    assert "the harness's step" in measured
    assert "margin: margin_factor is the published formula's x1.1" in measured
    assert main(["estimate", "--model", "gemma-2-9b", "--tp", "2", "--lengths", "4096"]) == 0
    assert "the harness's step" not in capsys.readouterr().out


ROUTINGS = ("concentrated", "balanced", "capacity:1.5", "rows:3000")
ASSUMED = {
    "concentrated": "concentrated routing",
    "balanced": "balanced routing",
    "capacity:1.5": "capacity:1.5 routing",
    "rows:3000": "rows:3000 routing",
}
"""What ``assumptions["experts"]`` says of each routing priced, written out."""


@pytest.mark.parametrize("policy", ["reference", "global", "tight"])
@pytest.mark.parametrize("routing", ROUTINGS)
@pytest.mark.parametrize("ep", [1, 4])
def test_the_assumed_routing_is_the_one_priced(policy: str, routing: str, ep: int) -> None:
    """Where the routing is named as not priced (the reference charges every expert row
    concentrated; at EP 1 every routed copy lands on the rank's experts, so balanced is
    concentrated), the assumption states the concentrated routing that was priced;
    elsewhere the routing asked (tight at EP 1 prices a stated row count or capacity as
    a bound on the rank's k x tokens rows). The issue's case: TP 2 EP 4 balanced under
    ``reference`` once assumed "balanced routing" while naming the routing as ignored."""
    est = price(describe_step("qwen3-30b-a3b", [4096], tp=2, ep=ep, moe_routing=routing), policy)
    ignored = "moe_routing" in est.to_dict()["ignored_options"]
    unpriced = policy != "tight" or (ep == 1 and routing == "balanced")
    assert ignored == (routing != "concentrated" and unpriced)
    stated = "concentrated" if unpriced else routing
    assert est.assumptions["experts"].endswith("; " + ASSUMED[stated])


def test_the_reference_at_tp2_ep4_balanced_assumes_what_it_charges() -> None:
    step = describe_step("qwen3-30b-a3b", [4096], tp=2, ep=4, moe_routing="balanced")
    est = price(step, "reference")  # ART's MoE steps default to tight
    assert est.policy == "reference"
    assert est.ignored_options[0].startswith("moe_routing: the reference charges every")
    assert est.assumptions["experts"] == (
        "experts split over EP 4 only (ETP 1: each expert whole on its rank); concentrated routing"
    )


@pytest.mark.parametrize("policy", ["reference", "global", "tight"])
@pytest.mark.parametrize("planner", [None, "balanced", "chunked"])
@pytest.mark.parametrize("model", ["qwen3-1.7b", "qwen3-30b-a3b"])
def test_the_assumed_cp_layout_is_the_one_priced(
    policy: str, planner: str | None, model: str
) -> None:
    """``global`` charges every CP rank the packed count whatever the layout; the
    reference does on every step but dense CP with gradients and partial recompute (the
    MoE model here); tight prices the busiest rank's layout. The assumption names a
    planner's layout only where one was priced."""
    moe = {"ep": 4} if model != "qwen3-1.7b" else {}
    step = describe_step(model, [6144, 2048], tp=2, cp=2, planner=planner, **moe)
    est = price(step, policy)
    priced = policy == "tight" or (policy == "reference" and model == "qwen3-1.7b")
    line = est.assumptions["cp_layout"]
    if priced:
        assert line.startswith(f"{est.planner}: ")
    else:
        assert line.startswith("every CP rank charged the packed tokens: no CP layout priced")
    if planner is not None and not priced:
        assert "planner" in est.to_dict()["ignored_options"]


@pytest.mark.parametrize(
    ("routing", "said"),
    [
        ("balanced", "MoE routing: balanced, an expectation: "),
        ("concentrated", "MoE routing: concentrated, a bound (worst: a router without "),
        ("capacity:1", "MoE routing: capacity:1, a bound (capacity: stated): "),
    ],
)
def test_the_routing_line_reads_as_english(routing: str, said: str) -> None:
    step = describe_step("qwen3-30b-a3b", [4096], tp=2, ep=4, moe_routing=routing)
    est = price(step, "tight")
    (line,) = [ln for ln in render_estimate(est, step.plan).splitlines() if "MoE routing" in ln]
    assert line.startswith(said)
