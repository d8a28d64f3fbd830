"""``cpmem report`` without matplotlib: one line naming the extra, nothing written."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from cpmem.cli import main
from cpmem.reports import calibration as report
from cpmem.reports.progress import Progress, wanted


def test_report_stops_before_writing_when_matplotlib_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # None in sys.modules makes `import matplotlib` raise ImportError, as if absent
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    out = tmp_path / "report"
    assert main(["report", "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1
    assert "pip install 'cpmem[report]'" in lines[0]
    assert "Traceback" not in captured.err
    assert not out.exists()  # nothing written, not even the directory


def test_write_report_checks_before_writing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(report.CpmemError, match=r"cpmem\[report\]"):
        report.write_report(["reference"], tmp_path / "r", report.default_golden_dir())
    assert not (tmp_path / "r").exists()


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_draws_on_a_terminal_only() -> None:
    tty, pipe = _Tty(), io.StringIO()
    assert wanted(stream=tty) and not wanted(json_mode=True, stream=tty)
    assert not wanted(stream=pipe)
    with Progress("pricing", 3, enabled=wanted(stream=tty), stream=tty) as bar:
        for _ in range(3):
            bar.step()
    assert "pricing  3/3" in tty.getvalue()
    assert tty.getvalue().endswith("\r")  # the line is erased at the end
    with Progress("pricing", 3, enabled=wanted(stream=pipe), stream=pipe) as bar:
        bar.step()
    assert pipe.getvalue() == ""
