"""The figure of ``cpmem capacity --plot``: memory per rank against sequence length.

One curve per layout: a single sequence's static memory plus its figure (the forward
peak, or the whole step), on the busiest rank, against the sequence's tokens (log
scale), each layout's longest fitting sequence marked; one horizontal line for the
device: its total less the runtime's 3% reserve and the memory outside PyTorch, which
static memory and the step share (a curve crosses it where its layout stops fitting).

matplotlib (the ``report`` extra) is imported only when a figure is drawn, so cpmem
imports and ``cpmem capacity`` prints its table without it; a missing matplotlib is one
line naming the extra. The PNG is written to a temporary file beside the target and
renamed over it, so a failure leaves nothing half-written.
"""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from cpmem.admission.capacity import Capacity, LayoutCapacity
from cpmem.errors import CpmemError, InputError
from cpmem.units import GIB

if TYPE_CHECKING:
    from matplotlib.figure import Figure

REPORT_EXTRA_HINT = "pip install 'cpmem[report]'"
POINTS = 24
"""Lengths per layout's curve, log-spaced."""
REACH = 1.5
"""Each curve runs to this multiple of its layout's longest sequence."""
SHORTEST = 256
"""The shortest length drawn (a rank needs a token; shorter ones are all static)."""


def require_matplotlib() -> None:
    """Fail with one line naming the extra, before anything is priced or written."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise CpmemError(
            f"the capacity plot needs matplotlib, which is not installed: {REPORT_EXTRA_HINT}"
        ) from None


def check_plot_path(path: str | Path) -> Path:
    """A ``.png`` path in an existing directory (checked before the search runs)."""
    out = Path(path)
    if out.suffix.lower() != ".png":
        raise InputError("plot", str(path), "must name a .png file")
    if not out.parent.is_dir():
        raise InputError("plot", str(path), f"directory {str(out.parent)!r} does not exist")
    return out


def curve_lengths(layout: LayoutCapacity) -> list[int]:
    """``POINTS`` log-spaced single-sequence lengths up to ``REACH`` x the longest (and the
    longest itself; 65,536 tokens stand for the longest where nothing fits)."""
    longest = layout.longest_sequence
    low = max(SHORTEST, layout.cp)
    high = max(2 * low, int(REACH * (longest or 1 << 16)))
    step = (math.log(high) - math.log(low)) / (POINTS - 1)
    lengths = {round(math.exp(math.log(low) + i * step)) for i in range(POINTS)}
    if longest is not None:
        lengths.add(longest)
    return sorted(lengths)


def layout_curve(found: Capacity, layout: LayoutCapacity) -> list[tuple[int, int]]:
    """(tokens, static + figure bytes) of one sequence along ``curve_lengths``, priced
    as the search priced it (lengths the planner refuses are left out)."""
    points = []
    for length in curve_lengths(layout):
        need = found.required(layout.tp, layout.cp, [length])
        if need is not None:
            points.append((length, layout.static_bytes + need))
    return points


def write_capacity_plot(found: Capacity, path: str | Path) -> Path:
    """Draw ``found``'s curves and the device line into the PNG at ``path``."""
    require_matplotlib()
    out = check_plot_path(path)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 6))
    usable = found.usable_bytes / GIB
    for layout in found.layouts:
        points = layout_curve(found, layout)
        if not points:
            continue
        (line,) = ax.plot(
            [t for t, _ in points],
            [b / GIB for _, b in points],
            marker=".",
            lw=1.3,
            label=_label(layout),
        )
        if layout.longest_sequence is not None and layout.required_at_longest is not None:
            ax.plot(
                [layout.longest_sequence],
                [(layout.static_bytes + layout.required_at_longest) / GIB],
                marker="o",
                ms=7,
                color=line.get_color(),
                markeredgecolor="k",
            )
    device = found.device
    ax.axhline(
        usable,
        color="k",
        ls="--",
        lw=1.2,
        label=(
            f"device {device.name}: {device.total_bytes / GIB:.2f} GiB total less the "
            f"3% reserve ({found.reserve_bytes / GIB:.2f}) and outside PyTorch "
            f"({found.non_torch_bytes / GIB:.2f}) = {usable:.2f} GiB"
        ),
    )
    if found.max_position_embeddings is not None:
        ax.axvline(
            found.max_position_embeddings,
            color="0.5",
            ls=":",
            lw=1,
            label=f"max_position_embeddings ({found.max_position_embeddings:,})",
        )
    ax.set_xscale("log")
    ax.set_ylim(0, usable * 1.6)
    ax.set_xlabel("tokens of one sequence (log scale)")
    figure = "forward peak" if found.figure == "forward" else "forward + backward"
    ax.set_ylabel(f"static memory + {figure}, busiest rank (GiB)")
    ax.set_title(
        f"{found.model}: memory per rank against sequence length "
        f"(policy {found.policy}; o: the longest that fits)"
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="upper left", fontsize=7, ncol=2)
    fig.tight_layout()
    _save(fig, out)
    plt.close(fig)
    return out


def _label(layout: LayoutCapacity) -> str:
    sp = " sp" if layout.sp else ""
    return f"TP {layout.tp} x CP {layout.cp}{sp}"


def _save(fig: Figure, out: Path) -> None:
    """Save to a temporary file beside ``out``, then rename it over ``out``."""
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".png", dir=out.parent)
    os.close(fd)
    try:
        fig.savefig(tmp, format="png", dpi=110)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
