"""Who measured what with which code: the revision, the driver's sha256, the software.

Why: a native row is only evidence if it says which estimator revision and which
driver code produced it; summary.json keeps this next to the rows.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from .gdn import have_fla
from .paths import PACKAGE_DIR, REPO_ROOT
from .spec import CellSpec, is_hex
from .torchlib import load_torch

SOURCE_REPOSITORY = "cpmem"
SOURCE_PATH = "gpu_tests/driver"
CAMPAIGN = "native"


def driver_files() -> list[Path]:
    """The driver's source files: every ``*.py`` under the package, caches excluded."""
    return sorted(
        (p for p in PACKAGE_DIR.rglob("*.py") if "__pycache__" not in p.parts),
        key=lambda p: p.relative_to(PACKAGE_DIR).as_posix(),
    )


def driver_sha256() -> str:
    """sha256 of the driver package: for each of its ``*.py`` files in sorted order of
    their path relative to the package (``/``-separated), that path, a NUL byte, the
    content's length in decimal, a NUL byte, then the content. One figure for the whole
    package, so any change to any of its modules changes it; a row's ``driver_sha256``
    names the code that measured it (it is not the sha of any single file)."""
    digest = hashlib.sha256()
    for path in driver_files():
        data = path.read_bytes()
        rel = path.relative_to(PACKAGE_DIR).as_posix()
        digest.update(rel.encode() + b"\0" + str(len(data)).encode() + b"\0" + data)
    return digest.hexdigest()


def git_revision() -> tuple[str | None, bool | None]:
    """(HEAD revision, whether cpmem/ or gpu_tests/ differ from it); None where no git."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True,
            check=True, timeout=10,
        ).stdout.strip()  # fmt: skip
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "cpmem", "gpu_tests"], cwd=REPO_ROOT,
            capture_output=True, text=True, check=True, timeout=10,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None, None
    return (head if is_hex(head, 40) else None), bool(dirty)


def provenance(spec: CellSpec) -> dict[str, Any]:
    """Who measured what with which code: recorded in summary.json next to the rows."""
    try:
        torch = load_torch()
    except ImportError:  # row formatting is tested where torch is not installed
        torch = None
    commit, dirty = git_revision()
    commit = spec.source_commit or os.environ.get("CPMEM_SOURCE_COMMIT") or commit
    cuda = torch is not None and torch.cuda.is_available()
    return {
        "campaign": CAMPAIGN,
        "source_repository": SOURCE_REPOSITORY,
        "source_path": SOURCE_PATH,
        "git_revision": commit,
        "git_dirty": dirty,
        "driver_sha256": driver_sha256(),
        "torch_version": torch.__version__ if torch is not None else None,
        "cuda_version": torch.version.cuda if torch is not None else None,
        "device_name": torch.cuda.get_device_name(0) if cuda else "cpu",
        "python": sys.version.split()[0],
        "date_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "fla_installed": have_fla(),
    }
