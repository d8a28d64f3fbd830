"""``cpmem capacity --plot``: a PNG written whole or not at all, and one line naming the
report extra where matplotlib is missing."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from cpmem.admission.capacity import capacity
from cpmem.cli import main
from cpmem.errors import InputError
from cpmem.reports import capacity_plot

PNG = b"\x89PNG\r\n\x1a\n"
ARGV = ["capacity", "--model", "qwen3.5-4b", "--device", "h200", "--layouts", "1x1,2x2"]


def test_plot_is_a_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib", reason="the report extra (matplotlib) is not installed")
    out = tmp_path / "capacity.png"
    assert main([*ARGV, "--plot", str(out)]) == 0
    assert f"plot: {out}" in capsys.readouterr().out
    assert out.read_bytes()[:8] == PNG
    assert [p.name for p in tmp_path.iterdir()] == ["capacity.png"]  # no temporary left


def test_curves_are_priced_as_the_search_prices() -> None:
    found = capacity("qwen3.5-4b", device="h200", layouts="2x2")
    lay = found.layouts[0]
    points = capacity_plot.layout_curve(found, lay)
    assert len(points) >= capacity_plot.POINTS
    tokens = [t for t, _ in points]
    assert tokens == sorted(tokens) and lay.longest_sequence in tokens
    assert max(tokens) >= capacity_plot.REACH * (lay.longest_sequence or 0) - 1
    at = dict(points)[lay.longest_sequence or 0]
    assert at == lay.static_bytes + (lay.required_at_longest or 0)
    assert at <= found.usable_bytes  # the curve is under the device line where it fits


def test_a_failed_write_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("matplotlib", reason="the report extra (matplotlib) is not installed")
    from matplotlib.figure import Figure

    def broken(self: Figure, fname: str, **kwargs: object) -> None:
        Path(fname).write_bytes(PNG[:4])  # half a file, then the failure
        raise OSError("disk full")

    monkeypatch.setattr(Figure, "savefig", broken)
    found = capacity("qwen3.5-4b", device="h200", layouts="1x1")
    out = tmp_path / "capacity.png"
    with pytest.raises(OSError, match="disk full"):
        capacity_plot.write_capacity_plot(found, out)
    assert list(tmp_path.iterdir()) == []


def test_missing_matplotlib_is_one_line_naming_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises
    out = tmp_path / "capacity.png"
    assert main([*ARGV, "--plot", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "pip install 'cpmem[report]'" in lines[0]
    assert not out.exists()
    assert main(ARGV) == 0  # the table needs no matplotlib


@pytest.mark.parametrize("path", ["capacity.svg", "missing/capacity.png"])
def test_a_bad_plot_path_names_plot(tmp_path: Path, path: str) -> None:
    with pytest.raises(InputError) as err:
        capacity_plot.check_plot_path(tmp_path / path)
    assert err.value.field == "plot"
