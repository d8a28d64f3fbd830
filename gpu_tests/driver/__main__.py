"""``python -m gpu_tests.driver ...`` and ``python gpu_tests/driver ...``.

Why the path bootstrap: run by its folder's path, Python puts this folder (not the
checkout) first on sys.path and runs this file outside the package; the checkout root
takes that place so that ``gpu_tests.driver`` (and cpmem, oracles) import from it.
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:
    _here = Path(__file__).resolve().parent
    _root = str(_here.parent.parent)
    if sys.path and Path(sys.path[0] or ".").resolve() == _here:
        sys.path[0] = _root
    elif _root not in sys.path:
        sys.path.insert(0, _root)

from gpu_tests.driver.cli import main

if __name__ == "__main__":
    sys.exit(main())
