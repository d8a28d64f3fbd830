"""Mixture-of-experts runs: the expert layout, its checks, the experts' parameters and
the MoE layer's saved set.

Expected values come from Megatron-LM's source facts named in each test (its expert
``RankGenerator``, ``arguments.py``'s assertions and defaults, the shapes of
``experts.py``) and from the 8-expert functional-test case
(``golden/megatron/cases/moe/gpt3_mcore_te_tp2_pp1_te_8experts2parallel_dist_optimizer``:
the tiny GPT, TP 2, EP 2, 8 experts, top-1, SP, no linear biases).
"""

from __future__ import annotations

import pytest

from cpmem.errors import InputError
from cpmem.megatron import activations, static
from cpmem.megatron.args import parse_megatron_args
from tests.unit.megatron_lm.tiny import run_of, tiny

MOE = {
    "num_experts": 8,
    "expert_model_parallel_size": 2,
    "tensor_model_parallel_size": 2,
    "sequence_parallel": True,
    "moe_router_topk": 1,
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
    """Expert DP = world / (ETP x EP x PP); ETP defaults to TP (arguments.py:587-588)."""
    run = run_of(tiny(**MOE, context_parallel_size=2), world_size=8)
    assert (run.etp, run.ep, run.edp) == (2, 2, 2)
    assert run.dp == 2  # dense DP = 8 / (TP 2 x CP 2)
    assert run.local_experts == 4


def test_the_last_rank_is_last_in_every_expert_coordinate() -> None:
    """The expert RankGenerator's order tp-ep-dp-pp, TP fastest: rank 7 of 8 at ETP 2,
    EP 2, EDP 2 is (1, 1, 1, 0); rank 5 is (1, 0, 1, 0)."""
    assert run_of(tiny(**MOE)).expert_coordinates == {"etp": 1, "ep": 1, "edp": 1, "pp": 0}
    assert run_of(tiny(**MOE), rank=5).expert_coordinates == {
        "etp": 1,
        "ep": 0,
        "edp": 1,
        "pp": 0,
    }


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


def test_each_layer_holds_its_local_experts_sharded_over_etp() -> None:
    """E / EP = 4 local experts of fc1 [f / ETP, h] and fc2 [h, f / ETP], f = 4h = 2048,
    h = 512, ETP 2 (experts.py, no biases)."""
    run = run_of(tiny(**MOE))
    assert static.expert_layer_tensors(run) == [1024 * 512, 512 * 1024] * 4
    # the router's [E, h] weight sits with the dense parameters, whole on every TP rank
    assert 8 * 512 in static.layer_tensors(run)


def test_the_expert_buffer_is_sharded_over_the_expert_dp_group() -> None:
    """The distributed optimizer's master weights and moments of the experts: 1/EDP of
    the expert buffer (EDP 2 here, dense DP 4)."""
    args = tiny(**MOE, use_distributed_optimizer=True)
    run = run_of(args)
    experts = sum(static.expert_layer_tensors(run)) * run.stage_layers
    whole = static.static_components(run_of(tiny(**MOE)))
    sharded = static.static_components(run)
    dense = sum(static.stage_tensors(run, 0)[0])
    # Adam's moments of the dense share (1/4) and of the expert share (1/2), to padding
    expected = 8 * (dense / 4 + experts / 2)
    assert abs(sharded["adam_moments"] - expected) / expected < 1e-3
    assert whole["adam_moments"] == 8 * (dense + experts)


def test_grouped_gemm_keeps_four_stream_workspaces() -> None:
    """TE's GroupedLinear runs on 4 cuBLAS streams with a workspace each (module/base.py)."""
    run = run_of(tiny(**MOE, moe_grouped_gemm=True), device="h100")
    parts = static.static_components(run)
    assert parts["te_grouped_gemm_workspaces"] == 4 * parts["te_cublaslt_workspace"]


def test_worst_case_routing_puts_min_k_local_copies_of_every_gathered_token_here() -> None:
    """n_sp = 4096 / TP 2 tokens on each of ETP 2 x EP 2 ranks; top-1 with 4 local
    experts: at most one copy of each of the 8192 gathered tokens."""
    assert activations.routed_rows(run_of(tiny(**MOE))) == 2048 * 4
    top2 = run_of(tiny(**{**MOE, "moe_router_topk": 2}))
    assert activations.routed_rows(top2) == 2048 * 4 * 2
