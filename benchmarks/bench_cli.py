"""Speed of the command a user runs first (prints; asserts nothing).

Target (README's first command): ``cpmem estimate --model qwen3.5-27b --lengths 4096,4096
--shared-prefix 1228 --cp 2`` answers in 0.2 s or less, the whole process: the
interpreter's start-up, importing cpmem and the pricing. Each figure is the median wall
time of fresh processes of this interpreter, run one after another; the command runs as
its console script does (``from cpmem.cli import main; sys.exit(main())``). Beside it: an
empty interpreter and ``import numpy`` (the one dependency; the estimate of a hybrid
model does not import it), importing ``cpmem.cli`` alone, and the command's own work
once imported (in this process), so a slower figure says which part moved. The import's
own breakdown is ``python -X importtime -c "import cpmem.cli"``.
"""

from __future__ import annotations

import contextlib
import io
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench_planning import row, timeit

ROOT = Path(__file__).resolve().parents[1]
README_ESTIMATE = [
    "estimate", "--model", "qwen3.5-27b", "--lengths", "4096,4096", "--shared-prefix", "1228",
    "--cp", "2",
]  # fmt: skip
CONSOLE_SCRIPT = "import sys; from cpmem.cli import main; sys.exit(main())"
TARGET_S = 0.2
REPEAT = 15


def process_seconds(args: list[str], repeat: int = REPEAT) -> float:
    """Median wall seconds of ``python args...`` in a fresh process (output discarded)."""
    rounds = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, *args], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        rounds.append(time.perf_counter() - t0)
    return statistics.median(rounds)


def beside(label: str, seconds: float) -> None:
    """A figure printed for comparison, with no target of its own."""
    print(f"{label:<58} {seconds * 1e3:>10.3f} ms")


def main() -> None:
    print(f"{Path(sys.executable)} (median of {REPEAT} fresh processes each)")
    empty = process_seconds(["-c", "pass"])
    numpy = process_seconds(["-c", "import numpy"])
    imported = process_seconds(["-c", "import cpmem.cli"])
    command = process_seconds(["-c", CONSOLE_SCRIPT, *README_ESTIMATE])
    beside("python -c pass", empty)
    beside("python -c 'import numpy'", numpy)
    beside("python -c 'import cpmem.cli'", imported)
    row("cpmem estimate, the README's first command (whole process)", command, TARGET_S)

    from cpmem.cli import main as cli_main

    def in_process() -> None:
        with contextlib.redirect_stdout(io.StringIO()):
            cli_main(README_ESTIMATE)

    work = timeit(in_process)
    beside("  of which: the command's work once imported", work)
    print(
        f"cpmem estimate: {command:.3f} s against the {TARGET_S} s target "
        f"({'met' if command <= TARGET_S else 'MISSED'}); importing cpmem.cli adds "
        f"{imported - empty:.3f} s to the interpreter's {empty:.3f} s, the command's work "
        f"{work:.3f} s; import numpy alone takes {numpy:.3f} s"
    )


if __name__ == "__main__":
    main()
