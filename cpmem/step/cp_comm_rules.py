"""Which CP comm types Transformer Engine's context-parallel attention runs a model's
layers under, and the type a step runs where none is asked (``default_cp_comm``): TE's
sliding-window attention runs under ``all_gather`` and ``a2a`` only, its latent attention
with a value width other than the key's under ``p2p`` and ``a2a+p2p`` only."""

from __future__ import annotations

from cpmem.model.geometry import ModelGeometry

TE_WINDOW_CP_COMMS = ("all_gather", "a2a")
TE_MLA_CP_COMMS = ("p2p", "a2a+p2p")


def te_cp_comms(geometry: ModelGeometry) -> tuple[str, ...] | None:
    """The CP comm types Transformer Engine's CP attention runs ``geometry``'s layers
    under (``cpmem.step.step.StepSettings._check_te_cp_comm``), or None where it runs every type."""
    if geometry.windowed:
        return TE_WINDOW_CP_COMMS
    if geometry.is_mla and geometry.v_head_dim != geometry.head_dim:
        return TE_MLA_CP_COMMS
    return None


def default_cp_comm(geometry: ModelGeometry, runtime_default: str) -> str:
    """The CP comm type a step runs where none is asked: the runtime's own
    (``runtime_default``) where Transformer Engine runs the model's attention under it,
    else the first type TE does run it under (a latent-attention model under ART's
    ``all_gather`` rides ``p2p``; a windowed one under Megatron-LM's ``p2p`` rides
    ``all_gather``), so a default never names a type TE refuses."""
    allowed = te_cp_comms(geometry)
    if allowed is None or runtime_default in allowed:
        return runtime_default
    return allowed[0]
