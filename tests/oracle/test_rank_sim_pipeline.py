"""Rank simulator, pipeline stages (oracles/rank_sim/pipeline/stage.py): one stage of one rank
running megatron's schedule of forwards and backwards over M micro-batches.

Small on purpose: Qwen3-1.7B truncated to 8 layers (2 per stage at pp = 4), TP1 CP1,
256-512 tokens. The expected in-flight counts come from megatron's own
``get_pp_rank_microbatches``, called here directly.
"""

from __future__ import annotations

import json
import warnings
from functools import cache

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from oracles.rank_sim.__main__ import main  # noqa: E402
from oracles.rank_sim.geometry import SimInputError, get_model  # noqa: E402
from oracles.rank_sim.head import padded_vocab  # noqa: E402
from oracles.rank_sim.layout import GdnPiece, RankLayout, contiguous_layout  # noqa: E402
from oracles.rank_sim.pipeline import StageResult, simulate_stage, stage_schedule  # noqa: E402
from oracles.rank_sim.recompute import Recompute  # noqa: E402
from oracles.rank_sim.runner import simulate_rank  # noqa: E402

warnings.filterwarnings("ignore")

MODEL = get_model("qwen3-1.7b").truncated(8)
SELECTIVE = Recompute.parse("selective", "core_attn")
PP, M = 4, 8


def _layout(tokens: int) -> RankLayout:
    return RankLayout(1, 1, 0, (tokens,), (tokens,), (GdnPiece(tokens),), tokens, True)


@cache
def _stage(
    stage: int,
    pp: int = PP,
    lengths: tuple[int, ...] = (512,) * M,
    vpp: int = 1,
    head: str = "hidden",
    rc: Recompute = SELECTIVE,
    layers: int = 8,
    deallocate: bool = True,
) -> StageResult:
    return simulate_stage(
        MODEL.truncated(layers), [_layout(n) for n in lengths], rc, pp=pp, stage=stage,
        vpp=vpp, head=head, deallocate_outputs=deallocate,
    )  # fmt: skip


class _Group:
    def __init__(self, size: int, rank: int) -> None:
        self._size, self._rank = size, rank

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank


class _P2P:
    def __init__(self, pp: int, rank: int, vpp: int | None) -> None:
        self.pp_group = _Group(pp, rank)
        self.virtual_pipeline_model_parallel_size = vpp


def _megatron_warmup(
    pp: int, stage: int, vpp: int | None, microbatches: int, group: int | None = None
) -> int:
    """megatron's num_warmup_microbatches (group: microbatch_group_size_per_vp_stage)."""
    from megatron.core.pipeline_parallel.schedules import get_pp_rank_microbatches

    chunks, group = vpp or 1, group or pp
    return get_pp_rank_microbatches(
        microbatches, chunks, group, p2p_communicator=_P2P(pp, stage, vpp)
    )[2]


@pytest.mark.parametrize("head", ["hidden", "logits"])
def test_one_stage_one_microbatch_is_simulate_rank(head: str) -> None:
    lay = _layout(512)
    ref = simulate_rank(MODEL, lay, SELECTIVE, head=head)
    got = simulate_stage(MODEL, [lay], SELECTIVE, pp=1, stage=0, head=head)
    assert got.forward_peak_bytes == ref.forward_peak_bytes
    assert got.forward_backward_peak_bytes == ref.forward_backward_peak_bytes
    assert got.retained_bytes == ref.retained_bytes
    assert got.forward_peak.components == ref.components["forward_peak"]
    assert got.schedule == "no-pipelining" and [op.kind for op in got.ops] == [
        "forward",
        "backward",
    ]


def test_hybrid_tp_sp_cp_stage_is_simulate_rank_and_receives_local_rows() -> None:
    """Qwen3.5-4B (GDN + attention, a relayout between them) at TP2 SP CP2."""
    model = get_model("qwen3.5-4b").truncated(4)
    lay = contiguous_layout([(512, None)], (256, 256), (258, 254), tp=2, rank=1, logical_tokens=512)
    ref = simulate_rank(model, lay, SELECTIVE, cp_comm="p2p")
    got = simulate_stage(model, [lay], SELECTIVE, pp=1, stage=0, cp_comm="p2p")
    assert (got.forward_peak_bytes, got.forward_backward_peak_bytes, got.retained_bytes) == (
        ref.forward_peak_bytes, ref.forward_backward_peak_bytes, ref.retained_bytes,
    )  # fmt: skip
    second = simulate_stage(model, [lay, lay], SELECTIVE, pp=2, stage=1)
    # megatron's recv buffer: [tokens / cp / tp, H] of the previous layer's kind (GDN: 254)
    rows = 254 // 2
    assert second.forward_peak.components["pp_input"] == rows * model.hidden * 2
    assert second.forward_peak.in_flight_chunks == 1


def test_order_is_megatrons() -> None:
    # 1F1B: warm-up min(pp - stage - 1, M), one forward then one backward, cool-down
    s = stage_schedule(3, 4, 1)
    assert s.warmup == 2
    assert [(k[0], k[1]) for k in s.ops] == [
        ("forward", 0), ("forward", 1), ("forward", 2), ("backward", 0),
        ("backward", 1), ("backward", 2),
    ]  # fmt: skip
    # the table of megatron's comment (PP2, N3 M5, VP2), backward with the chunk reversed
    s = stage_schedule(5, 2, 0, vpp=2, group=3)
    forwards = [(mb, c) for kind, mb, c in s.ops if kind == "forward"]
    backwards = [(mb, c) for kind, mb, c in s.ops if kind == "backward"]
    assert [mb for mb, _ in forwards] == [0, 1, 2, 0, 1, 2, 3, 4, 3, 4]
    assert [c for _, c in forwards] == [0, 0, 0, 1, 1, 1, 0, 0, 1, 1]
    assert backwards == [(mb, 1 - c) for mb, c in forwards]
    assert s.warmup == _megatron_warmup(2, 0, 2, 5, group=3) == 5 and s.total == 10


@pytest.mark.parametrize("stage", range(PP))
def test_1f1b_in_flight_at_the_forward_peak(stage: int) -> None:
    r = _stage(stage)
    assert r.warmup == _megatron_warmup(PP, stage, None, M) == min(PP - stage - 1, M)
    assert r.forward_peak.kind == "forward"
    assert r.forward_peak.in_flight_microbatches == min(PP - stage, M)
    few = _stage(stage, lengths=(512, 512))  # fewer micro-batches than the window
    assert few.forward_peak.in_flight_microbatches == min(PP - stage, 2)


@pytest.mark.parametrize("stage", range(PP))
def test_interleaved_in_flight_at_the_forward_peak(stage: int) -> None:
    r = _stage(stage, lengths=(256,) * M, vpp=2)
    warmup = _megatron_warmup(PP, stage, 2, M)
    assert r.schedule == "interleaved" and r.warmup == warmup
    assert r.chunk_layers == ((stage, stage + 1), (PP + stage, PP + stage + 1))
    assert r.forward_peak.in_flight_chunks == min(warmup + 1, 2 * M)


def test_first_minus_last_stage_is_the_window_of_retained_microbatches() -> None:
    """Equal micro-batches, 1F1B: stage 0 holds min(pp, M) - 1 more micro-batches than
    stage pp - 1 at its peak (same layer count, hidden head)."""
    one = _stage(0, lengths=(512,))  # one micro-batch through stage 0's layers
    retained = one.ops[0].end_bytes
    first, last = _stage(0), _stage(PP - 1)
    expected = (min(PP, M) - 1) * retained
    for a, b in (
        (first.forward_peak_bytes, last.forward_peak_bytes),
        (first.forward_backward_peak_bytes, last.forward_backward_peak_bytes),
    ):
        assert (a - b) / expected == pytest.approx(1.0, abs=0.03)


def _window(lengths: tuple[int, ...], pp: int, stage: int) -> list[frozenset[int]]:
    """In-flight micro-batches at each forward of 1F1B, restated from megatron's loop."""
    m = len(lengths)
    warm = min(pp - stage - 1, m)
    alive: set[int] = set()
    windows = []
    done = 0
    for f in range(m):
        alive.add(f)
        windows.append(frozenset(alive))
        if f >= warm:  # steady state: one backward after each forward
            alive.discard(done)
            done += 1
    return windows


def test_differing_lengths_peak_holds_the_in_flight_window() -> None:
    lengths = (256, 256, 512, 512, 512, 128)
    single = {n: _stage(0, lengths=(n,)) for n in set(lengths)}
    retained = {n: r.ops[0].end_bytes for n, r in single.items()}
    fwd_peak = {n: r.forward_peak_bytes for n, r in single.items()}
    windows = _window(lengths, PP, 0)
    estimate = [
        sum(retained[lengths[mb]] for mb in w if mb != f) + fwd_peak[lengths[f]]
        for f, w in enumerate(windows)
    ]
    best = max(range(len(lengths)), key=lambda f: estimate[f])
    assert windows[best] == frozenset({1, 2, 3, 4})  # the designed window
    r = _stage(0, lengths=lengths)
    assert r.forward_peak.microbatch == best
    assert {mb for mb, _ in r.forward_peak.in_flight} == windows[best]
    held = {mb for mb, b in r.forward_peak.by_microbatch.items() if b > 1 << 20}
    assert held == windows[best]
    assert r.forward_peak_bytes / estimate[best] == pytest.approx(1.0, abs=0.01)


def test_first_stage_embedding_and_last_stage_head() -> None:
    tokens = 256
    middle, last = (_stage(s, pp=3, lengths=(tokens,), head="logits", layers=6) for s in (1, 2))
    logits = tokens * padded_vocab(MODEL.vocab, 1)
    extra = last.forward_peak_bytes - middle.forward_peak_bytes
    assert extra / (6 * logits) == pytest.approx(1.0, abs=0.03)  # bf16 logits + fp32 copy
    assert "head" in last.forward_peak.components and "head" not in middle.forward_peak.components
    # the first stage's input is the embedding output: with the frozen embedding it needs
    # no gradient and goes after the first layer; a later stage keeps its received input
    rows = tokens * MODEL.hidden * 2
    first = _stage(0, pp=3, lengths=(tokens,), layers=6)
    mid = _stage(1, pp=3, lengths=(tokens,), layers=6)
    assert "pp_input" not in first.forward_peak.components
    assert mid.forward_peak.components["pp_input"] == rows
    assert 0 < mid.retained_bytes - first.retained_bytes - rows < 8192  # + the norm's rstd
    # under full recompute the embedding output is the first checkpoint's kept input
    full = Recompute.parse("full")
    f0, f1 = (_stage(s, pp=3, lengths=(tokens,), rc=full, layers=6) for s in (0, 1))
    assert f0.retained_bytes == f1.retained_bytes
    assert f0.forward_peak.components.get("embedding") == rows


def test_sent_outputs_are_deallocated_as_megatron_does() -> None:
    freed = _stage(0, pp=2, lengths=(512,), layers=4)
    kept = _stage(0, pp=2, lengths=(512,), layers=4, deallocate=False)
    # the output's storage goes; megatron's 1-element stand-in (one 512-byte block) stays
    assert kept.retained_bytes - freed.retained_bytes == 512 * MODEL.hidden * 2 - 512


def test_input_errors_name_the_field() -> None:
    lay = _layout(256)
    for kwargs, name in (
        ({"pp": 0, "stage": 0}, "pp"),
        ({"pp": 2, "stage": 2}, "stage"),
        ({"pp": 2, "stage": 0, "vpp": 0}, "vpp"),
        ({"pp": 1, "stage": 0, "vpp": 2}, "vpp"),
        ({"pp": 3, "stage": 0}, "stage_layers"),  # 8 layers over 3 stages
        ({"pp": 2, "stage": 0, "stage_layers": [3, 4]}, "stage_layers"),
        ({"pp": 2, "stage": 0, "stage_layers": [8, 0]}, "stage_layers"),
        ({"pp": 4, "stage": 0, "vpp": 2}, "microbatches"),  # interleaving needs M >= pp
    ):
        with pytest.raises(SimInputError) as err:
            simulate_stage(MODEL, [lay, lay], SELECTIVE, **kwargs)
        assert err.value.field == name, kwargs
    with pytest.raises(SimInputError) as err:
        simulate_stage(MODEL, [], SELECTIVE, pp=1, stage=0)
    assert err.value.field == "microbatches"


def test_cli_stage_json(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--model", "qwen3-1.7b", "--layers", "4", "--microbatch-rank-tokens", "256;128;256",
            "--pp", "2", "--stage", "0", "--json"]  # fmt: skip
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["pipeline"]["pp"] == 2 and out["pipeline"]["schedule"] == "1f1b"
    assert [mb["attention_tokens"] for mb in out["layout"]["microbatches"]] == [[256], [128], [256]]
    (stage,) = out["stages"]
    assert stage["stage"] == 0 and stage["tokens"] == [256, 128, 256]
    assert stage["forward_peak"]["in_flight_microbatches"] == 2
    assert len(stage["ops"]) == 6 and stage["ops"][0]["kind"] == "forward"
    assert out["busiest"]["stage"] == 0
    for bad, name in (
        (["--pp", "2", "--stage", "3"], "stage"),
        (["--pp", "2", "--vpp", "0"], "vpp"),
        (["--microbatches", "0"], "microbatches"),
        (["--pp", "3"], "stage_layers"),
        (["--pp", "2", "--stage-layers", "1,2"], "stage_layers"),
        (["--microbatch-rank-tokens", "256;128", "--microbatches", "3"], "microbatches"),
    ):
        base = ["--model", "qwen3-1.7b", "--layers", "4"]
        if "--microbatch-rank-tokens" not in bad:
            base += ["--rank-tokens", "256"]
        assert main(base + bad) == 2
        assert f"error: {name}=" in capsys.readouterr().err
