"""Rank simulator's GDN kernel taken from fla-core's own autograd function.

Where fla imports (``nox -s simulate_fla``: fla-core 0.6.0 + triton on CPU), the fla
path's saved set is what fla's ``ChunkGatedDeltaRuleFunction`` saves and the simulator
picks it; in the default environment (no fla) those tests skip and the flag's refusal
is checked instead.
"""

from __future__ import annotations

import inspect
import warnings

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from oracles.rank_sim import fla_kernel as FK  # noqa: E402
from oracles.rank_sim import kernels as K  # noqa: E402
from oracles.rank_sim.__main__ import main  # noqa: E402
from oracles.rank_sim.geometry import SimInputError, get_model  # noqa: E402
from oracles.rank_sim.layout import GdnPiece, RankLayout  # noqa: E402
from oracles.rank_sim.recompute import Recompute  # noqa: E402
from oracles.rank_sim.runner import simulate_rank  # noqa: E402

warnings.filterwarnings("ignore")

FLA, WHY = FK.importable()
needs_fla = pytest.mark.skipif(not FLA, reason=f"fla-core not importable: {WHY}")
BF16, F32 = torch.bfloat16, torch.float32


@pytest.fixture(autouse=True)
def _restore_selection():
    yield
    K.select_gdn_kernel("auto")  # what the import chose (no RANK_SIM_GDN_KERNEL in tests)


def _layout(tokens: int, pieces: tuple[GdnPiece, ...] | None = None) -> RankLayout:
    return RankLayout(1, 1, 0, (tokens,), (tokens,), pieces or (GdnPiece(tokens),), tokens, True)


def _saved(kernel, n: int, h: int = 4, hk: int = 2, d: int = 32) -> list[tuple]:
    """What ``kernel`` saves for backward, inputs built as the GDN layer builds them."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    seen: list[tuple] = []
    with FakeTensorMode():
        leaf = torch.empty(n, 2 * hk * d + h * d, dtype=BF16, requires_grad=True)
        qkv = leaf * 1  # the conv output
        q, k, v = qkv.split([hk * d, hk * d, h * d], -1)
        q = q.reshape(n, hk, d).repeat_interleave(h // hk, dim=1)
        k = k.reshape(n, hk, d).repeat_interleave(h // hk, dim=1)
        v = v.reshape(n, h, d)
        g = torch.empty(n, h, dtype=F32, requires_grad=True) * 1
        beta = torch.sigmoid(torch.empty(n, h, dtype=BF16, requires_grad=True))
        h0 = torch.zeros(h, d, d, dtype=F32)

        def pack(t):
            seen.append((tuple(t.shape), t.dtype, t.is_contiguous()))
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            o, fin = kernel.apply(q, k, v, g, beta, h0)
        assert o.shape == (n, h, d) and fin.shape == (h, d, d) and fin.dtype == F32
        o.backward(torch.empty_like(o))
        assert leaf.grad is not None and leaf.grad.shape == leaf.shape
    return seen


def test_fla_flag_without_fla_is_one_line_naming_the_flag(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    if FLA:  # where fla imports, make it look absent
        monkeypatch.setattr(FK, "importable", lambda: (False, "ModuleNotFoundError: fla"))
    before = K.GDN_KERNEL
    rc = main(["--model", "qwen3.5-4b", "--rank-tokens", "128", "--gdn-kernel", "fla"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err
    assert err.startswith("error: gdn_kernel='fla'") and "--gdn-kernel" in err
    assert before == K.GDN_KERNEL  # nothing switched
    with pytest.raises(SimInputError, match="gdn_kernel"):
        K.select_gdn_kernel("triton")


def test_auto_is_the_stand_in_where_fla_does_not_import(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(FK, "importable", lambda: (False, "ModuleNotFoundError: fla"))
    assert K.select_gdn_kernel("auto") == "stand-in"
    assert K.GatedDeltaRule is K.StandInGatedDeltaRule
    r = simulate_rank(get_model("qwen3.5-4b").truncated(1), _layout(128), Recompute.parse("none"))
    assert r.as_dict()["gdn_kernel"] == "stand-in"


@needs_fla
def test_fla_saves_what_its_autograd_function_saves() -> None:
    from fla.ops.gated_delta_rule.chunk import ChunkGatedDeltaRuleFunction

    # fla-core 0.6.0, fla/ops/gated_delta_rule/chunk.py, ChunkGatedDeltaRuleFunction.forward
    src = inspect.getsource(ChunkGatedDeltaRuleFunction.forward)
    args = src.split("ctx.save_for_backward(")[1].split(")")[0]
    names = [a.strip() for a in args.split(",") if a.strip()]
    assert names == ["q", "q_rstd", "k", "k_rstd", "v", "g", "beta_raw", "beta", "A",
                     "initial_state", "cu_seqlens", "chunk_indices", "g_input", "A_log",
                     "dt_bias"]  # fmt: skip
    n, h, d = 200, 4, 32  # 200 tokens: 4 chunks of 64, the last partial
    saved = _saved(FK.FlaGatedDeltaRule, n, h=h, d=d)
    # one batch row; cu_seqlens, chunk_indices, g_input, A_log, dt_bias are None (not
    # packed); beta_raw is beta (no sigmoid in kernel); q, k: fla's l2-normalised copies
    assert saved == [
        ((1, n, h, d), BF16, True),  # q (l2norm_fwd output)
        ((1, n, h), F32, True),  # q_rstd
        ((1, n, h, d), BF16, True),  # k (l2norm_fwd output)
        ((1, n, h), F32, True),  # k_rstd
        ((1, n, h, d), BF16, True),  # v: input_guard's contiguous copy of the layer's view
        ((1, n, h), F32, True),  # g: chunk_local_cumsum output, fp32
        ((1, n, h), BF16, True),  # beta_raw
        ((1, n, h), BF16, True),  # beta (the same tensor)
        ((1, n, h, 64), BF16, True),  # A: (I + A)^-1 per 64-token chunk, k's dtype
        ((1, h, d, d), F32, True),  # initial_state
    ]
    # the stand-in saves the same sizes, except that its v is the layer's view (of the
    # conv output) and q/k are the layer's tensors, not copies
    stand = _saved(K.StandInGatedDeltaRule, n, h=h, d=d)
    assert [s[:2] for s in stand] == [
        ((n, h, d), BF16), ((n, h), F32), ((n, h, d), BF16), ((n, h), F32),
        ((n, h, d), BF16), ((n, h), F32), ((n, h), BF16), ((n, h, 64), BF16),
        ((h, d, d), F32),
    ]  # fmt: skip
    assert not stand[4][2]  # the view


@needs_fla
def test_simulator_picks_fla_and_nothing_leaks() -> None:
    from triton.runtime.jit import KernelInterface

    original = KernelInterface.__getitem__
    label = K.select_gdn_kernel("auto")
    assert label == f"fla-core {FK.version()}" and K.GatedDeltaRule is FK.FlaGatedDeltaRule
    FK.LAUNCHES.clear()
    pieces = (GdnPiece(96), GdnPiece(64, parent=0), GdnPiece(96))
    model = get_model("qwen3.5-4b").truncated(4)  # 3 GDN layers, 1 attention
    r = simulate_rank(model, _layout(256, pieces), Recompute.parse("selective", "core_attn"))
    assert r.as_dict()["gdn_kernel"] == label
    assert {"l2norm_fwd_kernel", "chunk_gated_delta_rule_fwd_kernel_h_blockdim64",
            "chunk_fwd_kernel_o", "chunk_gated_delta_rule_bwd_kernel_dhu_blockdim64",
            "prepare_wy_repr_bwd_kernel"} <= set(FK.LAUNCHES)  # fmt: skip
    assert FK.LAUNCHES.count("chunk_fwd_kernel_o") == 3 * 3  # 3 layers x 3 pieces
    assert not FK.launches_patched() and KernelInterface.__getitem__ is original
    # full recompute re-runs the forward inside backward: the scope nests
    r = simulate_rank(model, _layout(256), Recompute.parse("full"))
    assert not FK.launches_patched() and KernelInterface.__getitem__ is original


@needs_fla
def test_fla_keeps_less_than_the_stand_in_by_the_conv_output_it_frees() -> None:
    """Per GDN layer fla keeps a contiguous copy of v (value width) where the stand-in's
    v view keeps the whole conv output (q, k and v widths) alive: 2 x key width x 2 bytes
    per token less; the forward peak rises by fla's new q/k/v copies."""
    m = get_model("qwen3.5-4b")
    kw = m.gdn_key_heads * m.gdn_key_dim
    n = 512
    rc = Recompute.parse("none")
    out = {}
    for kern in ("stand-in", "fla"):
        K.select_gdn_kernel(kern)
        one = simulate_rank(m.truncated(1), _layout(n), rc)
        two = simulate_rank(m.truncated(2), _layout(n), rc)
        out[kern] = two.retained_bytes - one.retained_bytes
    assert out["stand-in"] - out["fla"] == n * 2 * kw * 2


@needs_fla
def test_cli_flag_chooses_per_run(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    argv = ["--model", "qwen3.5-4b", "--rank-tokens", "128", "--layers", "1", "--json"]
    for flag, want in (("stand-in", "stand-in"), ("fla", f"fla-core {FK.version()}")):
        assert main([*argv, "--gdn-kernel", flag]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["provenance"]["gdn_kernel"] == want == out["ranks"][0]["gdn_kernel"]
        assert out["provenance"]["fla"] == FK.version()
