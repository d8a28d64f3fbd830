"""Pricing one checkout's estimator for ``cpmem diff``: a git worktree of a revision,
and this checkout's ``snapshot.py`` run as a script in a subprocess with ``PYTHONPATH``
at that checkout, so that it prices the checkout's own cpmem (``cpmem.diff.snapshot``
says which layouts it knows)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from cpmem.errors import CpmemError


class DiffError(CpmemError):
    """A revision, repository or checkout that cannot be priced."""


def _git(repo: Path, *args: str) -> str:
    try:
        done = subprocess.run(
            ["git", "-C", str(repo), *args], capture_output=True, text=True, check=False
        )
    except OSError as exc:
        raise DiffError(f"cannot run git: {exc}") from None
    if done.returncode != 0:
        raise DiffError(f"git {' '.join(args)} in {repo}: {done.stderr.strip()}")
    return done.stdout.strip()


def resolve_repo(repo: Path | None) -> Path:
    """The repository whose working tree is priced (default: the checkout cpmem runs from,
    else the one around the current directory)."""
    if repo is not None:
        return Path(_git(repo, "rev-parse", "--show-toplevel"))
    here = Path(__file__).resolve().parents[2]
    if (here / ".git").exists():
        return here
    return Path(_git(Path.cwd(), "rev-parse", "--show-toplevel"))


def resolve_revision(repo: Path, rev: str) -> str:
    """The full commit id of ``rev``; a DiffError naming it when git cannot find it."""
    return _git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")


@contextmanager
def worktree(repo: Path, commit: str) -> Iterator[Path]:
    """A temporary, detached ``git worktree`` of ``commit``, removed afterwards."""
    tmp = Path(tempfile.mkdtemp(prefix="cpmem-diff-"))
    path = tmp / "base"
    _git(repo, "worktree", "add", "--detach", "--quiet", str(path), commit)
    try:
        yield path
    finally:
        try:
            _git(repo, "worktree", "remove", "--force", str(path))
        except DiffError:
            shutil.rmtree(path, ignore_errors=True)
            subprocess.run(["git", "-C", str(repo), "worktree", "prune"], check=False)
        shutil.rmtree(tmp, ignore_errors=True)


def price_checkout(
    root: Path,
    golden_dir: Path,
    row_sources: Mapping[str, str] | None = None,
    *,
    label: str = "pricing",
    progress: bool = False,
) -> dict[str, Any]:
    """Run ``snapshot.py`` against the cpmem at ``root``; its JSON result."""
    with tempfile.TemporaryDirectory(prefix="cpmem-price-") as tmp:
        script, out = Path(__file__).with_name("snapshot.py"), Path(tmp) / "priced.json"
        env = {
            **os.environ,
            "PYTHONPATH": str(root),
            "CPMEM_GOLDEN_DIR": str(golden_dir),
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        cmd = [
            sys.executable,
            str(script),
            str(root),
            str(golden_dir),
            str(out),
            json.dumps(dict(row_sources or {})),
            label,
            "1" if progress else "0",
        ]
        done = subprocess.run(
            cmd, env=env, stdout=subprocess.PIPE, stderr=None if progress else subprocess.PIPE
        )
        if done.returncode != 0 or not out.is_file():
            err = (done.stderr or b"").decode("utf-8", "replace").strip().splitlines()
            tail = "\n  ".join(err[-8:]) if err else f"exit status {done.returncode}"
            raise DiffError(f"pricing the cpmem at {root} failed:\n  {tail}")
        result: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
        return result
