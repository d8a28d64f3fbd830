"""Saved-tensor oracle: self-consistency, then the documented relation to the reference widths.

The expected relation of every row, and the reason for every difference, is written
below by hand (EXPECTED); nothing here derives it from the code under test. A row the
table does not list, or a listed row that is not measured, fails.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

# `oracles/` is a top-level folder beside `cpmem/`, not an installed package.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from oracles import megatron_layer as mg  # noqa: E402
from oracles import saved_tensors as st  # noqa: E402

SMALL_SEQ = 128  # real-tensor checks: widths divided by 8, one 128-token sequence
SCALE = 8

# (geometry, kind, variant) of every pure-torch reference layer.
REFERENCE_LAYERS = [
    ("qwen3.5-27b", "attention", ""),  # gated, GQA
    ("qwen3-1.7b", "attention", ""),  # ungated
    ("qwen3.5-4b", "gdn", ""),  # q/k repeated to the value heads (megatron)
    ("qwen3.5-4b", "gdn", "no-repeat"),  # grouped q/k into the kernel
    ("qwen3.5-27b", "mlp", "fused"),
    ("qwen3-1.7b", "mlp", "unfused"),
    ("qwen3-1.7b", "mlp", "unfused-sigmoid"),
]
IDS = [f"{g}-{k}-{v or 'default'}" for g, k, v in REFERENCE_LAYERS]


# --------------------------------------------------------------------------- (a) and (b)


@pytest.mark.parametrize(("model", "kind", "variant"), REFERENCE_LAYERS, ids=IDS)
def test_hooks_agree_with_live_storages(model: str, kind: str, variant: str) -> None:
    """Real tensors: the storages alive after forward are exactly the hooked ones."""
    geo = st.GEOMETRIES[model].scaled(SCALE)
    m = st.measure_reference(geo, kind, SMALL_SEQ, variant=variant, fake=False, track_live=True)
    assert m.bytes() > 0
    assert m.live_keys == set(m.records), "live storages differ from saved storages"
    assert m.live_bytes == m.bytes(), f"live {m.live_bytes} B != saved {m.bytes()} B"


@pytest.mark.parametrize(("model", "kind", "variant"), REFERENCE_LAYERS, ids=IDS)
def test_fake_agrees_with_real(model: str, kind: str, variant: str) -> None:
    """FakeTensorMode saves the same storages (sizes, dtypes, shapes) as real tensors."""
    geo = st.GEOMETRIES[model].scaled(SCALE)
    real = st.measure_reference(geo, kind, SMALL_SEQ, variant=variant, fake=False)
    fake = st.measure_reference(geo, kind, SMALL_SEQ, variant=variant, fake=True)

    def shape_set(m: st.Measurement) -> list[tuple[int, str, tuple[int, ...]]]:
        return sorted((r.nbytes, str(r.dtype), r.shape) for r in m.records.values())

    assert fake.bytes() == real.bytes()
    assert shape_set(fake) == shape_set(real)


@pytest.mark.parametrize(("model", "kind", "variant"), REFERENCE_LAYERS, ids=IDS)
def test_saved_set_suffices_for_backward(model: str, kind: str, variant: str) -> None:
    """The custom kernels' saved sets are enough to run backward (adapter grads finite)."""
    geo = st.GEOMETRIES[model].scaled(SCALE)
    torch.manual_seed(0)
    layer = st.build_reference_layer(geo, kind, variant)
    x = torch.randn(1, 64, geo.hidden, dtype=st.BF16, requires_grad=True)
    layer(x).float().pow(2).mean().backward()
    grads = [p.grad for n, p in layer.named_parameters() if n.endswith(("lora_a", "lora_b"))]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_hook_counts_each_storage_once_and_skips_parameters() -> None:
    """Two views of one storage count once; a saved parameter does not count."""
    w = torch.nn.Parameter(torch.randn(4, 4))
    x = torch.randn(8, 4, requires_grad=True)
    counter = st.SavedTensorCounter(exclude=st.storage_keys([w]))
    with counter():
        y = x * 2
        (y[:4] * y[4:]).sum()  # saves two views of y's storage
        x @ w  # saves x and the parameter
    assert counter.bytes() == y.untyped_storage().nbytes() + x.untyped_storage().nbytes()


# --------------------------------------------------------------------------- (c) relations

# Every row of the comparison at TP1, seq 1024, bf16 elements per token per layer.
# relation: "==" the oracle's bulk (storages at least hidden/8 wide per token) equals the
#           reference exactly and the small terms stay under 2% of it;
#           ">=" the reference covers every saved byte (an envelope);
#           "<"  the reference prices less than the oracle's bulk (an under-count, with
#           its reason).
# Letters: H hidden, F ffn, Q/KV attention widths, K/V GDN widths (docs/pricing.md).
EXPECTED: dict[tuple[str, str, str, str], tuple[str, str]] = {
    # Output-gated attention with a flash-style kernel: 2H + 6Q + 3KV. The kernel's
    # (b,s,h,d) output makes the head merge a view, so the gate multiply's input and the
    # kernel output are one storage; the reference prices 7Q.
    ("qwen3.5-27b", "attention", "none", "torch-sdpa"): (">=", "gated flash: 6Q+3KV <= 7Q+3KV"),
    ("qwen3.5-4b", "attention", "none", "torch-sdpa"): (">=", "gated flash: 6Q+3KV <= 7Q+3KV"),
    ("qwen3.5-35b-a3b", "attention", "none", "torch-sdpa"): (">=", "gated flash: 6Q+3KV <= 7Q+3KV"),
    # Ungated: q-proj output, roped q, kernel output (= o-proj input): 3Q + 3KV vs 5Q.
    ("qwen3-1.7b", "attention", "none", "torch-sdpa"): (">=", "ungated flash: 3Q+3KV <= 5Q+3KV"),
    # GDN with megatron's q/k repeat: 2H + 4K + 7V + 66Vh (A: 64 per value head; beta and
    # gate logits ride in the projection output) + small.
    # The reference 4K + 8V is an envelope (slack V - 66Vh: about V/2 here).
    ("qwen3.5-27b", "gdn", "none", "torch-fused-kernel/repeat-qk"): (
        ">=",
        "fused GDN saved set 4K+7V+66Vh <= 4K+8V",
    ),
    ("qwen3.5-4b", "gdn", "none", "torch-fused-kernel/repeat-qk"): (
        ">=",
        "fused GDN saved set 4K+7V+66Vh <= 4K+8V",
    ),
    ("qwen3.5-35b-a3b", "gdn", "none", "torch-fused-kernel/repeat-qk"): (
        ">=",
        "fused GDN saved set 4K+7V+66Vh <= 4K+8V",
    ),
    # Grouped q/k into the kernel: no repeated copies, 2V less.
    ("qwen3.5-27b", "gdn", "none", "torch-fused-kernel/grouped-qk"): (
        ">=",
        "no q/k repeat: 4K+5V+66Vh",
    ),
    ("qwen3.5-4b", "gdn", "none", "torch-fused-kernel/grouped-qk"): (
        ">=",
        "no q/k repeat: 4K+5V+66Vh",
    ),
    ("qwen3.5-35b-a3b", "gdn", "none", "torch-fused-kernel/grouped-qk"): (
        ">=",
        "no q/k repeat: 4K+5V+66Vh",
    ),
    # Fused SwiGLU: norm input + norm output + (gate‖up) + product = 2H + 3F exactly.
    ("qwen3.5-27b", "mlp", "none", "torch-fused"): ("==", "fused SwiGLU 2H+3F"),
    ("qwen3.5-4b", "mlp", "none", "torch-fused"): ("==", "fused SwiGLU 2H+3F"),
    # Unfused with F.silu keeps gate, up, silu, product: 4F; spelled x·sigmoid(x) it also
    # keeps the sigmoid: 5F, the reference's count.
    ("qwen3-1.7b", "mlp", "none", "torch-unfused"): (">=", "F.silu saves its input only: 4F"),
    ("qwen3-1.7b", "mlp", "none", "torch-unfused-sigmoid"): ("==", "x·sigmoid(x) SwiGLU: 5F"),
    # megatron-core 0.16 local spec on CPU, as built (torch norms).
    ("qwen3-1.7b", "attention", "none", "megatron-local"): (
        "<",
        "non-flash local attention keeps s×s scores; CPU rms_norm keeps fp32 copies",
    ),
    ("qwen3-1.7b", "attention", "selective-core_attn", "megatron-local"): (
        "<",
        "CPU torch rms_norm keeps fp32 copies of norm/q-norm/k-norm inputs",
    ),
    ("qwen3-1.7b", "mlp", "none", "megatron-local"): (
        "<",
        "CPU torch rms_norm keeps an fp32 copy of its input (+H)",
    ),
    # The same layer with the norms replaced by the fused-kernel contract (GPU-like).
    ("qwen3-1.7b", "attention", "none", "megatron-local+fused-norm"): (
        "<",
        "non-flash local attention keeps the s×s scores",
    ),
    ("qwen3-1.7b", "attention", "selective-core_attn", "megatron-local+fused-norm"): (
        ">=",
        "fused qkv storage + q copy + roped q,k + output: 4Q+3KV <= 5Q+3KV",
    ),
    # megatron's GLU adds glu_linear_offset to the linear half: one more F-wide storage,
    # so the unfused megatron MLP keeps exactly 2H + 5F.
    ("qwen3-1.7b", "mlp", "none", "megatron-local+fused-norm"): ("==", "megatron GLU: 2H+5F"),
    ("qwen3-1.7b", "mlp", "selective-mlp", "megatron-local+fused-norm"): (
        "<",
        "local spec: pre-MLP norm outside the checkpoint keeps 2H; ref prices H",
    ),
    ("qwen3-1.7b", "layer", "full", "megatron-local+fused-norm"): (
        ">=",
        "full recompute keeps H + rope table; ref keeps H + one layer's workspace / L",
    ),
}


@pytest.fixture(scope="module")
def rows():  # type: ignore[no-untyped-def]
    pytest.importorskip("megatron.core")
    width_table = pytest.importorskip("tests.oracle.width_table")
    t0 = time.perf_counter()
    out = width_table.compute_rows()
    print(f"\n[oracle] {len(out)} rows in {time.perf_counter() - t0:.1f} s")
    return out


def test_table_lists_every_row(rows) -> None:  # type: ignore[no-untyped-def]
    measured = {r.key for r in rows}
    assert measured == set(EXPECTED), (
        f"unlisted rows: {sorted(measured - set(EXPECTED))}; "
        f"unmeasured rows: {sorted(set(EXPECTED) - measured)}"
    )


def _holds(relation: str, row) -> bool:  # type: ignore[no-untyped-def]
    if relation == "==":
        return row.bulk == row.reference and row.total - row.bulk <= 0.02 * row.reference
    if relation == ">=":
        return row.reference >= row.total
    if relation == "<":
        return row.reference < row.bulk
    raise AssertionError(f"unknown relation {relation!r}")


def test_documented_relations_hold(rows) -> None:  # type: ignore[no-untyped-def]
    from tests.oracle.width_table import format_table

    reasons = {k: f"[expected {rel}] {why}" for k, (rel, why) in EXPECTED.items()}
    print("\nSaved-tensor oracle vs cpmem reference widths (TP1, seq 1024, bf16 el/token)")
    print(format_table(rows, reasons))
    failures = [
        f"{r.key}: expected {EXPECTED[r.key][0]} ({EXPECTED[r.key][1]}), got oracle "
        f"{r.total:.1f} (bulk {r.bulk:.1f}) vs reference {r.reference}"
        for r in rows
        if r.key in EXPECTED and not _holds(EXPECTED[r.key][0], r)
    ]
    assert not failures, "\n".join(failures)


def test_every_difference_has_a_reason() -> None:
    for key, (relation, reason) in EXPECTED.items():
        assert relation in ("==", ">=", "<"), key
        assert reason.strip(), f"{key} has no reason"


# --------------------------------------------------------------------------- (d) megatron


def test_megatron_recompute_modes_order() -> None:
    """Local spec on CPU, as built: full < core_attn+mlp < mlp < core_attn <= none."""
    pytest.importorskip("megatron.core")
    geo = st.GEOMETRIES["qwen3-1.7b"]
    w = {mode: mg.measure_megatron(geo, mode, 512).width() for mode in mg.MEGATRON_MODES}
    print(
        "\n[megatron local, qwen3-1.7b widths, seq 512] "
        + ", ".join(f"{k}={v:.0f}" for k, v in w.items())
    )
    assert w["full"] < w["selective-core_attn+mlp"] < w["selective-mlp"]
    assert w["selective-mlp"] < w["selective-core_attn"] <= w["none"]
    assert w["selective-core_attn+mlp"] < w["selective-core_attn"]


def test_megatron_fake_agrees_with_real_small() -> None:
    """A small megatron layer saves the same bytes with real and fake tensors, every mode."""
    pytest.importorskip("megatron.core")
    geo = st.GEOMETRIES["qwen3-1.7b"].scaled(SCALE)
    for mode in mg.MEGATRON_MODES:
        real = mg.measure_megatron(geo, mode, SMALL_SEQ, fake=False)
        fake = mg.measure_megatron(geo, mode, SMALL_SEQ, fake=True)
        assert real.bytes() == fake.bytes() > 0, mode
