"""The Megatron-LM tier's kept report (``golden/reports/megatron.md``) and its peers'
section of ``golden/reports/peers.md``.

``python -m cpmem.gate.megatron_report`` prints the report; ``--write PATH`` writes it,
``--check PATH`` fails when the written one is stale (``nox -s golden``). The peers on
these recordings are Megatron-LM's own ``report_theoretical_memory``
(``oracles.peers.megatron_args_theoretical``, given the run's resolved arguments), the
even CP split of it (its activation term divided by CP, the split a user applies to a
formula that has none) and Megatron-Bridge's ``estimate_training_memory``
(``oracles.peers_bridge.bridge_args_theoretical``, given the same arguments); cpmem is
priced as the tier prices it.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cpmem.gate.external import load_estimator
from cpmem.gate.megatron_misses import DECLARED_MISSES, MIB, STATIC_TOLERANCE
from cpmem.gate.megatron_tier import (
    CHECKS,
    HEADROOM_MEDIAN,
    MOE_BALANCED_TOLERANCE,
    MegatronTier,
    TierRow,
    read_case,
    run_tier,
)
from cpmem.gate.tier_vocab import TOKENIZER_VOCABULARIES
from cpmem.gate.world_candidates import world_sections
from cpmem.golden.files import default_golden_dir
from cpmem.golden.megatron import Recording
from cpmem.golden.megatron_features import FEATURES
from cpmem.golden.megatron_history import load_recorded_images
from cpmem.megatron.args import MegatronArgs
from cpmem.pricing.weights import padded_vocab
from cpmem.reports.kept import kept_report_cli
from cpmem.reports.tables import pct, table
from cpmem.step.step import Step
from cpmem.units import fmt_gib

REPORT_PATH = "golden/reports/megatron.md"
MEGATRON_FORMULA = "oracles.peers:megatron_args_theoretical"
BRIDGE_FORMULA = "oracles.peers_bridge:bridge_args_theoretical"
"""The peers, loaded as the gate loads every external estimator (an oracle is never
imported by cpmem's modules)."""


def formula_arguments(row: TierRow) -> dict[str, Any]:
    """The run's arguments as Megatron-LM's formula reads them (its defaults resolved, as
    the step was read), with the two Megatron-Bridge's formula reads besides
    (``context_parallel_size``, ``moe_router_topk``)."""
    step = row.step
    g, settings, layout, pipe = (
        step.geometry,
        step.settings,
        step.plan.layout,
        step.settings.pipeline,
    )
    lengths = step.request.sequence_lengths if step.request is not None else [0]
    moe = g.is_moe
    return {
        "num_layers": g.layers,
        "hidden_size": g.hidden,
        "num_attention_heads": g.q_heads,
        "kv_channels": g.head_dim,
        "group_query_attention": g.kv_groups != g.q_heads,
        "num_query_groups": g.kv_groups,
        "swiglu": g.gated_mlp,
        "ffn_hidden_size": g.ffn if not moe else g.expert_ffn,
        "normalization": "LayerNorm" if g.norm == "layernorm" else "RMSNorm",
        "padded_vocab_size": padded_vocab(g, layout.tp),
        "untie_embeddings_and_output_weights": not g.tied_embeddings,
        "tensor_model_parallel_size": layout.tp,
        "pipeline_model_parallel_size": pipe.pp,
        "context_parallel_size": layout.cp,
        "virtual_pipeline_model_parallel_size": pipe.vpp if pipe.vpp > 1 else None,
        "data_parallel_size": layout.dp,
        "use_distributed_optimizer": settings.optimizer.distributed,
        "seq_length": max(lengths),
        "micro_batch_size": len(lengths),
        "sequence_parallel": layout.sp_active,
        "recompute_granularity": _granularity(step),
        "num_microbatches": pipe.microbatches,
        "world_size": settings.world_size,
        # no hybrid layers, latent attention or MTP; the experts as the run has them
        "hybrid_layer_pattern": None,
        "multi_latent_attention": False,
        "num_experts": g.num_experts if moe else None,
        "moe_layer_freq": 1,
        "moe_ffn_hidden_size": g.expert_ffn if moe else None,
        "moe_shared_expert_intermediate_size": g.shared_expert_ffn or None,
        "moe_latent_size": None,
        "mtp_num_layers": None,
        "expert_tensor_parallel_size": layout.etp if moe else 1,
        "expert_model_parallel_size": layout.ep,
        "moe_router_topk": g.moe_top_k if moe else 2,
        "add_bias_linear": g.attention_bias,
    }


def _granularity(step: Step) -> str | None:
    rc = step.recompute
    if rc.full:
        return "full"
    return "selective" if rc.keeps_saved_sets and rc.modules else None


Formula = Callable[[dict[str, Any]], dict[str, float]]


def peer_figures(row: TierRow, formula: Formula, bridge: Formula) -> dict[str, tuple[float, float]]:
    """Each estimator's (static, peak) figure for a recording."""
    args = formula_arguments(row)
    f = formula(args)
    weights, act = f["weight_and_optimizer_bytes"], f["activation_bytes"]
    b = bridge(args)
    return {
        "Megatron-LM report_theoretical_memory": (weights, weights + act),
        "even CP split of it": (weights, weights + act / row.step.plan.layout.cp),
        "Megatron-Bridge estimate_training_memory": (
            b["weight_and_optimizer_bytes"],
            b["total_bytes"],
        ),
        "cpmem": (float(row.static_bytes), float(row.peak_bytes)),
    }


def _peer_table(rows: Sequence[TierRow]) -> list[str]:
    formula: Formula = load_estimator(MEGATRON_FORMULA)
    bridge: Formula = load_estimator(BRIDGE_FORMULA)
    figures = [peer_figures(r, formula, bridge) for r in rows]
    names = list(figures[0]) if figures else []
    out = []
    for name in names:
        static_err = [
            f[name][0] / r.measured_static - 1 for f, r in zip(figures, rows, strict=True)
        ]
        peak_err = [f[name][1] / r.measured_peak - 1 for f, r in zip(figures, rows, strict=True)]
        out.append(
            [
                name,
                f"{sum(abs(e) <= STATIC_TOLERANCE for e in static_err)}/{len(rows)}",
                pct(statistics.median(static_err)),
                f"{sum(e >= 0 for e in peak_err)}/{len(rows)}",
                pct(statistics.median(peak_err)),
                pct(min(peak_err)),
            ]
        )
    return table(
        [
            "estimator",
            "static within 3%",
            "median static error",
            "covers the peak",
            "median peak error",
            "worst peak error",
        ],
        out,
        style="markdown",
    )


def peers_section(tier: MegatronTier) -> list[str]:
    """The peers on Megatron-LM's own recordings (a section of ``peers.md``)."""
    rows = list(tier.rows)
    return [
        "## Megatron-LM's own runs (the second measured tier)",
        "",
        f"The {len(rows)} priced recordings of `golden/megatron/recordings.csv` (GPT and MoE "
        "families; "
        "the rank Megatron-LM logs, `docs/megatron-runtime.md`): static = the last "
        "`mem-allocated-bytes`, peak = the largest `mem-max-allocated-bytes`. Megatron-LM's "
        "formula (`oracles.peers.megatron_args_theoretical`, restated from "
        "`theoretical_memory_usage.py` at the recordings' snapshot and checked equal to the "
        "source on 200+ argument sets) gives its weight-and-optimizer term as the static "
        "figure and its total as the peak; the even CP split divides its activation term by "
        "CP. cpmem's peak is the tier's: `peak_bytes` of the rank Megatron-LM logs, under "
        "`--attention-backend auto` with Transformer Engine's pick.",
        "",
        *_peer_table(rows),
        "",
        "Megatron-LM's formula prices the first pipeline stage with no biases, no kernel "
        "workspaces, no fp32 copy of the logits at PP > 1 and no unfused attention scores; "
        "the recordings are the last stage's.",
        "",
        "Megatron-Bridge's `estimate_training_memory` (`oracles.peers_bridge."
        "bridge_args_theoretical`, restated from `theoretical_memory_utils.py` at "
        "Megatron-Bridge 067f987d and checked equal to the source, to the byte, on every "
        "recording's arguments; static = its weight-and-optimizer term, peak = its total) "
        "counts Megatron-LM's weights and Adam state with every norm as a LayerNorm's "
        "weight and bias split over TP, no router weights and the distributed optimizer "
        "sharded over DP x CP, and always Table 2's SP + selective-recompute activations "
        "(whatever the recompute and SP; a MoE layer `topk x moe_ffn + shared` wide) over "
        "TP x CP, for the first stage, the output layer at PP 1; its training-time report "
        "prints the activation term only under SP with selective recompute.",
    ]


def _family_counts(tier: MegatronTier) -> str:
    families = sorted({r.recording.family for r in tier.rows})
    return ", ".join(
        f"{sum(r.recording.family == f for r in tier.rows)} {f.upper() if f == 'gpt' else f}"
        for f in families
    )


def _family_rows(tier: MegatronTier) -> list[list[str]]:
    """Each family's checks: passed of its recordings, its median headroom."""
    out = []
    for family in sorted({r.recording.family for r in tier.rows}):
        rows = [r for r in tier.rows if r.recording.family == family]
        out.append(
            [
                family,
                str(len(rows)),
                *(f"{sum(r.passed(c) for r in rows)}/{len(rows)}" for c in CHECKS),
                pct(statistics.median(r.headroom for r in rows)),
            ]
        )
    return out


def _check_rows(tier: MegatronTier) -> list[list[str]]:
    n = len(tier.rows)
    out = []
    for c in CHECKS:
        out.append(
            [
                c,
                f"{tier.count(c)}/{n}",
                str(len(tier.declared_failures(c))),
                str(len(tier.failing(c))),
            ]
        )
    return out


def _term_rows(tier: MegatronTier) -> list[list[str]]:
    """The terms only the rank simulator stood behind before, against these recordings."""
    groups: list[tuple[str, Callable[[TierRow], bool]]] = [
        ("the LM head and its loss (every recording: the last stage)", lambda r: True),
        ("PP 1, one micro-batch at a time (gradient accumulation)", lambda r: r.pp == 1),
        (
            "1F1B pipeline, one micro-batch in flight on the last stage",
            lambda r: r.pp > 1 and not r.interleaved,
        ),
        ("interleaved pipeline, chunks in flight", lambda r: r.interleaved),
        ("context parallelism (p2p, a2a+p2p)", lambda r: r.step.plan.layout.cp > 1),
        ("sequence parallelism", lambda r: r.step.plan.layout.sp_active),
        ("full recompute", lambda r: r.step.recompute.full),
        ("unfused attention (named)", lambda r: _backend(r) == ("unfused", "unfused")),
        (
            "attention auto: flash-attn picked (A100, deterministic GB200)",
            lambda r: _backend(r) == ("flash", "auto"),
        ),
        ("attention auto: fused (cuDNN) picked", lambda r: _backend(r) == ("fused", "auto")),
        ("local transformer implementation", lambda r: _backend(r)[0] == "local"),
        ("fp16", lambda r: r.step.settings.optimizer.grad_bytes == 2),
        ("distributed optimizer", lambda r: r.step.settings.optimizer.distributed),
        (
            "MoE (the worst case covers, headroom the expectation's)",
            lambda r: r.step.geometry.is_moe,
        ),
    ]
    out = []
    for name, select in groups:
        rows = [r for r in tier.rows if select(r)]
        if not rows:
            continue
        out.append(
            [
                name,
                str(len(rows)),
                pct(statistics.median(r.static_error for r in rows)),
                f"{sum(r.passed('covers') for r in rows)}/{len(rows)}",
                pct(statistics.median(r.headroom for r in rows)),
                pct(max(r.headroom for r in rows)),
                pct(statistics.median(r.bound_headroom for r in rows)),
            ]
        )
    return out


def _backend(row: TierRow) -> tuple[str, str]:
    runtime = row.step.settings.runtime
    return runtime.attention_backend, runtime.backend_asked


def _recording_rows(tier: MegatronTier) -> list[list[str]]:
    out = []
    for r in sorted(tier.rows, key=lambda x: x.recording.recording_id):
        rec = r.recording
        marks = []
        for c in CHECKS:
            if not r.passed(c):
                marks.append(f"{c} (declared)" if r.declared(c) else f"{c} FAILS")
        out.append(
            [
                rec.recording_id,
                rec.device,
                str(rec.world_size),
                fmt_gib(r.measured_static),
                fmt_gib(r.static_bytes),
                pct(r.static_error),
                fmt_gib(r.measured_peak),
                fmt_gib(r.peak_bytes),
                pct(r.headroom),
                pct(r.bound_headroom) if r.routing_bound else "",
                _backend(r)[0],
                ", ".join(marks) or "ok",
            ]
        )
    return out


def _all_counts(tier: MegatronTier) -> str:
    families = sorted({r.family for r in tier.recordings})
    return ", ".join(
        f"{sum(r.family == f for r in tier.recordings)} {f.upper() if f == 'gpt' else f}"
        for f in families
    )


def _feature_rows(tier: MegatronTier) -> list[list[str]]:
    """Each feature family: its recordings, cases, and how many are priced and refused."""
    what = {f.tag: f.what for f in FEATURES}
    return [
        [
            f.feature,
            what[f.feature],
            str(len(f.recordings)),
            str(len(f.cases)),
            str(len(f.priced)),
            str(len(f.refusals)),
        ]
        for f in tier.by_feature()
    ]


def _refused_rows(tier: MegatronTier) -> list[list[str]]:
    """Every refused recording of a feature family: what its arguments or world size lack."""
    out = []
    for f in sorted(tier.refusals, key=lambda x: x.recording.recording_id):
        rec = f.recording
        if not rec.features:
            continue
        out.append(
            [
                rec.recording_id,
                rec.device,
                "" if rec.world_size is None else str(rec.world_size),
                ", ".join(rec.features),
                f.refused_values,
            ]
        )
    return out


def _vocab_assumptions() -> list[str]:
    """The tier's vocabulary assumptions (``cpmem.gate.tier_vocab``), one line each."""
    return [
        f"- Assumed by the tier: a `--tokenizer-model` named `{name}` has a vocabulary of "
        f"{size:,} ({source})."
        for name, (size, source) in TOKENIZER_VOCABULARIES.items()
    ]


def _world_refusals(
    tier: MegatronTier, golden_dir: Path | None
) -> list[tuple[Recording, MegatronArgs, str]]:
    """The recordings refused for their world size alone, with their arguments and image."""
    golden = golden_dir or default_golden_dir()
    images = load_recorded_images(golden)
    out = []
    for refusal in tier.refusals:
        if any(p.field != "world_size" for p in refusal.problems):
            continue
        rec = refusal.recording
        out.append((rec, read_case(rec.model_config(golden)), images[rec.recording_id].base_image))
    return out


def render_report(tier: MegatronTier, golden_dir: Path | None = None) -> str:
    n = len(tier.rows)
    refused = [[why, str(len(ids))] for why, ids in sorted(tier.refused.items())]
    declared = [
        [
            m.check,
            m.label,
            m.direction,
            pct(m.limit),
            f"{m.cap_bytes / MIB:,.0f} MiB"
            + (" (or what the run's figures explain)" if m.cap else ""),
            str(sum(r.declared(m.check) is m for r in tier.rows)),
            m.why,
        ]
        for m in DECLARED_MISSES
    ]
    lines = [
        "# Megatron-LM's functional-test recordings: the second measured tier",
        "",
        f"Generated by `python -m cpmem.gate.megatron_report --write {REPORT_PATH}`; do not "
        "edit by hand (`nox -s golden` fails when it is stale). `cpmem gate` runs the same "
        "checks (`cpmem.gate.megatron_tier`); `docs/megatron-runtime.md` says what is "
        "measured and how each argument enters.",
        "",
        f"- {n} recordings ({_family_counts(tier)}) priced from their own `model_config.yaml` on the rank "
        "Megatron-LM logs (the last), their recipe's world size and their platform's device.",
        f"- {len(tier.recordings)} recordings in `golden/megatron/recordings.csv` "
        f"({_all_counts(tier)}); {len(tier.refusals)} refused, each with every reason (their "
        'arguments, or a world size the snapshot does not give): "Refused arguments" and '
        '"By feature family" below.',
        f"- {len(tier.unnamed_platform)} recordings name no platform (`golden_values_dev.json`, "
        f"`golden_values_lts.json`): imported, not priced. {len(tier.no_values)} recordings "
        "have no finite value.",
        f"- Static: within {pct(STATIC_TOLERANCE)} of the last `mem-allocated-bytes`. Covers: "
        "`peak_bytes` >= the largest `mem-max-allocated-bytes`. Headroom: at most 10% above "
        "it where it is >= 8 GiB, 20% below; median at most "
        f"{pct(HEADROOM_MEDIAN)} (here {pct(tier.median_headroom)}). An MoE run's router has "
        "no capacity: `peak_bytes` prices the worst case it can reach, a bound that must "
        "cover, and its headroom is the balanced expectation's, within "
        f"{pct(MOE_BALANCED_TOLERANCE)} of the recording either side; `peak_bytes`' own "
        f"median headroom, the bounds in, is {pct(tier.median_bound_headroom)}.",
        "- The recordings' own tolerance: Megatron-LM's CI accepts a rerun within 5% of the "
        "recorded values, so the same case's recordings (containers, `_2nd` files) differ by "
        "up to a few percent; a 3% static check is inside that band only where the runs "
        "themselves agree.",
        "- Priced by `tight`, the layer kinds' one model both measured runtimes check, with "
        "no margin for Megatron-LM's runs: no constant is fitted to these recordings (each "
        "term a tensor read from Megatron-LM's, Transformer Engine's or PyTorch's source; "
        "`docs/megatron-runtime.md` names the few whose lifetime the recordings decided), "
        "so there is nothing to cross-validate over cases; the recordings kept aside check "
        "the terms as they stand.",
        "- `--attention-backend auto`: Transformer Engine's pick in the container of the CI "
        "image the recording was made in (`golden/megatron/recorded_images.csv`; "
        "`cpmem.step.backend_choice`): the `lts` environment ran NGC PyTorch 24.01 until "
        "2025-11-06, whose deterministic A100 runs are unfused; the figures under the "
        "backends other containers pick are reported, never counted.",
        *_vocab_assumptions(),
        "",
        "## Checks",
        "",
        *table(
            ["check", "passed", "declared misses", "failing"], _check_rows(tier), style="markdown"
        ),
        "",
        "By family:",
        "",
        *table(
            ["family", "recordings", *(f"{c} passed" for c in CHECKS), "median headroom"],
            _family_rows(tier),
            style="markdown",
        ),
        "",
        "## Refused arguments",
        "",
        *(table(["refusal", "recordings"], refused, style="markdown") if refused else ["none"]),
        "",
        "## World sizes the snapshot does not give",
        "",
        "Each recording refused for its world size alone, priced at every DP its arguments "
        "allow (the DP dividing the global batch over the micro-batch; "
        "`cpmem.gate.world_candidates`). Shown, never counted: the DP that matches best "
        "would be an integer fitted to the recording.",
        "",
        *(world_sections(_world_refusals(tier, golden_dir)) or ["none"]),
        "## By feature family",
        "",
        "The feature families each recording's arguments turn on "
        "(`cpmem.golden.megatron_features`: a rule over the case's `MODEL_ARGS` and "
        "`TEST_TYPE`, the `features` column of `recordings.csv`); a recording may exercise "
        "several:",
        "",
        *table(
            ["feature", "what", "recordings", "cases", "priced", "refused"],
            _feature_rows(tier),
            style="markdown",
        ),
        "",
        "Their refused recordings, and what each one's refusal names (the reasons are in "
        '"Refused arguments"; the world size is empty where the snapshot does not give it, '
        "`world_size_basis` in `recordings.csv` says why):",
        "",
        *table(
            ["recording", "device", "world", "features", "refused"],
            _refused_rows(tier),
            style="markdown",
        ),
        "",
        "## The terms against the recordings",
        "",
        "What the harness's tier could only simulate (the head, pipeline schedules, CP) "
        "meets measurements here:",
        "",
        *table(
            [
                "recordings exercising",
                "n",
                "median static error",
                "covered",
                "median headroom",
                "max headroom",
                "median peak_bytes headroom (MoE bounds in)",
            ],
            _term_rows(tier),
            style="markdown",
        ),
        "",
        "## Declared misses",
        "",
        *table(
            ["check", "miss", "direction", "limit", "cap", "recordings", "why"],
            declared,
            style="markdown",
        ),
        "",
        "## Every recording",
        "",
        *table(
            [
                "recording",
                "device",
                "world",
                "static GiB",
                "priced",
                "error",
                "peak GiB",
                "priced",
                "headroom",
                "bound headroom",
                "backend",
                "status",
            ],
            _recording_rows(tier),
            style="markdown",
        ),
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None, emit: Callable[[str], None] = print) -> int:
    """``python -m cpmem.gate.megatron_report [--write PATH | --check PATH]``."""

    def make(golden: Path | None = None) -> tuple[str, bool]:
        tier = run_tier(golden or default_golden_dir())
        return render_report(tier, golden), tier.passed

    return kept_report_cli(argv, make, "python -m cpmem.gate.megatron_report", emit)


if __name__ == "__main__":
    raise SystemExit(main())
