"""Mixture-of-experts runs: the expert layout, its checks, the experts' parameters and
their static memory (the layer's saved set is ``tight``'s MoE kind).

Expected values come from Megatron-LM's source facts named in each test (its expert
``RankGenerator``, ``arguments.py``'s assertions and defaults, the shapes of
``experts.py``) and from the 8-expert functional-test case
(``golden/megatron/cases/moe/gpt3_mcore_te_tp2_pp1_te_8experts2parallel_dist_optimizer``:
the tiny GPT, TP 2, EP 2, 8 experts, top-1, SP, no linear biases).
"""

from __future__ import annotations

import pytest

from cpmem.errors import InputError
from cpmem.megatron.args import parse_megatron_args
from cpmem.pricing.optimizer_state import expert_shards
from cpmem.pricing.weights import expert_tensors, layer_tensors
from tests.unit.megatron_lm.tiny import SMALL, static_of, tiny
from tests.unit.megatron_lm.tiny import step_of as run_of

MOE = {
    "num_experts": 8,
    "expert_model_parallel_size": 2,
    "tensor_model_parallel_size": 2,
    "sequence_parallel": True,
    "moe_router_topk": 1,
    # Megatron-LM requires the pre-softmax router with top-1 routing (read as a flag given)
    "flag_values": {"--moe-router-pre-softmax": True},
    "add_bias_linear": False,
}


def test_moe_defaults_are_megatrons() -> None:
    """transformer_config.py: top-k 2, the allgather dispatcher, no grouped GEMM;
    model_parallel_config.py: EP 1; arguments.py: ETP None (then TP)."""
    args = parse_megatron_args(
        {
            "--num-layers": 2,
            "--hidden-size": 64,
            "--num-attention-heads": 4,
            "--seq-length": 128,
            "--max-position-embeddings": 128,
            "--micro-batch-size": 1,
            "--num-experts": 4,
        }
    )
    assert args.moe_router_topk == 2
    assert args.moe_token_dispatcher_type == "allgather"
    assert args.moe_grouped_gemm is False
    assert args.expert_model_parallel_size == 1
    assert args.expert_tensor_parallel_size is None


def test_the_expert_layout_folds_cp_into_the_expert_dp() -> None:
    """Expert DP = world / (ETP x EP x PP), CP folded in; ETP defaults to TP
    (arguments.py:587-588)."""
    step = run_of(tiny(**MOE, context_parallel_size=2), world_size=8)
    layout = step.plan.layout
    assert (layout.etp, layout.ep) == (2, 2)
    assert layout.dp == 2  # dense DP = 8 / (TP 2 x CP 2)
    assert expert_shards(step.settings) == 2


def test_ep_not_dividing_the_experts_is_refused_naming_the_flag() -> None:
    with pytest.raises(InputError) as err:
        run_of(
            tiny(**{**MOE, "expert_model_parallel_size": 3, "global_batch_size": 48}), world_size=12
        )
    assert "--expert-model-parallel-size 3" in str(err.value)


def test_etp_ep_pp_not_dividing_the_world_is_refused() -> None:
    with pytest.raises(InputError) as err:
        run_of(tiny(**{**MOE, "expert_model_parallel_size": 8}), world_size=8)
    assert "ETP x EP x PP" in str(err.value)


def test_moe_with_tp_needs_sequence_parallelism() -> None:
    with pytest.raises(InputError) as err:
        run_of(tiny(**{**MOE, "sequence_parallel": False}))
    assert "--sequence-parallel" in str(err.value)


def test_expert_flags_without_experts_are_refused() -> None:
    with pytest.raises(InputError) as err:
        run_of(tiny(expert_model_parallel_size=2))
    assert "--num-experts" in str(err.value)


def test_an_unpriced_dispatcher_is_refused_by_name() -> None:
    with pytest.raises(InputError) as err:
        run_of(tiny(**MOE, moe_token_dispatcher_type="flex"))
    assert "--moe-token-dispatcher-type flex" in str(err.value)


def test_shared_expert_overlap_is_refused_naming_what_it_keeps() -> None:
    """With the overlap megatron-core turns the shared experts' linears' own SP
    communication off and gathers their input itself (shared_experts.py:150-161, 236 at
    4828d651): fc1 saves the gathered input, fc2's un-scattered output is made at the
    routed combine, and their backward interleaves with the routed experts'. The gate is
    a refusal of its own."""
    flags = {
        **SMALL,
        "--num-experts": 4,
        "--disable-bias-linear": True,
        "--moe-shared-expert-intermediate-size": 128,
        "--moe-token-dispatcher-type": "alltoall",
    }
    with pytest.raises(InputError) as err:
        parse_megatron_args({**flags, "--moe-shared-expert-overlap": True})
    assert err.value.value == "--moe-shared-expert-overlap"
    for tensor in ("all-gathered [tokens, H] input", "un-scattered [tokens, H] output"):
        assert tensor in err.value.reason
    assert "backward is interleaved" in err.value.reason
    with pytest.raises(InputError) as err:
        parse_megatron_args({**flags, "--moe-shared-expert-gate": True})
    assert err.value.value == "--moe-shared-expert-gate" and "gate" in err.value.reason


def test_each_layer_holds_its_local_experts_sharded_over_etp() -> None:
    """E / EP = 4 local experts of fc1 [f / ETP, h] and fc2 [h, f / ETP], f = 4h = 2048,
    h = 512, ETP 2 (experts.py, no biases)."""
    step = run_of(tiny(**MOE))
    g, layout = step.geometry, step.plan.layout
    assert expert_tensors(g, 0, layout.ep, layout.etp) == [1024 * 512, 512 * 1024] * 4
    # the router's [E, h] weight sits with the dense parameters, whole on every TP rank
    assert 8 * 512 in layer_tensors(g, 0, layout.tp)


def test_the_expert_buffer_is_sharded_over_the_expert_dp_group() -> None:
    """The distributed optimizer's master weights and moments of the experts: 1/EDP of
    the expert buffer (EDP 2 here, dense DP x CP 4)."""
    step = run_of(tiny(**MOE, use_distributed_optimizer=True))
    g, layout = step.geometry, step.plan.layout
    experts = sum(expert_tensors(g, 0, layout.ep, layout.etp)) * 12
    dense = sum(sum(layer_tensors(g, i, layout.tp)) for i in range(12))
    dense += 50432 // 2 * 512 + 1024 * 512 + 2 * 512  # embedding, positions, final norm
    whole = static_of(tiny(**MOE))
    sharded = static_of(tiny(**MOE, use_distributed_optimizer=True))
    # the master copy and Adam's moments (12 B) of the dense share (1/4) and the expert
    # share (1/2), to the buffers' padding
    expected = 12 * (dense / 4 + experts / 2)
    assert abs(sharded["optimizer_states"] - expected) / expected < 1e-3
    assert whole["optimizer_states"] == 12 * (dense + experts)


def test_grouped_gemm_keeps_four_stream_workspaces() -> None:
    """TE's GroupedLinear runs on 4 cuBLAS streams with a workspace each (module/base.py)."""
    parts = static_of(tiny(**MOE, moe_grouped_gemm=True), device="h100")
    assert parts["te_grouped_gemm_workspaces"] == 4 * parts["te_cublaslt_workspace"]


def test_the_allgather_dispatcher_gathers_into_the_global_buffer() -> None:
    """token_dispatcher.py (use_global_buffer=True): the MoE input gathered over ETP x EP,
    [n/TP x ETP x EP, h] bf16 = 2048 x 4 x 512 x 2 bytes, the largest use of the buffer."""
    assert static_of(tiny(**MOE))["global_memory_buffer"] == 2048 * 4 * 512 * 2
