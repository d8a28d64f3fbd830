"""``cpmem admit``'s human answer: the decision, the variants it considered, and what it
was decided against (``cpmem.admission.budget``): which budget, and which one decided
where a budget and a device were both given. Its JSON is ``Decision.to_dict``."""

from __future__ import annotations

from cpmem.admission.admission import Decision
from cpmem.plan.planners import EXECUTABLE
from cpmem.reports.cli_render import render_whole_device, step_kinds_line
from cpmem.reports.tables import table
from cpmem.units import fmt_gib

WHOLE = "static memory and activations together"


def budget_line(decision: Decision) -> str:
    """What the decision was taken against, and which budget decided."""
    budget = decision.budget
    assert budget is not None
    if budget.decided_by == "runtime":
        return (
            "against the runtime's figures: what its process has left after its static "
            "memory (free + reusable reserved - 3% of the total), for the activations alone"
        )
    usable = dict(budget.usable)
    whole = decision.device_budget
    static = "" if whole is None else f" (static {fmt_gib(whole.static.total)} GiB of them)"
    device = budget.device.name if budget.device is not None else ""
    of_device = (
        f"the device {device}'s {fmt_gib(usable.get('device'))} GiB (its total less the 3% "
        "reserve and the memory outside PyTorch)"
    )
    of_budget = f"--budget-gib {fmt_gib(usable.get('budget'))} GiB"
    if len(usable) == 1:
        where = of_budget if budget.decided_by == "budget" else of_device
        return f"against {where}: usable for {WHOLE}{static}"
    decided, other = (
        (of_budget, of_device) if budget.decided_by == "budget" else (of_device, of_budget)
    )
    return f"decided by {decided}, the smaller beside {other}: usable for {WHOLE}{static}"


def render_admit(decision: Decision) -> list[str]:
    """The decision's lines: the action and its bytes, the variants considered, a split or
    a suggestion, the budget, and the whole device's breakdown where it was weighed."""
    chosen = decision.planner_of(decision.variant) or ""
    lines = [
        f"{decision.action.upper()}: required {fmt_gib(decision.required_bytes)} GiB "
        f"({decision.variant}, planner {chosen or None}), "
        f"usable {fmt_gib(decision.available_bytes)} GiB"
    ]
    if decision.action == "fit" and decision.variant.startswith("memory-minimal"):
        lines.append(
            f"  fits only if the runtime lays the request out as {chosen} "
            f"({EXECUTABLE.get(chosen, chosen)}), not as {decision.planner_of('cost-optimal')}"
        )
    considered = []
    for variant, required in decision.considered:
        planner = decision.planner_of(variant) or "-"
        runs = EXECUTABLE.get(planner, "")
        considered.append(
            [
                "  considered",
                variant,
                f"{fmt_gib(required)} GiB",
                f"planner {planner}" + (f": {runs}" if runs else ""),
            ]
        )
    lines += table(None, considered, right=(2,))
    if any(v.startswith("split-") for v, _ in decision.considered):
        lines.append(
            "  split-N: the request run as N sequential sub-forwards (its sequences "
            "divided N ways, a shared prefix repeated where needed), every part's "
            "activations kept until backward"
        )
    if decision.action == "split":
        lines.append(f"  split into {decision.parts} sub-forwards")
    if decision.suggestion:
        lines.append(f"  suggestion: {decision.suggestion}")
    lines.append("  " + budget_line(decision))
    if decision.device_budget is not None:
        lines += ["  " + line for line in render_whole_device(decision)]
    else:
        kinds = step_kinds_line(decision)
        if kinds is not None:
            lines.append("  " + kinds)
    return lines
