"""The layer kinds: one module per kind of sub-layer, each ending in its spec
(``cpmem.pricing.kinds.spec``), registered here by the name ``ModelGeometry.mixers`` and
``mlps`` give it.

- mixers: ``attention`` (its variants: MHA/GQA, windowed, sinks, gated, latent), ``gdn``
  (Gated DeltaNet), ``mamba`` (Mamba-2), ``none`` (a layer that is a feed-forward block
  alone);
- feed-forward blocks: ``dense`` (``mlp``), ``moe``, ``none`` (a layer that is a mixer
  alone).

The static memory (``cpmem.pricing.weights``, ``static``), the reference formula and
``tight``'s composition (``cpmem.pricing.tight.compose``) read every kind through its
spec; adding a kind is its module and its line here.
"""

from __future__ import annotations

from cpmem.errors import InputError
from cpmem.pricing.kinds.attention import ATTENTION
from cpmem.pricing.kinds.gdn import GDN
from cpmem.pricing.kinds.mamba import MAMBA
from cpmem.pricing.kinds.mlp import DENSE
from cpmem.pricing.kinds.moe import MOE
from cpmem.pricing.kinds.spec import NO_MIXER, NO_MLP, MixerSpec, MlpSpec

MIXERS: dict[str, MixerSpec] = {s.name: s for s in (ATTENTION, GDN, MAMBA, NO_MIXER)}
MLPS: dict[str, MlpSpec] = {s.name: s for s in (DENSE, MOE, NO_MLP)}


def mixer_spec(kind: str) -> MixerSpec:
    """The spec of the mixer ``kind``."""
    try:
        return MIXERS[kind]
    except KeyError:
        raise InputError("mixers", kind, f"is not a mixer kind; one of {sorted(MIXERS)}") from None


def mlp_spec(kind: str) -> MlpSpec:
    """The spec of the feed-forward ``kind``."""
    try:
        return MLPS[kind]
    except KeyError:
        raise InputError(
            "mlps", kind, f"is not a feed-forward kind; one of {sorted(MLPS)}"
        ) from None
