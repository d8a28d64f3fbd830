"""Speed figures for planning, pricing and width selection (prints; asserts nothing).

Targets (issue: cpmem core): pricing one plan <= 50 us; building and pricing the
exact plan of 64 pairs of 8k tokens at CP 1/2/4/8 <= 5 ms each; width selection
over 256 such requests under CP 4 <= 100 ms; the cheap global-count probe as a ratio.
"""

from __future__ import annotations

import contextlib
import io
import statistics
import time
from collections.abc import Callable

from cpmem import cli
from cpmem.admission.width import select_width
from cpmem.model.load import load_model
from cpmem.plan.layout import ParallelLayout
from cpmem.plan.planners import plan_request
from cpmem.plan.request import Request
from cpmem.pricing.registry import price
from cpmem.step.describe import describe_step

GIB = 1 << 30


def timeit(fn: Callable[[], object], repeat: int = 7, number: int | None = None) -> float:
    """Median seconds per call over ``repeat`` rounds of ``number`` calls."""
    if number is None:
        number, t0 = 1, time.perf_counter()
        fn()
        one = time.perf_counter() - t0
        number = max(1, int(0.05 / max(one, 1e-7)))
    rounds = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        rounds.append((time.perf_counter() - t0) / number)
    return statistics.median(rounds)


def row(label: str, seconds: float, target: float) -> None:
    ok = "ok" if seconds <= target else "OVER TARGET"
    print(f"{label:<58} {seconds * 1e3:>10.3f} ms   target {target * 1e3:>7.3f} ms  {ok}")


def main() -> None:
    model = load_model("qwen3.5-27b")
    pair = Request.pair(4096, 4096, 1228)
    plan = plan_request(pair, ParallelLayout(cp=2), geometry=model)
    inputs = describe_step(model, plan=plan, cp=2)
    row("price one plan (27B CP2 4k pair)", timeit(lambda: price(inputs)), 50e-6)

    seed = ["estimate", "--model", "qwen3.5-27b", "--lengths", "4096,4096"]
    seed += ["--shared-prefix", "1228", "--cp", "2"]

    def cli_estimate(argv: list[str]) -> None:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            cli.main(argv)

    # the command's own work, the interpreter's start-up and cpmem's import aside (the
    # whole process against its 0.2 s: bench_cli.py): the human table prices the
    # harness's step beside the trainer's, the JSON one step
    row(
        "cpmem estimate, once imported (README's first command)",
        timeit(lambda: cli_estimate(seed)),
        0.2,
    )
    row(
        "cpmem estimate --json, once imported", timeit(lambda: cli_estimate([*seed, "--json"])), 0.2
    )

    batch = Request.combined([Request.pair(8192, 8192, 2000)] * 64)
    for cp in (1, 2, 4, 8):

        def plan_and_price(cp: int = cp) -> None:
            price(describe_step(model, request=batch, cp=cp))

        row(f"plan + price 64 pairs of 8k, CP {cp}", timeit(plan_and_price), 5e-3)

    small = load_model("qwen3.5-4b")
    queue = [Request.pair(8192, 8192, 2000) for _ in range(256)]
    budget = 120 * GIB
    exact = select_width(small, queue, budget, cp=4)
    cheap = select_width(small, queue, budget, cp=4, probe="count")
    t_exact = timeit(lambda: select_width(small, queue, budget, cp=4), repeat=5)
    t_cheap = timeit(lambda: select_width(small, queue, budget, cp=4, probe="count"), repeat=5)
    row(f"width selection, 256 x 8k pairs, CP 4 (exact) -> {exact.count}", t_exact, 0.1)
    print(
        f"{'width selection, token-count probe (optimistic) -> ' + str(cheap.count):<58} "
        f"{t_cheap * 1e3:>10.3f} ms   exact/count time ratio {t_exact / t_cheap:.1f}x"
    )
    print(
        f"exact search built {exact.exact_plans} exact plans and pruned {exact.pruned} widths "
        f"with the ceil(packed/CP) bound"
    )


if __name__ == "__main__":
    main()
