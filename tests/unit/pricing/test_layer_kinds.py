"""The layer kinds' specs (``cpmem.pricing.kinds``): every kind of the stack is priced
through one spec, its parameters counted as megatron-core builds them, its trained
tensors adding up to its parameters, and an unknown kind refused by name.

Expected values are hand counts from the modules' constructors (megatron-core 0.16
``ssm/mamba_mixer.py``, ``ssm/gated_delta_net.py``, ``transformer/multi_latent_attention.py``),
written out below, not read from the code under test.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from cpmem.api import describe_step, estimate, load_model
from cpmem.errors import InputError
from cpmem.model.geometry import ModelGeometry
from cpmem.plan.layout import ParallelLayout
from cpmem.pricing.kinds import MIXERS, MLPS, mixer_spec, mlp_spec
from cpmem.pricing.weights import expert_tensors, layer_tensors, total_parameters
from cpmem.step.trainer import Adapter

# a small Mamba-2 hybrid: h1024, 32 heads of 64 (d = 2048), state 128, 8 groups, kernel 4;
# attention 16 heads of 64, 8 groups; an MLP of 4096 (GeLU-style, ungated)
H, D, N, G, HEADS = 1024, 2048, 128, 8, 32
HYBRID = ModelGeometry(
    name="mamba-hybrid",
    hidden=H,
    mixers=("mamba", "none", "attention", "none"),
    mlps=("none", "dense", "none", "dense"),
    q_heads=16,
    kv_groups=8,
    head_dim=64,
    vocab=50_304,
    ffn=4096,
    gated_mlp=False,
    qk_norm=False,
    mamba_heads=HEADS,
    mamba_head_dim=64,
    mamba_state_dim=N,
    mamba_groups=G,
    mamba_conv_kernel=4,
    mamba_chunk=128,
)


def test_a_mamba_mixer_holds_megatron_cores_parameters() -> None:
    # in_proj H x (2d + 2GN + heads) = 1024 x (4096 + 2048 + 32) = 6,324,224
    # conv1d over d + 2GN = 4096 channels, kernel 4 and a bias: 4096 x 5 = 20,480
    # dt_bias, A_log, D: 3 x 32 = 96; the gated norm's weight: d = 2,048
    # out_proj d x H = 2,097,152; the input norm (RMSNorm): H = 1,024
    sharded = 6_324_224 + 20_480 + 96 + 2_048 + 2_097_152
    p = mixer_spec("mamba").parameters(HYBRID)
    assert (p.sharded, p.experts, p.replicated) == (sharded, 0, 1_024)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_a_mamba_layers_trained_tensors_are_its_parameters_on_the_rank(tp: int) -> None:
    tensors = layer_tensors(HYBRID, 0, tp)
    p = mixer_spec("mamba").parameters(HYBRID)
    assert sum(tensors) == p.sharded // tp + p.replicated
    assert H * (2 * D + 2 * G * N + HEADS) // tp in tensors  # in_proj's shard


def test_mixer_and_mlp_less_layers_hold_nothing_of_their_missing_part() -> None:
    assert mlp_spec("none").parameters(HYBRID).on_rank(1, 1) == 0
    assert mixer_spec("none").parameters(HYBRID).on_rank(1, 1) == 0
    # the MLP-only layer: fc1 (ungated, F = 4096) and fc2, no bias, its input norm
    assert sum(layer_tensors(HYBRID, 1, 1)) == 2 * 4096 * H + H


def test_the_hybrids_total_is_its_layers_and_embeddings_by_hand() -> None:
    mamba = 6_324_224 + 20_480 + 96 + 2_048 + 2_097_152 + 1_024
    attention = H * (16 * 64 + 2 * 8 * 64) + 16 * 64 * H + H  # QKV, proj, input norm
    mlp = 2 * 4096 * H + H
    embeddings = 2 * 50_304 * H  # untied: the embedding and the output layer
    assert total_parameters(HYBRID) == mamba + attention + 2 * mlp + embeddings + H


@pytest.mark.parametrize("model", ["qwen3.5-4b", "moonlight-16b-a3b", "gpt-oss-20b", "gemma-3-12b"])
@pytest.mark.parametrize("tp", [1, 2])
def test_every_kinds_trained_tensors_add_up_to_its_parameters(model: str, tp: int) -> None:
    """Full training's tensors (the DDP buffer's layout) and the static weights' count are
    two readings of one constructor: per layer, the dense tensors on a rank are the
    sharded parameters over TP plus the replicated ones, the experts' the rest."""
    g = load_model(model)
    for i in {0, g.layers - 1}:
        mixer = mixer_spec(g.mixers[i]).parameters(g)
        mlp = mlp_spec(g.mlps[i]).parameters(g)
        dense = mixer.sharded / tp + mixer.replicated + mlp.sharded / tp + mlp.replicated
        assert sum(layer_tensors(g, i, tp)) == pytest.approx(dense, abs=8)
        assert sum(expert_tensors(g, i, 1, 1)) == mlp.experts


def test_full_training_prices_gdn_gated_latent_sinks_and_sandwich_layers() -> None:
    for model in ("qwen3.5-4b", "moonlight-16b-a3b", "gpt-oss-20b", "gemma-3-12b"):
        # gpt-oss's experts have biases, which megatron-core builds at ETP 1 only
        etp = {"etp": 1} if model == "gpt-oss-20b" else {}
        est = estimate(model, [2048], runtime="megatron-lm", training="full", tp=2, **etp)
        assert est.static.components["weights"] > 0
        assert est.peak_bytes > est.static.total


def test_latent_attentions_trained_tensors_by_hand() -> None:
    """Moonlight's MLA (h2048, 16 heads, no q_lora_rank, kv_lora_rank 512, nope 128,
    rope 64, v 128) at TP 2: the query's plain projection h x 16 x 192 / 2, the KV down
    projection h x (512 + 64) whole, the KV up projection 512 x 16 x 256 / 2, the output
    projection 16 x 128 / 2 x h, the input norm h and the KV norm 512."""
    g = load_model("moonlight-16b-a3b")
    t = mixer_spec("attention").trained_tensors(g, 2)
    assert t.weights == (2048 * 16 * 192 // 2, 2048 * 576, 512 * 16 * 256 // 2, 1024 * 2048)
    assert t.norms == (2048,) and t.extra == (512,)


def test_an_unknown_kind_is_refused_by_name() -> None:
    with pytest.raises(InputError, match="mixers"):
        mixer_spec("retnet")
    with pytest.raises(InputError, match="mlps"):
        mlp_spec("kan")
    with pytest.raises(InputError, match="a layer needs a mixer or a feed-forward block"):
        replace(HYBRID, mixers=("none", *HYBRID.mixers[1:]))


def test_every_registered_kind_names_itself() -> None:
    assert set(MIXERS) == {"attention", "gdn", "mamba", "none"}
    assert set(MLPS) == {"dense", "moe", "none"}
    assert all(name == spec.name for name, spec in {**MIXERS, **MLPS}.items())


def test_mamba_adapters_sit_on_in_proj_and_out_proj() -> None:
    layout = ParallelLayout(tp=2, sp=True)
    r16 = mixer_spec("mamba").adapter_parameters(HYBRID, Adapter(rank=16), layout)
    # in_proj: A (H) + B's shard ((2d + 2GN + heads) / 2); out_proj: A's shard (d / 2) + B (H)
    assert r16 == 16 * ((H + 6_176 // 2) + (D // 2 + H))
    none = mixer_spec("mamba").adapter_parameters(
        HYBRID, Adapter(rank=16, targets=("qkv", "proj")), layout
    )
    assert none == 0


def test_a_mamba_layer_keeps_its_in_proj_copy_three_inner_tensors_and_its_norm() -> None:
    """Per token at TP 1 with the harness's adapters (hand count, the module docstring's
    reading of megatron's training path): the input norm's input and output (2H = 2,048),
    the residual dropout's bool mask (H/2 = 512, dropout 0.1), the in_proj output's copy
    (2d + 2GN + heads = 6,176), out_x, the gated norm's input and output (3d = 6,144), the
    norm's fp32 rstd per group (2G = 16), the input norm's fp32 rstd (2) and two rank-1
    A·x (2)."""
    from cpmem.pricing.tight.compose import tight_widths

    g = replace(HYBRID, hidden_dropout=0.1)
    step = describe_step(g, [4096])
    w = tight_widths(g, step)
    assert w.of("mamba") == 2_048 + 512 + 6_176 + 6_144 + 16 + 2 + 2
    tp2 = tight_widths(g, describe_step(g, [4096], tp=2, sp=False))
    assert tp2.of("mamba") == 2_048 + 512 + (6_176 + 6_144 + 16 + 2) // 2 + 2


@pytest.mark.parametrize(
    "model", ["qwen3.5-4b", "moonlight-16b-a3b", "gpt-oss-20b", "gemma-3-12b", "deepseek-v3"]
)
@pytest.mark.parametrize("tp", [1, 2])
def test_every_kinds_matrix_shapes_hold_its_matrix_elements(model: str, tp: int) -> None:
    """Each kind's listed ``(rows, cols)`` (``TrainedTensors.shapes``, ``expert_shapes``)
    are the matrices its element counts give, one for one in order: the layer-wise
    layout packs by the shapes, the buffers count the elements."""
    g = load_model(model)
    for kinds in {(g.mixers[i], g.mlps[i]) for i in range(g.layers)}:
        for spec in (mixer_spec(kinds[0]), mlp_spec(kinds[1])):
            t = spec.trained_tensors(g, tp)
            matrices = [n for n, m in zip(t.weights, t.matrix_flags(), strict=False) if m]
            assert t.shapes is not None, spec.name
            # the same matrices; the shapes in the order megatron-core registers them
            assert sorted(r * c for r, c in t.shapes) == sorted(matrices), spec.name
        mlp = mlp_spec(kinds[1])
        flags = mlp.expert_matrix_flags(g, 1, 1)
        tensors = mlp.expert_tensors(g, 1, 1)
        assert [r * c for r, c in mlp.expert_shapes(g, 1, 1)] == [
            n for n, m in zip(tensors, flags, strict=True) if m
        ]


def test_mamba_and_gdn_list_the_shapes_of_the_matrices_muon_steps() -> None:
    # mamba: out_proj [H, D / TP] alone (in_proj use_muon=False, the conv kernel 3-D)
    assert mixer_spec("mamba").trained_tensors(HYBRID, 2).shapes == ((H, D // 2),)
    # attention: linear_proj [H, Q / TP] registered before linear_qkv [(Q + 2 KV) / TP, H]
    # (attention.py: Attention.__init__ builds linear_proj, SelfAttention then linear_qkv)
    assert mixer_spec("attention").trained_tensors(HYBRID, 2).shapes == (
        (H, 16 * 64 // 2),
        ((16 + 2 * 8) * 64 // 2, H),
    )


def test_a_moe_blocks_matrices_are_listed_router_first_and_shared_gate_last() -> None:
    # moe_layer.py: the router registered before the shared experts; shared_experts.py:
    # gate_weight [1, H] set after SharedExpertMLP's own linears (super().__init__)
    g = load_model("qwen3.5-35b-a3b")
    shapes = mlp_spec(g.mlps[0]).trained_tensors(g, 1).shapes
    assert shapes is not None
    f = g.shared_expert_ffn
    assert shapes == ((g.num_experts, g.hidden), (2 * f, g.hidden), (g.hidden, f), (1, g.hidden))
