"""Muon's static memory (``cpmem.pricing.muon``, ``static._muon_training``) and the
distributed optimizer's instances (``optimizer_state.optimizer_shards``).

Expected values derived by hand from Megatron-LM at the recordings' snapshot (d98e8a64):

- which tensors Muon steps: ``emerging_optimizers.py:140-147`` (``_is_muon_excluded``: not
  ``use_muon=False``, not ``is_embedding_or_output_parameter``, exactly 2-D), the word
  embedding tagged at ``language_module.py:230`` (the position table is not tagged);
- Muon's state: one fp32 ``momentum_buffer`` (Emerging-Optimizers'
  ``OrthogonalizedOptimizer.step``: ``torch.zeros_like(grad)`` of the fp32 master's
  gradient); Adam's ``exp_avg`` and ``exp_avg_sq`` for the rest; each wrapped by
  ``Float16OptimizerWithFloat16Params`` (an fp32 master copy per parameter);
- the legacy layer-wise distributed optimizer (``--no-use-layer-wise-param-layout``):
  DDP without the distributed optimizer's buffers (``dist_utils.py:326-332`` re-enables
  them only for the precomputed layout), parameters sorted by element count and dealt
  ping-pong over the DP x CP ranks, ``layer_wise_optimizer.py:713-754`` (its docstring's
  example: 4 ranks, p0-p9 -> [[p0, p7, p8], [p1, p6, p9], [p2, p5], [p3, p4]]);
- ``--num-distributed-optimizer-instances N``: the DP x CP group cut into N groups of
  consecutive ranks (``parallel_state.py``), each instance's buffers sharded over its own
  DP x CP / N ranks.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from megatron_lm.tiny import priced, static_of, step_of, tiny

from cpmem.errors import InputError
from cpmem.megatron.args import MegatronArgs
from cpmem.pricing.muon import layer_wise_share, ping_pong_rank
from cpmem.step.trainer import Optimizer

H = 512
V = 50304
LAYER = 12 * H * H + 13 * H
TINY_PARAMS = 12 * LAYER + V * H + 1024 * H + 2 * H  # tests/unit/pricing/test_full_training_static
# Muon's matrices: per layer QKV 3h^2, projection h^2, fc1 and fc2 4h^2 each; the
# 1024 x h position table (2-D, untagged). Adam: biases, norms, the word embedding.
MUON = 12 * 12 * H * H + 1024 * H
ADAM = TINY_PARAMS - MUON


def muon(**changes: object) -> MegatronArgs:
    return tiny(optimizer="muon", **changes)


def test_the_docstrings_ping_pong_example() -> None:
    # layer_wise_optimizer.py:720-722: 10 sorted parameters over 4 ranks
    ranks = [ping_pong_rank(i, 4) for i in range(10)]
    assert ranks == [0, 1, 2, 3, 3, 2, 1, 0, 0, 1]
    owned = {r: [i for i in range(10) if ranks[i] == r] for r in range(4)}
    assert owned == {0: [0, 7, 8], 1: [1, 6, 9], 2: [2, 5], 3: [3, 4]}


def test_a_share_takes_its_tensors_by_sorted_position() -> None:
    # sizes 10..100 given out of order; sorted, rank 0 of 4 gets the 1st, 8th and 9th
    sizes = [100, 10, 90, 20, 80, 30, 70, 40, 60, 50]
    share = layer_wise_share(sizes, [True] * 10, 4, 0)
    assert share.elements == 10 + 80 + 90
    assert share.state_bytes == 4 * (10 + 80 + 90)


def test_equal_sizes_stepped_by_both_are_priced_at_the_costlier() -> None:
    # two tensors of 8 elements, one Muon's (4 B) and one Adam's (8 B), over 2 ranks:
    # each rank gets one; which one depends on the parameter groups' order, so each is
    # priced at Adam's 8 B (an upper bound by 4 B x 8)
    for rank in (0, 1):
        share = layer_wise_share([8, 8], [True, False], 2, rank)
        assert (share.elements, share.state_bytes) == (8, 64)


def test_muon_without_the_distributed_optimizer_keeps_a_momentum_per_matrix() -> None:
    parts = static_of(muon(), world_size=8)
    assert parts["weights"] == 2 * TINY_PARAMS
    assert parts["gradient_buffer"] == 4 * TINY_PARAMS
    # fp32 master of every parameter, Muon's momentum (4 B) or Adam's moments (8 B)
    assert parts["optimizer_states"] == 4 * TINY_PARAMS + 4 * MUON + 8 * ADAM
    assert "master_gradients" not in parts
    adam = static_of(tiny(), world_size=8)
    assert adam["optimizer_states"] - parts["optimizer_states"] == 4 * MUON


def test_the_legacy_layer_wise_optimizer_gives_the_last_rank_its_dealt_tensors() -> None:
    # the tiny's 148 tensors sorted: h x74 (biases of projection and fc2, the four norm
    # tensors per layer, the final norm's two), 3h x12, 4h x12, h^2 x12, 1024h (= 2h^2),
    # 3h^2 x12, 4h^2 x24, Vh. DP 8: the last rank (7) gets positions 7 and 8 of each 16:
    # h: 7, 8, 23, 24, 39, 40, 55, 56, 71, 72 (10); 3h (74-85): none; 4h (86-97): 87,
    # 88; h^2 (98-109): 103, 104; 1024h (110): no; 3h^2 (111-122): 119, 120; 4h^2
    # (123-146): 135, 136; Vh (147): no
    adam = 10 * H + 2 * 4 * H
    matrices = 2 * H * H + 2 * 3 * H * H + 2 * 4 * H * H
    args = muon(use_distributed_optimizer=True, use_layer_wise_param_layout=False)
    parts = static_of(args, world_size=8)
    assert parts["weights"] == 2 * TINY_PARAMS  # whole, unpadded
    assert parts["gradient_buffer"] == 4 * TINY_PARAMS
    assert parts["optimizer_states"] == 4 * (adam + matrices) + 8 * adam + 4 * matrices


def test_the_precomputed_layout_bin_packs_the_tinys_matrices_over_8_ranks() -> None:
    # Muon's matrices (layer_wise_optimizer.py:38-53), in h^2 = 262144 (a multiple of 64:
    # no start padding) and cost units 512^3: fc1 [4h, h] and fc2 [h, 4h] 4h^2 cost 4 (x24),
    # QKV [3h, h] 3h^2 cost 3 (x12), the position table [1024, h] 2h^2 cost 2, the
    # projection [h, h] h^2 cost 1 (x12): 146 h^2, cap 146 / 8 x 1.3 = 23.7 h^2 (never
    # reached). LPT over 8 ranks (ties to the lowest): the 24 fc's three rounds (12 each),
    # the 12 QKVs one round then ranks 0-3 (18 | 15), the table to rank 4 (17), the 12
    # projections to 5 6 7 5 6 7 4 5 6 7 0 1: ranks 0 and 1 hold 19 h^2, 2-7 18 h^2.
    # Shards padded to 19 h^2 (divisor lcm(64, 128 / 8) = 64): a buffer of 152 h^2.
    # The rest (Adam's, the distributed optimizer's byte shards): 12 x 13h + 2h + Vh =
    # 25836544, a multiple of lcm(8, 128): unpadded, 3229568 per rank.
    h2 = H * H
    adam_total = 12 * 13 * H + 2 * H + V * H
    assert adam_total == TINY_PARAMS - 146 * h2
    buffer = 152 * h2 + adam_total
    args = muon(use_distributed_optimizer=True)
    for rank, matrices in (("last", 18 * h2), ("busiest", 19 * h2)):
        parts = static_of(args, world_size=8, rank=rank)
        assert parts["weights"] == 2 * buffer
        assert parts["gradient_buffer"] == 4 * buffer
        # a master copy (4 B) each; Muon's momentum 4 B, Adam's moments 8 B
        assert parts["optimizer_states"] == 8 * matrices + 12 * (adam_total // 8)


def test_the_tinys_matrices_fit_one_bucket() -> None:
    # --overlap-grad-reduce: buckets of max(40M, 1M x 8) = 40M elements (dist_utils.py:316);
    # a bucket closes only once it holds 40M, and the tiny's matrices are 146 h^2 = 38.3M
    args = muon(use_distributed_optimizer=True)
    assert static_of(replace(args, overlap_grad_reduce=True)) == static_of(args)


def test_buckets_pack_the_first_stages_first_chunk_alone() -> None:
    # h 1024: 146 x 1024^2 = 153M matrix elements, several 40M buckets on the first stage
    # (dist_utils.py:360-373: a later stage's layout is one bucket). The buckets' packing
    # is megatron-core's (tests/oracle/test_layer_wise_layout_oracle.py); here, that the
    # run reaches it: the first stage's buffer moves, the last stage's does not.
    wide = muon(
        use_distributed_optimizer=True,
        hidden_size=1024,
        num_attention_heads=16,
        global_batch_size=64,
    )
    piped = replace(wide, pipeline_model_parallel_size=2)
    for args, rank, moves in ((wide, "last", True), (piped, 0, True), (piped, "last", False)):
        one = static_of(args, world_size=16, rank=rank)
        bucketed = static_of(replace(args, overlap_grad_reduce=True), world_size=16, rank=rank)
        assert (one["weights"] != bucketed["weights"]) == moves, (rank, moves)


def test_the_precomputed_layout_refuses_routed_experts_with_biases() -> None:
    # optimizer/__init__.py:918-926: Adam's expert-parallel groups assert on this path
    args = muon(use_distributed_optimizer=True, num_experts=8, expert_model_parallel_size=8)
    with pytest.raises(InputError) as err:
        step_of(args)
    assert "non-emerging expert-parallel param groups" in str(err.value)
    assert static_of(replace(args, add_bias_linear=False))["optimizer_states"] > 0


def test_the_native_door_names_the_layout_only_with_muons_distributed_optimizer() -> None:
    with pytest.raises(InputError) as err:
        Optimizer("adam", True, muon_layout="precomputed")
    assert "muon_layout" in str(err.value)
    assert Optimizer("muon", True, muon_layout="precomputed").label.endswith("precomputed layout)")


def test_dist_muon_is_muon_with_the_layer_wise_optimizer() -> None:
    # arguments.py:1727-1733: the deprecated name
    a = static_of(tiny(optimizer="dist_muon", use_layer_wise_param_layout=False))
    b = static_of(muon(use_distributed_optimizer=True, use_layer_wise_param_layout=False))
    assert a == b


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"fp16": True, "bf16": False}, "emerging optimizer with fp16 is not supported"),
        (
            {"use_distributed_optimizer": True, "num_distributed_optimizer_instances": 2},
            "Partial DistOpt cannot be used without DistOpt",
        ),
    ],
)
def test_muon_runs_megatron_rejects_or_cpmem_does_not_price_are_refused(
    changes: dict[str, object], says: str
) -> None:
    with pytest.raises(InputError) as err:
        step_of(muon(**changes))
    assert says in str(err.value)


@pytest.mark.parametrize("optimizer", ["sgd", "lion", "soap", "adaptive_muon"])
def test_other_optimizers_are_refused_by_name(optimizer: str) -> None:
    with pytest.raises(InputError) as err:
        step_of(tiny(optimizer=optimizer))
    assert f"--optimizer {optimizer}" in str(err.value)


# --- several distributed-optimizer instances ---------------------------------------------


def _last_rank_real_share(sizes: list[int], d: int) -> int:
    """Real elements in the last of ``d`` slices of a one-bucket buffer laid out in
    reverse order, each parameter starting on 64 elements, the bucket padded to
    lcm(d, 128) (param_layout.py, distrib_optimizer.py; restated as in
    test_full_training_static)."""
    spans = []
    start = 0
    for n in reversed(sizes):
        start = -(-start // 64) * 64
        spans.append((start, start + n))
        start += n
    numel = -(-start // math.lcm(d, 128)) * math.lcm(d, 128)
    lo = numel - numel // d
    return sum(max(0, b - max(a, lo)) for a, b in spans if b > lo)


def _tiny_sizes() -> list[int]:
    layer = [3 * H * H, 3 * H, H * H, H, 4 * H * H, 4 * H, 4 * H * H, H, H, H, H, H]
    return [V * H, 1024 * H] + layer * 12 + [H, H]


@pytest.mark.parametrize(("world", "instances"), [(8, 2), (8, 4), (5, 5)])
def test_each_instance_shards_over_its_own_ranks(world: int, instances: int) -> None:
    args = tiny(
        use_distributed_optimizer=True,
        num_distributed_optimizer_instances=instances,
        global_batch_size=None,
    )
    parts = static_of(args, world_size=world)
    d = world // instances  # TP 1, PP 1, CP 1: DP x CP / N ranks per instance
    align = math.lcm(d, 128)
    padded = -(-TINY_PARAMS // align) * align
    assert parts["weights"] == 2 * padded
    assert parts["gradient_buffer"] == 4 * padded
    assert parts["optimizer_states"] == 12 * _last_rank_real_share(_tiny_sizes(), d)


def test_one_instance_per_rank_keeps_the_whole_state() -> None:
    # N = DP: each instance is one rank, which holds the master copy and moments of all
    args = tiny(use_distributed_optimizer=True, num_distributed_optimizer_instances=8)
    assert static_of(args, world_size=8)["optimizer_states"] == 12 * TINY_PARAMS


@pytest.mark.parametrize(
    ("changes", "world", "says"),
    [
        ({"num_distributed_optimizer_instances": 2}, 8, "Partial DistOpt"),
        (
            {"use_distributed_optimizer": True, "num_distributed_optimizer_instances": 3},
            8,
            "must divide DP x CP",
        ),
    ],
)
def test_instances_megatron_rejects_are_refused(
    changes: dict[str, object], world: int, says: str
) -> None:
    with pytest.raises(InputError) as err:
        step_of(tiny(**changes), world_size=world)
    assert says in str(err.value)


def test_the_precomputed_layouts_terms_are_read_from_source() -> None:
    # the recordings' Muon runs all take --no-use-layer-wise-param-layout
    # (golden/megatron/cases/moe/*muon*): the precomputed layout's buffers and shards are
    # no recording's; the legacy path's are
    labels = {
        name: src.label
        for name, src in priced(muon(use_distributed_optimizer=True)).provenance.items()
    }
    for term in ("weights", "gradient_buffer", "optimizer_states"):
        assert labels[term] == "structure (source)", term
    assert labels["cublas_workspaces"] == "measured (megatron-lm)"
    legacy = muon(use_distributed_optimizer=True, use_layer_wise_param_layout=False)
    assert priced(legacy).provenance["weights"].label == "measured (megatron-lm)"
