"""When each Megatron-LM recording was made, and in which CI image: read from Megatron-LM's
git history (``golden/megatron/recorded_images.csv``).

A golden-values file of the snapshot holds what its case logged the last time CI
re-recorded it, and CI rebuilds its images over time: the same ``lts`` environment ran
NGC PyTorch 24.01 until Megatron-LM's "Bump LTS container" commit (23a1dcaf74,
2025-11-06) and 25.09 after it. The image decides Transformer Engine's attention backend
under ``--attention-backend auto``, so a recording is priced in the container it ran in.

- ``values_commit``: the commit that wrote the recording's memory values. The file's
  history is walked back from the snapshot (``git log --follow``, across the moves of its
  test case) while both memory series (``mem-allocated-bytes``,
  ``mem-max-allocated-bytes``, finite values) stay what the snapshot holds; the oldest
  such commit wrote them. A later commit that rewrote other series (iteration times,
  losses) leaves them as they were.
- ``values_date``: that commit's committer date.
- ``base_image``: the image the recording's environment was built from at that commit:
  the ``BASE_IMAGE`` of the ``CI_MCORE_<ENV>_IMAGE`` entry of the build matrix under
  ``.gitlab/stages/`` (``01.test.yml`` early in 2025, ``01.build.yml`` after), else
  ``docker/.ngc_version.<env>``.

``write_recorded_images`` writes the table from a clone of Megatron-LM with its history;
it is provenance, not a measurement, and is pinned by ``golden/MANIFEST.sha256`` like
the rest of ``golden/megatron/``.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from cpmem.golden.files import GoldenDataError, atomic_write, csv_bytes, read_csv
from cpmem.golden.megatron import (
    ALLOCATED,
    MAX_ALLOCATED,
    MEGATRON_SUBDIR,
    Recording,
    snapshot_commit,
)

RECORDED_IMAGES_FILE = "recorded_images.csv"
RECORDED_IMAGE_COLUMNS = ("recording_id", "values_commit", "values_date", "base_image")
_ENTRY = re.compile(r"-\s*IMAGE:\s*CI_MCORE_(?P<env>[A-Z]+)_IMAGE\b")
_BASE = re.compile(r"BASE_IMAGE:\s*(?P<image>\S+)")


@dataclass(frozen=True)
class RecordedImage:
    """Where and when one recording was made (``recorded_images.csv``)."""

    recording_id: str
    values_commit: str
    values_date: str
    base_image: str


def _git(repo: Path, *args: str) -> str | None:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    return done.stdout if done.returncode == 0 else None


def memory_series(text: str) -> dict[str, dict[int, float]]:
    """The two memory series of a golden-values file, finite values only."""
    data = json.loads(text)
    out: dict[str, dict[int, float]] = {}
    for name in (ALLOCATED, MAX_ALLOCATED):
        values = data.get(name, {}).get("values", {}) if isinstance(data, dict) else {}
        out[name] = {
            int(step): float(v)
            for step, v in values.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        }
    return out


def base_image(repo: Path, commit: str, environment: str) -> str:
    """The image ``environment`` (``dev``/``lts``) was built from at ``commit``."""
    listing = _git(repo, "ls-tree", "--name-only", commit, ".gitlab/stages/") or ""
    for path in sorted(listing.split()):
        text = _git(repo, "show", f"{commit}:{path}") or ""
        entries = re.split(r"(?=-\s*IMAGE:)", text)
        for entry in entries:
            m = _ENTRY.match(entry.strip())
            if m and m["env"].lower() == environment:
                base = _BASE.search(entry)
                if base:
                    return base["image"]
    pinned = _git(repo, "show", f"{commit}:docker/.ngc_version.{environment}")
    if pinned and pinned.strip():
        return pinned.strip()
    raise GoldenDataError(
        "names no base image for its environment", file=f"{commit}", value=environment
    )


def recorded_image(repo: Path, snapshot: str, recording: Recording) -> RecordedImage:
    """The commit that wrote ``recording``'s memory values and its environment's image."""
    path = recording.upstream_path
    log = _git(repo, "log", "--follow", "--format=C %H %cs", "--name-only", snapshot, "--", path)
    here = _git(repo, "show", f"{snapshot}:{path}")
    if log is None or here is None:
        raise GoldenDataError("is not in the repository's history", file=path, value=snapshot)
    reference = memory_series(here)
    history: list[tuple[str, str, str]] = []
    for line in log.splitlines():
        if line.startswith("C "):
            _, commit, date = line.split()
            history.append((commit, date, ""))
        elif line.strip() and history and not history[-1][2]:
            history[-1] = (*history[-1][:2], line.strip())
    found: tuple[str, str] | None = None
    for commit, date, name in history:
        text = _git(repo, "show", f"{commit}:{name or path}")
        if text is None or memory_series(text) != reference:
            break
        found = (commit, date)
    if found is None:
        raise GoldenDataError("has no commit holding its values", file=path)
    commit, date = found
    return RecordedImage(
        recording.recording_id, commit, date, base_image(repo, commit, recording.environment)
    )


def write_recorded_images(
    repo: Path, golden_dir: Path, recordings: Iterable[Recording], workers: int = 8
) -> int:
    """Write ``recorded_images.csv`` for ``recordings`` from the clone at ``repo`` (at the
    snapshot ``golden/megatron/MANIFEST.tsv`` names); every row is found before the file
    is written. Returns the rows written."""
    snapshot = snapshot_commit(golden_dir / MEGATRON_SUBDIR)
    recs = list(recordings)
    with ThreadPoolExecutor(workers) as pool:
        found = list(pool.map(lambda r: recorded_image(repo, snapshot, r), recs))
    rows = [
        {
            "recording_id": f.recording_id,
            "values_commit": f.values_commit,
            "values_date": f.values_date,
            "base_image": f.base_image,
        }
        for f in found
    ]
    path = golden_dir / MEGATRON_SUBDIR / RECORDED_IMAGES_FILE
    atomic_write(path, csv_bytes(rows, RECORDED_IMAGE_COLUMNS))
    return len(rows)


def load_recorded_images(golden_dir: Path) -> dict[str, RecordedImage]:
    """``recorded_images.csv`` by recording id."""
    path = golden_dir / MEGATRON_SUBDIR / RECORDED_IMAGES_FILE
    header, rows = read_csv(path, f"{MEGATRON_SUBDIR}/{RECORDED_IMAGES_FILE}")
    if tuple(header) != RECORDED_IMAGE_COLUMNS:
        raise GoldenDataError(
            f"header {header} is not {list(RECORDED_IMAGE_COLUMNS)}", file=str(path)
        )
    out: dict[str, RecordedImage] = {}
    for i, row in enumerate(rows, start=1):
        if not re.fullmatch(r"[0-9a-f]{40}", row["values_commit"]) or not row["base_image"]:
            raise GoldenDataError("has no commit or image", file=str(path), row=i)
        out[row["recording_id"]] = RecordedImage(
            row["recording_id"], row["values_commit"], row["values_date"], row["base_image"]
        )
    return out
