"""The attention backend a step prices: the one asked for, or under ``auto`` the one
Transformer Engine's selection picks for the step's model, layout, dtype and device
(``cpmem.step.attention_backend``), with the backends other containers would pick (the
spread). A backend TE refuses for the step (unfused under CP, TE's ``utils.py:756-760``)
is never priced: asking for it is an error naming TE's reason.

The container the pick is made under is a named setting: ``dev`` (the default,
``attention_backend.DEFAULT_CONTAINER``), ``ngc-24.10`` (NGC PyTorch 24.10: TE's pick as
``dev``'s; its PyTorch, ``cpmem.step.torch_build``, is what differs) or ``ngc-24.01``:
NGC PyTorch 24.01, the image
Megatron-LM's ``lts`` environment was built from until its "Bump LTS container" commit
(23a1dcaf74, 2025-11-06; ``.gitlab/stages/01.build.yml`` before it), whose Transformer
Engine predates megatron-core 0.16's range; restated with the oldest rule this project
reads (TE 2.9) and no flash-attn 2 that TE's gates accept (its flash-attn predates the
2.4.1 that deterministic runs need). ``container_for_image`` names the container of a CI
image: the A100 recordings made on 24.01 peak at the unfused figure, those of every later
image at the default container's pick (``cpmem.gate.megatron_tier``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from cpmem.errors import InputError
from cpmem.step.attention_backend import (
    CONTAINERS,
    DEFAULT_CONTAINER,
    AttentionQuery,
    BackendSelection,
    Container,
    select_attention_backend,
)
from cpmem.step.runtime import AttentionBackend

NGC_2401_CONTAINER = Container(
    "ngc-pytorch-24.01",
    te=(2, 9),
    cudnn=(8, 9, 7),
    flash_attn_2=None,
    flash_attn_3=False,
    source=(
        "Megatron-LM's lts image until 2025-11-06: nvcr.io/nvidia/pytorch:24.01 "
        "(.gitlab/stages/01.build.yml at 08a0a19cd8); its TE is older than the rules restated "
        "here (TE 2.9's is used) and its flash-attn older than TE's gates accept"
    ),
)
NAMED_CONTAINERS: dict[str, Container] = {
    "dev": DEFAULT_CONTAINER,
    "ngc-24.10": DEFAULT_CONTAINER,
    "ngc-24.01": NGC_2401_CONTAINER,
}
"""Each named container's attention software. ``ngc-24.10`` picks as ``dev`` does (as every
image after 24.01 is priced); it differs in its PyTorch (``cpmem.step.torch_build``)."""
IMAGE_CONTAINERS: dict[str, str] = {
    "nvcr.io/nvidia/pytorch:24.01-py3": "ngc-24.01",
    "nvcr.io/nvidia/pytorch:24.10-py3": "ngc-24.10",
}
"""CI images priced in a container other than ``dev``, by its name: 24.01, whose
Transformer Engine picks otherwise and whose PyTorch is 2.2, and 24.10, whose PyTorch is
2.5 (``cpmem.step.torch_build``); every other image is ``dev``."""


def container_for_image(image: str) -> str:
    """The named container a CI image's attention choice is priced under."""
    return IMAGE_CONTAINERS.get(image, "dev")


@dataclass(frozen=True)
class BackendChoice:
    """The backend priced, what was asked, and the other backends some container picks."""

    backend: AttentionBackend
    asked: str
    spread: tuple[AttentionBackend, ...]
    reasons: tuple[str, ...] = ()


def container_named(name: str) -> Container:
    try:
        return NAMED_CONTAINERS[name]
    except KeyError:
        raise InputError("container", name, f"must be one of {sorted(NAMED_CONTAINERS)}") from None


def choose_backend(
    asked: str,
    *,
    compute_capability: tuple[int, int],
    heads: int,
    groups: int,
    head_dim: int,
    value_dim: int,
    sequence: int,
    tp: int,
    cp: int,
    cp_comm: str,
    dtype: str,
    attention_dropout: float,
    deterministic: bool,
    env: Mapping[str, str],
    container: str = "dev",
    window: int = 0,
    softmax_type: str = "vanilla",
) -> BackendChoice:
    """The backend a Megatron-core step prices for ``asked`` (``auto`` or a backend)."""
    query = _query(
        compute_capability,
        heads,
        groups,
        head_dim,
        value_dim,
        sequence,
        tp,
        cp,
        cp_comm,
        dtype,
        attention_dropout,
        deterministic,
        tuple(sorted(env.items())),
        asked,
        window,
        softmax_type,
    )
    selection = _select(query, tuple(sorted(env.items())), container)
    if selection.backend is None:
        raise InputError(
            "attention_backend",
            asked,
            "Transformer Engine has no backend for this attention: " + "; ".join(selection.reasons),
        )
    spread = tuple(b for b in selection.spread if b != selection.backend)
    return BackendChoice(selection.backend, asked, spread, selection.reasons)


def _query(
    compute_capability: tuple[int, int],
    heads: int,
    groups: int,
    head_dim: int,
    value_dim: int,
    sequence: int,
    tp: int,
    cp: int,
    cp_comm: str,
    dtype: str,
    attention_dropout: float,
    deterministic: bool,
    env: tuple[tuple[str, str], ...],
    asked: str,
    window: int,
    softmax_type: str,
) -> AttentionQuery:
    return AttentionQuery(
        compute_capability=compute_capability,
        num_attention_heads=heads,
        num_query_groups=groups,
        head_dim_qk=head_dim,
        head_dim_v=value_dim,
        max_seqlen_q=sequence,
        max_seqlen_kv=sequence,
        tensor_parallel_size=tp,
        dtype=dtype,
        attention_dropout=attention_dropout,
        context_parallel_size=cp,
        cp_comm_type=cp_comm,
        window_size=(window, 0) if window else None,
        deterministic_mode=deterministic,
        softmax_type=softmax_type,
        attention_backend=asked,
        env=dict(env),
    )


_SELECTIONS: dict[tuple[AttentionQuery, tuple[tuple[str, str], ...], str], BackendSelection] = {}


def _select(
    query: AttentionQuery, env: tuple[tuple[str, str], ...], container: str
) -> BackendSelection:
    """TE's pick under the named container, spread over every container (cached: the
    spread evaluates each of ``CONTAINERS``; the query's environment is not part of its
    equality, so it keys the cache beside it)."""
    key = (query, env, container)
    if key not in _SELECTIONS:
        if len(_SELECTIONS) > 512:
            _SELECTIONS.clear()
        named = container_named(container)
        _SELECTIONS[key] = select_attention_backend(query, named, (*CONTAINERS, NGC_2401_CONTAINER))
    return _SELECTIONS[key]


def check_softmax_backend(softmax_type: str, backend: str, cp: int, cp_comm: str) -> None:
    """A backend named for a softmax other than vanilla that Transformer Engine does not
    run under it is refused (``auto`` never picks one: ``choose_backend`` hands the type
    to the selection): FlashAttention at all, the fused backend under CP other than a2a
    (utils.py:708-710 and 735-742 at TE v2.11, ``cpmem.step.attention_backend``)."""
    if softmax_type == "vanilla":
        return
    if backend == "flash":
        why = "Transformer Engine turns FlashAttention off under it (utils.py:708-710 at TE v2.11)"
    elif backend == "fused" and cp > 1 and cp_comm != "a2a":
        why = (
            f"Transformer Engine's fused attention runs it under CP only with a2a, not "
            f"{cp_comm} (utils.py:735-742 at TE v2.11)"
        )
    else:
        return
    raise InputError("attention_backend", backend, f"softmax_type {softmax_type}: {why}")
