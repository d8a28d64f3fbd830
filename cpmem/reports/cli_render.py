"""The command line's human tables: an estimate with its static memory and stages, the
whole device under an admission decision, a capacity table (``cpmem estimate``, ``admit``,
``capacity``; their JSON is each result's ``to_dict``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from cpmem.model.presets import MEASURED, PRESETS
from cpmem.plan.plan import Plan
from cpmem.pricing.components import outside_figure
from cpmem.pricing.estimate import Estimate
from cpmem.pricing.provenance import REFERENCE_POLICIES
from cpmem.pricing.reference import SAFETY
from cpmem.pricing.tight.calibrated import MARGIN
from cpmem.reports.tables import table
from cpmem.step.routing import routing_kind
from cpmem.step.step import Step
from cpmem.units import MIB, counted, fmt_gib

if TYPE_CHECKING:  # the estimate's rendering runs without the admission modules
    from cpmem.admission.admission import Decision
    from cpmem.admission.capacity import Capacity, Fit


def render_estimate(est: Estimate, plan: Plan) -> str:
    """The human table: per-rank bytes, then the busiest rank's breakdown."""
    trained = est.trained
    asked = " (auto: Transformer Engine's pick)" if est.backend_asked == "auto" else ""
    runtime = "" if est.facts.evidence == "art_cells" else f"  runtime={est.runtime}"
    experts = f" ep={est.ep} etp={est.etp}" if est.ep > 1 or est.etp > 1 else ""
    lines = [
        f"{est.model}  policy={est.policy}{runtime}  recompute={est.recompute}  "
        f"tp={est.tp} cp={est.cp} sp={'on' if est.sp else 'off'}{experts}  planner={est.planner}",
        f"logical tokens {est.logical_tokens:,}  packed {est.packed_tokens:,}  "
        f"grad segments {est.grad_segments}",
        f"head {est.head.label}  {trained}  cp_comm {est.cp_comm}  "
        f"attention {est.attention_backend}{asked}",
        "",
    ]
    ranks = []
    for r, b in enumerate(est.per_rank_bytes):
        mark = "<- busiest" if r == est.busiest_rank else ""
        ranks.append([f"{r}", f"{plan.rank_tokens[r]:,}", f"{b:,}", fmt_gib(b), mark])
    lines += table(["rank", "tokens", "bytes", "GiB", ""], ranks, right=(0, 1, 2, 3))
    sources = est.provenance
    parts = []
    for name, b in est.components.items():
        if not b:  # a term this step does not hold (the JSON lists every one)
            continue
        share = b / est.estimate_bytes if est.estimate_bytes else 0.0
        parts.append([name, f"{b:,}", fmt_gib(b), f"{share:.1%}", sources[name].label])
    busiest = f"busiest rank {est.busiest_rank}, {est.busiest_tokens:,} tokens priced"
    parts.append(["estimate", f"{est.estimate_bytes:,}", fmt_gib(est.estimate_bytes), "", busiest])
    if est.forward_backward_bytes is not None:
        fb = est.forward_backward_bytes
        parts.append(["forward+backward", f"{fb:,}", fmt_gib(fb), "", "the whole step"])
    headers = ["component", "bytes", "GiB", "share", "checked by"]
    lines += ["", *table(headers, parts, right=(1, 2, 3))]
    if est.stage_bytes:
        stages = [
            [
                f"{s}",
                f"{b:,}",
                fmt_gib(b),
                "<- busiest" if s == est.busiest_stage else "",
            ]
            for s, b in enumerate(est.stage_bytes)
        ]
        lines += ["", *table(["stage", "bytes", "GiB", ""], stages, right=(0, 1, 2))]
        lines.append(f"busiest stage {est.busiest_stage}: its peak is the {est.pipeline_op}")
    if est.static is not None:
        lines += ["", *render_static(est)]
    lines += ["", *render_basis(est)]
    return "\n".join(lines)


def margin_line(est: Estimate) -> str | None:
    """What the estimate's margin is, in one line (None: the step carries none)."""
    held = {n: b for n, b in est.components.items() if n.startswith("margin_") and b}
    if not held:
        return None
    if est.policy in REFERENCE_POLICIES:
        return (
            f"margin: margin_factor is the published formula's x{SAFETY:g} on the sum of its "
            "terms (docs/pricing.md)"
        )
    m = MARGIN  # the only margin tight prices: a runtime's fitted one (Runtime.fitted_margin)
    return (
        "margin: tight's margin for ART's runtime, fitted on ART's golden cells "
        f"(calibrated.MARGIN, docs/tight.md): x{m.forward_factor:g} on the structural sum "
        f"(margin_factor) and {m.forward_allowance // MIB} MiB on a forward "
        f"(margin_allowance; {m.backward_allowance // MIB} MiB on a backward, "
        f"{m.cold_backward_allowance // MIB} MiB more on a first backward)"
    )


def routing_line(est: Estimate) -> str | None:
    """Of an MoE step priced under its routing: which routing priced it (a bound or the
    expectation) and the figure under each other one, with what a capacity would save
    (None: no routing figures)."""
    figures = est.routing_figures
    if not figures:
        return None
    own = routing_kind(est.facts.moe_routing)
    others = []
    for name, b in figures.items():
        if name == own:
            continue
        label = f"capacity factor {est.capacity_factor:g}" if name == "capacity" else name
        others.append(f"{label} {fmt_gib(b)} GiB")
    bound = est.routing_bound
    article = "an" if bound[0] in "aeiou" else "a"
    line = (
        f"MoE routing: {est.facts.moe_routing}, {article} {bound}: "
        f"{fmt_gib(figures[own])} GiB; under " + ", ".join(others)
    )
    saved = figures[own] - figures.get("capacity", figures[own])
    if own == "concentrated" and saved > 0:
        line += (
            f"; stating the capacity (--moe-routing capacity:{est.capacity_factor:g}) "
            f"would save {fmt_gib(saved)} GiB"
        )
    return line


def render_basis(est: Estimate) -> list[str]:
    """The margin, the MoE routing, each assumption and the memory outside the figure,
    one line each."""
    lines = [line for line in (margin_line(est), routing_line(est)) if line is not None]
    lines += [f"assumes {name}: {text}" for name, text in est.assumptions.items()]
    return lines + [f"outside the figure: {n}" for n in est.notes if outside_figure(n)]


def render_static(est: Estimate) -> list[str]:
    """The static memory under the activations and, with a device, what it leaves; with
    pipeline stages, the stage where static and activations together are largest."""
    assert est.static is not None
    sources = est.provenance
    rows = [
        [name, f"{b:,}", fmt_gib(b), sources[name].label]
        for name, b in est.static.components.items()
        if b
    ]
    rows.append(["static", f"{est.static.total:,}", fmt_gib(est.static.total), ""])
    activations, _ = est.device_required()
    whole = est.whole_device_bytes()
    rows.append(["static + estimate", f"{whole:,}", fmt_gib(whole), ""])
    title = "static memory (per rank)"
    if est.stage_statics:
        title = f"static memory (stage {est.device_stage()}, the fullest)"
    lines = table([title, "bytes", "GiB", "checked by"], rows, right=(1, 2))
    budget = est.device_budget
    if budget is not None:
        left = budget.budget_bytes - activations
        lines.append(
            f"device {budget.device.name} ({budget.device.total_bytes:,} B): reserve "
            f"{fmt_gib(budget.reserve_bytes)} GiB, outside PyTorch "
            f"{fmt_gib(budget.non_torch_bytes)} GiB, budget for activations "
            f"{fmt_gib(budget.budget_bytes)} GiB, "
            + (f"{fmt_gib(left)} GiB left" if left >= 0 else f"{fmt_gib(-left)} GiB SHORT")
        )
    return lines


def render_whole_device(decision: Decision) -> list[str]:
    """The device's bytes on every rank, the busiest marked."""
    whole = decision.whole_device()
    from cpmem.admission.budget import BUDGET_DEVICE

    given = whole["device"] == BUDGET_DEVICE  # a given budget: nothing taken off it
    keys = (
        ("static", "static_bytes"),
        ("activations", "activations_bytes"),
        ("head", "head_bytes"),
        *(() if given else (("reserve (3%)", "reserve_bytes"),)),
        *(() if given else (("outside PyTorch", "non_torch_bytes"),)),
        ("free", "free_bytes"),
        ("budget" if given else "device total", "device_total_bytes"),
    )
    rows = [[name, f"{whole[key]:,}", fmt_gib(float(str(whole[key])))] for name, key in keys]
    title = "--budget-gib" if given else f"device {whole['device']}"
    lines = table([f"{title}, busiest rank", "bytes", "GiB"], rows, right=(1, 2))
    per_rank = whole["per_rank_bytes"]
    assert isinstance(per_rank, list)
    marks = [
        f"{r}: {fmt_gib(b)} GiB" + (" (busiest)" if r == whole["busiest_rank"] else "")
        for r, b in enumerate(per_rank)
    ]
    lines.append("  static + activations per rank: " + ", ".join(marks))
    kinds = step_kinds_line(decision)
    if kinds is not None:
        lines.append("  " + kinds)
    stage = decision.estimate.device_stage()
    if decision.estimate.stage_statics:
        lines.append(f"  pipeline stage {stage}: where static + activations are largest")
    return lines


def step_kinds_line(decision: Decision) -> str | None:
    """Which step kind the decision was taken on, with the chosen variant's bytes at each
    (whole-device bytes against a device or a budget, activations against the runtime's
    figures); None where none was recorded."""
    if not decision.step_kinds:
        return None
    kinds = ", ".join(f"{k} {fmt_gib(b)} GiB" for k, b in decision.step_kinds)
    where = "of its activations"
    if decision.device_budget is not None:
        from cpmem.admission.budget import BUDGET_DEVICE

        given = decision.device_budget.device.name == BUDGET_DEVICE
        where = "with its static memory" if given else "on the device"
    if len({b for _, b in decision.step_kinds}) == 1:
        return f"decided on the first and the steady step alike ({kinds})"
    return f"decided on the {decision.estimate.step_kind} step, the larger {where} ({kinds})"


def stages_label(settings: Mapping[str, Any]) -> str:
    pp = int(settings.get("pp", 1))
    if pp == 1:
        return ""
    vpp, m = int(settings.get("vpp", 1)), int(settings.get("microbatches", 1))
    chunks = f", {vpp} chunks a stage" if vpp > 1 else ""
    return f"  pp {pp}{chunks}, {counted(m, 'micro-batch')} (the busiest stage's figure and static)"


def render_capacity(found: Capacity) -> str:
    """One row per layout: the longest sequence, the pack, the budget and the static."""
    dev = found.device
    lines = [
        f"{found.model} on {dev.name} ({fmt_gib(dev.total_bytes)} GiB; "
        f"{fmt_gib(found.usable_bytes)} GiB after the 3% reserve and "
        f"{fmt_gib(found.non_torch_bytes)} GiB outside PyTorch)  policy={found.policy}  "
        f"figure={found.figure}",
        f"recompute {found.recompute}  head {found.head}  {found.adapter}"
        + stages_label(found.settings),
        "",
    ]
    rows = []
    marks: set[str] = set()
    for lay in found.layouts:
        note = []
        if lay.beyond_positions:
            note.append("*")
        if lay.single.guard_lowered or lay.pack.guard_lowered:
            note.append("!")
        marks.update(note)
        rows.append(
            [
                str(lay.tp),
                str(lay.cp),
                "on" if lay.sp else "off",
                fit_tokens(lay.single),
                fmt_gib(lay.required_at_longest),
                fit_pack(lay.pack),
                fmt_gib(lay.budget_bytes),
                fmt_gib(lay.static_bytes),
                " ".join(note),
            ]
        )
    headers = [
        "TP",
        "CP",
        "SP",
        "longest sequence",
        "GiB at it",
        f"pack ({found.pack} x length = tokens)",
        "budget GiB",
        "static GiB",
        "",
    ]
    if not marks:  # no notes: no empty column
        headers, rows = headers[:-1], [row[:-1] for row in rows]
    lines += table(headers, rows, right=(0, 1, 3, 4, 5, 6, 7), style="rule")
    lines += [
        "",
        f"budget: what the device leaves the step's {found.figure} figure on the busiest rank "
        "(its total less the 3% reserve, the memory outside PyTorch and the layout's static "
        "memory); the pack: equal sequences, no shared prefix",
        "every length is priced at the larger of its first and its steady step (static "
        "memory included); at the longest sequence: "
        + ", ".join(f"{lay.label} {lay.step_kind}" for lay in found.layouts),
    ]
    if "*" in marks:
        lines.append(
            f"*: longer than max_position_embeddings ({found.max_position_embeddings:,}) of "
            f"{found.model}, priced as --allow-long prices it"
        )
    if "!" in marks:
        lines.append(
            "!: a shorter length than the bisection's first answer did not fit (the figure is "
            "not monotone in the length there, e.g. the chunked planner under CP); the answer "
            "is the longest below it"
        )
    if any(lay.single.at_cap or lay.pack.at_cap for lay in found.layouts):
        lines.append(f">=: still fits at the search's cap ({found.cap:,} tokens per sequence)")
    for ex in found.excluded:
        lines.append(f"excluded {ex.tp}x{ex.cp}: {ex.reason}")
    return "\n".join(lines)


def fit_tokens(fit: Fit) -> str:
    if fit.length is None:
        return "-"
    return (">=" if fit.at_cap else "") + f"{fit.length:,}"


def fit_pack(fit: Fit) -> str:
    if fit.length is None:
        return "-"
    return f"{fit.sequences} x {fit_tokens(fit)} = {fit.tokens:,}"


def _gib_rows(components: Mapping[str, int], est: Estimate) -> list[str]:
    """Named byte counts as indented ``name  x GiB  checked by`` lines."""
    sources = est.provenance
    rows = [
        ["  " + k, f"{fmt_gib(v)} GiB", sources[k].label if k in sources else ""]
        for k, v in components.items()
    ]
    return table(None, rows, right=(1,))


def render_megatron_estimate(
    est: Estimate, step: Step, spread: Mapping[str, int], ignored: Sequence[str]
) -> str:
    """A Megatron-LM run on its answered rank: the step as read, its static memory and
    its peak over a steady step, each with its named terms."""
    settings, layout, pipe = step.settings, step.plan.layout, step.settings.pipeline
    stage = est.device_stage("forward_backward")
    runtime = settings.runtime
    world = settings.world_size
    moe = ""
    if step.geometry.is_moe:
        moe = (
            f", {step.geometry.num_experts} experts: EP {layout.ep} ETP {layout.etp}, "
            f"{settings.moe_routing} routing"
        )
    asked = " (auto: Transformer Engine's pick)" if runtime.backend_asked == "auto" else ""
    lines = [
        f"Megatron-LM run, {settings.training} training, {settings.rank} rank (stage {stage} "
        f"of {pipe.pp}) of {world}: TP {layout.tp} PP {pipe.pp} CP {layout.cp} DP {layout.dp}"
        + (f" VP {pipe.vpp}" if pipe.vpp > 1 else "")
        + moe
        + f", {counted(pipe.microbatches, 'micro-batch')}, "
        f"{settings.device.name if settings.device else 'no device'}, attention "
        f"{runtime.attention_backend}{asked}; policy {est.policy}",
    ]
    static = est.static if not est.stage_statics else est.stage_statics[stage]
    if static is not None:
        lines.append(f"static_bytes {fmt_gib(static.total)} GiB (allocated between steps)")
        lines += _gib_rows(static.components, est)
    figure = "forward" if est.forward_backward_bytes is None else "forward_backward"
    lines.append(
        f"peak_bytes {fmt_gib(est.peak_bytes)} GiB (the allocator's peak over a steady step: "
        f"static memory + {fmt_gib(est.stage_figure(stage, figure))} GiB of activations"
        + (f"; {est.pipeline_op}" if est.pipeline_op else "")
        + ")"
    )
    components = est.forward_backward_components or est.components
    lines += _gib_rows({k: v for k, v in components.items() if v}, est)
    if spread:
        shown = ", ".join(f"{k} {fmt_gib(v)} GiB" for k, v in spread.items())
        lines.append(f"backend spread (another container's Transformer Engine picks): {shown}")
    lines += render_basis(est)
    if est.ignored_options:
        lines.append("not priced by this policy: " + "; ".join(est.ignored_options))
    if ignored:
        lines.append(f"ignored (no memory cpmem prices): {' '.join(ignored)}")
    return "\n".join(lines)


def model_rows() -> list[dict[str, Any]]:
    """``cpmem models``: every built-in geometry, and whether it was measured."""
    return [
        {
            "name": g.name,
            "family": g.family or "measured preset",
            "measured": g.name in MEASURED,
            "aliases": list(g.aliases),
            "hidden": g.hidden,
            "layers": g.layers,
            "gdn_layers": g.gdn_layers,
            "moe_layers": g.moe_layers,
            "ffn": g.ffn,
            "heads": f"{g.q_heads}/{g.kv_groups}/{g.head_dim}",
            "fused_swiglu": g.fused_swiglu,
        }
        for g in PRESETS.values()
    ]


def render_models(rows: list[dict[str, Any]]) -> str:
    """The ``cpmem models`` table."""
    lines = [
        f"{'name':<18} {'hidden':>6} {'layers':>6} {'gdn':>4} {'moe':>4} {'ffn':>6}  "
        "heads(q/kv/d)  measured  aliases"
    ]
    for r in rows:
        lines.append(
            f"{r['name']:<18} {r['hidden']:>6} {r['layers']:>6} {r['gdn_layers']:>4} "
            f"{r['moe_layers']:>4} {r['ffn']:>6}  {r['heads']:<13}  "
            f"{'yes' if r['measured'] else 'no':<8}  {', '.join(r['aliases'])}"
        )
    return "\n".join(lines)
