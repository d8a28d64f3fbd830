"""Control estimates: a generated grid of requests whose estimates are pinned.

Controls are recorded outputs of the estimator, baselines and not measurements. The
golden cells only cover what was measured; an estimator change can also move paths
nobody measured (full recompute, no-grad, MoE, other TP sizes, lengths, request
shapes). ``golden/controls/controls.csv`` records every built-in policy's current
estimate (and forward+backward figure where the policy prices it), to the byte, for
a fixed grid of such requests, so the gate notices when a change moves one.
Re-recording is an explicit act (``cpmem gate --record-controls``): it always writes
a diff report (every changed control, old, new, ratio) to stdout and to
``golden/controls/last_diff.md``.

The grid is deterministic (no randomness): a product of the four preset models,
TP 1/2/4/8 (where the heads allow), CP 1 and 2 (at TP <= 2), lengths 64..32k, three
request shapes, and the recompute modes (none, selective, full, no-grad; MoE
variants for the MoE model).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import subprocess
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cpmem
from cpmem.api import estimate
from cpmem.errors import CpmemError, InputError
from cpmem.gate.controls_diff import ControlDiff, compare_controls
from cpmem.golden.files import CONTROLS_SUBDIR
from cpmem.golden.manifest import verify_manifest, write_manifest
from cpmem.model.presets import PRESETS
from cpmem.pricing.estimate import Estimate
from cpmem.pricing.inputs import MoeRouting

__all__ = [
    "CONTROLS_FILE",
    "CONTROL_COLUMNS",
    "CONTROL_POLICIES",
    "DIFF_FILE",
    "META_FILE",
    "ControlRequest",
    "ControlsError",
    "compute_controls",
    "control_grid",
    "controls_bytes",
    "load_controls",
    "record_controls",
]

CONTROLS_FILE = "controls.csv"
META_FILE = "controls.meta.json"
DIFF_FILE = "last_diff.md"
CONTROL_POLICIES = ("reference", "global", "tight")  # every built-in policy

TPS = (1, 2, 4, 8)
LENGTHS = (64, 2048, 32768)
SHARED_FRACTION = 0.3  # the prefix share the measured pairs used (e.g. 614 of 2048)
SHAPES = ("pair", "pair-shared", "independent")

CONTROL_COLUMNS = (
    "control_id",
    "model",
    "tp",
    "cp",
    "sp",
    "ep",
    "mode",
    "modules",
    "moe_routing",
    "shape",
    "lengths",
    "shared_prefix",
    "logical_tokens",
    "packed_tokens",
    "priced_tokens",
    "grad_segments",
    "policy",
    "estimate_bytes",
    "per_rank_bytes",
    "forward_backward_bytes",
)


class ControlsError(CpmemError, ValueError):
    """Controls are missing, malformed, or may not be written as asked."""


@dataclass(frozen=True)
class ControlRequest:
    """One control: a request and the settings it is priced under."""

    model: str
    tp: int
    cp: int
    ep: int
    mode: str
    modules: str  # "" when the mode takes none
    moe_routing: MoeRouting
    shape: str
    lengths: tuple[int, ...]
    shared_prefix: int

    @property
    def sp(self) -> bool:
        return self.tp > 1  # as Megatron runs it, and as cpmem.api defaults

    @property
    def control_id(self) -> str:
        lengths = "+".join(str(n) for n in self.lengths)
        return (
            f"ctl:{self.model}:tp{self.tp}:cp{self.cp}:ep{self.ep}:{self.mode}:"
            f"{self.modules or '-'}:{self.moe_routing}:{self.shape}:{lengths}/{self.shared_prefix}"
        )

    def price(self, policy: str = "reference") -> Estimate:
        """Through the planner-facing API, so planner changes move controls too."""
        return estimate(
            self.model,
            list(self.lengths),
            shared_prefix=self.shared_prefix,
            tp=self.tp,
            cp=self.cp,
            sp=self.sp,
            ep=self.ep,
            recompute=self.mode,
            modules=self.modules or None,
            policy=policy,
            moe_routing=self.moe_routing,
        )


def _shape_lengths(shape: str, n: int) -> tuple[tuple[int, ...], int]:
    if shape == "pair":
        return (n, n), 0
    if shape == "pair-shared":
        return (n, n), int(n * SHARED_FRACTION)
    # independent sequences of unequal lengths (no shared prefix)
    return (n, max(64, n // 2), max(64, n // 4)), 0


def _supports_tp(model: str, tp: int) -> bool:
    try:
        PRESETS[model].check_tp(tp)
    except InputError:
        return False
    return True


def control_grid() -> list[ControlRequest]:
    """The fixed grid, in a stable order. Changing it changes control ids (reported)."""
    out: list[ControlRequest] = []
    for name, geometry in PRESETS.items():
        moe = geometry.is_moe
        settings: list[tuple[str, str, MoeRouting]] = [
            ("full", "", "concentrated"),
            ("no-grad", "", "concentrated"),
            ("selective", "core_attn", "concentrated"),
            ("none", "", "concentrated"),
        ]
        if moe:
            settings += [
                ("selective", "core_attn+moe", "concentrated"),
                ("selective", "core_attn", "balanced"),
            ]
        for tp in TPS:
            if not _supports_tp(name, tp):
                continue
            ep = tp if moe else 1  # the measured MoE cells ran EP = TP
            for cp in (1, 2):
                if cp == 2 and tp > 2:
                    continue
                for mode, modules, routing in settings:
                    for shape in SHAPES:
                        for n in LENGTHS:
                            lengths, prefix = _shape_lengths(shape, n)
                            out.append(
                                ControlRequest(
                                    name, tp, cp, ep, mode, modules, routing, shape, lengths, prefix
                                )
                            )
    return out


def _row(req: ControlRequest, est: Estimate, policy: str) -> dict[str, str]:
    return {
        "control_id": req.control_id,
        "model": req.model,
        "tp": str(req.tp),
        "cp": str(req.cp),
        "sp": str(req.sp),
        "ep": str(req.ep),
        "mode": req.mode,
        "modules": req.modules,
        "moe_routing": req.moe_routing,
        "shape": req.shape,
        "lengths": "+".join(str(n) for n in req.lengths),
        "shared_prefix": str(req.shared_prefix),
        "logical_tokens": str(est.logical_tokens),
        "packed_tokens": str(est.packed_tokens),
        "priced_tokens": str(est.busiest_tokens),
        "grad_segments": str(est.grad_segments),
        "policy": policy,
        "estimate_bytes": str(est.estimate_bytes),
        "per_rank_bytes": "+".join(str(b) for b in est.per_rank_bytes),
        "forward_backward_bytes": str(est.forward_backward_bytes or ""),
    }


def compute_controls(policies: Iterable[str] = CONTROL_POLICIES) -> list[dict[str, str]]:
    """Price every control with each policy; rows in ``CONTROL_COLUMNS`` order,
    control by control, the policies in the order given."""
    names = list(policies)
    return [_row(req, req.price(p), p) for req in control_grid() for p in names]


def policy_rows(rows: Iterable[Mapping[str, str]], policy: str) -> list[dict[str, str]]:
    """The recorded rows of one policy."""
    return [dict(r) for r in rows if r.get("policy") == policy]


def controls_bytes(rows: Iterable[Mapping[str, str]]) -> bytes:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CONTROL_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: r[k] for k in CONTROL_COLUMNS})
    return buf.getvalue().encode("utf-8")


def controls_dir(golden_dir: Path) -> Path:
    return golden_dir / CONTROLS_SUBDIR


def load_controls(golden_dir: Path, *, any_header: bool = False) -> list[dict[str, str]]:
    """The recorded controls; raises ControlsError if missing or malformed.

    ``any_header`` reads an older recording (other columns) for the diff of a
    re-recording; columns it lacks read as empty."""
    path = controls_dir(golden_dir) / CONTROLS_FILE
    if not path.is_file():
        raise ControlsError(f"{path}: missing; record them with `cpmem gate --record-controls`")
    with path.open(encoding="utf-8", newline="") as fh:
        reader = csv.DictReader(fh)
        if any_header:
            return [{k: r.get(k) or "" for k in CONTROL_COLUMNS} for r in reader]
        if tuple(reader.fieldnames or ()) != CONTROL_COLUMNS:
            raise ControlsError(
                f"{path}: header {reader.fieldnames} is not {list(CONTROL_COLUMNS)}"
            )
        return list(reader)


def load_meta(golden_dir: Path) -> dict[str, Any]:
    path = controls_dir(golden_dir) / META_FILE
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def git_revision() -> tuple[str, bool | None]:
    """The checkout's commit and whether it had local changes ("unknown" outside git)."""
    root = Path(__file__).resolve().parents[2]
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown", None
    return rev, bool(status.strip())


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def record_controls(golden_dir: Path, *, overwrite: bool) -> ControlDiff:
    """Recompute the controls and write them, the metadata, the diff and the manifest.

    ``overwrite`` must be True when controls already exist (the CLI flag
    ``--record-controls`` sets it): nothing overwrites recorded controls by
    accident. The manifest must be clean outside ``controls/`` first, so that
    regenerating it can only bless the controls, never a tampered measurement.
    When the values are unchanged, controls.csv and its metadata keep their bytes
    (the revision that first produced them stays recorded); the diff is still
    written.
    """
    target = controls_dir(golden_dir) / CONTROLS_FILE
    if target.exists() and not overwrite:
        raise ControlsError(f"{target} exists; re-record only with `cpmem gate --record-controls`")
    prefix = f"{CONTROLS_SUBDIR}/"
    other = [p for p in verify_manifest(golden_dir) if not p.startswith(prefix)]
    if other:
        raise ControlsError(
            "the golden manifest has problems outside controls/; refusing to regenerate "
            "it over them:\n  " + "\n  ".join(other)
        )
    new_rows = compute_controls()
    old_rows = load_controls(golden_dir, any_header=True) if target.exists() else []
    diff = compare_controls(old_rows, new_rows)
    data = controls_bytes(new_rows)
    if not target.exists() or target.read_bytes() != data:
        rev, dirty = git_revision()
        meta = {
            "policies": list(CONTROL_POLICIES),
            "cpmem_version": cpmem.__version__,
            "git_revision": rev,
            "git_dirty": dirty,
            "controls": len(new_rows),
            "csv_sha256": hashlib.sha256(data).hexdigest(),
            "generated_by": "cpmem gate --record-controls",
            "grid": {
                "models": list(PRESETS),
                "tp": list(TPS),
                "lengths": list(LENGTHS),
                "shapes": list(SHAPES),
                "shared_fraction": SHARED_FRACTION,
            },
        }
        _atomic_write(target, data)
        meta_bytes = (json.dumps(meta, indent=2, sort_keys=True) + "\n").encode("utf-8")
        _atomic_write(controls_dir(golden_dir) / META_FILE, meta_bytes)
    meta_now = load_meta(golden_dir)
    header = (
        f"policies {', '.join(CONTROL_POLICIES)}, values from cpmem "
        f"{meta_now.get('cpmem_version', '?')} "
        f"at {meta_now.get('git_revision', '?')}"
    )
    _atomic_write(controls_dir(golden_dir) / DIFF_FILE, diff.markdown(header).encode("utf-8"))
    write_manifest(golden_dir)
    return diff
