"""Speed of ``cpmem capacity`` (prints; asserts nothing).

Target (issue: capacity): a 16-layout table under one second. TP x CP <= 8 gives ten
layouts, so the 16 are those ten and six of 16 ranks (1x16, 2x8, 4x4, 8x2, 4x8, 8x4),
on the H200 with the default step; the median of a few runs, with the probes (estimates)
each table priced. The attention-only 1.7B runs the chunked planner, the slowest of the
three (its cost model walks the chunks and the CP ranks).
"""

from __future__ import annotations

import statistics
import time

from cpmem.admission.capacity import capacity

LAYOUTS = "1x1,1x2,1x4,1x8,2x1,2x2,2x4,4x1,4x2,8x1,1x16,2x8,4x4,8x2,4x8,8x4"
TARGET_S = 1.0
REPEAT = 5


def main() -> None:
    for model in ("qwen3.5-27b", "qwen3.5-4b", "qwen3-1.7b"):
        rounds, probes = [], 0
        for _ in range(REPEAT):
            t0 = time.perf_counter()
            found = capacity(model, device="h200", layouts=LAYOUTS)
            rounds.append(time.perf_counter() - t0)
            probes = found.probes
        median = statistics.median(rounds)
        label = f"capacity, 16 layouts, {model} on h200 ({probes} estimates)"
        verdict = "ok" if median <= TARGET_S else "OVER TARGET"
        print(f"{label:<58} {median * 1e3:>10.1f} ms   target {TARGET_S * 1e3:>7.1f} ms  {verdict}")


if __name__ == "__main__":
    main()
