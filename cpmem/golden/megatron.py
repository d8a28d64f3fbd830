"""Megatron-LM's functional-test recordings: the second measured runtime's data layer.

Megatron-LM's CI trains its own test cases (GPT, MoE, Mamba-2 hybrids, Nemotron 3) and
keeps the memory its last rank logs at every step (``golden/megatron/README.md``).
``import_recordings`` reads a snapshot of those test cases (``cases/<family>/<case>/``:
each case's ``model_config.yaml``, its ``golden_values_<environment>_<platform>.json``
files reduced to the two memory series; the CI recipes and ``MANIFEST.tsv``) and keeps:

- every case's ``model_config.yaml`` and every recipe, unedited (they are the inputs the
  recordings were made with);
- ``MANIFEST.tsv``, unedited (each original's upstream path and git blob);
- ``recordings.csv``, one normalised row per recording: the case, the environment and
  platform its file name gives, the feature families its arguments turn on
  (``megatron_features``), the world size its recipe runs and the rule that says so
  (``WORLD_RULES``; empty where the snapshot does not say), how many steps it logged and
  how many of them are finite, and each series' last and maximum finite value.

The raw series are not kept: every figure the gate reads is in the table, and each row
names the upstream file (path and git blob) it was reduced from. A measured value is
never edited: the table holds the recorded numbers as the files give them.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from cpmem.golden.files import GoldenDataError, atomic_write, csv_bytes, read_csv
from cpmem.golden.megatron_features import (
    FEATURE_TAGS,
    case_features,
    format_features,
    parse_features,
)

MEGATRON_SUBDIR = "megatron"
RECORDINGS_FILE = "recordings.csv"
UPSTREAM_MANIFEST = "MANIFEST.tsv"
ALLOCATED = "mem-allocated-bytes"
MAX_ALLOCATED = "mem-max-allocated-bytes"

RECORDING_COLUMNS: tuple[str, ...] = (
    "recording_id",
    "family",
    "case",
    "file",
    "environment",
    "platform",
    "device",
    "second_recording",
    "test_type",
    "features",
    "world_size",
    "world_size_basis",
    "upstream_path",
    "git_blob",
    "steps",
    "finite_steps",
    "first_finite_step",
    "last_finite_step",
    "allocated_last_bytes",
    "allocated_max_bytes",
    "max_allocated_last_bytes",
    "max_allocated_max_bytes",
)

# A platform named in a golden-values file name -> the device it ran on. The CI recipes
# run ``dgx_a100`` / ``dgx_h100`` (recipes/h100/*.yaml) and ``dgx_gb200``
# (recipes/gb200/*.yaml); ``dgxa100_dracooci[-ord]`` and ``dgxh100_dgxc`` are other
# clusters' A100 and H100 nodes. A file named ``golden_values_dev.json`` or
# ``golden_values_lts.json`` names no platform: its device is left empty.
PLATFORM_DEVICES: dict[str, str] = {
    "dgx_a100": "a100",
    "dgxa100_dracooci": "a100",
    "dgxa100_dracooci-ord": "a100",
    "dgx_h100": "h100",
    "dgxh100_dgxc": "h100",
    "dgx_gb200": "gb200",
}
ENVIRONMENTS = ("dev", "lts")
_FILE = re.compile(
    r"^golden_values_(?P<env>dev|lts)(?:_(?P<platform>.+?))?(?P<second>_2nd)?\.json$"
)


@dataclass(frozen=True)
class WorldRule:
    """A rule giving the GPUs some recordings ran on, and the source it stands on."""

    applies: Callable[[str, str, str, str], bool]
    """(family, case, device, test type) -> whether the rule is the recording's."""
    world_size: int | None
    basis: str
    """What ``recordings.csv`` says of it (``world_size_basis``); ``{family}`` is the
    recording's family."""


def _gb200(device: str) -> bool:
    return device == "gb200"


RELEASE_WORLD_BASIS = (
    "unknown: no recipe of the snapshot, nor any in Megatron-LM's history, runs the release "
    "cases (their CI recipes are the private megatron-lm-convergence-tests repository, "
    "checked out at tests/test_utils/local_recipes by .gitlab/stages/04.functional-tests.yml); "
    "the arguments fix TP 8 x PP 1 x DP with DP dividing 96 (global batch 384 / micro-batch 4)"
)
WORLD_RULES: tuple[WorldRule, ...] = (
    WorldRule(lambda f, c, d, t: t == "release", None, RELEASE_WORLD_BASIS),
    WorldRule(
        lambda f, c, d, t: f in ("gpt", "moe") and _gb200(d) and c.endswith("_1node"),
        4,
        "recipes/gb200/{family}-1node.yaml: 1 x 4",
    ),
    WorldRule(
        lambda f, c, d, t: f in ("gpt", "moe") and _gb200(d),
        8,
        "recipes/gb200/{family}.yaml: 2 x 4",
    ),
    WorldRule(lambda f, c, d, t: f in ("gpt", "moe"), 8, "recipes/h100/{family}.yaml: 1 x 8"),
    WorldRule(
        lambda f, c, d, t: f == "nemotron" and c.endswith("_1N4G"),
        4,
        "recipes/gb200/nemotron-1node.yaml: 1 x 4",
    ),
    WorldRule(lambda f, c, d, t: f == "nemotron", 8, "recipes/gb200/nemotron.yaml: 2 x 4"),
    WorldRule(
        lambda f, c, d, t: f == "hybrid" and c.startswith("hybrid_flextron_"),
        8,
        "Megatron-LM's tests/test_utils/recipes/h100/flextron.yaml at the snapshot (blob "
        "45515e547bad39c8b13f8979193dfee612868892; not among the snapshot's recipes/): 1 x 8",
    ),
    WorldRule(lambda f, c, d, t: f == "hybrid", 8, "recipes/h100/mamba.yaml: 1 x 8"),
)
"""The recordings' world sizes, first rule that applies. ``recipes/h100/{gpt,moe}.yaml``
(platforms ``dgx_a100``, ``dgx_h100``) and ``mamba.yaml`` (the hybrid cases): 1 node x 8;
``recipes/gb200/{gpt,moe,nemotron}.yaml``: 2 nodes x 4; ``recipes/gb200/*-1node.yaml``,
which run the ``_1node`` (and Nemotron's ``_1N4G``) cases: 1 node x 4. A file naming no
platform (or another cluster's A100/H100 nodes) ran the 8-GPU recipe its environment's
``dgx_a100`` recordings ran. The release runs' world size is not in the snapshot: left
empty, with what their arguments say of it."""


def world_size(family: str, case: str, device: str, test_type: str) -> tuple[int | None, str]:
    """The GPUs a recording ran on (None: not known) and the basis ``WORLD_RULES`` gives;
    a family no rule covers is refused."""
    for rule in WORLD_RULES:
        if rule.applies(family, case, device, test_type):
            return rule.world_size, rule.basis.format(family=family)
    raise GoldenDataError("has no world-size rule (WORLD_RULES)", file=f"{family}/{case}")


@dataclass(frozen=True)
class Recording:
    """One recording, as ``recordings.csv`` holds it (bytes as the file gives them)."""

    recording_id: str
    family: str
    case: str
    file: str
    environment: str
    platform: str
    device: str
    second_recording: bool
    test_type: str
    features: tuple[str, ...]
    """The feature families its arguments turn on (``megatron_features.FEATURES``)."""
    world_size: int | None
    """None where the snapshot does not say (``world_size_basis`` says why)."""
    world_size_basis: str
    upstream_path: str
    git_blob: str
    steps: int
    finite_steps: int
    first_finite_step: int | None
    last_finite_step: int | None
    allocated_last_bytes: float | None
    allocated_max_bytes: float | None
    max_allocated_last_bytes: float | None
    max_allocated_max_bytes: float | None

    @property
    def has_values(self) -> bool:
        return self.finite_steps > 0

    def model_config(self, golden_dir: Path) -> Path:
        """The case's ``model_config.yaml`` kept beside the table."""
        return (
            golden_dir / MEGATRON_SUBDIR / "cases" / self.family / self.case / "model_config.yaml"
        )


def _finite(series: dict[str, object], where: str) -> list[tuple[int, float]]:
    values = series.get("values")
    if not isinstance(values, dict):
        raise GoldenDataError("has no 'values' mapping", file=where)
    out: list[tuple[int, float]] = []
    for step, value in values.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if math.isfinite(value):
                out.append((int(step), float(value)))
        elif value != "nan":
            raise GoldenDataError("is neither a number nor 'nan'", file=where, value=repr(value))
    return sorted(out)


def _fmt(value: float | None) -> str:
    if value is None:
        return ""
    return str(int(value)) if float(value).is_integer() else repr(value)


def _upstream(source_dir: Path) -> dict[tuple[str, str], tuple[str, str]]:
    """(case, file) -> (upstream path, git blob) from the snapshot's ``MANIFEST.tsv``."""
    path = source_dir / UPSTREAM_MANIFEST
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise GoldenDataError(f"cannot read: {exc}", file=str(path)) from exc
    out: dict[tuple[str, str], tuple[str, str]] = {}
    body = [ln for ln in lines if ln and not ln.startswith("#")]
    header = body[0].split("\t") if body else []
    if header[:4] != ["case", "file", "upstream_path", "git_blob"]:
        raise GoldenDataError(
            f"header {header} is not case, file, upstream_path, git_blob", file=str(path)
        )
    for i, ln in enumerate(body[1:], start=2):
        fields = ln.split("\t")
        if len(fields) < 4:
            raise GoldenDataError("has fewer than 4 fields", file=str(path), row=i)
        out[(fields[0], fields[1])] = (fields[2], fields[3])
    return out


def snapshot_commit(source_dir: Path) -> str:
    """The Megatron-LM commit the snapshot's ``MANIFEST.tsv`` names on its first line."""
    first = (source_dir / UPSTREAM_MANIFEST).read_text(encoding="utf-8").splitlines()[0]
    m = re.search(r"\b([0-9a-f]{40})\b", first)
    if m is None:
        raise GoldenDataError(
            "first line names no 40-hex commit", file=UPSTREAM_MANIFEST, value=first
        )
    return m.group(1)


def normalise(source_dir: Path) -> list[dict[str, str]]:
    """Every recording of the snapshot at ``source_dir`` as a ``recordings.csv`` row."""
    import yaml  # the core's one reader of model_config.yaml (PyYAML)

    upstream = _upstream(source_dir)
    rows: list[dict[str, str]] = []
    cases_dir = source_dir / "cases"
    for family_dir in sorted(p for p in cases_dir.iterdir() if p.is_dir()):
        for case_dir in sorted(p for p in family_dir.iterdir() if p.is_dir()):
            family, case = family_dir.name, case_dir.name
            config = yaml.load(
                (case_dir / "model_config.yaml").read_text(encoding="utf-8"),
                Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader),
            )
            test_type = str(config.get("TEST_TYPE", "regular"))
            features = format_features(case_features(config.get("MODEL_ARGS") or {}, test_type))
            for path in sorted(case_dir.glob("golden_values_*.json")):
                where = f"{family}/{case}/{path.name}"
                m = _FILE.match(path.name)
                if m is None:
                    raise GoldenDataError(
                        "is not golden_values_<env>[_<platform>][_2nd].json", file=where
                    )
                platform = m["platform"] or ""
                if platform and platform not in PLATFORM_DEVICES:
                    raise GoldenDataError("names an unknown platform", file=where, value=platform)
                device = PLATFORM_DEVICES.get(platform, "")
                world, basis = world_size(family, case, device, test_type)
                key = (f"{family}/{case}", path.name)
                if key not in upstream:
                    raise GoldenDataError(f"has no row in {UPSTREAM_MANIFEST}", file=where)
                data = json.loads(path.read_text(encoding="utf-8"))
                series = {}
                for name in (ALLOCATED, MAX_ALLOCATED):
                    if name not in data:
                        raise GoldenDataError(f"has no {name!r} series", file=where)
                    series[name] = _finite(data[name], f"{where}: {name}")
                steps = len(data[ALLOCATED]["values"])
                finite_steps = sorted(
                    {s for s, _ in series[ALLOCATED]} & {s for s, _ in series[MAX_ALLOCATED]}
                )
                alloc = [v for s, v in series[ALLOCATED] if s in finite_steps]
                peak = [v for s, v in series[MAX_ALLOCATED] if s in finite_steps]
                rows.append(
                    {
                        "recording_id": f"{family}/{case}/{path.stem.removeprefix('golden_values_')}",
                        "family": family,
                        "case": case,
                        "file": path.name,
                        "environment": m["env"],
                        "platform": platform,
                        "device": device,
                        "second_recording": "true" if m["second"] else "false",
                        "test_type": test_type,
                        "features": features,
                        "world_size": "" if world is None else str(world),
                        "world_size_basis": basis,
                        "upstream_path": upstream[key][0],
                        "git_blob": upstream[key][1],
                        "steps": str(steps),
                        "finite_steps": str(len(finite_steps)),
                        "first_finite_step": str(finite_steps[0]) if finite_steps else "",
                        "last_finite_step": str(finite_steps[-1]) if finite_steps else "",
                        "allocated_last_bytes": _fmt(alloc[-1] if alloc else None),
                        "allocated_max_bytes": _fmt(max(alloc) if alloc else None),
                        "max_allocated_last_bytes": _fmt(peak[-1] if peak else None),
                        "max_allocated_max_bytes": _fmt(max(peak) if peak else None),
                    }
                )
    return rows


def import_recordings(source_dir: Path, golden_dir: Path) -> int:
    """Write ``golden/megatron/`` from the snapshot at ``source_dir``: the table, each
    case's ``model_config.yaml``, the recipes and ``MANIFEST.tsv`` (unedited copies).
    Everything is read and checked before anything is written; returns the rows."""
    rows = normalise(source_dir)
    target = golden_dir / MEGATRON_SUBDIR
    copies: list[tuple[Path, Path]] = [(source_dir / UPSTREAM_MANIFEST, target / UPSTREAM_MANIFEST)]
    for cfg in sorted((source_dir / "cases").glob("*/*/model_config.yaml")):
        copies.append((cfg, target / cfg.relative_to(source_dir)))
    for recipe in sorted((source_dir / "recipes").rglob("*.yaml")):
        copies.append((recipe, target / recipe.relative_to(source_dir)))
    for src, dst in copies:
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
    atomic_write(target / RECORDINGS_FILE, csv_bytes(rows, RECORDING_COLUMNS))
    return len(rows)


def _optional(text: str, kind: type[int] | type[float]) -> float | int | None:
    return None if text == "" else kind(text)


def _parse(row: dict[str, str], i: int, where: str) -> Recording:
    try:
        return Recording(
            recording_id=row["recording_id"],
            family=row["family"],
            case=row["case"],
            file=row["file"],
            environment=row["environment"],
            platform=row["platform"],
            device=row["device"],
            second_recording=row["second_recording"] == "true",
            test_type=row["test_type"],
            features=parse_features(row["features"]),
            world_size=_optional(row["world_size"], int),  # type: ignore[arg-type]
            world_size_basis=row["world_size_basis"],
            upstream_path=row["upstream_path"],
            git_blob=row["git_blob"],
            steps=int(row["steps"]),
            finite_steps=int(row["finite_steps"]),
            first_finite_step=_optional(row["first_finite_step"], int),  # type: ignore[arg-type]
            last_finite_step=_optional(row["last_finite_step"], int),  # type: ignore[arg-type]
            allocated_last_bytes=_optional(row["allocated_last_bytes"], float),
            allocated_max_bytes=_optional(row["allocated_max_bytes"], float),
            max_allocated_last_bytes=_optional(row["max_allocated_last_bytes"], float),
            max_allocated_max_bytes=_optional(row["max_allocated_max_bytes"], float),
        )
    except (KeyError, ValueError) as exc:
        raise GoldenDataError(f"cannot be read: {exc}", file=where, row=i) from exc


def load_recordings(golden_dir: Path, family: str | None = None) -> list[Recording]:
    """The recordings ``golden/megatron/recordings.csv`` holds (of one family if given)."""
    path = golden_dir / MEGATRON_SUBDIR / RECORDINGS_FILE
    header, rows = read_csv(path, f"{MEGATRON_SUBDIR}/{RECORDINGS_FILE}")
    if tuple(header) != RECORDING_COLUMNS:
        raise GoldenDataError(f"header {header} is not {list(RECORDING_COLUMNS)}", file=str(path))
    out = [_parse(r, i, str(path)) for i, r in enumerate(rows, start=1)]
    return [r for r in out if family is None or r.family == family]


def check_recordings(golden_dir: Path, recordings: Iterable[Recording]) -> list[str]:
    """Problems between the table and what is kept beside it (empty: consistent): every
    recording's case has its ``model_config.yaml``, names a ``MANIFEST.tsv`` row, only
    known features and a basis for its world size."""
    problems: list[str] = []
    manifest_path = golden_dir / MEGATRON_SUBDIR / UPSTREAM_MANIFEST
    listed = set()
    if manifest_path.is_file():
        for ln in manifest_path.read_text(encoding="utf-8").splitlines():
            fields = ln.split("\t")
            if len(fields) >= 4:
                listed.add((fields[2], fields[3]))
    for r in recordings:
        if not r.model_config(golden_dir).is_file():
            problems.append(f"{r.recording_id}: its case's model_config.yaml is missing")
        unknown = [t for t in r.features if t not in FEATURE_TAGS]
        if unknown:
            problems.append(f"{r.recording_id}: unknown features {unknown}")
        if not r.world_size_basis:
            problems.append(f"{r.recording_id}: its world size names no basis")
        if (r.upstream_path, r.git_blob) not in listed:
            problems.append(
                f"{r.recording_id}: {r.upstream_path} @ {r.git_blob} is not in {UPSTREAM_MANIFEST}"
            )
    return problems
