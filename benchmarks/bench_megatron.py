"""Speed figures for the Megatron-LM runtime (prints; asserts nothing).

Target (issue: one estimator for both measured runtimes): pricing one recording stays
under 1 ms, its arguments already read: the arguments described as a step
(``describe_megatron``, Transformer Engine's backend choice included), priced by
``tight`` and its backend spread priced beside it, for the longest case of the tier
(an interleaved pipeline under ``--attention-backend auto``). ``cpmem estimate`` on a
model stays under 0.2 s, the whole process (benchmarks/bench_cli.py). Reading a ``model_config.yaml``
and the whole tier are printed beside it (the tier adds its time to ``cpmem gate``).
"""

from __future__ import annotations

from pathlib import Path

from bench_planning import row, timeit

from cpmem.gate.megatron_tier import run_tier
from cpmem.golden.files import default_golden_dir
from cpmem.megatron.args import read_megatron_args
from cpmem.megatron.describe import describe_megatron
from cpmem.pricing.registry import backend_spread, price

CASE = "gpt3_mcore_te_tp1_pp4_vp1_resume_torch_dist"


def main() -> None:
    golden = default_golden_dir()
    config = golden / "megatron" / "cases" / "gpt" / CASE / "model_config.yaml"
    args = read_megatron_args(config)

    def describe() -> object:
        return describe_megatron(args, world_size=8, device="h100", rank="last")

    def price_one() -> object:
        step = describe_megatron(args, world_size=8, device="h100", rank="last")
        return price(step, "tight"), backend_spread(step, "tight")

    row(f"price one recording ({CASE}, h100)", timeit(price_one), 1e-3)
    row("  of which: describe its arguments as a step", timeit(describe), 1e-3)
    row("read its model_config.yaml", timeit(lambda: read_megatron_args(config)), 20e-3)
    row(
        "the whole tier (every recording, cases read once)",
        timeit(lambda: run_tier(Path(golden)), repeat=3),
        5.0,
    )


if __name__ == "__main__":
    main()
