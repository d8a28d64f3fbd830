"""The router's options read at the Megatron door: ``global_aux_loss`` load balancing and
the fused router kernels (``--moe-router-fusion``).

Expected values are read from the sources named in each test: megatron-core's
``moe/router.py`` and ``moe/moe_utils.py`` at the snapshot (d98e8a64) and Transformer
Engine's ``pytorch/router.py`` and ``csrc/extensions/router.cpp`` at b9d690e0. The run
is the tiny GPT's MoE case (``test_moe.MOE``: 8 experts, TP 2 SP, EP 2).
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from cpmem.errors import InputError
from cpmem.megatron.describe import megatron_geometry
from cpmem.pricing.kinds.moe import saved_width
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


def _fused_minus_unfused(args_changes: dict[str, object], tp: int) -> int:
    g = megatron_geometry(tiny(**{**MOE, **args_changes}))
    rows = Fraction(g.moe_top_k, 1)
    widths = [saved_width(g, tp, True, rows, False, False, tp, fused) for fused in (False, True)]
    return widths[1] - widths[0]


def test_the_fused_router_keeps_one_fp32_score_per_expert_and_no_top_k_copies() -> None:
    """TE b9d690e0 pytorch/router.py:59 saves the routing map and ``intermediate_output``,
    router.cpp allocates it ``{num_tokens, num_experts}`` in ``at::kFloat``: 4 bytes per
    expert and local token, 8 experts = 32 bytes = 16 bf16-equivalent elements. The
    unfused top-k (moe_utils.py:900-955) keeps per routed slot an fp32 probability and an
    int64 index, 12 bytes = 6 elements, which the fused kernel does not; the routing map is
    the dispatcher's either way. The tiny MoE's softmax
    top-1 router at TP 2 SP (one local token per two): (16 - 6) / 2 = +5 elements per
    token."""
    assert _fused_minus_unfused({}, tp=2) == (16 - 6 * 1) // 2


def test_the_fused_sigmoid_router_keeps_less_than_the_unfused_one() -> None:
    """Under sigmoid the unfused router keeps the fp32 scores over every expert as well
    (``torch.sigmoid(logits.float())``, moe_utils.py:925), the fused one its intermediate
    in their place: only the top-k's copies differ, 6 elements per slot. Top-2, 8 experts,
    TP 4 SP (the scoped CUDA-graph recordings' router): (0 - 6 x 2) / 4 = -3 elements per
    token."""
    sigmoid = {
        "moe_router_score_function": "sigmoid",
        "moe_router_topk": 2,
        "tensor_model_parallel_size": 4,
        "flag_values": {},
    }
    assert _fused_minus_unfused(sigmoid, tp=4) == -(6 * 2) // 4


def test_the_megatron_door_reads_the_fusion_into_the_process() -> None:
    """``--moe-router-fusion`` (transformer_config.py:944) reaches the step's runtime,
    priced rather than refused."""
    assert step_of(tiny(**MOE, moe_router_fusion=True)).settings.runtime.moe_router_fusion
    assert not step_of(tiny(**MOE)).settings.runtime.moe_router_fusion


def test_the_fused_router_in_fp64_is_refused_as_te_raises() -> None:
    """TE b9d690e0 pytorch/router.py:130-131: float64 logits raise ValueError."""
    with pytest.raises(InputError) as err:
        step_of(tiny(**MOE, moe_router_fusion=True, moe_router_dtype="fp64"))
    assert "--moe-router-fusion with --moe-router-dtype fp64" in str(err.value)
