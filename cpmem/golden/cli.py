"""``cpmem golden import|import-megatron|megatron-history|verify|manifest``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cpmem.golden.cells import load_cells
from cpmem.golden.files import (
    CELLS_FILE,
    SOURCES_SUBDIR,
    GoldenDataError,
    add_golden_argument,
    default_golden_dir,
)
from cpmem.golden.importer import import_sources
from cpmem.golden.manifest import data_files, verify, verify_manifest, write_manifest
from cpmem.golden.megatron import (
    MEGATRON_SUBDIR,
    RECORDINGS_FILE,
    import_recordings,
    load_recordings,
)
from cpmem.golden.megatron_history import RECORDED_IMAGES_FILE, write_recorded_images


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cpmem golden",
        description="Import, verify and pin the measured golden cells.",
        epilog="`cpmem golden export [--out FILE]` writes every measured cell's description "
        "for an external estimator (docs/external-estimators.md).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_import = sub.add_parser("import", help="import source CSVs into golden/ (append-only)")
    p_import.add_argument(
        "--sources",
        type=Path,
        default=None,
        help="directory with README.md and the source CSVs (default: GOLDEN/sources)",
    )
    p_megatron = sub.add_parser(
        "import-megatron",
        help="import a snapshot of Megatron-LM's functional-test recordings into GOLDEN/megatron",
    )
    p_megatron.add_argument(
        "--source",
        type=Path,
        required=True,
        help="the snapshot: cases/<family>/<case>/, recipes/ and MANIFEST.tsv",
    )
    p_history = sub.add_parser(
        "megatron-history",
        help="find when and in which CI image each Megatron-LM recording was made "
        "(GOLDEN/megatron/recorded_images.csv) from a clone of Megatron-LM with its history",
    )
    p_history.add_argument(
        "--repo",
        type=Path,
        required=True,
        help="a git clone of NVIDIA/Megatron-LM holding the snapshot commit and its history",
    )
    p_verify = sub.add_parser("verify", help="check schema, manifest and agreement with sources")
    p_manifest = sub.add_parser("manifest", help="regenerate golden/MANIFEST.sha256")
    for p in (p_import, p_megatron, p_history, p_verify, p_manifest):
        add_golden_argument(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    """``cpmem golden import|verify|manifest``; returns the process exit status."""
    args = _parser().parse_args(argv)
    golden_dir: Path = args.golden if args.golden is not None else default_golden_dir()
    try:
        if args.command == "import":
            sources: Path = (
                args.sources if args.sources is not None else (golden_dir / SOURCES_SUBDIR)
            )
            report = import_sources(sources, golden_dir)
            print(report.summary())
            stale = verify_manifest(golden_dir)
            print(
                "manifest ok"
                if not stale
                else f"manifest stale ({len(stale)} problems): run `cpmem golden manifest`"
            )
            return 0
        if args.command == "import-megatron":
            n = import_recordings(args.source, golden_dir)
            print(f"wrote {golden_dir / MEGATRON_SUBDIR / RECORDINGS_FILE} ({n} recordings)")
            print("run `cpmem golden manifest` to pin the new files")
            return 0
        if args.command == "megatron-history":
            n = write_recorded_images(args.repo, golden_dir, load_recordings(golden_dir))
            print(f"wrote {golden_dir / MEGATRON_SUBDIR / RECORDED_IMAGES_FILE} ({n} recordings)")
            print("run `cpmem golden manifest` to pin the new file")
            return 0
        if args.command == "manifest":
            path = write_manifest(golden_dir)
            print(f"wrote {path} ({len(data_files(golden_dir))} files)")
            return 0
        problems = verify(golden_dir)
    except GoldenDataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if problems:
        for p in problems:
            print(f"problem: {p}", file=sys.stderr)
        return 1
    n = len(load_cells(golden_dir / CELLS_FILE))
    print(f"{n} cells ok: schema valid, manifest ok, sources agree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
