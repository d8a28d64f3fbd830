"""Rank simulator: accounting, layout checks, CLI, and a small validation subset.

The full validation (every golden cell at full depth) runs in ``nox -s simulate``; here
only reduced-depth cells run, so the default CI stays short.
"""

from __future__ import annotations

import json
import warnings

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from oracles.rank_sim import validate  # noqa: E402
from oracles.rank_sim.__main__ import main  # noqa: E402
from oracles.rank_sim.geometry import SimInputError, from_hf_config, get_model  # noqa: E402
from oracles.rank_sim.layout import GdnPiece, RankLayout, row_segments  # noqa: E402
from oracles.rank_sim.recompute import Recompute  # noqa: E402
from oracles.rank_sim.runner import simulate_rank  # noqa: E402
from oracles.rank_sim.tracker import LiveBytesTracker, rounded  # noqa: E402
from oracles.rank_sim.validation import cell_layout, read_cells, simulate_cell  # noqa: E402

warnings.filterwarnings("ignore")


def _layout(tokens: int, tp: int = 1, cp: int = 1) -> RankLayout:
    counts = (tokens,) * cp
    return RankLayout(tp, cp, 0, counts, counts, (GdnPiece(tokens),), tokens * cp, True)


def test_tracker_counts_new_storages_rounded_and_frees_them() -> None:
    base = torch.zeros(10)
    with LiveBytesTracker([base]) as tr:
        a = torch.empty(100, dtype=torch.bfloat16)  # 200 bytes -> one 512-byte block
        view = base[:5]  # a view of a baseline storage is not an allocation
        assert tr.live == rounded(200) == 512
        b = torch.empty(1000, dtype=torch.float32)
        assert tr.live == 512 + 4096
        del b
        assert tr.live == 512
    assert tr.peaks["forward"].bytes == 512 + 4096
    del a, view


def test_layout_errors_name_the_field() -> None:
    with pytest.raises(SimInputError, match="rank_tokens"):
        RankLayout(2, 2, 0, (3, 4), (3, 4), (GdnPiece(3),), 7, True).check(True)
    with pytest.raises(SimInputError, match="segments"):
        RankLayout(1, 1, 0, (8,), (8,), (GdnPiece(5),), 8, True).check(True)
    with pytest.raises(SimInputError, match="tp"):
        get_model("qwen3.5-27b").check_tp(5)
    assert row_segments([10, 10], 4, 16) == [(4, None), (6, 0), (6, 0)]
    assert row_segments([10, 10], 4, 20) == [(10, None), (10, None)]


def test_hf_config_matches_preset() -> None:
    cfg = {
        "model_type": "qwen3_5_text", "hidden_size": 2560, "intermediate_size": 9216,
        "num_hidden_layers": 32, "num_attention_heads": 16, "num_key_value_heads": 4,
        "head_dim": 256, "full_attention_interval": 4, "linear_num_key_heads": 16,
        "linear_key_head_dim": 128, "linear_num_value_heads": 32, "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4, "vocab_size": 248320,
    }  # fmt: skip
    model = from_hf_config(cfg, "qwen3.5-4b")
    assert model == get_model("Qwen/Qwen3.5-4B")


def test_depth_is_additive() -> None:
    """Every period of layers adds the same retained bytes (what lets a smaller run stand
    for a deeper one); checked rather than assumed."""
    base = get_model("qwen3.5-4b")
    lay = _layout(512, tp=2, cp=1)
    rc = Recompute.parse("selective", "core_attn")
    r = [simulate_rank(base.truncated(n), lay, rc).retained_bytes for n in (4, 8, 12)]
    assert r[2] - r[1] == r[1] - r[0] > 0


def test_mlp_saved_set_matches_the_saved_tensor_oracle() -> None:
    """One fused MLP sub-layer at TP1 keeps what the oracle's SwiGLUMLP keeps (the
    oracle counts the layer input too; here that storage is the mixer's output, so it
    carries the mixer's label)."""
    from oracles.saved_tensors import GEOMETRIES, measure_reference

    seq = 256
    model = get_model("qwen3.5-4b").truncated(1)
    res = simulate_rank(model, _layout(seq), Recompute.parse("none"))
    oracle = measure_reference(GEOMETRIES["qwen3.5-4b"], "mlp", seq).bytes()
    sim_mlp = res.components["retained"]["mlp"] + rounded(seq * model.hidden * 2)  # + its input
    assert abs(sim_mlp - oracle) <= 8 * 512


def test_recompute_orders_retained_bytes() -> None:
    model = get_model("qwen3.5-4b").truncated(4)
    lay = _layout(1024)
    got = {
        mode: simulate_rank(model, lay, Recompute.parse(*mode.split(":"))).retained_bytes
        for mode in ("none", "selective:core_attn", "selective:core_attn+mlp", "full")
    }
    assert got["none"] > got["selective:core_attn"] > got["selective:core_attn+mlp"] > got["full"]
    nograd = simulate_rank(model, lay, Recompute.parse("no-grad"))
    assert nograd.forward_backward_peak_bytes == nograd.forward_peak_bytes


SUBSET = (
    "cp:27b-selective:4096+4096",
    "tp:final:Qwen3.8-27B:tp4:selective:core_attn+mlp:compiled:2048+2048",
    "tp:eager_control:Qwen3-1.7B:tp2:selective:core_attn:eager:1024+1024",
)


@pytest.mark.parametrize("cell_id", SUBSET)
def test_golden_subset_at_reduced_depth(cell_id: str) -> None:
    """A few recorded layouts at 4 layers: the step runs and its figures are ordered;
    the full-depth comparison lives in golden/reports/rank_sim_validation.md."""
    cells = {c.cell_id: c for c in read_cells()[0]}
    cell = cells[cell_id]
    layout = cell_layout(cell)
    assert sum(layout.attention_tokens) == cell.packed
    if cell.retained:
        assert layout.attn_local == cell.retained
    r = simulate_cell(cell, layers=4)
    assert 0 < r.retained_bytes <= r.forward_peak_bytes <= r.forward_backward_peak_bytes


def test_report_is_current() -> None:
    assert not validate.is_stale(), "regenerate: python -m oracles.rank_sim.validate --write"


def test_cli_json_and_errors(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--model", "qwen3.5-4b", "--rank-tokens", "256,128", "--cp", "2", "--layers", "4"]
    assert main([*argv, "--lengths", "200,200", "--shared-prefix", "16", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["rank"] for r in out["ranks"]] == [0, 1]
    assert out["busiest_rank"] == 0
    assert {"torch", "megatron-core", "fla", "simulator"} <= set(out["provenance"])
    for bad, field in (
        (["--model", "nope", "--rank-tokens", "8"], "model"),
        (["--model", "qwen3.5-27b", "--rank-tokens", "8", "--tp", "5"], "tp"),
        (["--model", "qwen3.5-27b", "--lengths", "3", "--cp", "4"], "cp"),
        (["--model", "qwen3.5-27b", "--rank-tokens", "8,8", "--cp", "3"], "rank_tokens"),
    ):
        assert main(bad) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"error: {field}=") and "\n" not in err


def test_tp_by_cp_ranks_follow_their_token_counts() -> None:
    """TP 2 x CP 4 (a layout no measured cell has): each CP rank runs its own count, the
    busier rank holds more, and a rank's K/V gather spans the whole packed row."""
    model = get_model("qwen3.5-4b").truncated(4)
    counts = (1024, 512, 512, 256)
    rc = Recompute.parse("selective", "core_attn")
    res = [
        simulate_rank(
            model,
            RankLayout(2, 4, r, counts, counts, (GdnPiece(counts[r]),), sum(counts), True),
            rc,
        )
        for r in (0, 1, 3)
    ]
    assert res[0].retained_bytes > res[1].retained_bytes > res[2].retained_bytes
    assert res[0].tokens == 1024 and res[2].tokens == 256


def test_lengths_of_a_hybrid_under_tp_by_cp_whose_rank_counts_pad_past_the_row(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Each CP rank's count is padded to TP on its own: 3001+2001 at TP2 x CP4 gives
    ranks that together hold more than the packed row (a row cut at the packed count would
    not match them: 'segments=1000: != the rank's 1002 GDN tokens'); the extra are
    padding, and every rank simulates."""
    argv = ["--model", "qwen3.5-4b", "--lengths", "3001,2001", "--tp", "2", "--cp", "4"]
    assert main([*argv, "--layers", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    counts = out["layout"]["gdn_tokens"]
    assert sum(counts) > out["layout"]["packed_tokens"]
    assert [r["tokens"] for r in out["ranks"]] == counts
