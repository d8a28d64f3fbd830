"""Where the project's shared directory is (``shared/golden-sources/`` and the rest), when
this checkout can see it.

The shared directory sits beside the main checkout (``<parent>/main`` and
``<parent>/shared``). A checkout finds it, in order:

- ``CPMEM_SHARED_DIR``, where it is set;
- ``../shared`` beside this checkout;
- ``../shared`` beside the main checkout, the one git names as this worktree's common
  directory (a ``git worktree`` elsewhere, e.g. ``<parent>/wt/<name>``).

CI has no shared directory: the tests that need it skip.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENV = "CPMEM_SHARED_DIR"


def _main_checkout(root: Path) -> Path | None:
    """The checkout whose ``.git`` is ``root``'s common git directory (None: not git)."""
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--git-common-dir"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    common = (root / done.stdout.strip()).resolve()
    return common.parent if common.name == ".git" else None


def shared_dir(root: Path = ROOT) -> Path:
    """The shared directory this checkout sees; a path that does not exist where there is
    none (tests skip on ``is_dir()``)."""
    given = os.environ.get(ENV)
    if given:
        return Path(given)
    candidates = [root.parent / "shared"]
    main = _main_checkout(root)
    if main is not None:
        candidates.append(main.parent / "shared")
    return next((c for c in candidates if c.is_dir()), candidates[0])
