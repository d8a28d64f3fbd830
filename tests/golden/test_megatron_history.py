"""When and in which CI image each Megatron-LM recording was made (recorded_images.csv),
and the history walk that finds it, on a small repository built here.

Expected outcomes: hand-written commits and their dates; the facts of Megatron-LM's CI
(the lts environment's image was NGC PyTorch 24.01 until 23a1dcaf74, 2025-11-06, and 25.09
after it; docker/.ngc_version.lts at the snapshot).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from cpmem.golden.files import GoldenDataError, default_golden_dir
from cpmem.golden.megatron import Recording, load_recordings
from cpmem.golden.megatron_history import (
    base_image,
    load_recorded_images,
    memory_series,
    recorded_image,
)

GOLDEN = default_golden_dir()
BUMP_DATE = "2025-11-06"  # Megatron-LM 23a1dcaf74 "replay: ci: Bump LTS container (#2157)"


def test_every_recording_has_its_commit_and_image() -> None:
    images = load_recorded_images(GOLDEN)
    recordings = load_recordings(GOLDEN)
    assert set(images) == {r.recording_id for r in recordings}
    for rec in recordings:
        found = images[rec.recording_id]
        assert found.values_date <= "2026-12-03"
        assert found.base_image.startswith("nvcr.io/nvidia/pytorch:")


def test_the_lts_image_is_2401_before_the_bump_and_2509_after() -> None:
    images = load_recorded_images(GOLDEN)
    lts = [r for r in load_recordings(GOLDEN) if r.environment == "lts"]
    before = [images[r.recording_id] for r in lts if images[r.recording_id].values_date < BUMP_DATE]
    after = [images[r.recording_id] for r in lts if images[r.recording_id].values_date > BUMP_DATE]
    assert len(before) > 100 and len(after) > 50
    assert {f.base_image for f in before} == {"nvcr.io/nvidia/pytorch:24.01-py3"}
    assert {f.base_image for f in after} == {"nvcr.io/nvidia/pytorch:25.09-py3"}


def test_memory_series_keeps_the_finite_memory_values_only() -> None:
    text = json.dumps(
        {
            "mem-allocated-bytes": {"values": {"1": "nan", "2": 10.0, "3": 12}},
            "mem-max-allocated-bytes": {"values": {"1": 20.0}},
            "lm loss": {"values": {"1": 3.0}},
        }
    )
    assert memory_series(text) == {
        "mem-allocated-bytes": {2: 10.0, 3: 12.0},
        "mem-max-allocated-bytes": {1: 20.0},
    }


def _git(repo: Path, *args: str, date: str | None = None) -> str:
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t")
    env["GIT_COMMITTER_EMAIL"] = "t@t"
    if date:
        env["GIT_AUTHOR_DATE"] = env["GIT_COMMITTER_DATE"] = f"{date}T12:00:00"
    done = subprocess.run(["git", "-C", str(repo), *args], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _values(peak: float, loss: float) -> str:
    return json.dumps(
        {
            "mem-allocated-bytes": {"values": {"1": 1.0}},
            "mem-max-allocated-bytes": {"values": {"1": peak}},
            "lm loss": {"values": {"1": loss}},
        }
    )


def _commit(repo: Path, files: dict[str, str], date: str, message: str) -> str:
    for name, text in files.items():
        path = repo / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", message, date=date)
    return _git(repo, "rev-parse", "HEAD")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "megatron"
    repo.mkdir()
    _git(repo, "init", "-q")
    return repo


BUILD = """test:build_image:
  parallel:
    matrix:
      - IMAGE: CI_MCORE_LTS_IMAGE
        FILE: Dockerfile.ci.lts
        BASE_IMAGE: nvcr.io/nvidia/pytorch:{lts}
      - IMAGE: CI_MCORE_DEV_IMAGE
        FILE: Dockerfile.ci.dev
        BASE_IMAGE: nvcr.io/nvidia/pytorch:{dev}
"""


def _recording(path: str) -> Recording:
    return Recording(
        "gpt/case/lts_dgx_a100", "gpt", "case", "golden_values_lts_dgx_a100.json", "lts",
        "dgx_a100", "a100", False, "regular", (), 8, "recipes/h100/gpt.yaml: 1 x 8", path,
        "0" * 40, 1, 1, 1, 1, 1.0, 1.0, 1.0, 1.0,
    )  # fmt: skip


def test_the_walk_finds_the_commit_that_wrote_the_memory_values(repo: Path) -> None:
    """Values written on day 1, moved to a new path on day 2 (renamed), other series
    rewritten on day 3, the image bumped on day 4: the values are day 1's, in day 1's
    image; a later change of the memory values would move it."""
    old_path = "tests/old/case/golden_values_lts_dgx_a100.json"
    new_path = "tests/new/case/golden_values_lts_dgx_a100.json"
    stages = ".gitlab/stages/01.build.yml"
    _commit(repo, {stages: BUILD.format(lts="24.01-py3", dev="25.03-py3")}, "2025-01-01", "ci")
    first = _commit(repo, {old_path: _values(100.0, 3.0)}, "2025-02-01", "record")
    _git(repo, "mv", "tests/old", "tests/new")
    _commit(repo, {}, "2025-03-01", "move")
    _commit(repo, {new_path: _values(100.0, 2.5)}, "2025-04-01", "losses only")
    snapshot = _commit(
        repo, {stages: BUILD.format(lts="25.09-py3", dev="26.02-py3")}, "2025-11-06", "bump"
    )
    found = recorded_image(repo, snapshot, _recording(new_path))
    assert (found.values_commit, found.values_date) == (first, "2025-02-01")
    assert found.base_image == "nvcr.io/nvidia/pytorch:24.01-py3"
    assert base_image(repo, snapshot, "dev") == "nvcr.io/nvidia/pytorch:26.02-py3"

    rerecorded = _commit(repo, {new_path: _values(101.0, 2.5)}, "2025-12-01", "new values")
    found = recorded_image(repo, rerecorded, _recording(new_path))
    assert (found.values_commit, found.base_image) == (
        rerecorded,
        "nvcr.io/nvidia/pytorch:25.09-py3",
    )


def test_an_image_falls_back_to_the_ngc_version_file_and_is_never_guessed(repo: Path) -> None:
    first = _commit(repo, {"docker/.ngc_version.lts": "nvcr.io/nvidia/pytorch:25.09-py3\n"},
                    "2026-01-01", "pin")  # fmt: skip
    assert base_image(repo, first, "lts") == "nvcr.io/nvidia/pytorch:25.09-py3"
    with pytest.raises(GoldenDataError, match="names no base image"):
        base_image(repo, first, "dev")


def test_a_file_not_in_the_history_is_an_error(repo: Path) -> None:
    head = _commit(repo, {"README": "x"}, "2026-01-01", "start")
    with pytest.raises(GoldenDataError, match="not in the repository's history"):
        recorded_image(repo, head, _recording("tests/missing.json"))
