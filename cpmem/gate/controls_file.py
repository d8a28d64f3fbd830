"""The recorded controls on disk: ``golden/controls/controls.csv``, its metadata, the
diff of the last re-recording, and the re-recording itself (``cpmem gate
--record-controls``). What is recorded is ``cpmem.gate.controls``."""

from __future__ import annotations

import csv
import hashlib
import json
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import cpmem
from cpmem.errors import CpmemError
from cpmem.gate.controls import (
    CONTROL_COLUMNS,
    CONTROL_MODELS,
    CONTROL_POLICIES,
    LENGTHS,
    SHAPES,
    SHARED_FRACTION,
    TPS,
    compute_controls,
)
from cpmem.gate.controls_diff import ControlDiff, compare_controls
from cpmem.golden.files import CONTROLS_SUBDIR, atomic_write, csv_bytes
from cpmem.golden.manifest import verify_manifest, write_manifest

CONTROLS_FILE = "controls.csv"
META_FILE = "controls.meta.json"
DIFF_FILE = "last_diff.md"


class ControlsError(CpmemError, ValueError):
    """Controls are missing, malformed, or may not be written as asked."""


def policy_rows(rows: Iterable[Mapping[str, str]], policy: str) -> list[dict[str, str]]:
    """The recorded rows of one policy."""
    return [dict(r) for r in rows if r.get("policy") == policy]


def controls_bytes(rows: Iterable[Mapping[str, str]]) -> bytes:
    return csv_bytes(rows, CONTROL_COLUMNS)


def controls_dir(golden_dir: Path) -> Path:
    return golden_dir / CONTROLS_SUBDIR


def load_controls(golden_dir: Path, *, any_header: bool = False) -> list[dict[str, str]]:
    """The recorded controls; raises ControlsError if missing or malformed.

    ``any_header`` reads an older recording (other columns) for the diff of a
    re-recording: each row has the columns of ``CONTROL_COLUMNS`` the file has."""
    path = controls_dir(golden_dir) / CONTROLS_FILE
    if not path.is_file():
        raise ControlsError(f"{path}: missing; record them with `cpmem gate --record-controls`")
    with path.open(encoding="utf-8", newline="") as fh:
        reader = csv.DictReader(fh)
        if any_header:
            return [{k: r[k] for k in CONTROL_COLUMNS if k in r} for r in reader]
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
    new_rows = compute_controls(golden_dir)
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
                "models": list(CONTROL_MODELS),
                "tp": list(TPS),
                "lengths": list(LENGTHS),
                "shapes": list(SHAPES),
                "shared_fraction": SHARED_FRACTION,
            },
        }
        atomic_write(target, data)
        meta_bytes = (json.dumps(meta, indent=2, sort_keys=True) + "\n").encode("utf-8")
        atomic_write(controls_dir(golden_dir) / META_FILE, meta_bytes)
    meta_now = load_meta(golden_dir)
    header = (
        f"policies {', '.join(CONTROL_POLICIES)}, values from cpmem "
        f"{meta_now.get('cpmem_version', '?')} "
        f"at {meta_now.get('git_revision', '?')}"
    )
    atomic_write(controls_dir(golden_dir) / DIFF_FILE, diff.markdown(header).encode("utf-8"))
    write_manifest(golden_dir)
    return diff
