"""Which tensors are live at a peak: replaying a CUDA memory-history snapshot.

Why it exists: a measured peak says how many bytes were live, not which tensors they
were. ``--memory-history FILE`` (measure.py) records one forward+backward with
``torch.cuda.memory._record_memory_history`` and dumps the snapshot; this module
replays its allocation trace, finds the moments that matter and groups the tensors
live there by the code that allocated them. Pure Python: no torch needed to read it.

The snapshot is the dict ``torch.cuda.memory._snapshot()`` returns (pickled by
``_dump_snapshot``): ``device_traces`` holds one list of trace entries per device,
each with ``action``, ``addr``, ``size`` and ``frames`` (innermost first; each frame
``filename``, ``line``, ``name``). Rules of the replay:

- Bytes are counted from the first recorded entry on: a tensor allocated before
  recording began is not in the trace, and a free of such an address is ignored (it
  never goes negative). The figures are therefore increments above the live bytes at
  the start of recording, as the driver's peaks are above its pre-forward baseline.
- ``alloc`` makes a block live; ``free_completed`` (the moment the allocator's
  allocated-bytes figure drops) ends it. A trace with no ``free_completed`` at all
  uses ``free_requested`` instead. Segment and snapshot entries are ignored.
- The forward ends at, in order: the caller's trace index; the first ``alloc`` whose
  frames contain a frame named FORWARD_END_MARKER (the driver allocates one element
  there right after the forward returns); the first ``alloc`` with a frame named
  ``backward`` (``Tensor.backward`` creating the seed gradient, python stacks). None
  of them: no forward figures.

Three moments are reported: the overall peak, the forward peak (the peak of entries
before the forward's end) and the forward end (what the forward left live: the
tensors kept for backward plus the output).
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cpmem.errors import CpmemError, InputError

from .spec import int_field

# The function measure.py calls right after the forward (its name is the marker).
FORWARD_END_MARKER = "cpmem_forward_end"
# Group by the innermost frame in this checkout, megatron or torch.nn.
DEFAULT_WITHIN = ("gpu_tests/", "cpmem/", "oracles/", "megatron/", "torch/nn/")
NO_FRAME = "<no python frame>"


@dataclass(frozen=True)
class Block:
    """One live allocation: where in the trace it was made, its size and call stack."""

    index: int
    addr: int
    size: int
    frames: tuple[tuple[str, int, str], ...]  # (filename, line, function), innermost first


def load_snapshot(path: str | Path) -> dict[str, Any]:
    """The pickled snapshot dict; InputError naming the file on anything unreadable."""
    name = str(path)
    try:
        with open(path, "rb") as fh:
            data = pickle.load(fh)
    except FileNotFoundError:
        raise InputError("snapshot", name, "no such file") from None
    except (OSError, pickle.UnpicklingError, EOFError, ValueError) as exc:
        raise InputError("snapshot", name, f"not a readable pickle ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("device_traces"), list):
        raise InputError("snapshot", name, "not a memory snapshot (no device_traces list)")
    return data


def pick_trace(snapshot: dict[str, Any], device: int | None = None) -> tuple[int, list[Any]]:
    """The given device's trace, else the longest one (the device the driver recorded)."""
    traces = snapshot.get("device_traces")
    if not isinstance(traces, list) or not traces:
        raise InputError("snapshot", "device_traces", "no device traces")
    if device is None:
        device = max(range(len(traces)), key=lambda d: len(traces[d]))
    if not 0 <= device < len(traces):
        raise InputError("device", device, f"the snapshot has devices 0..{len(traces) - 1}")
    return device, list(traces[device])


def _frames(entry: dict[str, Any]) -> tuple[tuple[str, int, str], ...]:
    return tuple(
        (str(f.get("filename", "?")), int(f.get("line", 0)), str(f.get("name", "?")))
        for f in entry.get("frames") or ()
    )


def _free_action(trace: Sequence[dict[str, Any]]) -> str:
    has_completed = any(e.get("action") == "free_completed" for e in trace)
    return "free_completed" if has_completed else "free_requested"


def replay(trace: Sequence[dict[str, Any]], stop: int | None = None) -> tuple[int, int]:
    """(peak live bytes, index of the entry that reached it) over ``trace[:stop]``.

    The index is -1 when nothing was live above the start (an empty or free-only trace).
    """
    free = _free_action(trace)
    live: dict[int, int] = {}
    total = peak = 0
    at = -1
    for i, e in enumerate(trace[:stop]):
        action = e.get("action")
        if action == "alloc":
            total -= live.pop(e["addr"], 0)  # a reused address whose free was not recorded
            live[e["addr"]] = int(e["size"])
            total += int(e["size"])
            if total > peak:
                peak, at = total, i
        elif action == free:
            total -= live.pop(e["addr"], 0)  # 0: allocated before recording began
    return peak, at


def live_after(trace: Sequence[dict[str, Any]], index: int) -> list[Block]:
    """The blocks live once ``trace[index]`` has been applied (index -1: none)."""
    free = _free_action(trace)
    live: dict[int, Block] = {}
    for i, e in enumerate(trace[: index + 1]):
        action = e.get("action")
        if action == "alloc":
            live[e["addr"]] = Block(i, int(e["addr"]), int(e["size"]), _frames(e))
        elif action == free:
            live.pop(e["addr"], None)
    return list(live.values())


def forward_end(trace: Sequence[dict[str, Any]]) -> tuple[int | None, str | None]:
    """The first trace index that belongs to backward, and how it was found."""
    for name, source in ((FORWARD_END_MARKER, "marker"), ("backward", "backward frame")):
        for i, e in enumerate(trace):
            if e.get("action") == "alloc" and any(f[2] == name for f in _frames(e)):
                return i, source
    return None, None


def short_filename(filename: str, within: Sequence[str]) -> str:
    """The path from site-packages/ or from the first ``within`` fragment on."""
    for cut in ("site-packages/", "dist-packages/"):
        if cut in filename:
            return filename[filename.rindex(cut) + len(cut) :]
    for w in within:
        if w in filename:
            return filename[filename.index(w) :]
    return filename


def group_key(
    frames: Sequence[tuple[str, int, str]], within: Sequence[str] = DEFAULT_WITHIN, depth: int = 1
) -> str:
    """``file:line:function`` of the innermost frame(s) inside ``within``.

    With no such frame the innermost frame stands in; with no frame at all (C++ only,
    e.g. autograd's own backward) the key is NO_FRAME. ``depth`` > 1 joins that many
    matching frames, innermost first, with `` < ``.
    """
    chosen = [f for f in frames if any(w in f[0] for w in within)][:depth] or list(frames[:1])
    if not chosen:
        return NO_FRAME
    return " < ".join(f"{short_filename(f[0], within)}:{f[1]}:{f[2]}" for f in chosen)


def group(
    blocks: Sequence[Block], within: Sequence[str] = DEFAULT_WITHIN, depth: int = 1
) -> list[dict[str, Any]]:
    """Blocks grouped by ``group_key``: count, bytes and the distinct sizes, most bytes first."""
    groups: dict[str, dict[str, Any]] = {}
    for b in blocks:
        g = groups.setdefault(
            group_key(b.frames, within, depth), {"count": 0, "bytes": 0, "sizes": set()}
        )
        g["count"] += 1
        g["bytes"] += b.size
        g["sizes"].add(b.size)
    rows = [
        {"key": k, "count": g["count"], "bytes": g["bytes"], "sizes": sorted(g["sizes"])[::-1]}
        for k, g in groups.items()
    ]
    return sorted(rows, key=lambda r: (-r["bytes"], r["key"]))


def moment(
    trace: Sequence[dict[str, Any]], index: int, within: Sequence[str], depth: int
) -> dict[str, Any]:
    """The live set after ``trace[index]``: its bytes, block count and groups."""
    blocks = live_after(trace, index)
    return {
        "index": index,
        "live_bytes": sum(b.size for b in blocks),
        "live_blocks": len(blocks),
        "groups": group(blocks, within, depth),
    }


def analyse(
    snapshot: dict[str, Any],
    *,
    device: int | None = None,
    end: int | None = None,
    within: Sequence[str] = DEFAULT_WITHIN,
    depth: int = 1,
) -> dict[str, Any]:
    """The overall peak, forward peak and forward end of one device's trace (JSON-able)."""
    device, trace = pick_trace(snapshot, device)
    source: str | None = "caller"
    if end is None:
        end, source = forward_end(trace)
    elif not 0 <= end <= len(trace):
        raise InputError("forward_end", end, f"must be within the trace's 0..{len(trace)} entries")
    free = _free_action(trace)
    allocated = {e["addr"] for e in trace if e.get("action") == "alloc"}
    unmatched = sum(1 for e in trace if e.get("action") == free and e["addr"] not in allocated)
    _, peak_at = replay(trace)
    result: dict[str, Any] = {
        "device": device,
        "entries": len(trace),
        "free_action": free,
        "frees_of_unrecorded_allocations": unmatched,
        "forward_end_index": end,
        "forward_end_source": source if end is not None else None,
        "overall_peak": moment(trace, peak_at, within, depth),
        "forward_peak": None,
        "forward_end": None,
    }
    if end is not None:
        _, fwd_at = replay(trace, end)
        result["forward_peak"] = moment(trace, fwd_at, within, depth)
        result["forward_end"] = moment(trace, end - 1, within, depth)
    return result


def render(result: dict[str, Any], top: int = 15) -> str:
    """The analysis as text: one table of the largest groups per moment."""
    mib = 2**20
    lines = [
        f"device {result['device']}: {result['entries']} trace entries, frees by "
        f"{result['free_action']}, {result['frees_of_unrecorded_allocations']} frees of "
        f"allocations made before recording (ignored); forward ends at entry "
        f"{result['forward_end_index']} ({result['forward_end_source'] or 'not found'})"
    ]
    for name in ("overall_peak", "forward_peak", "forward_end"):
        m = result[name]
        if m is None:
            lines.append(f"\n{name}: not available (no forward end found)")
            continue
        lines.append(
            f"\n{name}: {m['live_bytes'] / mib:.1f} MiB live in {m['live_blocks']} blocks "
            f"after entry {m['index']}"
        )
        lines.append(f"{'MiB':>10s} {'count':>6s}  {'sizes (bytes)':24s} where")
        for g in m["groups"][:top]:
            sizes = ",".join(str(s) for s in g["sizes"][:3]) + (
                ",..." if len(g["sizes"]) > 3 else ""
            )
            lines.append(f"{g['bytes'] / mib:10.1f} {g['count']:6d}  {sizes:24s} {g['key']}")
        if len(m["groups"]) > top:
            rest = m["groups"][top:]
            lines.append(
                f"{sum(g['bytes'] for g in rest) / mib:10.1f} {sum(g['count'] for g in rest):6d}"
                f"  {'':24s} ({len(rest)} more groups)"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m gpu_tests.driver.history SNAPSHOT``: exit 2 with ``error: ...`` on bad input."""
    p = argparse.ArgumentParser(
        prog="python -m gpu_tests.driver.history",
        description="Group the tensors live at the peaks of a CUDA memory-history snapshot.",
    )
    p.add_argument("snapshot", help="pickle written by --memory-history / _dump_snapshot")
    p.add_argument("--top", default="15", help="groups shown per moment (text output)")
    p.add_argument("--json", action="store_true", help="print the whole analysis as JSON")
    p.add_argument("--json-out", default=None, help="also write the analysis as JSON to FILE")
    p.add_argument("--device", default=None, help="device index (default: the longest trace)")
    p.add_argument("--forward-end", default=None, help="trace index where backward begins")
    p.add_argument("--within", default=",".join(DEFAULT_WITHIN), help="path fragments to group by")
    p.add_argument("--depth", default="1", help="matching frames joined into one key")
    args = p.parse_args(argv)
    try:
        top = int_field("top", args.top, 1)
        depth = int_field("depth", args.depth, 1)
        device = None if args.device is None else int_field("device", args.device, 0)
        end = None if args.forward_end is None else int_field("forward_end", args.forward_end, 0)
        within = tuple(w for w in args.within.split(",") if w)
        if not within:
            raise InputError("within", args.within, "needs at least one path fragment")
        result = analyse(
            load_snapshot(args.snapshot), device=device, end=end, within=within, depth=depth
        )
    except CpmemError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2) if args.json else render(result, top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
