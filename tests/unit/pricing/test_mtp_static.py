"""The static memory of multi-token-prediction (MTP) depths: their parameters on the last
pipeline stage (frozen weights, full training's tensors, LoRA's adapters), the embedding
copy an MTP stage holds, and the runtime that builds them.

Expected values are counted by hand from megatron-core's ``MultiTokenPredictionLayer``
(``enorm``, ``hnorm``, ``eh_proj`` of ``2H x H`` without bias, column-parallel, the layer,
``final_layernorm``) on a small model: H = 64, 4 heads of 16 (MHA), a SwiGLU MLP of 128,
RMSNorm, no biases, a 1,000-token vocabulary padded to 1,024.
"""

from __future__ import annotations

from dataclasses import replace

from cpmem.model.geometry import ModelGeometry
from cpmem.plan.layout import ParallelLayout
from cpmem.pricing.static import adapter_parameters, mtp_adapter_parameters, static_memory
from cpmem.pricing.weights import rank_weights, stage_tensors, total_parameters
from cpmem.step.describe import describe_settings
from cpmem.step.trainer import Adapter

SMALL = ModelGeometry(
    name="small",
    hidden=64,
    mixers=("attention",) * 4,
    mlps=("dense",) * 4,
    q_heads=4,
    kv_groups=4,
    head_dim=16,
    ffn=128,
    vocab=1000,
    qk_norm=False,
)
MTP = replace(SMALL, mtp_mixers=("attention",), mtp_mlps=("dense",), mtp_depths=1)

LAYER = 64 * (64 + 2 * 64) + 64 * 64 + 64 + (2 * 128 + 128) * 64 + 64
"""One layer: QKV (64 -> 192) and the output projection (64 -> 64), the input norm; fc1
(64 -> 256), fc2 (128 -> 64), the pre-MLP norm: 41,088."""
DEPTH = 2 * 64 * 64 + 3 * 64 + LAYER
"""One MTP depth: eh_proj (128 -> 64), enorm, hnorm, final_layernorm, its layer: 49,472."""
DEPTH_TP2 = (64 * 192 + 64 * 64 + 256 * 64 + 128 * 64 + 2 * 64 * 64) // 2 + 2 * 64 + 3 * 64
"""The depth on one of two TP ranks: the linears halved, the five norms whole: 24,896."""


def test_the_hand_counts() -> None:
    assert (LAYER, DEPTH, DEPTH_TP2) == (41_088, 49_472, 24_896)


def test_the_last_stage_holds_the_mtp_depth() -> None:
    layout = ParallelLayout(tp=1)
    assert rank_weights(MTP, layout).mtp == 2 * DEPTH
    assert rank_weights(MTP, layout, first=True, last=False).mtp == 0
    assert rank_weights(SMALL, layout).mtp == 0
    assert rank_weights(MTP, layout).layers == rank_weights(SMALL, layout).layers
    tp2 = ParallelLayout(tp=2, sp=True)
    assert rank_weights(MTP, tp2).mtp == 2 * DEPTH_TP2


def test_shared_depths_hold_one_set_of_weights() -> None:
    three = replace(MTP, mtp_depths=3)
    shared = replace(three, mtp_shared=True)
    layout = ParallelLayout(tp=1)
    assert rank_weights(three, layout).mtp == 3 * 2 * DEPTH
    assert rank_weights(shared, layout).mtp == 2 * DEPTH
    assert total_parameters(three) - total_parameters(SMALL) == 3 * DEPTH
    assert total_parameters(shared) - total_parameters(SMALL) == DEPTH
    assert total_parameters(three, mtp=False) == total_parameters(SMALL)


def test_an_mtp_stage_that_is_not_the_first_holds_the_embedding() -> None:
    """gpt_model.py:173: the MTP stage builds the embedding (untied here: the output
    layer beside it), a copy in a bucket of its own (language_module.py:269-279)."""
    layout = ParallelLayout(tp=1)
    matrix = 1024 * 64
    assert rank_weights(MTP, layout, first=False, last=True).embedding == 2 * matrix
    assert rank_weights(SMALL, layout, first=False, last=True).embedding == 0
    last = stage_tensors(MTP, layout, [2, 3], first=False, last=True)
    assert last.tied_copy == (matrix,)
    assert stage_tensors(MTP, layout, [0, 1, 2, 3], first=True, last=True).tied_copy == ()


def test_full_training_tensors_of_a_depth() -> None:
    """After the final norm, in megatron-core's order: enorm, hnorm, eh_proj, the layer's
    tensors (its weights, then norms), final_layernorm; then the output layer."""
    layout = ParallelLayout(tp=1)
    with_mtp = stage_tensors(MTP, layout, [0, 1, 2, 3], first=True, last=True).dense
    without = stage_tensors(SMALL, layout, [0, 1, 2, 3], first=True, last=True).dense
    depth = [64, 64, 8192, 64 * 192, 64 * 64, 256 * 64, 128 * 64, 64, 64, 64]
    assert with_mtp == without[:-1] + tuple(depth) + without[-1:]
    assert sum(depth) == DEPTH


def test_lora_adapts_the_mtp_layers_on_the_last_stage() -> None:
    layout = ParallelLayout(tp=1)
    adapter = Adapter(8)
    one_layer = adapter_parameters(SMALL, adapter, layout, [0])
    assert mtp_adapter_parameters(MTP, adapter, layout) == one_layer
    assert mtp_adapter_parameters(SMALL, adapter, layout) == 0


def test_only_a_runtime_that_builds_mtp_prices_it() -> None:
    """ART's trainer builds no MTP layers (Runtime.builds_mtp): its step's model has none
    and its static memory is the model's without them; Megatron-LM's has them."""
    art = describe_settings(MTP, runtime="art")
    assert art.geometry.mtp_depths == 0
    bare = describe_settings(SMALL, runtime="art")
    assert static_memory(art).components == static_memory(bare).components
    megatron = describe_settings(MTP, runtime="megatron-lm", training="full")
    assert megatron.geometry.mtp_depths == 1
    full = static_memory(megatron).components
    plain = static_memory(describe_settings(SMALL, runtime="megatron-lm", training="full"))
    # bf16 weights without the distributed optimizer (no buffer padding): the depth's
    assert full["weights"] - plain.components["weights"] == 2 * DEPTH
