"""The gate's human report: checks table, tightest cells, power detail, failures."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cpmem.reports.tables import pct, table
from cpmem.units import fmt_gib


def render(report: Mapping[str, Any]) -> str:
    """The human report: checks table, tightest cells, power detail, failures, summary."""
    ch = report["checks"]
    gold, cov, conf, ctl, ref, pw = (
        ch["golden"],
        ch["coverage"],
        ch["conformance"],
        ch["controls"],
        ch["refusals"],
        ch["power"],
    )
    tg = ch["targets"]

    def status(c: Mapping[str, Any]) -> str:
        return "PASS" if c["passed"] else "FAIL"

    conf_detail = (
        f"policy {report['policy']} claims no recorded estimates"
        if conf["claims_none"]
        else "; ".join(f"{p['claim']} {p['matched']}/{p['checked']}" for p in conf["claims"])
    )
    if ctl.get("error"):
        ctl_scope, ctl_detail = "0 controls", ctl["error"]
    elif ctl["required"]:
        ctl_scope = f"{ctl['total']} controls"
        ctl_detail = (
            "byte-identical to golden/controls"
            if ctl["byte_identical"]
            else f"{len(ctl['differing'])} differ from golden/controls"
        )
    else:
        ctl_scope = f"{ctl['total']} controls"
        ctl_detail = (
            f"{ctl['matching']}/{ctl['total']} match the reference's recorded values "
            f"(informational: only the recorded policies must reproduce their own)"
        )
    negs, muts = pw["negative_controls"], pw["mutants"]
    rows = [
        [
            "golden",
            status(gold),
            f"{gold['cells']} cells",
            "schema, manifest and sources agree" if gold["passed"] else "golden layer damaged",
        ],
        [
            "coverage",
            status(cov),
            f"{cov['cells']} cells, {cov['rank_samples']} rank-samples",
            (
                f"headroom min {pct(cov['min_headroom'])} / median "
                f"{pct(cov['median_headroom'])} / max {pct(cov['max_headroom'])}"
            )
            if cov["cells"]
            else "no measured cells",
        ],
        *(
            [
                [
                    "",
                    "",
                    f"{cov['forward_backward']['cells']} forward+backward peaks",
                    f"{cov['forward_backward']['covered']}/{cov['forward_backward']['cells']} "
                    f"covered; headroom min {pct(cov['forward_backward']['min_headroom'])} / "
                    f"median {pct(cov['forward_backward']['median_headroom'])} / max "
                    f"{pct(cov['forward_backward']['max_headroom'])}",
                ]
            ]
            if "forward_backward" in cov
            else []
        ),
        *(
            [
                [
                    "request_path",
                    status(ch["request_path"]),
                    f"{ch['request_path']['cells']} cells from their requests",
                    f"{ch['request_path']['cells'] - len(ch['request_path']['failing'])} covered; "
                    f"busiest as recorded on {ch['request_path']['busiest_matching']}/"
                    f"{ch['request_path']['cp_cells']} CP cells",
                ]
            ]
            if "request_path" in ch
            else []
        ),
        ["conformance", status(conf), f"{conf['checked']} recorded estimates", conf_detail],
        [
            "controls",
            status(ctl) if ctl["required"] else "INFO",
            ctl_scope,
            ctl_detail,
        ],
        [
            "refusals",
            status(ref),
            f"{ref['cells']} cells",
            f"{ref['refused']} recorded refused, {ref['admitted']} ran; "
            f"{len(ref['failing'])} decided otherwise",
        ],
        [
            "power",
            status(pw),
            f"{len(negs)} negative controls, {len(muts)} mutants",
            f"negative controls flagged {sum(n['caught'] for n in negs)}/{len(negs)}; "
            f"mutants caught {sum(m['caught'] for m in muts)}/{len(muts)}",
        ],
        *_fitting_rows(ch, status),
        *_static_rows(ch, status),
        *_megatron_rows(ch, status),
        [
            "targets",
            status(tg),
            f"{tg['declared']} targets",
            f"{tg['met']}/{tg['declared']} met"
            if tg["declared"]
            else f"policy {report['policy']} declares none",
        ],
    ]
    lines = [f"cpmem gate: policy {report['policy']}, golden {report['golden_dir']}", ""]
    lines += table(["check", "result", "scope", "detail"], rows, style="rule")

    tight = sorted(cov["rows"], key=lambda r: r["headroom"])[:5]
    if tight:
        lines += ["", "tightest cells (coverage):"]
        lines += table(
            ["cell", "estimate GiB", "peak GiB", "headroom"],
            [
                [
                    r["cell_id"],
                    fmt_gib(r["estimate_bytes"]),
                    fmt_gib(r["forward_peak_bytes"]),
                    pct(r["headroom"]),
                ]
                for r in tight
            ],
            style="rule",
        )
    if "request_path" in ch:
        rp_rows = [r for r in ch["request_path"]["rows"] if r["cp"] > 1 or not r["covered"]]
        lines += ["", "request path: planned (default planner) vs recorded busiest tokens:"]
        lines += table(
            ["cell", "planner", "planned", "recorded", "estimate GiB", "peak GiB", "headroom"],
            [
                [
                    r["cell_id"],
                    r["planner"],
                    f"{r['planned_busiest_tokens']:,}",
                    f"{r['recorded_busiest_tokens']:,}" if r["recorded_busiest_tokens"] else "-",
                    fmt_gib(r["estimate_bytes"]),
                    fmt_gib(r["forward_peak_bytes"]),
                    pct(r["headroom"]) + ("" if r["covered"] else " NOT COVERED"),
                ]
                for r in rp_rows
            ],
            style="rule",
        )
    lines += ["", "power: recorded negative-control estimates (must NOT cover the peak):"]
    lines += table(
        ["cell", "recorded GiB", "peak GiB", "ratio", "flagged"],
        [
            [
                n["cell_id"],
                fmt_gib(n["recorded_estimate_bytes"] or 0),
                fmt_gib(n["forward_peak_bytes"] or 0),
                f"{n['ratio']:.3f}" if n["ratio"] is not None else "-",
                "caught" if n["caught"] else "NOT CAUGHT",
            ]
            for n in negs
        ],
        style="rule",
    )
    lines += ["", f"power: mutants of {pw['mutants_of']} (each must be caught):"]
    lines += _mutant_table(muts)
    if "cross_validation" in ch:
        cv = ch["cross_validation"]
        lines += [
            "",
            "cross-validation: constants refitted without each fold, on the held-out cells:",
        ]
        lines += table(
            ["fold", "held out", "cells", "fwd covered", "fb covered", "refit"],
            [
                [
                    f["fold"],
                    f["held_out"],
                    f"{f['cells']}",
                    f"{f['forward_covered']}/{f['cells']}",
                    f"{f['forward_backward_covered']}/{f['cells']}",
                    f["refit"],
                ]
                for f in cv["folds"]
            ],
            style="rule",
        )
        if cv["known_misses"]:
            lines += [
                "",
                "declared held-out misses (known, unexplained; the list may only shrink):",
            ]
            lines += [f"  {m}" for m in cv["known_misses"]]

    if tg["declared"]:
        lines += ["", f"targets declared by policy {report['policy']}:"]
        lines += table(
            ["target", "figure", "bound", "cells", "measured", "worst cell", "met"],
            [
                [
                    t["target"],
                    t["figure"],
                    t["bound"],
                    f"{t['cells']}",
                    t["measured"],
                    t["worst_cell"] or "-",
                    "met" if t["met"] else "MISSED",
                ]
                for t in tg["targets"]
            ],
            style="rule",
        )

    failures = []
    for name, c in ch.items():
        if name == "controls" and not c["required"]:
            continue
        for item in c.get("failing", []):
            failures.append(f"  {name}: {item}")
    if ch["controls"].get("error") and ch["controls"]["required"]:
        failures.append(f"  controls: {ch['controls']['error']}")
    if failures:
        lines += ["", "failures:", *failures]
    if not conf["passed"]:
        lines += ["", "conformance mismatches:"]
        lines += [
            f"  {m['claim']}: {m['cell_id']}: recorded {m['recorded_bytes']:,}, "
            f"estimate {m['estimate_bytes']:,} ({m['difference_bytes']:+,})"
            for m in conf["mismatches"]
        ]
    lines += ["", report["summary"]]
    return "\n".join(lines)


def _static_rows(ch: Mapping[str, Any], status: Any) -> list[list[str]]:
    """The static-memory and budget checks, where the report has them."""
    if "static" not in ch or "budget" not in ch:
        return []
    st, bu = ch["static"], ch["budget"]
    declared = ", ".join(f"{k} {n}" for k, n in st["declared"].items() if n) or "none"
    return [
        [
            "static",
            status(st),
            f"{st['checked']} recorded baselines",
            f"{st['within']} within 3% (max error {pct(st['max_abs_error'])}); declared: "
            f"{declared}",
        ],
        [
            "budget",
            status(bu),
            f"{bu['checked']} recorded budgets",
            f"max error {pct(bu['max_abs_error_from_baseline'])} from the recorded baseline "
            f"({bu['from_baseline_checked']} cells, bound 1%), "
            f"{pct(bu['max_abs_error_from_static'])} from the estimated static (bound 3%)",
        ],
    ]


def _megatron_rows(ch: Mapping[str, Any], status: Any) -> list[list[str]]:
    """The Megatron-LM recordings' tier (``cpmem.gate.megatron_tier``), where present."""
    if "megatron" not in ch:
        return []
    mg = ch["megatron"]
    c = mg["checks"]
    failing = sum(len(c[k]["failing"]) for k in c)
    return [
        [
            "megatron",
            status(mg),
            f"{mg['recordings']} recordings",
            f"static within 3% {c['static']['passed']}, covers {c['covers']['passed']}, "
            f"headroom {c['headroom']['passed']}; declared "
            f"{sum(c[k]['declared'] for k in c)}, failing {failing}; median headroom "
            f"{pct(mg['median_headroom'])}",
        ]
    ]


def _fitting_rows(ch: Mapping[str, Any], status: Any) -> list[list[str]]:
    if "cross_validation" not in ch:
        return []
    const, cv = ch["constants"], ch["cross_validation"]
    return [
        [
            "constants",
            status(const),
            "refit on every cell",
            "the fit reproduces the constants in the code"
            if const["passed"]
            else f"code {const['constants']} != fit {const['refit']}",
        ],
        [
            "cross-val",
            status(cv),
            f"{len(cv['folds'])} folds, {cv['held_out_cells']} held-out cells",
            f"{len(cv['misses'])} held-out misses, {len(cv['known_misses'])} declared; "
            f"{len(cv['failing'])} undeclared or stale",
        ],
    ]


def _mutant_table(muts: Sequence[Mapping[str, Any]]) -> list[str]:
    rows = []
    for m in muts:
        if "coverage_failing" in m:  # a reference-formula mutant
            cells = (
                m["coverage_failing"] if m["caught_by"] == "coverage" else m["conformance_failing"]
            )
            shown = ", ".join(cells[:3]) + (f" (+{len(cells) - 3} more)" if len(cells) > 3 else "")
        else:  # a fitted policy's mutant, refitted
            shown = "; ".join(m["targets_missed"][:2] or m["new_held_out_misses"][:2])
        rows.append([m["mutant"], m["caught_by"] or "NOT CAUGHT", shown or "-"])
    return table(["mutant", "caught by", "evidence"], rows, style="rule") if rows else ["  (none)"]
