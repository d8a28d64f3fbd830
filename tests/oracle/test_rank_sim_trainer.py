"""Rank simulator: the step a trainer runs beyond the calibration harness (LM head and
loss, LoRA rank / dropout / targets, CP communication type). Truncated models and short
sequences; expected bytes are derived from shapes and dtype sizes."""

from __future__ import annotations

import csv
import json
import warnings
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from oracles.rank_sim.__main__ import main  # noqa: E402
from oracles.rank_sim.geometry import SimInputError, get_model  # noqa: E402
from oracles.rank_sim.layout import GdnPiece, RankLayout  # noqa: E402
from oracles.rank_sim.recompute import Recompute  # noqa: E402
from oracles.rank_sim.runner import simulate_rank  # noqa: E402
from oracles.rank_sim.tracker import LiveBytesTracker  # noqa: E402
from oracles.sim_grid.worker import rank_signature, simulate_job  # noqa: E402

warnings.filterwarnings("ignore")
BF16, F32, BOOL = 2, 4, 1  # bytes per element
SMALL = 64 * 1024  # per-token / per-row statistics next to the big tensors
ROWS = Path(__file__).resolve().parents[2] / "golden" / "simulated" / "rows.csv"


def _layout(counts: tuple[int, ...], tp: int = 1, rank: int = 0) -> RankLayout:
    return RankLayout(tp, len(counts), rank, counts, counts, (GdnPiece(counts[rank]),),
                      sum(counts), True)  # fmt: skip


NONE = Recompute.parse("none")
SELECTIVE = Recompute.parse("selective", "core_attn")


# -- defaults: today's figures ------------------------------------------------------------

# (model, layers, tp, counts, mode, modules, kwargs) -> (forward, forward+backward, retained)
# bytes as the simulator gave them before these inputs existed
TODAY = [
    (("qwen3.5-4b", 8, 2, (512, 384), "none", None, {}), (376260096, 385043456, 366692864)),
    (("qwen3.5-4b", 4, 2, (1024,), "full", None, {}), (78643200, 133144064, 16777728)),
    (("qwen3-1.7b", 4, 2, (512, 512), "none", None, {}), (133615104, 145149952, 128372224)),
    (
        ("qwen3.5-35b-a3b", 4, 4, (1024,), "selective", "core_attn+moe", {"ep": 4}),
        (269572608, 331237888, 129981440),
    ),
]


@pytest.mark.parametrize(("case", "expected"), TODAY)
def test_defaults_reproduce_todays_figures(
    case: tuple[Any, ...], expected: tuple[int, ...]
) -> None:
    name, layers, tp, counts, mode, modules, kw = case
    model = get_model(name).truncated(layers)
    rc = Recompute.parse(mode, modules)
    implicit = simulate_rank(model, _layout(counts, tp), rc, **kw)
    explicit = simulate_rank(
        model, _layout(counts, tp), rc, **kw, head="hidden", lora_rank=1, lora_dropout=0.0,
        lora_targets="all", cp_comm="all_gather",
    )  # fmt: skip
    for r in (implicit, explicit):
        assert (r.forward_peak_bytes, r.forward_backward_peak_bytes, r.retained_bytes) == expected
    assert implicit.components == explicit.components
    assert "head_backward_peak" not in implicit.components


def _job_from_row(row: dict[str, str]) -> dict[str, Any]:
    source = row["model_source"]
    return {
        "config_id": row["config_id"], "model": row["model"],
        "config_path": None if source == "preset" else str(ROWS.parent / source),
        "tp": int(row["tp"]), "cp": int(row["cp"]), "mode": row["mode"],
        "modules": row["modules"], "ep": int(row["ep"]), "routing": row["routing"],
        "lengths": [int(x) for x in row["lengths"].split("+")],
        "shared_prefix": int(row["shared_prefix"]), "logical_tokens": int(row["logical_tokens"]),
        "attention_tokens": [int(x) for x in row["attention_tokens"].split("+")],
        "gdn_tokens": [int(x) for x in row["gdn_tokens"].split("+")],
    }  # fmt: skip


def test_worker_reproduces_a_grid_row_and_takes_the_step_fields() -> None:
    rows = {r["config_id"]: r for r in csv.DictReader(ROWS.open())}
    row = rows["qwen3-1.7b:tp4:cp2:pair-16k:none"]
    job = {**_job_from_row(row), "rank": 0}
    res = simulate_job(job)
    assert str(res["forward_peak_bytes"]) == row["rank_forward_peak_bytes"].split("+")[0]
    assert (
        str(res["forward_backward_peak_bytes"])
        == row["rank_forward_backward_peak_bytes"].split("+")[0]
    )
    assert "step" not in res
    explicit = simulate_job({**job, "head": "hidden", "lora_rank": 1, "cp_comm": "all_gather"})
    assert explicit["forward_peak_bytes"] == res["forward_peak_bytes"]
    assert explicit["step"]["head"] == "hidden"
    assert rank_signature(job, 0) == rank_signature(job, 1)
    assert rank_signature({**job, "cp_comm": "p2p"}, 0) != rank_signature(
        {**job, "cp_comm": "p2p"}, 1
    )


# -- the LM head ----------------------------------------------------------------------------


def _head_run(head: str, tokens: int = 256, tp: int = 1, layers: int = 1) -> Any:
    model = get_model("qwen3.5-4b").truncated(layers)  # 248,320 vocabulary (a multiple of 128·TP)
    return simulate_rank(model, _layout((tokens,), tp), NONE, head=head), model


@pytest.mark.parametrize("head", ["logits", "fused"])
@pytest.mark.parametrize("tp", [1, 2])
def test_logits_head_keeps_4_bytes_and_peaks_6_bytes_per_logit(head: str, tp: int) -> None:
    tokens = 256
    r, model = _head_run(head, tokens, tp)
    logits = tokens * model.vocab // tp  # each TP rank: all its CP tokens, V/TP columns
    kept = r.components["retained"]["head"]
    assert F32 * logits <= kept <= F32 * logits + SMALL  # the fp32 softmax
    peak = r.components["forward_peak"]["head"]  # bf16 logits + their fp32 copy
    assert (BF16 + F32) * logits <= peak <= (BF16 + F32) * logits + SMALL
    assert r.forward_peak_bytes - peak == sum(
        v for k, v in r.components["forward_peak"].items() if k != "head"
    )
    first = r.components["head_backward_peak"]  # the fp32 gradient and its bf16 cast
    assert (BF16 + F32) * logits <= first["head"] + first["head_backward"]
    assert first["head"] + first["head_backward"] <= (BF16 + F32) * logits + SMALL
    assert r.components["retained"]["labels"] == 8 * tokens * tp // tp  # int64 per token
    assert r.step["head"] == head


def test_chunked_keeps_far_less_and_its_peak_scales_with_the_chunk() -> None:
    tokens = 512
    full, model = _head_run("logits", tokens)
    small, _ = _head_run("chunked:64", tokens)
    large, _ = _head_run("chunked:128", tokens)
    assert small.components["retained"]["head"] < full.components["retained"]["head"] / 100
    a, b = (x.components["forward_peak"]["head"] for x in (small, large))
    assert 1.9 < b / a < 2.1
    assert a > F32 * 64 * model.vocab  # at least one fp32 chunk of logits in flight
    assert small.step["head"] == "chunked:64"


def test_linear_ce_never_allocates_a_token_by_vocab_tensor(monkeypatch: pytest.MonkeyPatch) -> None:
    largest: dict[str, int] = {}
    add = LiveBytesTracker._add

    def spy(self: LiveBytesTracker, st: Any) -> None:
        largest[self.label] = max(largest.get(self.label, 0), st.nbytes())
        add(self, st)

    monkeypatch.setattr(LiveBytesTracker, "_add", spy)
    tokens = 256
    r, model = _head_run("linear-ce", tokens)
    logits = tokens * model.vocab
    assert max(largest.values()) < BF16 * logits  # no bf16 [tokens, V] anywhere in the step
    head = max(largest["head"], largest["head_backward"])
    assert head < logits  # the head's largest: not even 1 byte per logit
    assert largest["head"] >= F32 * model.vocab  # the per-vocabulary average logit
    assert r.components["retained"]["head"] < 2 * BF16 * tokens * model.hidden + F32 * model.vocab


# -- adapters -------------------------------------------------------------------------------

# qwen3.5-4b, TP1: per layer the adapted projections' inputs (elements per token)
H, F_FFN, ATTN_OUT, GDN_OUT = 2560, 9216, 16 * 256, 32 * 128
INPUTS = {"gdn": (H, GDN_OUT, H, F_FFN), "attention": (H, ATTN_OUT, H, F_FFN)}


def _adapter_run(layers: int = 4, tokens: int = 256, **kw: Any) -> Any:
    model = get_model("qwen3.5-4b").truncated(layers)
    return simulate_rank(model, _layout((tokens,)), NONE, **kw), model


@pytest.mark.parametrize("rank", [16, 128])
def test_rank_adds_r_values_per_token_per_adapted_projection(rank: int) -> None:
    tokens = 256
    base, model = _adapter_run(tokens=tokens)
    wide, _ = _adapter_run(tokens=tokens, lora_rank=rank)
    adapted = 4 * model.layers  # qkv|gdn_in, proj|gdn_out, fc1, fc2
    assert wide.retained_bytes - base.retained_bytes == adapted * tokens * (rank - 1) * BF16


def test_dropout_keeps_a_mask_and_a_dropped_copy() -> None:
    tokens = 256
    base, model = _adapter_run(tokens=tokens)
    drop, _ = _adapter_run(tokens=tokens, lora_dropout=0.1)
    elements = tokens * sum(sum(INPUTS[k]) for k in model.kinds)
    # per adapted projection: + bool mask + bf16 dropped copy - the input itself, which
    # nothing else keeps once A saves the dropped copy (frozen bases save no input).
    # Except the first layer's first projection: its input (the frozen embedding's,
    # normed) needs no gradient, so autograd keeps no mask there, only the copy.
    first = tokens * H
    assert drop.retained_bytes - base.retained_bytes == (elements - first) * BOOL
    assert drop.step["lora_dropout"] == 0.1


def test_dropout_saved_set_of_one_adapter() -> None:
    """One column-parallel adapted projection: A saves the dropped bf16 copy, autograd the
    bool mask, both of the input's shape; the input itself is not saved."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from oracles.rank_sim.adapters import AdapterSpec, LoRAColumn
    from oracles.rank_sim.layers import _config
    from oracles.rank_sim.runner import init_groups, release_groups

    saved: list[Any] = []
    init_groups(1, 1, 0)
    try:
        with FakeTensorMode(allow_non_fake_inputs=True):
            model, lay = get_model("qwen3.5-4b"), _layout((64,))
            lin = LoRAColumn(H, 128, _config(model, lay), 1, AdapterSpec.parse(8, 0.1), "qkv")
            for p in lin.base.parameters():
                p.requires_grad_(False)
            x = torch.empty((64, H), dtype=torch.bfloat16, requires_grad=True)
            with torch.autograd.graph.saved_tensors_hooks(
                lambda t: saved.append(t) or t, lambda t: t
            ):
                lin(x)
    finally:
        release_groups()
    shapes = [(t.dtype, tuple(t.shape)) for t in saved if t.dim() == 2 and t.shape[0] == 64]
    assert (torch.bool, (64, H)) in shapes
    assert (torch.bfloat16, (64, H)) in shapes
    assert not any(t is x for t in saved)
    assert (torch.bfloat16, (64, 8)) in shapes  # the rank-8 activation A·x


def test_attention_targets_drop_the_mlp_adapters_kept_tensors() -> None:
    tokens, rank = 256, 4
    full, model = _adapter_run(tokens=tokens, lora_rank=rank)
    attn, _ = _adapter_run(tokens=tokens, lora_rank=rank, lora_targets="attention")
    # per MLP: fc1's input (the norm output) and A·x, fc2's input (the SwiGLU output) and A·x
    per_layer = tokens * (H + rank + F_FFN + rank) * BF16
    assert full.retained_bytes - attn.retained_bytes == model.layers * per_layer
    assert attn.step["lora_targets"] == ["qkv", "proj", "gdn_in", "gdn_out"]
    mlp, _ = _adapter_run(tokens=tokens, lora_targets="mlp")
    assert mlp.retained_bytes < full.retained_bytes


def test_experts_only_under_moe_recompute_gives_the_experts_gradients() -> None:
    model = get_model("qwen3.5-35b-a3b").truncated(2)
    rc = Recompute.parse("selective", "core_attn+moe")
    r = simulate_rank(model, _layout((512,), tp=4), rc, ep=4, lora_targets="experts")
    assert r.forward_backward_peak_bytes > r.forward_peak_bytes > r.retained_bytes > 0


# -- CP communication -----------------------------------------------------------------------


@pytest.mark.parametrize("cp", [2, 4])
def test_p2p_and_a2a_keep_no_other_ranks_kv(cp: int) -> None:
    model = get_model("qwen3-1.7b").truncated(2)  # 16 query, 8 KV heads of 128
    width = 128
    counts = (width,) * cp
    got = {
        comm: simulate_rank(model, _layout(counts), NONE, cp_comm=comm)
        for comm in ("all_gather", "p2p", "a2a")
    }
    kv_row = 8 * 128 * BF16  # one token's K (or V) for all KV heads
    # all_gather keeps the gathered K and V (CP ranks' rows); p2p its last received chunk,
    # a2a the post-all-to-all k and v: the local element count either way
    other_ranks = model.layers * 2 * (cp - 1) * width * kv_row
    for comm in ("p2p", "a2a"):
        assert got["all_gather"].retained_bytes - got[comm].retained_bytes == other_ranks
        assert got[comm].step["cp_comm"] == comm


def test_ring_and_ulysses_run_backward_under_tp_and_recompute() -> None:
    model = get_model("qwen3.5-4b").truncated(4)
    for comm in ("p2p", "a2a"):
        for rc in (NONE, SELECTIVE):
            r = simulate_rank(model, _layout((256, 256), tp=2), rc, cp_comm=comm)
            assert r.forward_backward_peak_bytes >= r.forward_peak_bytes >= r.retained_bytes > 0


# -- refusals -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        (["--cp-comm", "a2a", "--cp", "8", "--rank-tokens", ",".join(["64"] * 8)], "cp_comm"),
        (["--cp-comm", "ring"], "cp_comm"),
        (["--lora-rank", "0"], "lora_rank"),
        (["--lora-dropout", "1.0"], "lora_dropout"),
        (["--lora-dropout", "-0.1"], "lora_dropout"),
        (["--head", "chunked:0"], "head"),
        (["--head", "softmax"], "head"),
        (["--lora-targets", "qkv,router"], "lora_targets"),
    ],
)
def test_invalid_inputs_are_one_line_errors(
    extra: list[str], field: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--model", "qwen3.5-27b", "--rank-tokens", "64", "--layers", "4"]
    assert main([*argv, *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {field}=") and "\n" not in err


def test_simulate_rank_refuses_with_the_field() -> None:
    model = get_model("qwen3.5-35b-a3b").truncated(4)  # 2 KV groups: 1 per rank at TP2
    with pytest.raises(SimInputError, match=r"^cp_comm="):
        simulate_rank(model, _layout((64, 64), tp=2), NONE, ep=4, cp_comm="a2a")
    with pytest.raises(SimInputError, match=r"^lora_targets="):
        simulate_rank(model, _layout((64,)), NONE, lora_targets="lm_head")


def test_cli_json_says_which_step(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--model", "qwen3.5-4b", "--rank-tokens", "128,128", "--cp", "2", "--layers", "4"]
    extra = ["--head", "linear-ce", "--lora-rank", "8", "--lora-dropout", "0.05",
             "--lora-targets", "attention+fc2", "--cp-comm", "p2p", "--json"]  # fmt: skip
    assert main([*argv, *extra]) == 0
    out = json.loads(capsys.readouterr().out)
    step = out["step"]
    assert step == {"head": "linear-ce", "lora_rank": 8, "lora_dropout": 0.05,
                    "lora_targets": ["qkv", "proj", "fc2", "gdn_in", "gdn_out"],
                    "cp_comm": "p2p"}  # fmt: skip
    assert all(r["step"] == step for r in out["ranks"])
    assert "head_backward_peak" in out["ranks"][0]["components"]
