"""The rank simulator's figures behind ``tight``'s counted constants, produced here.

Each test runs the simulator now (oracles/rank_sim/, CPU, fake tensors, a small
configuration), derives the figure a constant's docstring names from what it allocates
and keeps, and fails when the constant stops equalling it. Nothing here prices a step
with cpmem: the expected values are the simulator's.
"""

from __future__ import annotations

import warnings
from dataclasses import replace
from fractions import Fraction
from typing import ClassVar

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from cpmem.pricing.kinds.attention import FLASH_BACKWARD_DQ_Q  # noqa: E402
from cpmem.pricing.kinds.gdn import GDN_BACKWARD_WORKSPACE_V, GDN_CHUNK  # noqa: E402
from cpmem.pricing.kinds.moe import (  # noqa: E402
    MOE_ROUTER_PER_TOPK,
    MOE_ROW_COMPILED_F,
    MOE_ROW_EAGER_F,
    MOE_ROW_SMALL,
)
from oracles.rank_sim import kernels as K  # noqa: E402
from oracles.rank_sim.geometry import SimModel  # noqa: E402
from oracles.rank_sim.layout import GdnPiece, RankLayout  # noqa: E402
from oracles.rank_sim.recompute import Recompute  # noqa: E402
from oracles.rank_sim.runner import RankResult, simulate_rank  # noqa: E402
from oracles.rank_sim.tracker import LiveBytesTracker  # noqa: E402
from tests.oracle.test_rank_sim_moe import EP, LAYERS, SMALL, TOKENS, TP  # noqa: E402

warnings.filterwarnings("ignore")

BF16 = 2  # bytes per element

# ---------------------------------------------------------------- flash attention backward


def _flash_backward_rise(n_q: int, n_k: int, q_heads: int, kv_heads: int, d: int) -> int:
    """Bytes the simulator's flash kernel allocates in backward on top of its saved set
    and the incoming gradient, for ``n_q`` query tokens over ``n_k`` (CP-gathered) keys."""
    with FakeTensorMode():
        q = torch.empty(n_q, q_heads, d, dtype=torch.bfloat16, requires_grad=True)
        k = torch.empty(n_k, kv_heads, d, dtype=torch.bfloat16, requires_grad=True)
        v = torch.empty(n_k, kv_heads, d, dtype=torch.bfloat16, requires_grad=True)
        with LiveBytesTracker([q, k, v]) as tracker:
            out = K.FlashAttention.apply(q, k, v)
            grad = torch.empty_like(out)
            tracker.set_phase("backward")
            before = tracker.live
            out.backward(grad)
            return tracker.peaks["backward"].bytes - before


def test_flash_backward_holds_three_query_widths_beside_the_key_gradients() -> None:
    """FlashAttention-2's contract as oracles/rank_sim/kernels.py lays it out: the
    backward allocates dq (bf16) and its fp32 accumulator for every query token, and the
    head-expanded dk/dv for every key token the kernel saw. Under CP the keys are the
    gathered ones: between one and two ranks' worth of keys only the key-side buffers
    grow; what stays, per query token, is ``FLASH_BACKWARD_DQ_Q`` query widths (3.05 here:
    the accumulator's 128-row tile padding and the fp32 softmax-d are its excess)."""
    n, hq, hkv, d = 8192, 16, 4, 128
    q_bytes = n * hq * d * BF16
    one, two = (_flash_backward_rise(n, cp * n, hq, hkv, d) for cp in (1, 2))
    per_key_rank = two - one
    query_side = one - per_key_rank  # the part that does not follow the gathered keys
    assert query_side / q_bytes == pytest.approx(FLASH_BACKWARD_DQ_Q, abs=0.1)
    # the key side: dk, dv expanded to the query heads (2Q per key token), then summed
    # back to the KV heads; tight prices the expanded pair (2 x CP x Q)
    assert per_key_rank / q_bytes == pytest.approx(2 + 2 * hkv / hq, abs=0.01)


# ------------------------------------------------------------- chunked gated delta rule


def _gdn_backward_rise(n: int, heads: int, d: int) -> int:
    """Bytes the simulator's chunked gated delta rule (the stand-in laid out after
    fla-core 0.6.0's ``chunk_gated_delta_rule_bwd``) holds in backward on top of its saved
    set, the incoming gradient ``do`` included; ``d`` is both the key and the value head
    dim (as on every Qwen3.5 preset)."""
    bf16, f32 = torch.bfloat16, torch.float32
    with FakeTensorMode():
        q, k, v = (torch.empty(n, heads, d, dtype=bf16, requires_grad=True) for _ in range(3))
        g = torch.empty(n, heads, dtype=f32, requires_grad=True)
        beta = torch.empty(n, heads, dtype=bf16, requires_grad=True)
        h0 = torch.empty(heads, d, d, dtype=f32, requires_grad=True)
        with LiveBytesTracker([q, k, v, g, beta, h0]) as tracker:
            o, _final = K.StandInGatedDeltaRule.apply(q, k, v, g, beta, h0)
            tracker.set_phase("backward")
            before = tracker.live
            torch.autograd.backward([o], [torch.empty_like(o)])
            return tracker.peaks["backward"].bytes - before


def _solve(rows: list[list[Fraction]], rhs: list[Fraction]) -> list[Fraction]:
    """Gauss-Jordan elimination, exact."""
    m = [[*row, b] for row, b in zip(rows, rhs, strict=True)]
    size = len(m)
    for col in range(size):
        pivot = next(r for r in range(col, size) if m[r][col] != 0)
        m[col], m[pivot] = m[pivot], m[col]
        m[col] = [x / m[col][col] for x in m[col]]
        for r in range(size):
            if r != col:
                m[r] = [a - m[r][col] * b for a, b in zip(m[r], m[col], strict=True)]
    return [row[-1] for row in m]


def test_gdn_backward_holds_nine_value_widths_and_two_chunk_state_tensors() -> None:
    """``GDN_BACKWARD_WORKSPACE_V``: per token the kernel's backward holds ``a``
    value-width tensors (w, u, v_new, dv_local, dv, dq, dk, dw and the incoming do), ``b``
    chunk-state tensors (one ``dk x dv`` state per chunk and value head: the recomputed
    states and their gradient) and a few bytes per head (the fp32 dg and the dbeta).
    Per token (the difference of two lengths, which drops the per-call initial-state
    gradient), at three head dims: the three coefficients, exactly."""
    heads, lengths, dims = 8, (4096, 8192), (32, 64, 128)
    rows, rhs = [], []
    for d in dims:
        short, long = (_gdn_backward_rise(n, heads, d) for n in lengths)
        per_token = Fraction(long - short, lengths[1] - lengths[0])
        state = Fraction(heads * d * d * BF16, K.CHUNK)  # per token: one per chunk and head
        rows.append([Fraction(heads * d * BF16), state, Fraction(heads)])
        rhs.append(per_token)
    value_widths, chunk_states, bytes_per_head = _solve(rows, rhs)
    assert (value_widths, chunk_states, bytes_per_head) == (9, 2, 4 + 2)
    assert value_widths == GDN_BACKWARD_WORKSPACE_V
    assert K.CHUNK == GDN_CHUNK  # the chunk the states are counted per


# --------------------------------------------------------------------------------- MoE


def _layout() -> RankLayout:
    return RankLayout(TP, 1, 0, (TOKENS,), (TOKENS,), (GdnPiece(TOKENS),), TOKENS, True)


def _moe(model: SimModel, routing: str = "concentrated", compiled: bool = False) -> RankResult:
    rc = Recompute.parse("selective", "core_attn")
    return simulate_rank(model, _layout(), rc, compiled=compiled, ep=EP, routing=routing)


def test_router_keeps_ten_elements_per_routed_slot() -> None:
    """megatron's ``topk_routing_with_score_function`` and the unfused ``permute`` as
    oracles/rank_sim/moe.py restates them keep, per local token and routed slot, the top-k
    indices (int64, saved by ``topk`` and the probs ``scatter``), the fp32 top-k softmax
    and the sorted token indices (int64, saved by ``unpermute``). Measured by raising the
    top-k above the rank's local experts (SMALL: 8 experts over EP 2), where a
    concentrated rank's experts receive the same rows whatever the top-k: every byte the
    extra slots add is the router's."""
    local_experts, extra_slots = SMALL.num_experts // EP, 2
    top_k = (local_experts, local_experts + extra_slots)
    fewer, more = (_moe(replace(SMALL, moe_top_k=k)) for k in top_k)
    assert fewer.expert_rows == more.expert_rows  # the same expert rows
    local_tokens = TOKENS // TP  # the router runs on the local (SP) tokens
    added = more.retained_bytes - fewer.retained_bytes
    per_slot = added / (LAYERS * local_tokens * extra_slots)
    assert per_slot == 20  # bytes: 8 + 4 + 8
    assert per_slot / BF16 == MOE_ROUTER_PER_TOPK


@pytest.mark.parametrize(
    ("compiled", "f_multiple"), [(False, MOE_ROW_EAGER_F), (True, MOE_ROW_COMPILED_F)]
)
def test_expert_row_keeps_its_input_f_multiples_and_four_small_elements(
    compiled: bool, f_multiple: int
) -> None:
    """Per routed expert row the simulator's experts keep ``H + c·F_e + 4`` bf16
    elements: c = 6 eager (megatron's unfused probs-weighted GLU), 3 compiled (the fused
    kernel's set), and 4 besides the H- and F_e-wide tensors (the row's fp32 prob and the
    two rank-1 LoRA activations). Per row = (concentrated - balanced) / the extra rows;
    two expert widths separate the F_e coefficient from the rest."""
    per_row: dict[int, float] = {}
    for fe in (SMALL.expert_ffn, 2 * SMALL.expert_ffn):
        model = replace(SMALL, expert_ffn=fe)
        conc, bal = _moe(model, "concentrated", compiled), _moe(model, "balanced", compiled)
        rows = LAYERS * (conc.expert_rows - bal.expert_rows)
        per_row[fe] = (conc.retained_bytes - bal.retained_bytes) / rows / BF16
    narrow, wide = SMALL.expert_ffn, 2 * SMALL.expert_ffn
    coefficient = (per_row[wide] - per_row[narrow]) / (wide - narrow)
    assert coefficient == f_multiple
    assert per_row[narrow] - coefficient * narrow - SMALL.hidden == MOE_ROW_SMALL


# ------------------------------------------------- a checkpointed MoE backward at EP > TP


class _PeakStorages(LiveBytesTracker):
    """The tracker, remembering the sizes of the storages live at the backward's peak."""

    at_peak: ClassVar[list[int]] = []

    def _add(self, st: torch.UntypedStorage) -> None:
        super()._add(st)
        peak = self.peaks.get("backward")
        if self.phase == "backward" and peak is not None and self.live == peak.bytes:
            _PeakStorages.at_peak = [size for size, _ in self._seen.values()]


def test_a_checkpointed_moe_backward_at_ep_above_tp_holds_four_row_wide_buffers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``MOE_CHECKPOINT_BACKWARD_ROW_H``: with the EP group wider than TP (TP1 CP2 EP2,
    the other CP rank's tokens routed here too) and a ``moe`` checkpoint, the last MoE
    layer's backward peaks with four [rows, H] buffers live: the recomputed dispatched
    input and three of the backward's fresh row buffers. At EP = TP (TP2 EP2 SP) the
    simulator holds the same four, where tight does not price them (its docstring says
    why): this asserts the disagreement it names."""
    from cpmem.pricing.kinds.moe import MOE_CHECKPOINT_BACKWARD_ROW_H
    from oracles.rank_sim import runner

    model = replace(SMALL, hidden=256)  # an H-wide row is 512 B: whole blocks
    monkeypatch.setattr(runner, "LiveBytesTracker", _PeakStorages)
    layout = RankLayout(1, 2, 0, (TOKENS,) * 2, (TOKENS,) * 2, (GdnPiece(TOKENS),), TOKENS, False)
    result = simulate_rank(model, layout, Recompute.parse("selective", "core_attn+moe"), ep=2)
    row_wide = result.expert_rows * model.hidden * BF16
    assert _PeakStorages.at_peak.count(row_wide) == 1 + MOE_CHECKPOINT_BACKWARD_ROW_H
    within = RankLayout(2, 1, 0, (TOKENS,), (TOKENS,), (GdnPiece(TOKENS),), TOKENS, True)
    result = simulate_rank(model, within, Recompute.parse("selective", "core_attn+moe"), ep=2)
    row_wide = result.expert_rows * model.hidden * BF16
    assert _PeakStorages.at_peak.count(row_wide) == 1 + MOE_CHECKPOINT_BACKWARD_ROW_H


# ------------------------------------------ what an MoE layer gathers over TP under SP


def _moe_kept_per_local_token(shared_ffn: int, tp: int, modules: str, **adapters: object) -> float:
    """The simulator's ``moe``-labelled bytes retained after forward, per MoE layer and
    local (SP) token, balanced at EP = TP."""
    model = replace(SMALL, hidden=256, shared_expert_ffn=shared_ffn)  # whole 512-B blocks
    layout = RankLayout(tp, 1, 0, (TOKENS,), (TOKENS,), (GdnPiece(TOKENS),), TOKENS, tp > 1)
    rc = Recompute.parse("selective", modules)
    result = simulate_rank(model, layout, rc, ep=tp, routing="balanced", **adapters)  # type: ignore[arg-type]
    return result.components["retained"]["moe"] / (LAYERS * TOKENS // tp)


def test_an_moe_layer_gathers_over_tp_only_for_its_shared_expert() -> None:
    """``moe.kept_width`` / ``moe.shared_width``: the router and the ``alltoall``
    dispatcher run on the rank's sequence shard, so an MoE layer without a shared expert
    keeps per local token at TP2 under SP exactly what it keeps per token at TP1 (no
    ``H``-wide gathered copy, which a dense layer's LoRA input would add); a shared
    expert's ``fc1`` adapter saves its SP-gathered input (``H`` per global token, two per
    local token at TP2). Under a ``moe`` checkpoint the layer keeps the same with or
    without a shared expert: the gathered copy is recomputed. ``tight``'s
    ``moe.kept_width`` keeps ``2H/s`` on both."""
    from cpmem.model.presets import get_preset
    from cpmem.pricing.kinds import moe

    routed_only = (_moe_kept_per_local_token(0, tp, "core_attn") for tp in (1, 2))
    assert len(set(routed_only)) == 1
    with_shared = {tp: _moe_kept_per_local_token(32, tp, "core_attn") for tp in (1, 2)}
    # per local token the shared SwiGLU's F_s/t set is TP1's; what TP2 adds is gathered:
    # H per global token (2H per local token) and fc1's rank-1 A·x on the gathered rows
    gathered = with_shared[2] - with_shared[1]
    assert gathered == (2 * 256 + 1) * BF16
    checkpointed = {
        (shared, tp): _moe_kept_per_local_token(shared, tp, "core_attn+moe")
        for shared in (0, 32)
        for tp in (1, 2)
    }
    assert len(set(checkpointed.values())) == 1
    # tight: the norm's input and output on the sequence shard, with or without one
    for name in ("qwen3-30b-a3b", "qwen3.5-35b-a3b"):
        geometry = get_preset(name)
        assert moe.kept_width(geometry, 2, True) == geometry.hidden  # 2H/2
        assert moe.kept_width(geometry, 1, False) == 2 * geometry.hidden


@pytest.mark.parametrize(
    ("rank", "dropout", "targets"),
    [(16, 0.0, "all"), (1, 0.0, "qkv,proj,experts"), (4, 0.1, "qkv,fc1"), (8, 0.1, "qkv,fc2")],
)
def test_a_shared_experts_adapters_keep_what_tight_adds_for_them(
    rank: int, dropout: float, targets: str
) -> None:
    """``adapters.extra_width(..., "shared")``: a shared expert's ``fc1`` / ``fc2``
    adapters keep ``r - 1`` more values per token each, a dropout mask of their input,
    and give back what the harness's rank-1 adapter pinned where a target is dropped
    (fc1: its gathered input; fc2: the SwiGLU's output). The shared expert's part is the
    simulator's MoE layer with it less without it, at TP2 SP; per global token. The
    row-parallel ``fc2`` adapter's R-wide partial is reduce-scattered under SP, so the
    simulator keeps it per local token where ``tight`` counts it whole, as on a dense
    MLP's ``fc2``: ``(1 - 1/s)`` of it, the one difference."""
    from cpmem.model.presets import get_preset
    from cpmem.pricing import adapters
    from cpmem.step.trainer import Adapter

    def shared_part(**step: object) -> float:
        kept = [_moe_kept_per_local_token(f, 2, "core_attn", **step) for f in (32, 0)]
        return (kept[0] - kept[1]) / 2 / BF16  # per global token, elements

    step = {"lora_rank": rank, "lora_dropout": dropout, "lora_targets": targets}
    got = shared_part(**step) - shared_part()
    # extra_width("shared") reads H and F_s only: the simulator's, on an MoE preset
    geometry = replace(get_preset("qwen3.5-35b-a3b"), hidden=256, shared_expert_ffn=32)
    adapter = Adapter(rank, dropout, targets)
    fc2_partial = (adapter.rank - 1) if adapter.adapts("fc2") else -1  # the pinned rank-1
    assert adapters.extra_width(geometry, adapter, 2, "shared", sp=True) == got + fc2_partial / 2


@pytest.mark.parametrize(
    ("rank", "dropout", "targets"),
    [(16, 0.0, "all"), (64, 0.0, "qkv,experts"), (8, 0.1, "all"), (1, 0.0, "qkv,fc1,fc2")],
)
def test_expert_adapters_keep_what_tight_adds_per_routed_row(
    rank: int, dropout: float, targets: str
) -> None:
    """``adapters.extra_width(..., "expert")`` per routed row: each routed expert's fc1
    and fc2 adapters keep ``r - 1`` more values per row each and, with dropout, a bool
    mask of their inputs (``H`` and ``F_e``); experts left without adapters give back the
    harness's two rank-1 activations. Per row = (concentrated - balanced) / the extra
    rows, as ``MOE_ROW_SMALL`` is read, with the step's adapters less the harness's."""
    from cpmem.model.presets import get_preset
    from cpmem.pricing import adapters
    from cpmem.step.trainer import Adapter

    model = replace(SMALL, hidden=256, shared_expert_ffn=0)

    def per_row(**step: object) -> float:
        rc = Recompute.parse("selective", "core_attn")
        layout = _layout()
        run = {
            r: simulate_rank(model, layout, rc, ep=EP, routing=r, **step)
            for r in ("concentrated", "balanced")
        }  # type: ignore[arg-type]
        rows = LAYERS * (run["concentrated"].expert_rows - run["balanced"].expert_rows)
        return (run["concentrated"].retained_bytes - run["balanced"].retained_bytes) / rows / BF16

    got = per_row(lora_rank=rank, lora_dropout=dropout, lora_targets=targets) - per_row()
    geometry = replace(get_preset("qwen3-30b-a3b"), hidden=256, expert_ffn=model.expert_ffn)
    assert adapters.extra_width(geometry, Adapter(rank, dropout, targets), TP, "expert") == got
