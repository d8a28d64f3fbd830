"""The memory-history analyser (gpu_tests/driver/history.py) and ``--memory-history``.

Why synthetic snapshots: a real one needs CUDA. Each trace below is small enough that
its peaks and groups are worked out by hand in the comments; the code under test
never computes an expected value.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest

from gpu_tests import driver
from gpu_tests.driver import history, measure

SITE = "/env/lib/python3.12/site-packages/"
REPO = "/work/main/"
LINEAR = {"filename": SITE + "torch/nn/modules/linear.py", "line": 125, "name": "forward"}
MLP = {"filename": REPO + "gpu_tests/driver/engine_torch.py", "line": 80, "name": "mlp"}
ATTN = {"filename": REPO + "gpu_tests/driver/engine_torch.py", "line": 50, "name": "attn"}
OTHER = {"filename": "/usr/lib/python3.12/contextlib.py", "line": 1, "name": "helper"}
MARK = {"filename": REPO + "gpu_tests/driver/measure.py", "line": 9, "name": "cpmem_forward_end"}
BACKWARD = {"filename": SITE + "torch/_tensor.py", "line": 600, "name": "backward"}


def ev(action: str, addr: int, size: int, *frames: dict[str, Any]) -> dict[str, Any]:
    return {"action": action, "addr": addr, "size": size, "stream": 0, "frames": list(frames)}


def snap(*traces: list[dict[str, Any]]) -> dict[str, Any]:
    return {"segments": [], "device_traces": list(traces)}


# index: what happens                                   live bytes after it
TRACE = [
    ev("segment_alloc", 0x1000, 2**21),  # 0: reserved, not allocated        0
    ev("alloc", 0x100, 1000, LINEAR, ATTN),  # 1: A                         1000
    ev("free_requested", 0x999, 5000),  # 2: allocated before recording     1000
    ev("free_completed", 0x999, 5000),  # 3: ignored, not -5000             1000
    ev("alloc", 0x200, 3000, OTHER, MLP),  # 4: B                           4000
    ev("alloc", 0x300, 500, MLP),  # 5: C                                   4500  <- forward peak
    ev("free_requested", 0x200, 3000),  # 6: B still counted                4500
    ev("free_completed", 0x200, 3000),  # 7: B gone                         1500
    ev(
        "alloc", 0x400, 2000
    ),  # 8: D, no python frame                      3500  <- forward end after this
    ev("alloc", 0x500, 512, MARK, MLP),  # 9: the driver's marker            4012
    ev("free_completed", 0x500, 512),  # 10                                 3500
    ev("alloc", 0x600, 4000),  # 11: E                                      7500  <- overall peak
    ev("free_completed", 0x100, 1000),  # 12: A                             6500
    ev("free_completed", 0x600, 4000),  # 13: E                             2500
]
ENGINE = "gpu_tests/driver/engine_torch.py"


def keys(moment: dict[str, Any]) -> list[tuple[str, int, int]]:
    return [(g["key"], g["count"], g["bytes"]) for g in moment["groups"]]


def test_peaks_and_groups_of_a_hand_worked_trace() -> None:
    r = history.analyse(snap([], TRACE))  # device 0 empty: the longest trace is picked
    assert (r["device"], r["entries"], r["free_action"]) == (1, 14, "free_completed")
    assert (r["forward_end_index"], r["forward_end_source"]) == (9, "marker")
    assert r["frees_of_unrecorded_allocations"] == 1
    # overall peak after entry 11: A 1000 (linear), C 500 (mlp), D 2000 + E 4000 (no frame)
    peak = r["overall_peak"]
    assert (peak["index"], peak["live_bytes"], peak["live_blocks"]) == (11, 7500, 4)
    assert keys(peak) == [
        (history.NO_FRAME, 2, 6000),
        ("torch/nn/modules/linear.py:125:forward", 1, 1000),
        (f"{ENGINE}:80:mlp", 1, 500),
    ]
    assert peak["groups"][0]["sizes"] == [4000, 2000]
    # forward peak: entries 0..8 only; reached after entry 5 with A, B and C live.
    # B's innermost frame (contextlib) is outside the repo: its engine_torch frame counts.
    fwd = r["forward_peak"]
    assert (fwd["index"], fwd["live_bytes"]) == (5, 4500)
    assert keys(fwd) == [
        (f"{ENGINE}:80:mlp", 2, 3500),
        ("torch/nn/modules/linear.py:125:forward", 1, 1000),
    ]
    assert fwd["groups"][0]["sizes"] == [3000, 500]
    # forward end: after entry 8, before the marker: A, C, D
    end = r["forward_end"]
    assert (end["index"], end["live_bytes"]) == (8, 3500)
    assert keys(end) == [
        (history.NO_FRAME, 1, 2000),
        ("torch/nn/modules/linear.py:125:forward", 1, 1000),
        (f"{ENGINE}:80:mlp", 1, 500),
    ]


def test_free_before_alloc_ordering_and_address_reuse() -> None:
    # 100 allocated and freed, then 300 at the same address, then 50: peak 350 at entry 3
    trace = [
        ev("alloc", 1, 100, MLP),
        ev("free_completed", 1, 100),
        ev("alloc", 1, 300, MLP),
        ev("alloc", 2, 50, ATTN),
    ]
    assert history.replay(trace) == (350, 3)
    # the free's request alone does not release: live 100, 100, 400, 300, 350, so the
    # peak is 400 at entry 2 (releasing at the request would give 350 at entry 4)
    trace = [
        ev("alloc", 1, 100),
        ev("free_requested", 1, 100),
        ev("alloc", 2, 300),
        ev("free_completed", 1, 100),
        ev("alloc", 3, 50),
    ]
    assert history.replay(trace) == (400, 2)
    # an address allocated again without a recorded free replaces the old block: 300, not 400
    assert history.replay([ev("alloc", 1, 100), ev("alloc", 1, 300)]) == (300, 1)


def test_free_requested_is_used_when_no_free_completed_was_recorded() -> None:
    trace = [ev("alloc", 1, 100), ev("free_requested", 1, 100), ev("alloc", 2, 60)]
    assert history.replay(trace) == (100, 0)
    r = history.analyse(snap(trace))
    assert r["free_action"] == "free_requested"
    assert (r["overall_peak"]["live_bytes"], r["overall_peak"]["index"]) == (100, 0)


def test_frees_of_unrecorded_allocations_never_go_negative() -> None:
    trace = [ev("free_completed", 7, 10**6), ev("alloc", 1, 10), ev("free_completed", 8, 10**6)]
    assert history.replay(trace) == (10, 1)
    assert [b.size for b in history.live_after(trace, 2)] == [10]
    r = history.analyse(snap(trace))
    assert r["frees_of_unrecorded_allocations"] == 2
    assert r["overall_peak"]["live_bytes"] == 10
    empty = history.analyse(snap([ev("free_completed", 7, 10**6)]))
    assert (empty["overall_peak"]["index"], empty["overall_peak"]["live_bytes"]) == (-1, 0)
    assert empty["overall_peak"]["groups"] == []


def test_forward_end_from_backward_frame_or_caller_or_none() -> None:
    trace = [ev("alloc", 1, 100, MLP), ev("alloc", 2, 50, BACKWARD), ev("alloc", 3, 500)]
    r = history.analyse(snap(trace))
    assert (r["forward_end_index"], r["forward_end_source"]) == (1, "backward frame")
    assert r["forward_peak"]["live_bytes"] == 100
    assert r["overall_peak"]["live_bytes"] == 650
    # the caller's end: entries 0 and 1 are the forward (100 + 50 live after entry 1)
    r = history.analyse(snap(trace), end=2)
    assert (r["forward_end_index"], r["forward_end_source"]) == (2, "caller")
    assert (r["forward_peak"]["live_bytes"], r["forward_end"]["live_bytes"]) == (150, 150)
    assert r["forward_end"]["index"] == 1
    r = history.analyse(snap([ev("alloc", 1, 100)]))
    assert (r["forward_end_index"], r["forward_peak"], r["forward_end"]) == (None, None, None)
    with pytest.raises(driver.InputError, match="forward_end=9"):
        history.analyse(snap(trace), end=9)


def test_group_key_choices() -> None:
    frames = [(f["filename"], f["line"], f["name"]) for f in (OTHER, LINEAR, ATTN)]
    assert history.group_key(frames) == "torch/nn/modules/linear.py:125:forward"
    assert history.group_key(frames, within=("gpu_tests/",)) == f"{ENGINE}:50:attn"
    assert history.group_key(frames, depth=2) == (
        f"torch/nn/modules/linear.py:125:forward < {ENGINE}:50:attn"
    )
    # nothing inside: the innermost frame stands in; no frame at all: NO_FRAME
    assert history.group_key(frames[:1]) == "/usr/lib/python3.12/contextlib.py:1:helper"
    assert history.group_key([]) == history.NO_FRAME


def test_marker_name_is_the_drivers_function() -> None:
    assert measure.cpmem_forward_end.__name__ == history.FORWARD_END_MARKER


def test_cli_text_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(snap(TRACE)))
    assert history.main([str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["overall_peak"]["live_bytes"] == 7500
    written = tmp_path / "s.json"
    assert history.main([str(path), "--top", "1", "--json-out", str(written)]) == 0
    assert json.loads(written.read_text())["forward_peak"]["live_bytes"] == 4500
    text = capsys.readouterr().out
    assert "forward_peak: 0.0 MiB live in 3 blocks after entry 5" in text
    assert f"{ENGINE}:80:mlp" in text and "(1 more groups)" in text


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (None, "no such file"),
        (b"not a pickle", "not a readable pickle"),
        (pickle.dumps([1, 2]), "not a memory snapshot"),
    ],
)
def test_bad_file_exits_2_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes | None, reason: str
) -> None:
    path = tmp_path / "bad.pickle"
    if content is not None:
        path.write_bytes(content)
    assert history.main([str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: snapshot={str(path)!r}: {reason}")


def test_bad_cli_numbers_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(snap(TRACE)))
    assert history.main([str(path), "--top", "0"]) == 2
    assert "error: top='0': must be >= 1" in capsys.readouterr().err
    assert history.main([str(path), "--device", "3"]) == 2
    assert "error: device=3: the snapshot has devices 0..0" in capsys.readouterr().err


# ------------------------------------------------------------ --memory-history


def _args(*extra: str) -> Any:
    base = ["--model", "qwen3-1.7b", "--layers", "2", "--lengths", "64", *extra]
    return driver.build_parser().parse_args(base)


def test_memory_history_path_rules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    spec = driver.spec_from_args(_args("--out", "cell", "--memory-history", "h.pickle"))
    assert spec.memory_history == str(tmp_path / "cell" / "h.pickle")
    spec = driver.spec_from_args(_args("--out", "cell", "--memory-history", "x/h.pickle"))
    assert spec.memory_history == str(tmp_path / "x" / "h.pickle")
    spec = driver.spec_from_args(_args("--memory-history", "h.pickle"))
    assert spec.memory_history == str(tmp_path / "h.pickle")
    assert driver.spec_from_args(_args()).memory_history is None


@pytest.mark.parametrize(
    ("value", "reason"),
    [("", "must be a file path"), (".", "must be a file path"), ("f/h.pickle", "is not a dir")],
)
def test_bad_memory_history_exits_2(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    value: str,
    reason: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "f").write_text("a file, not a folder")
    argv = ["--model", "qwen3-1.7b", "--lengths", "64", "--memory-history", value]
    assert driver.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: memory_history={value!r}: ") and reason in err


def test_memory_history_on_cpu_is_a_note_only(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    path = str(tmp_path / "h.pickle")
    notes = measure.record_history_step(lambda: None, [], torch.device("cpu"), 0, path)
    assert notes == [f"memory history not recorded: no CUDA device ({path})"]
    assert not Path(path).exists()


def test_memory_history_step_order_with_a_fake_cuda(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 0: record on, the step (marker after the forward), dump, record off; others: step."""
    calls: list[Any] = []

    class FakeMemory:
        def _record_memory_history(self, enabled: Any, **kw: Any) -> None:
            calls.append(("record", enabled, kw.get("stacks")))

        def _dump_snapshot(self, path: str) -> None:
            calls.append(("dump", path))

    class FakeTorch:
        class cuda:  # mirrors torch.cuda
            memory = FakeMemory()

        def empty(self, n: int, device: Any) -> None:
            calls.append(("marker", n))

    def fake_step(forward: Any, adapters: Any, device: Any, rank: int, rep: int, after: Any) -> Any:
        calls.append(("forward", rep))
        after()
        calls.append(("backward", rep))
        return measure.RankSample(rank, rep, 0, 0, 10, 5, 20, 1.0, True, 0, 0, True, 0)

    monkeypatch.setattr(measure, "load_torch", lambda: FakeTorch())
    monkeypatch.setattr(measure, "measure_step", fake_step)
    cuda = type("Device", (), {"type": "cuda"})()
    path = str(tmp_path / "sub" / "h.pickle")
    notes = measure.record_history_step(lambda: None, [], cuda, 0, path)
    rep = measure.REPETITIONS
    assert calls == [
        ("record", "all", "python"),
        ("forward", rep),
        ("marker", 1),
        ("backward", rep),
        ("dump", path),
        ("record", None, None),
    ]
    assert (tmp_path / "sub").is_dir()
    assert len(notes) == 1 and "forward peak 10 B" in notes[0] and path in notes[0]
    calls.clear()
    assert measure.record_history_step(lambda: None, [], cuda, 1, path) == []
    assert calls == [("forward", rep), ("marker", 1), ("backward", rep)]


def test_requested_bytes_read_from_the_allocator_stats() -> None:
    """measure_step's allocator figures: the stat when this torch has it, else None."""
    from gpu_tests.driver import measure

    class Cuda:
        def __init__(self, stats: dict[str, int]) -> None:
            self.stats = stats

        def memory_stats(self, device: Any) -> dict[str, int]:
            return self.stats

    stats = {"requested_bytes.all.current": 1536, "requested_bytes.all.peak": 4096}
    fake = type("T", (), {"cuda": Cuda(stats)})()
    assert measure._requested(fake, None, "current") == 1536
    assert measure._requested(fake, None, "peak") == 4096
    old = type("T", (), {"cuda": Cuda({"allocated_bytes.all.peak": 4608})})()
    assert measure._requested(old, None, "peak") is None
