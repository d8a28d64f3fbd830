"""Source normalisation: the published measurement files (listed with their provenance
in the sources README) turned into cells rows, column by column, never guessed."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cpmem.golden.files import IMPORTED_BY, SOURCES_SUBDIR, GoldenDataError, read_csv
from cpmem.golden.schema import BOOLEANS, COLUMN_NAMES, ROW_SCHEMA, TP_RATIO_SCHEMA
from cpmem.golden.validation import check, raw_frame, validate_frame

SOURCES_README = "README.md"

# Layer counts (total, Gated DeltaNet) of the models the CP file names, from the
# sources README geometry table ("Qwen/Qwen3.8-27B" has the Qwen3.5-27B geometry).
# The CP file does not record them; the TP file does, and agrees.
_README_LAYERS: dict[str, tuple[int, int]] = {
    "Qwen/Qwen3.8-27B": (64, 48),
    "Qwen/Qwen3.5-4B": (32, 24),
    "Qwen/Qwen3-1.7B": (28, 0),
    "Qwen/Qwen3.5-35B-A3B": (40, 30),
}

# How the sources README says the cells were measured (constant for both files).
_DEVICE = "NVIDIA H200"
_DTYPE = "bf16"
_UNIT = "bytes"

_CP_HEADER: tuple[str, ...] = (
    "case", "source_sha", "driver_sha256", "model", "mode", "modules", "compiled", "tp",
    "cp", "lengths", "shared_prefix", "packed_tokens", "retained_tokens", "grad_segments",
    "measured_samples", "refused_samples", "old_estimate_bytes", "estimate_bytes",
    "forward_peak_bytes", "forward_backward_peak_bytes", "finite", "available_bytes_min",
)  # fmt: skip

_TP_HEADER: tuple[str, ...] = (
    "phase", "source_sha", "driver_sha256", "model", "layers", "gdn_layers", "tp", "ep",
    "etp", "sequence_parallel", "compiled", "concentrated_routing", "mode", "modules",
    "lengths", "shared_prefix", "logical_tokens", "packed_tokens", "grad_segment_count",
    "selected_max_depth", "memory_minimal", "estimate_bytes", "available_min_bytes",
    "measured_rank_samples", "refused_rank_samples", "forward_peak_max_bytes",
    "first_forward_peak_max_bytes", "repeat_forward_peak_max_bytes", "retained_max_bytes",
    "forward_backward_peak_max_bytes", "baseline_min_bytes", "baseline_max_bytes",
    "finite_loss_all", "finite_gradients_all", "estimate_covers_forward_all",
    "min_estimate_to_forward_ratio",
)  # fmt: skip

# Source column -> cells column, copied verbatim. Columns not listed are either
# combined (TP finite_*), looked up (CP layers), constant, or derived and dropped:
# TP min_estimate_to_forward_ratio = estimate_bytes / forward_peak_max_bytes (held to
# that definition by schema.TpRatioModel when the file is read).
CP_COPY: dict[str, str] = {
    "source_sha": "estimator_source_sha",
    "driver_sha256": "driver_sha256",
    "model": "model",
    "mode": "mode",
    "modules": "modules",
    "compiled": "compiled",
    "tp": "tp",
    "cp": "cp",
    "lengths": "lengths",
    "shared_prefix": "shared_prefix",
    "packed_tokens": "packed_tokens",
    "retained_tokens": "retained_tokens",
    "grad_segments": "grad_segments",
    "measured_samples": "measured_rank_samples",
    "refused_samples": "refused_rank_samples",
    "old_estimate_bytes": "recorded_old_estimate_bytes",
    "estimate_bytes": "recorded_estimate_bytes",
    "forward_peak_bytes": "forward_peak_bytes",
    "forward_backward_peak_bytes": "forward_backward_peak_bytes",
    "finite": "finite",
    "available_bytes_min": "available_bytes",
}

TP_COPY: dict[str, str] = {
    "phase": "phase",
    "source_sha": "estimator_source_sha",
    "driver_sha256": "driver_sha256",
    "model": "model",
    "layers": "layers",
    "gdn_layers": "gdn_layers",
    "tp": "tp",
    "ep": "ep",
    "etp": "etp",
    "sequence_parallel": "sequence_parallel",
    "compiled": "compiled",
    "concentrated_routing": "concentrated_routing",
    "mode": "mode",
    "modules": "modules",
    "lengths": "lengths",
    "shared_prefix": "shared_prefix",
    "logical_tokens": "logical_tokens",
    "packed_tokens": "packed_tokens",
    "grad_segment_count": "grad_segments",
    "selected_max_depth": "selected_max_depth",
    "memory_minimal": "memory_minimal",
    "estimate_bytes": "recorded_estimate_bytes",
    "available_min_bytes": "available_bytes",
    "measured_rank_samples": "measured_rank_samples",
    "refused_rank_samples": "refused_rank_samples",
    "forward_peak_max_bytes": "forward_peak_bytes",
    "first_forward_peak_max_bytes": "first_forward_peak_bytes",
    "repeat_forward_peak_max_bytes": "repeat_forward_peak_bytes",
    "retained_max_bytes": "retained_max_bytes",
    "forward_backward_peak_max_bytes": "forward_backward_peak_bytes",
    "baseline_min_bytes": "baseline_min_bytes",
    "baseline_max_bytes": "baseline_max_bytes",
    "estimate_covers_forward_all": "recorded_covers_forward",
}


@dataclass(frozen=True)
class SourceInfo:
    """Provenance of one source file, from the sources README table."""

    file: str
    repository: str
    path: str
    commit: str


_README_ROW = re.compile(
    r"^\|\s*`(?P<file>[^`]+)`\s*\|\s*(?P<repo>[\w.-]+/[\w.-]+)\s+`(?P<path>[^`]+)`\s*@\s*"
    r"(?P<commit>[0-9a-f]{40})\s*\|"
)


def read_provenance(sources_dir: Path) -> list[SourceInfo]:
    """Parse the (file, repository, path, commit) table of the sources README."""
    readme = sources_dir / SOURCES_README
    try:
        text = readme.read_text(encoding="utf-8")
    except OSError as exc:
        raise GoldenDataError(
            f"cannot read the provenance README: {exc}", file=str(readme)
        ) from exc
    infos = [
        SourceInfo(m["file"], m["repo"], m["path"], m["commit"])
        for line in text.splitlines()
        if (m := _README_ROW.match(line.strip()))
    ]
    if not infos:
        raise GoldenDataError(
            "no '| `file` | repo `path` @ <40-hex commit> |' provenance rows", file=str(readme)
        )
    return infos


def _model_short(model: str) -> str:
    return model.rsplit("/", 1)[-1]


def _normalize_cp(raw: Mapping[str, str], info: SourceInfo, row_no: int) -> dict[str, str]:
    where = f"{SOURCES_SUBDIR}/{info.file}"
    model = raw["model"]
    if model not in _README_LAYERS:
        raise GoldenDataError(
            "model has no layer counts in the sources README geometry table",
            file=where,
            row=row_no,
            column="model",
            value=model,
        )
    layers, gdn = _README_LAYERS[model]
    out = {dst: raw[src] for src, dst in CP_COPY.items()}
    out.update(
        cell_id=f"cp:{raw['case']}:{raw['lengths']}",
        campaign="cp",
        phase="final",
        layers=str(layers),
        gdn_layers=str(gdn),
        # The sources README: TP1, CP2, eager; no expert parallelism, no SP.
        ep="1",
        etp="1",
        sequence_parallel="False",
        concentrated_routing="",
        logical_tokens=_sum_lengths(raw["lengths"], where, row_no),
        selected_max_depth="",
        memory_minimal="",
        first_forward_peak_bytes="",
        repeat_forward_peak_bytes="",
        retained_max_bytes="",
        baseline_min_bytes="",
        baseline_max_bytes="",
        recorded_covers_forward="",
    )
    return out


def _normalize_tp(raw: Mapping[str, str], info: SourceInfo, row_no: int) -> dict[str, str]:
    where = f"{SOURCES_SUBDIR}/{info.file}"
    out = {dst: raw[src] for src, dst in TP_COPY.items()}
    loss, grads = raw["finite_loss_all"], raw["finite_gradients_all"]
    for col, val in (("finite_loss_all", loss), ("finite_gradients_all", grads)):
        if val not in ("", *BOOLEANS):
            raise GoldenDataError(
                "must be True, False or empty", file=where, row=row_no, column=col, value=val
            )
    if "False" in (loss, grads):
        finite = "False"
    elif loss == grads == "True":
        finite = "True"
    else:
        finite = ""  # not recorded (a refused cell never ran)
    compiled = "compiled" if raw["compiled"] == "True" else "eager"
    out.update(
        cell_id=(
            f"tp:{raw['phase']}:{_model_short(raw['model'])}:tp{raw['tp']}:{raw['mode']}:"
            f"{raw['modules'] or '-'}:{compiled}:{raw['lengths']}"
        ),
        campaign="tp",
        cp="1",  # the sources README: DP=CP=PP=1
        retained_tokens="",
        recorded_old_estimate_bytes="",
        finite=finite,
    )
    return out


def _sum_lengths(lengths: str, where: str, row_no: int) -> str:
    try:
        return str(sum(int(x) for x in lengths.split("+")))
    except ValueError:
        raise GoldenDataError(
            "lengths must be '+'-joined integers",
            file=where,
            row=row_no,
            column="lengths",
            value=lengths,
        ) from None


_NORMALIZED: dict[str, list[dict[str, str]]] = {}
"""Rows already normalised, by the sha256 of the sources directory's files (the last few)."""


def normalize_sources(sources_dir: Path | str) -> list[dict[str, str]]:
    """Normalise every file of the sources README table into cells rows (in table order).

    The file layout is recognised by its header (the CP or the TP campaign file);
    an unknown header is an error, never a guess. The rows are a function of the
    directory's bytes alone, so a directory whose files hash as one read before gives
    that read's rows again (copies): the gate checks the sources on every run, and a
    process runs it many times (the suite's tests), each a few tenths of a second.
    """
    sources_dir = Path(sources_dir)
    if not sources_dir.is_dir():  # refused by the reading itself, naming what is missing
        return _normalize_sources(sources_dir)
    digest = hashlib.sha256()
    for path in sorted(p for p in sources_dir.rglob("*") if p.is_file()):
        data = path.read_bytes()
        digest.update(f"{path.relative_to(sources_dir).as_posix()}\0{len(data)}\0".encode())
        digest.update(data)
    key = digest.hexdigest()
    if key not in _NORMALIZED:
        while len(_NORMALIZED) >= 4:
            del _NORMALIZED[next(iter(_NORMALIZED))]
        _NORMALIZED[key] = _normalize_sources(sources_dir)
    return [dict(row) for row in _NORMALIZED[key]]


def _normalize_sources(sources_dir: Path) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    for info in read_provenance(sources_dir):
        path = sources_dir / info.file
        where = f"{SOURCES_SUBDIR}/{info.file}"
        header, raws = read_csv(path, where)
        if tuple(header) == _CP_HEADER:
            normalize = _normalize_cp
        elif tuple(header) == _TP_HEADER:
            normalize = _normalize_tp
        else:
            raise GoldenDataError(
                f"header matches neither the CP nor the TP campaign layout: {header}", file=where
            )
        if normalize is _normalize_tp:  # its derived ratio column must match its definition
            text = raw_frame(raws, header, range(1, len(raws) + 1))
            check(TP_RATIO_SCHEMA, text, text, where)
        rows: list[dict[str, str]] = []
        for i, raw in enumerate(raws, start=1):
            row = normalize(raw, info, i)
            row.update(
                source_file=info.file,
                source_row=str(i),
                source_repository=info.repository,
                source_path=info.path,
                source_commit=info.commit,
                unit=_UNIT,
                device=_DEVICE,
                dtype=_DTYPE,
                imported_by=IMPORTED_BY,
            )
            rows.append({n: row[n] for n in COLUMN_NAMES})
        _disambiguate(rows)
        if rows:
            validate_frame(rows, where=where, schema=ROW_SCHEMA)
        out.extend(rows)
    return out


def _disambiguate(rows: list[dict[str, str]]) -> None:
    """Make ids unique within one file: a colliding id gets ':' + estimator sha (9 hex).

    Only ids that collide change, so ids of a fixed source file are stable.
    """
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["cell_id"]] = counts.get(row["cell_id"], 0) + 1
    for row in rows:
        if counts[row["cell_id"]] > 1:
            row["cell_id"] = f"{row['cell_id']}:{row['estimator_source_sha'][:9]}"
    seen: dict[str, int] = {}
    for row in rows:
        cid = row["cell_id"]
        if cid in seen:
            raise GoldenDataError(
                f"cell id not unique even with the estimator sha (rows {seen[cid]} and "
                f"{row['source_row']})",
                file=row["source_file"],
                column="cell_id",
                value=cid,
            )
        seen[cid] = int(row["source_row"])
