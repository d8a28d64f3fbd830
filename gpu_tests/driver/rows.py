"""Rank samples to one golden-schema row: aggregation, formatting, the rows.csv file.

Why: rows must follow golden/schema.json exactly (tests check the columns agree) and
aggregate the way the sources defined their figures (maxima over every rank and both
repetitions), so that ``cpmem.golden`` can append them unchanged.

A trainer cell (a head, or adapters other than rank-1 without dropout) is not the
harness every golden row is priced as, and the schema has no free-text column to say so.
Its settings go into one sidecar column, ``trainer_step`` (after the golden columns),
of the rows.csv files that hold such a row: the driver's own for that cell and the
device scripts' merged one (trainer_check.sh writes it for every row, harness rows
included). ``cpmem.golden.importer.append_rows`` refuses a row with an unknown column, so
a trainer row cannot enter golden/ as if it were a harness row. The cell id also names
the step (``:head-...``, ``:lora-r...``) where it is not the harness's; harness rows and
ids are exactly as before.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cpmem.model.geometry import ModelGeometry
from cpmem.plan.plan import Plan

from .provenance import CAMPAIGN, SOURCE_PATH, SOURCE_REPOSITORY
from .spec import CellSpec, recorded_model_name

PHASE = "native"
APPENDED_BY = "cpmem golden append"

# The golden schema's columns, in order (golden/schema.json; tests check they agree).
GOLDEN_COLUMNS: tuple[str, ...] = (
    "cell_id", "source_file", "source_row", "source_repository", "source_path",
    "source_commit", "campaign", "phase", "estimator_source_sha", "driver_sha256", "model",
    "layers", "gdn_layers", "tp", "cp", "ep", "etp", "sequence_parallel", "compiled",
    "concentrated_routing", "mode", "modules", "lengths", "shared_prefix", "logical_tokens",
    "packed_tokens", "retained_tokens", "grad_segments", "selected_max_depth",
    "memory_minimal", "measured_rank_samples", "refused_rank_samples",
    "recorded_estimate_bytes", "recorded_old_estimate_bytes", "available_bytes",
    "forward_peak_bytes", "first_forward_peak_bytes", "repeat_forward_peak_bytes",
    "retained_max_bytes", "forward_backward_peak_bytes", "baseline_min_bytes",
    "baseline_max_bytes", "finite", "recorded_covers_forward", "unit", "device", "dtype",
    "imported_by",
)  # fmt: skip

BYTE_COLUMNS: tuple[str, ...] = tuple(c for c in GOLDEN_COLUMNS if c.endswith("_bytes"))
# The sidecar column of trainer cells (module docstring); never a golden column.
TRAINER_COLUMN = "trainer_step"


def _max(values: Sequence[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return max(known) if len(known) == len(values) and known else None


def _min(values: Sequence[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return min(known) if len(known) == len(values) and known else None


def aggregate(ranks: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Maxima over every rank and both repetitions, as the sources define them."""
    samples = [s for r in ranks for s in r["samples"]]
    first = [s for s in samples if s["repetition"] == 0]
    repeat = [s for s in samples if s["repetition"] > 0]
    measured = all(s["forward_peak_bytes"] is not None for s in samples)
    finite = all(
        s["loss_finite"]
        and s["adapter_grads_finite"]
        and s["adapter_grads_present"] == s["adapter_params"]
        for s in samples
    )
    return {
        "measured": measured,
        "rank_samples": len(samples),
        "forward_peak_bytes": _max([s["forward_peak_bytes"] for s in samples]),
        "first_forward_peak_bytes": _max([s["forward_peak_bytes"] for s in first]),
        "repeat_forward_peak_bytes": _max([s["forward_peak_bytes"] for s in repeat]),
        "retained_max_bytes": _max([s["retained_bytes"] for s in samples]),
        "forward_backward_peak_bytes": _max([s["forward_backward_peak_bytes"] for s in samples]),
        "baseline_min_bytes": _min([s["baseline_bytes"] for s in samples]),
        "baseline_max_bytes": _max([s["baseline_bytes"] for s in samples]),
        "available_bytes": _min([s["available_bytes"] for s in samples]),
        "finite": finite,
        "gdn_fallback_saved_bytes": _max(
            [s.get("gdn_fallback_saved_bytes") for s in samples]
        ) if any(s.get("gdn_fallback_saved_bytes") is not None for s in samples) else None,
        # per rank-sample peak minus that sample's GDN fallback excess, then the maximum:
        # what the peaks would be with fla's kernel (summary only, not in the row)
        "forward_peak_less_gdn_fallback_bytes": _max(
            [_less_fallback(s, "forward_peak_bytes") for s in samples]
        ),
        "forward_backward_peak_less_gdn_fallback_bytes": _max(
            [_less_fallback(s, "forward_backward_peak_bytes") for s in samples]
        ),
    }  # fmt: skip


def _less_fallback(sample: dict[str, Any], key: str) -> int | None:
    peak = sample[key]
    return None if peak is None else peak - (sample.get("gdn_fallback_saved_bytes") or 0)


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "True" if value else "False"
    return str(value)


def cell_tag(spec: CellSpec, geometry: ModelGeometry) -> str:
    """A readable id fragment: model, layers, layout, recompute, request."""
    short = recorded_model_name(spec, geometry).split("/")[-1].lower()
    layout = f"tp{spec.tp}cp{spec.cp}{'sp' if spec.sp and spec.tp > 1 else ''}"
    rc = spec.recompute + (f"-{spec.modules}" if spec.modules else "")
    req = "+".join(str(n) for n in spec.lengths) + f"p{spec.shared_prefix}"
    tag = f"{short}-L{geometry.layers}:{layout}:{rc}:{req}:{spec.engine}"
    if spec.head != "hidden":
        tag += f":head-{spec.head.replace(':', '')}" + (f"-{spec.head_ce}" if spec.head_ce else "")
    if not spec.harness_adapters:
        tag += f":lora-r{spec.lora_rank}-p{spec.lora_dropout:g}"
    return "".join(c if c.isalnum() or c in "_.+:/-" else "-" for c in tag)


def trainer_step(spec: CellSpec) -> str:
    """The sidecar ``trainer_step`` text: head, its cross entropy, LoRA rank and dropout,
    e.g. ``head=logits;ce=megatron;lora_rank=1;lora_dropout=0`` (the harness:
    ``head=hidden;ce=;lora_rank=1;lora_dropout=0``)."""
    return (
        f"head={spec.head};ce={spec.head_ce};lora_rank={spec.lora_rank};"
        f"lora_dropout={spec.lora_dropout:g}"
    )


HARNESS_STEP = "head=hidden;ce=;lora_rank=1;lora_dropout=0"
"""``trainer_step`` of the harness (a row written without the sidecar column)."""


def build_row(
    spec: CellSpec,
    geometry: ModelGeometry,
    plan: Plan,
    estimate_bytes: int,
    agg: dict[str, Any],
    prov: dict[str, Any],
    device_name: str,
    run_id: str,
) -> dict[str, str]:
    """One golden-schema row. Peaks only where measured on CUDA; nothing is filled in."""
    measured = agg["measured"]
    peak = agg["forward_peak_bytes"]
    commit = prov["git_revision"] or ""
    row: dict[str, Any] = {
        "cell_id": f"native:{cell_tag(spec, geometry)}:{run_id}",
        "source_file": f"native-{run_id}.csv",
        "source_row": 1,
        "source_repository": SOURCE_REPOSITORY,
        "source_path": SOURCE_PATH,
        "source_commit": commit,
        "campaign": CAMPAIGN,
        "phase": PHASE,
        "estimator_source_sha": commit,
        "driver_sha256": prov["driver_sha256"],
        "model": recorded_model_name(spec, geometry),
        "layers": geometry.layers,
        "gdn_layers": geometry.gdn_layers,
        "tp": spec.tp,
        "cp": spec.cp,
        "ep": 1,
        "etp": 1,
        "sequence_parallel": spec.sp and spec.tp > 1,
        "compiled": False,
        "concentrated_routing": None,
        "mode": spec.recompute,
        "modules": spec.modules,
        "lengths": "+".join(str(n) for n in spec.lengths),
        "shared_prefix": spec.shared_prefix,
        "logical_tokens": plan.logical_tokens,
        "packed_tokens": plan.packed_tokens,
        "retained_tokens": plan.busiest_tokens,
        "grad_segments": plan.grad_segments,
        "selected_max_depth": None,
        "memory_minimal": None,
        "measured_rank_samples": agg["rank_samples"] if measured else 0,
        "refused_rank_samples": 0,
        "recorded_estimate_bytes": estimate_bytes,
        "recorded_old_estimate_bytes": None,
        "available_bytes": agg["available_bytes"],
        "forward_peak_bytes": peak,
        "first_forward_peak_bytes": agg["first_forward_peak_bytes"],
        "repeat_forward_peak_bytes": agg["repeat_forward_peak_bytes"],
        "retained_max_bytes": agg["retained_max_bytes"],
        "forward_backward_peak_bytes": agg["forward_backward_peak_bytes"],
        "baseline_min_bytes": agg["baseline_min_bytes"],
        "baseline_max_bytes": agg["baseline_max_bytes"],
        "finite": agg["finite"],
        "recorded_covers_forward": (estimate_bytes >= peak) if peak is not None else None,
        "unit": "bytes",
        "device": device_name,
        "dtype": "bf16",
        "imported_by": APPENDED_BY,
    }
    assert tuple(row) == GOLDEN_COLUMNS
    out = {k: _text(v) for k, v in row.items()}
    if not spec.is_harness:
        out[TRAINER_COLUMN] = trainer_step(spec)
    return out


def write_rows(path: Path, rows: Sequence[dict[str, str]]) -> None:
    """The golden columns, plus the sidecar ``trainer_step`` where any row has it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    columns = list(GOLDEN_COLUMNS)
    if any(TRAINER_COLUMN in r for r in rows):
        columns.append(TRAINER_COLUMN)
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns, lineterminator="\n", restval="")
        writer.writeheader()
        writer.writerows(rows)


def merge_cell_rows(cells_dir: Path, out: Path, trainer: bool = False) -> int:
    """The device scripts' one rows.csv: every ``<cell>/rows.csv`` under ``cells_dir``
    (one driver run each) in cell-name order; nothing written when there are none.
    With ``trainer`` (trainer_check.sh) every row gets the sidecar ``trainer_step``
    column (a row without one is a harness row: HARNESS_STEP). Returns the number of
    rows."""
    rows: list[dict[str, str]] = []
    for f in sorted(cells_dir.glob("*/rows.csv")):
        with f.open(newline="", encoding="utf-8") as fh:
            cell_rows = list(csv.DictReader(fh))
        if trainer:
            for r in cell_rows:
                r[TRAINER_COLUMN] = r.get(TRAINER_COLUMN) or HARNESS_STEP
        rows.extend(cell_rows)
    if rows:
        write_rows(out, rows)
    return len(rows)
