"""Oracle widths next to cpmem's reference widths, per model, layer kind and mode (TP1).

The comparison, not an oracle: it lives with the tests because it imports cpmem.
Widths are bf16 elements per token per layer (bytes / 2 / tokens), measured under
FakeTensorMode at the presets' real widths, one sub-layer per row.

Run: ``python -m tests.oracle.width_table`` (``nox -s oracle`` prints it through the tests).
"""

from __future__ import annotations

from dataclasses import dataclass

from oracles.megatron_layer import measure_megatron
from oracles.saved_tensors import GEOMETRIES, Measurement, OracleGeometry, measure_reference

SEQ = 1024  # tokens per measured forward; only the non-flash local attention depends on it


@dataclass(frozen=True)
class Row:
    """One comparison: oracle width (total, and without small terms) vs the reference."""

    model: str
    kind: str  # attention | gdn | mlp | layer
    mode: str  # recompute setting
    impl: str  # which oracle path measured it
    total: float  # every saved storage
    bulk: float  # without storages narrower than hidden/8 per token
    reference: int
    reference_term: str  # which reference width (or combination) it is compared with

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.model, self.kind, self.mode, self.impl)

    @property
    def relation(self) -> str:
        """== bulk equals the reference; >= reference covers everything; < it does not."""
        if self.bulk == self.reference:
            return "=="
        if self.reference >= self.total:
            return ">="
        if self.reference < self.bulk:
            return "<"
        return "~"  # between bulk and total: only the small terms are uncovered


# Why each non-equal row differs (the comparison's notes; the tests keep their own table).
# Keyed by (kind, mode, impl), then (kind, impl). Q, KV, K, V, H, F as in pricing.md.
REASONS: dict[tuple[str, ...], str] = {
    ("attention", "torch-sdpa"): "flash output is (b,s,h,d), so head merge is a view: kernel "
    "output = gate/o-proj input, one storage (gated 6Q+3KV, ungated 3Q+3KV; ref 7Q/5Q+3KV)",
    ("gdn", "torch-fused-kernel/repeat-qk"): "envelope: q,k,v,z share storages with the "
    "projection/conv outputs; 4K+7V+66Vh (A: 64 per value head) < 4K+8V",
    ("gdn", "torch-fused-kernel/grouped-qk"): "kernel takes grouped q,k (views of the conv "
    "output), no repeated copies: 2V below megatron's repeat",
    ("mlp", "torch-unfused"): "F.silu saves its input, not a sigmoid: 4F; ref prices 5F",
    ("attention", "megatron-local"): "non-flash local attention keeps s x s scores (fp32 "
    "softmax input, bf16 probs, bool mask); CPU torch rms_norm saves fp32 input copies",
    ("attention", "selective-core_attn", "megatron-local"): "CPU torch rms_norm saves fp32 "
    "copies of the norm, q-norm and k-norm inputs",
    ("attention", "none", "megatron-local+fused-norm"): "non-flash local attention keeps the "
    "s x s scores (grows with seq)",
    ("attention", "selective-core_attn", "megatron-local+fused-norm"): "fused qkv storage "
    "(Q+2KV) + q copy + roped q,k + core output: 4Q+3KV, no gate; ref 5Q+3KV",
    ("mlp", "megatron-local"): "CPU torch rms_norm saves an fp32 copy of its input (+H)",
    ("mlp", "selective-mlp", "megatron-local+fused-norm"): "local spec keeps "
    "pre_mlp_layernorm outside the checkpoint: its input and output (2H) stay; ref prices H "
    "(TE fuses the norm into fc1 and the checkpoint keeps only the residual)",
    ("layer", "full", "megatron-local+fused-norm"): "full recompute keeps the layer input (H) "
    "and the fp32 rope table (one storage all layers share); the ref keeps H per layer plus "
    "one layer's recompute workspace, counted here as 1/L of it per layer",
}


def reason_for(row: Row) -> str:
    if row.relation == "==":
        return "exact; small terms are fp32 rstd/lse, rank-1 LoRA, rope tables"
    return REASONS.get((row.kind, row.mode, row.impl)) or REASONS.get(
        (row.kind, row.impl), "(no note)"
    )


def _cpmem_widths(name: str):  # type: ignore[no-untyped-def]
    from cpmem.model.presets import PRESETS
    from cpmem.plan.layout import ParallelLayout
    from cpmem.pricing.reference import layer_widths

    return layer_widths(PRESETS[name], ParallelLayout())


def _row(
    model: str,
    kind: str,
    mode: str,
    impl: str,
    m: Measurement,
    label: str | None,
    ref: int,
    term: str,
) -> Row:
    return Row(model, kind, mode, impl, m.width(label), m.bulk_width(label), ref, term)


def compute_rows(seq: int = SEQ, models: tuple[str, ...] | None = None) -> list[Row]:
    """Every comparison row at TP1 (no SP)."""
    rows: list[Row] = []
    for name in models or tuple(GEOMETRIES):
        geo: OracleGeometry = GEOMETRIES[name]
        ref = _cpmem_widths(name)
        m = measure_reference(geo, "attention", seq)
        rows.append(
            _row(name, "attention", "none", "torch-sdpa", m, None, ref.of("attention"), "attention")
        )
        if geo.gdn_key_heads:
            for impl, variant in (
                ("torch-fused-kernel/repeat-qk", ""),
                ("torch-fused-kernel/grouped-qk", "no-repeat"),
            ):
                m = measure_reference(geo, "gdn", seq, variant=variant)
                rows.append(_row(name, "gdn", "none", impl, m, None, ref.of("gdn"), "gdn"))
        if ref.of("dense"):  # dense MLP models only (the MoE preset has none)
            variants = ["fused"] if geo.fused_swiglu else ["unfused", "unfused-sigmoid"]
            for act in variants:
                m = measure_reference(geo, "mlp", seq, variant=act)
                rows.append(
                    _row(name, "mlp", "none", f"torch-{act}", m, None, ref.of("dense"), "mlp")
                )
        if not geo.gated_attention:  # megatron's local spec builds the ungated dense layer
            rows += _megatron_rows(name, geo, ref, seq)
    return rows


def _megatron_rows(name: str, geo: OracleGeometry, ref, seq: int) -> list[Row]:  # type: ignore[no-untyped-def]
    rows: list[Row] = []
    for fused, impl in ((False, "megatron-local"), (True, "megatron-local+fused-norm")):
        for mode in ("none", "selective-core_attn"):
            m = measure_megatron(geo, mode, seq, fused_norm=fused)
            rows.append(
                _row(
                    name, "attention", mode, impl, m, "attention", ref.of("attention"), "attention"
                )
            )
            if mode == "none":
                rows.append(_row(name, "mlp", mode, impl, m, "mlp", ref.of("dense"), "mlp"))
        if fused:
            m = measure_megatron(geo, "selective-mlp", seq, fused_norm=True)
            rows.append(
                _row(
                    name, "mlp", "selective-mlp", impl, m, "mlp", ref.layer_input, "mlp - (mlp - H)"
                )
            )
            m = measure_megatron(geo, "full", seq, fused_norm=True)
            # the reference keeps H per layer plus one layer's recompute workspace,
            # here spread over the layers: H + (attention + mlp) / L per layer
            from cpmem.model.presets import PRESETS

            layers = PRESETS[name].layers
            full_ref = ref.layer_input + (ref.of("attention") + ref.of("dense")) // layers
            rows.append(
                _row(name, "layer", "full", impl, m, None, full_ref, "H + (attention + mlp) / L")
            )
    return rows


def format_table(
    rows: list[Row], reasons: dict[tuple[str, str, str, str], str] | None = None
) -> str:
    """Aligned text table; ``reasons`` (by row key) overrides the notes above."""
    head = (
        "model",
        "kind",
        "mode",
        "oracle path",
        "oracle",
        "bulk",
        "reference",
        "ref term",
        "rel",
        "reason",
    )
    body = [
        (
            r.model,
            r.kind,
            r.mode,
            r.impl,
            f"{r.total:.1f}",
            f"{r.bulk:.1f}",
            str(r.reference),
            r.reference_term,
            r.relation,
            (reasons or {}).get(r.key) or reason_for(r),
        )
        for r in rows
    ]
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head) - 1)]
    lines = []
    for line in [head, *body]:
        cells = [
            c.rjust(w) if i in (4, 5, 6) else c.ljust(w)
            for i, (c, w) in enumerate(zip(line[:-1], widths, strict=True))
        ]
        lines.append("  ".join([*cells, line[-1]]))
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def main() -> None:
    rows = compute_rows()
    print(f"Saved-tensor oracle vs reference widths, TP1, seq {SEQ}, bf16 elements/token/layer")
    print("oracle = every saved storage; bulk = without storages narrower than hidden/8")
    print(format_table(rows))


if __name__ == "__main__":
    main()
