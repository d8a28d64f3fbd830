"""The router's options read at the Megatron door: ``global_aux_loss`` load balancing and
the fused router kernels (``--moe-router-fusion``).

Expected values are read from the sources named in each test: megatron-core's
``moe/router.py`` and ``moe/moe_utils.py`` at the snapshot (d98e8a64) and Transformer
Engine's ``pytorch/router.py`` and ``csrc/extensions/router.cpp`` at b9d690e0. The run
is the tiny GPT's MoE case (``test_moe.MOE``: 8 experts, TP 2 SP, EP 2).
"""

from __future__ import annotations

from cpmem.pricing.registry import inapplicable_options
from tests.unit.megatron_lm.test_moe import MOE
from tests.unit.megatron_lm.tiny import priced, step_of, tiny


def _balanced(kind: str, coeff: float = 0.0):  # type: ignore[no-untyped-def]
    return tiny(**MOE, moe_router_load_balancing_type=kind, moe_aux_loss_coeff=coeff)


def test_global_aux_loss_keeps_what_aux_loss_keeps() -> None:
    """router.py:804-832 runs ``compute_routing_scores_for_aux_loss`` once for every
    aux-loss type and hands its scores to ``switch_load_balancing_loss_func`` in
    ``_apply_aux_loss`` (410-448) and ``_apply_global_aux_loss`` (507-551) alike: the
    same saved set per micro-batch, so the same figures, with and without a coefficient."""
    for coeff in (0.0, 1e-2):
        aux = priced(_balanced("aux_loss", coeff))
        global_ = priced(_balanced("global_aux_loss", coeff))
        assert global_.peak_bytes == aux.peak_bytes
        assert global_.static is not None and aux.static is not None
        assert global_.static.total == aux.static.total


def test_global_aux_loss_names_its_two_buffers_only_under_a_coefficient() -> None:
    """router.py:204-220 registers ``global_tokens_per_expert`` (num_experts fp32) and
    ``ga_steps`` (one fp32) only where ``get_aux_loss_coeff('global_aux_loss') > 0``; the
    default ``--moe-aux-loss-coeff`` is 0.0 (arguments.py:3536), as in the scoped CUDA-graph
    recordings, which keep neither."""
    named = inapplicable_options(step_of(_balanced("global_aux_loss", 1e-2)))
    assert any(n.startswith("global_aux_loss: two fp32 buffers") for n in named)
    unnamed = inapplicable_options(step_of(_balanced("global_aux_loss", 0.0)))
    assert not any(n.startswith("global_aux_loss") for n in unnamed)
    aux = inapplicable_options(step_of(_balanced("aux_loss", 1e-2)))
    assert not any(n.startswith("global_aux_loss") for n in aux)
