"""Where the driver package and the checkout it belongs to lie.

Why: workers are started by the package's path, its files are hashed for
``driver_sha256``, and git and the megatron shim are looked up from the checkout root.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent.parent
