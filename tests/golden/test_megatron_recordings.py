"""Megatron-LM's functional-test recordings as ``golden/megatron/`` keeps them.

Expected values: a small snapshot written here (its numbers reduced by hand), the CI
recipes kept beside the table (``recipes/*/*.yaml``: nodes x GPUs of each case they
list), the feature families read by hand from each case's ``model_config.yaml``, and,
where this checkout sees the project's shared directory (``tests.golden.shared_dir``),
the upstream JSON files themselves (``shared/golden-sources/megatron-lm``; CI has no
such directory and skips those checks).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from cpmem.golden.files import GoldenDataError, default_golden_dir, read_csv
from cpmem.golden.megatron import (
    ALLOCATED,
    MAX_ALLOCATED,
    RECORDING_COLUMNS,
    check_recordings,
    import_recordings,
    load_recordings,
    normalise,
    snapshot_commit,
    world_size,
)
from cpmem.golden.megatron_features import FEATURE_TAGS, case_features
from tests.golden.second_extraction import SECOND_EXTRACTION
from tests.golden.shared_dir import shared_dir

GOLDEN = default_golden_dir()
SHARED = shared_dir() / "golden-sources" / "megatron-lm"
COMMIT = "d98e8a64ddf34856e74b24714e3bedb2f5a39553"
CASE = "tiny_case_1node"


def _series(values: dict[str, object]) -> dict[str, object]:
    return {"start_step": 1, "end_step": 5, "step_interval": 1, "values": values}


def _snapshot(root: Path, extra_files: dict[str, dict[str, object]] | None = None) -> Path:
    """One GPT case with a GB200 recording and a resumed A100 one with 'nan' steps."""
    case_dir = root / "cases" / "gpt" / CASE
    case_dir.mkdir(parents=True)
    (case_dir / "model_config.yaml").write_text(
        "MODEL_ARGS:\n  --num-layers: 2\n  --multi-latent-attention: true\n"
        "  --cuda-graph-impl: none\nTEST_TYPE: ckpt-resume\n",
        encoding="utf-8",
    )
    files: dict[str, dict[str, object]] = {
        "golden_values_dev_dgx_gb200.json": {
            ALLOCATED: _series({"1": 100.0, "2": 130.0, "3": 120.0, "4": 120.0, "5": 120.0}),
            MAX_ALLOCATED: _series({"1": 500.0, "2": 600.0, "3": 700.0, "4": 650.0, "5": 640.0}),
        },
        "golden_values_lts_dgx_a100_2nd.json": {
            # steps 1 and 4 logged nothing; step 5 has no peak: only 2 and 3 are finite
            ALLOCATED: _series({"1": "nan", "2": 220.0, "3": 210.0, "4": "nan", "5": 300.0}),
            MAX_ALLOCATED: _series({"1": "nan", "2": 960.25, "3": 950.5, "4": "nan", "5": "nan"}),
        },
        **(extra_files or {}),
    }
    lines = [f"# NVIDIA/Megatron-LM snapshot {COMMIT}", "case\tfile\tupstream_path\tgit_blob"]
    for i, (name, body) in enumerate(files.items()):
        (case_dir / name).write_text(json.dumps(body), encoding="utf-8")
        if name != "golden_values_dev_dgx_h100.json":  # the one left out of the manifest
            upstream = f"tests/functional_tests/test_cases/gpt/{CASE}/{name}"
            lines.append(f"gpt/{CASE}\t{name}\t{upstream}\t{i:040x}")
    (root / "MANIFEST.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    recipe = root / "recipes" / "gb200" / "gpt-1node.yaml"
    recipe.parent.mkdir(parents=True)
    recipe.write_text("spec:\n  nodes: 1\n  gpus: 4\n", encoding="utf-8")
    return root


def test_normalise_reduces_each_recording_to_its_finite_steps(tmp_path: Path) -> None:
    rows = {r["file"]: r for r in normalise(_snapshot(tmp_path / "src"))}
    assert set(rows) == {"golden_values_dev_dgx_gb200.json", "golden_values_lts_dgx_a100_2nd.json"}
    gb200 = rows["golden_values_dev_dgx_gb200.json"]
    assert gb200 == {
        "recording_id": f"gpt/{CASE}/dev_dgx_gb200",
        "family": "gpt",
        "case": CASE,
        "file": "golden_values_dev_dgx_gb200.json",
        "environment": "dev",
        "platform": "dgx_gb200",
        "device": "gb200",
        "second_recording": "false",
        "test_type": "ckpt-resume",
        "features": "mla",  # --multi-latent-attention; --cuda-graph-impl none is no graph
        "world_size": "4",  # recipes/gb200/gpt-1node.yaml: 1 node x 4 GPUs
        "world_size_basis": "recipes/gb200/gpt-1node.yaml: 1 x 4",
        "upstream_path": f"tests/functional_tests/test_cases/gpt/{CASE}/"
        "golden_values_dev_dgx_gb200.json",
        "git_blob": f"{0:040x}",
        "steps": "5",
        "finite_steps": "5",
        "first_finite_step": "1",
        "last_finite_step": "5",
        "allocated_last_bytes": "120",
        "allocated_max_bytes": "130",
        "max_allocated_last_bytes": "640",
        "max_allocated_max_bytes": "700",
    }
    a100 = rows["golden_values_lts_dgx_a100_2nd.json"]
    assert (a100["environment"], a100["platform"], a100["device"]) == ("lts", "dgx_a100", "a100")
    assert a100["second_recording"] == "true"
    assert a100["world_size"] == "8"  # recipes/h100/gpt.yaml: 1 node x 8 GPUs
    assert a100["world_size_basis"] == "recipes/h100/gpt.yaml: 1 x 8"
    assert (a100["steps"], a100["finite_steps"]) == ("5", "2")
    assert (a100["first_finite_step"], a100["last_finite_step"]) == ("2", "3")
    # step 5's allocated 300 has no finite peak beside it: not counted
    assert (a100["allocated_last_bytes"], a100["allocated_max_bytes"]) == ("210", "220")
    assert (a100["max_allocated_last_bytes"], a100["max_allocated_max_bytes"]) == (
        "950.5",
        "960.25",
    )
    assert snapshot_commit(tmp_path / "src") == COMMIT


def test_a_recording_missing_from_the_manifest_is_refused(tmp_path: Path) -> None:
    extra = {
        "golden_values_dev_dgx_h100.json": {
            ALLOCATED: _series({"1": 1.0}),
            MAX_ALLOCATED: _series({"1": 2.0}),
        }
    }
    with pytest.raises(GoldenDataError) as err:
        normalise(_snapshot(tmp_path / "src", extra))
    assert err.value.file == f"gpt/{CASE}/golden_values_dev_dgx_h100.json"
    assert "MANIFEST.tsv" in str(err.value)


def test_an_unknown_platform_is_refused(tmp_path: Path) -> None:
    extra = {
        "golden_values_dev_dgx_z900.json": {
            ALLOCATED: _series({"1": 1.0}),
            MAX_ALLOCATED: _series({"1": 2.0}),
        }
    }
    with pytest.raises(GoldenDataError) as err:
        normalise(_snapshot(tmp_path / "src", extra))
    assert err.value.value == "dgx_z900" and "unknown platform" in str(err.value)


def test_a_value_that_is_neither_a_number_nor_nan_is_refused(tmp_path: Path) -> None:
    extra = {
        "golden_values_dev_dgx_a100.json": {
            ALLOCATED: _series({"1": "1.0e9"}),
            MAX_ALLOCATED: _series({"1": 2.0}),
        }
    }
    with pytest.raises(GoldenDataError) as err:
        normalise(_snapshot(tmp_path / "src", extra))
    assert err.value.value == repr("1.0e9")


def test_import_writes_the_table_and_unedited_copies_that_check_clean(tmp_path: Path) -> None:
    src = _snapshot(tmp_path / "src")
    golden = tmp_path / "golden"
    assert import_recordings(src, golden) == 2
    kept = golden / "megatron"
    for name in (
        "MANIFEST.tsv",
        f"cases/gpt/{CASE}/model_config.yaml",
        "recipes/gb200/gpt-1node.yaml",
    ):
        assert (kept / name).read_bytes() == (src / name).read_bytes()
    assert not list(kept.glob("cases/*/*/golden_values_*.json"))  # the raw series stay out
    recordings = load_recordings(golden)
    assert [r.recording_id for r in recordings] == [
        f"gpt/{CASE}/dev_dgx_gb200",
        f"gpt/{CASE}/lts_dgx_a100_2nd",
    ]
    assert recordings[1].allocated_last_bytes == 210.0
    assert recordings[1].max_allocated_max_bytes == 960.25
    assert check_recordings(golden, recordings) == []
    # a case whose model_config.yaml is gone, and a blob the manifest does not list
    (kept / f"cases/gpt/{CASE}/model_config.yaml").unlink()
    manifest = kept / "MANIFEST.tsv"
    manifest.write_text(manifest.read_text().replace(f"{1:040x}", f"{9:040x}"))
    problems = check_recordings(golden, recordings)
    assert len(problems) == 3
    assert sum("model_config.yaml is missing" in p for p in problems) == 2
    assert [p for p in problems if "is not in MANIFEST.tsv" in p] == [
        f"gpt/{CASE}/lts_dgx_a100_2nd: "
        f"tests/functional_tests/test_cases/gpt/{CASE}/golden_values_lts_dgx_a100_2nd.json"
        f" @ {1:040x} is not in MANIFEST.tsv"
    ]


# --- the real table ---------------------------------------------------------------------


RECORDINGS = load_recordings(GOLDEN)


def test_the_table_holds_611_recordings_of_four_families() -> None:
    # the first extraction: 450 GPT and 116 MoE recordings; the second (its README's "The
    # families added in the second extraction"): 17 GPT, 18 MoE, 8 hybrid, 2 Nemotron
    assert len(RECORDINGS) == 611
    assert len(load_recordings(GOLDEN, "gpt")) == 450 + 17
    assert len(load_recordings(GOLDEN, "moe")) == 116 + 18
    assert len(load_recordings(GOLDEN, "hybrid")) == 8
    assert len(load_recordings(GOLDEN, "nemotron")) == 2
    assert len({r.recording_id for r in RECORDINGS}) == 611
    header, _ = read_csv(GOLDEN / "megatron" / "recordings.csv", "recordings.csv")
    assert tuple(header) == RECORDING_COLUMNS


def test_each_case_carries_the_features_its_arguments_turn_on() -> None:
    by_case = {f"{r.family}/{r.case}": r.features for r in RECORDINGS}
    tagged = {case: features for case, features in by_case.items() if features}
    # the first extraction's one case of these kinds: latent attention with an MTP layer
    first = {"moe/gpt3_mcore_te_tp2_pp2_ep4_etp1_selective_recompute_experimental": ("mla", "mtp")}
    assert tagged == {**SECOND_EXTRACTION, **first}
    kept = {
        p.parent.relative_to(GOLDEN / "megatron" / "cases").as_posix()
        for p in (GOLDEN / "megatron" / "cases").glob("*/*/model_config.yaml")
    }
    assert set(SECOND_EXTRACTION) <= kept and len(kept) == 107 + 32 + len(SECOND_EXTRACTION)
    assert {tag for features in tagged.values() for tag in features} == set(FEATURE_TAGS)
    # the table holds what the rule reads in each kept model_config.yaml
    for case in {(r.family, r.case, r.test_type) for r in RECORDINGS}:
        config = yaml.safe_load(
            (GOLDEN / "megatron" / "cases" / case[0] / case[1] / "model_config.yaml").read_text()
        )
        assert case_features(config["MODEL_ARGS"], case[2]) == by_case[f"{case[0]}/{case[1]}"]


def test_a_feature_is_on_only_where_its_flag_turns_it_on() -> None:
    assert case_features({"--multi-latent-attention": None}, "regular") == ("mla",)
    assert case_features({"--multi-latent-attention": False}, "regular") == ()
    assert case_features({"--mtp-num-layers": 0, "--cuda-graph-impl": "none"}, "regular") == ()
    assert case_features({"--mtp-num-layers": 2, "--optimizer": "dist_muon"}, "regular") == (
        "mtp",
        "muon",
    )
    assert case_features({"--optimizer": "adam"}, "release") == ("release-15b",)
    assert case_features({" --fp8-param-gather ": True}, "regular") == ("fp8",)


def test_a_family_without_a_world_size_rule_is_refused() -> None:
    with pytest.raises(GoldenDataError) as err:
        world_size("bert", "bert_mr_tp2", "h100", "regular")
    assert err.value.file == "bert/bert_mr_tp2" and "world-size rule" in str(err.value)


def test_every_world_size_is_its_bases_recipe_or_left_unknown() -> None:
    """A basis naming a kept recipe holds that recipe's nodes x GPUs, and the recipe runs
    the recording's family; the release runs, which no recipe of the snapshot runs, have
    none, and say what their arguments allow."""
    recipes = GOLDEN / "megatron"
    checked = 0
    for r in RECORDINGS:
        # the table holds what the importer's rule gives
        assert world_size(r.family, r.case, r.device, r.test_type) == (
            r.world_size,
            r.world_size_basis,
        )
        if r.test_type == "release":
            assert r.world_size is None and r.world_size_basis.startswith("unknown: ")
            assert "TP 8 x PP 1 x DP with DP dividing 96" in r.world_size_basis
            continue
        assert r.world_size is not None
        if r.case.startswith("hybrid_flextron_"):
            # tests/test_utils/recipes/h100/flextron.yaml at the snapshot: nodes 1, gpus 8
            assert r.world_size == 8 and "h100/flextron.yaml" in r.world_size_basis
            continue
        recipe = yaml.safe_load((recipes / r.world_size_basis.split(":")[0]).read_text())
        assert r.world_size == recipe["spec"]["nodes"] * recipe["spec"]["gpus"], r.recording_id
        assert recipe["spec"]["model"] == r.family, r.recording_id
        checked += 1
    assert checked == 611 - 5 - 1


def test_every_recordings_case_and_manifest_row_is_kept() -> None:
    assert all(r.model_config(GOLDEN).is_file() for r in RECORDINGS)
    assert check_recordings(GOLDEN, RECORDINGS) == []
    assert snapshot_commit(GOLDEN / "megatron") == COMMIT


def test_every_recording_a_recipe_lists_has_that_recipes_world_size() -> None:
    world: dict[tuple[str, str, str], int] = {}
    for path in sorted((GOLDEN / "megatron" / "recipes").glob("*/*.yaml")):
        recipe = yaml.safe_load(path.read_text(encoding="utf-8"))
        gpus = recipe["spec"]["nodes"] * recipe["spec"]["gpus"]
        for product in recipe.get("products", []):
            for case in product["test_case"]:
                for run in product["products"]:
                    for env in run.get("environment", []):
                        for platform in run.get("platforms", []):
                            world[(case, env, platform)] = gpus
    listed = [r for r in RECORDINGS if (r.case, r.environment, r.platform) in world]
    assert len(listed) > 200
    assert {r.world_size for r in listed} == {4, 8}
    wrong = [
        r.recording_id for r in listed if r.world_size != world[(r.case, r.environment, r.platform)]
    ]
    assert wrong == []


def test_the_figures_are_consistent_within_each_row() -> None:
    for r in RECORDINGS:
        assert 0 <= r.finite_steps <= r.steps
        if not r.has_values:
            continue
        assert r.allocated_last_bytes is not None and r.allocated_max_bytes is not None
        assert r.max_allocated_last_bytes is not None and r.max_allocated_max_bytes is not None
        assert r.allocated_last_bytes <= r.allocated_max_bytes
        assert r.max_allocated_last_bytes <= r.max_allocated_max_bytes
        # the allocator's peak is never below what stays allocated
        assert r.allocated_max_bytes <= r.max_allocated_max_bytes


# --- against the upstream files, where they are beside this checkout -------------------

needs_shared = pytest.mark.skipif(
    not SHARED.is_dir(), reason=f"{SHARED} is not here (only beside the project's checkouts)"
)


@needs_shared
@pytest.mark.parametrize(
    "recording_id",
    [
        "gpt/gpt3_mcore_te_tp2_pp2/dev_dgx_a100",
        "gpt/gpt3_15b_8t_release/lts_dgx_a100",
        "hybrid/hybrid_mr_mcore_te_tp1_pp4_cp1_dgx_a100_1N8G/dev_dgx_h100",
        "nemotron/nemotron3_5_lightning_nightly_tp1_pp1_cp1_ep8_dgx_gb200/dev_dgx_gb200",
        "moe/gpt3_moe_mcore_te_tp4_ep2_etp2_pp2_scoped_cudagraph/dev_dgx_h100_2nd",
        "gpt/gpt3_mcore_te_tp1_pp1_resume_torch_dist_dist_optimizer/dev_dgx_h100_2nd",
        "gpt/gpt3_mcore_te_tp2_pp1_resume_torch_dist_multi_dist_optimizer_instances/"
        "lts_dgx_a100_2nd",
    ],
)
def test_a_rows_figures_are_its_upstream_files(recording_id: str) -> None:
    row = next(r for r in RECORDINGS if r.recording_id == recording_id)
    data = json.loads((SHARED / "cases" / row.family / row.case / row.file).read_text())

    def finite(name: str) -> dict[int, float]:
        return {
            int(step): float(v)
            for step, v in data[name]["values"].items()
            if v != "nan" and math.isfinite(v)
        }

    alloc, peak = finite(ALLOCATED), finite(MAX_ALLOCATED)
    steps = sorted(set(alloc) & set(peak))
    assert row.steps == len(data[ALLOCATED]["values"])
    assert row.finite_steps == len(steps)
    if not steps:
        assert row.allocated_last_bytes is None and row.max_allocated_max_bytes is None
        return
    assert (row.first_finite_step, row.last_finite_step) == (steps[0], steps[-1])
    assert row.allocated_last_bytes == alloc[steps[-1]]
    assert row.allocated_max_bytes == max(alloc[s] for s in steps)
    assert row.max_allocated_last_bytes == peak[steps[-1]]
    assert row.max_allocated_max_bytes == max(peak[s] for s in steps)


@needs_shared
def test_the_table_is_what_the_shared_snapshot_normalises_to() -> None:
    """Every figure of the table is the snapshot's own, reduced as the importer reduces it."""
    _, kept = read_csv(GOLDEN / "megatron" / "recordings.csv", "recordings.csv")
    assert normalise(SHARED) == kept


def test_two_hybrid_lts_recordings_are_one_copied_file() -> None:
    """golden/megatron/README.md: the lts A100 files of the TP 1 and TP 2 hybrid cases are
    one blob (a GPT case's file, copied when the hybrid cases were added): the same
    figures under two layouts, not two measurements."""
    lts = [
        r
        for r in RECORDINGS
        if r.family == "hybrid" and r.environment == "lts" and "_pp1_" in r.case
    ]
    assert len(lts) == 2 and lts[0].git_blob == lts[1].git_blob
    assert lts[0].git_blob.startswith("dc393d0d")
    assert (lts[0].allocated_last_bytes, lts[0].max_allocated_max_bytes) == (
        lts[1].allocated_last_bytes,
        lts[1].max_allocated_max_bytes,
    )
