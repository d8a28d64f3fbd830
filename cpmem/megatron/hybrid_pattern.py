"""A hybrid model's layer pattern as megatron-core reads it (``--hybrid-layer-pattern``).

megatron-core 0.16 at the recordings' snapshot
(``megatron/core/models/hybrid/hybrid_layer_allocation.py``): one symbol per layer, each a
layer of one sub-layer with its own input norm (``hybrid_layer_specs.hybrid_stack_spec``):

- ``M`` a Mamba-2 mixer (``MambaLayer``), ``G`` a Gated DeltaNet mixer, ``*`` self-attention,
  ``+`` multi-latent attention (it turns ``--multi-latent-attention`` on,
  ``arguments.py:919-923``), ``-`` a dense MLP (``MLPLayer``), ``E`` an MoE block
  (``MoETransformerLayer``); ``D`` (DeepSeek sparse attention, its indexer) is a symbol
  cpmem does not price;
- ``|`` cuts the main pattern into pipeline segments: segment ``v x PP + p`` is virtual
  stage ``v`` of pipeline rank ``p`` (``select_pipeline_segment``);
- ``/`` ends the main pattern; each pattern after it is one multi-token-prediction depth,
  and all must be the same (``parse_hybrid_pattern``).

``parse_hybrid_pattern`` returns the pattern or every problem it has, each with
megatron-core's reason.
"""

from __future__ import annotations

from dataclasses import dataclass

from cpmem.model.geometry import MixerKind, MlpKind

PIPE = "|"
MTP_SEPARATOR = "/"

SYMBOLS: dict[str, tuple[MixerKind, MlpKind]] = {
    "M": ("mamba", "none"),
    "G": ("gdn", "none"),
    "*": ("attention", "none"),
    "+": ("attention", "none"),
    "-": ("none", "dense"),
    "E": ("none", "moe"),
}
"""Each priced symbol's layer: its mixer and its feed-forward block (``+`` is latent
attention: the model's MLA fields say so)."""

UNPRICED_SYMBOLS = {
    "D": "DeepSeek sparse attention (DSAttention and its DSAIndexer, hybrid_layer_specs.py "
    "dsa_layer): its indexer's projections and scores are not priced",
}
"""Symbols megatron-core builds that cpmem does not price, with the reason."""

VALID = frozenset(SYMBOLS) | frozenset(UNPRICED_SYMBOLS)
"""megatron-core's ``Symbols.VALID_LAYERS``."""


@dataclass(frozen=True)
class HybridPattern:
    """A parsed pattern: the main stack's symbols, its pipeline segments' layer counts
    (one entry without ``|``), and one MTP depth's symbols with the number of depths."""

    main: str
    segments: tuple[int, ...]
    mtp: str
    depths: int

    @property
    def piped(self) -> bool:
        """Whether ``|`` cuts the main pattern (the pipeline is the pattern's)."""
        return len(self.segments) > 1

    def layers(self, symbols: str) -> tuple[tuple[MixerKind, ...], tuple[MlpKind, ...]]:
        """The mixers and feed-forward kinds of ``symbols``, one layer each."""
        kinds = [SYMBOLS[s] for s in symbols]
        return tuple(k[0] for k in kinds), tuple(k[1] for k in kinds)


def _symbol_problems(pattern: str, name: str, allow_pipe: bool) -> list[str]:
    """megatron-core's ``_validate_pattern``: unknown symbols, attention beside latent or
    sparse attention; and the symbols cpmem does not price."""
    out = []
    valid = VALID | ({PIPE} if allow_pipe else set())
    unknown = sorted({c for c in pattern if c not in valid})
    if unknown:
        out.append(
            f"in the {name} pattern {', '.join(repr(c) for c in unknown)} is not a valid "
            f"layer symbol (valid: {''.join(sorted(VALID))}; hybrid_layer_allocation.py "
            "_validate_pattern)"
        )
    if "*" in pattern and ("+" in pattern or "D" in pattern):
        out.append(
            f"the {name} pattern has both attention and MLA/DSA: megatron-core does not "
            "support both in one model (hybrid_layer_allocation.py _validate_pattern)"
        )
    for symbol, why in UNPRICED_SYMBOLS.items():
        if symbol in pattern:
            out.append(f"'{symbol}' in the {name} pattern is {why}")
    return out


def parse_hybrid_pattern(text: str) -> HybridPattern | list[str]:
    """``text`` as a ``HybridPattern``, or the list of its problems."""
    parts = text.split(MTP_SEPARATOR)
    main, mtp_parts = parts[0], parts[1:]
    problems = _symbol_problems(main, "main", allow_pipe=True)
    mtp = ""
    if any(mtp_parts):  # all empty after a '/': no MTP (parse_hybrid_pattern)
        mtp = mtp_parts[0]
        different = [i + 1 for i, p in enumerate(mtp_parts) if p != mtp]
        if different:
            problems.append(
                f"every MTP depth's pattern must be the same: depth 1 is {mtp!r}, depth "
                f"{different[0]} is {mtp_parts[different[0] - 1]!r} (parse_hybrid_pattern)"
            )
        problems += _symbol_problems(mtp, "MTP", allow_pipe=False)
        if "*" in main + mtp and ("+" in main + mtp):
            problems.append(
                "the main and MTP patterns mix attention and latent attention: cpmem's "
                "model has one attention variant"
            )
    segments = tuple(len(s) for s in main.split(PIPE))
    if not main.replace(PIPE, ""):
        problems.append("the main pattern has no layer")
    elif len(segments) > 1 and 0 in segments:
        problems.append(
            "a pipeline segment between '|' has no layer: cpmem prices stages of one layer or more"
        )
    if problems:
        return problems
    depths = len(mtp_parts) if mtp else 0
    return HybridPattern(main.replace(PIPE, ""), segments, mtp, depths)
