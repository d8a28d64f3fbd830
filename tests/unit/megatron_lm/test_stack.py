"""The layer stack read from Megatron-LM's arguments: hybrid patterns (their layers,
pipeline segments and MTP depths), ``--moe-layer-freq``, ``--mtp-num-layers``, latent
attention, Mamba-2's shapes, and the refusals, every problem named at once.

Expected stacks are listed by hand from the patterns (the symbols of megatron-core's
``hybrid_layer_allocation.Symbols``: ``M`` Mamba-2, ``*`` attention, ``-`` MLP, ``E`` MoE);
the cases are Megatron-LM's functional tests at the snapshot (``tests/functional_tests/
test_cases/hybrid/...``, ``nemotron/...``, ``gpt/gpt3_mcore_te_tp2_pp2_mla``), their model
flags restated here.
"""

from __future__ import annotations

from typing import Any

import pytest

from cpmem.errors import InputError
from cpmem.megatron.args import parse_megatron_args
from cpmem.megatron.describe import megatron_geometry
from cpmem.megatron.layer_freq import parse_layer_freq
from cpmem.megatron.layout import stage_layer_counts, virtual_pipeline_size

BASE = {
    "--hidden-size": 1024,
    "--num-attention-heads": 16,
    "--seq-length": 1024,
    "--max-position-embeddings": 1024,
    "--micro-batch-size": 4,
}
HYBRID_MR = {
    # hybrid_mr_mcore_te_tp1_pp1_cp1_dgx_a100_1N8G's model flags
    **BASE,
    "--group-query-attention": True,
    "--num-query-groups": 8,
    "--hybrid-layer-pattern": "M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M-",
    "--spec": "[megatron.core.models.hybrid.hybrid_layer_specs hybrid_stack_spec]",
    "--bf16": True,
}
LIGHTNING_1N4G = {
    # nemotron3_5_lightning_no_load_optim_tp1_pp1_cp1_ep4_dgx_gb200_1N4G's model flags
    "--spec": "[megatron.core.models.hybrid.hybrid_layer_specs hybrid_stack_spec]",
    "--hybrid-layer-pattern": "MEMEM*EMEMEM*E/*E/*E",
    "--num-layers": 14,
    "--hidden-size": 768,
    "--ffn-hidden-size": 512,
    "--moe-ffn-hidden-size": 512,
    "--num-attention-heads": 8,
    "--group-query-attention": True,
    "--num-query-groups": 2,
    "--kv-channels": 64,
    "--mamba-num-heads": 16,
    "--mamba-head-dim": 64,
    "--mamba-state-dim": 128,
    "--mamba-num-groups": 8,
    "--position-embedding-type": "none",
    "--normalization": "RMSNorm",
    "--untie-embeddings-and-output-weights": True,
    "--disable-bias-linear": True,
    "--squared-relu": True,
    "--use-fused-weighted-squared-relu": True,
    "--num-experts": 32,
    "--moe-router-topk": 4,
    "--moe-router-topk-scaling-factor": 2.5,
    "--moe-router-num-groups": 1,
    "--moe-router-group-topk": 1,
    "--moe-router-score-function": "sigmoid",
    "--moe-router-enable-expert-bias": True,
    "--moe-router-dtype": "fp32",
    "--moe-router-load-balancing-type": "seq_aux_loss",
    "--moe-shared-expert-intermediate-size": 1024,
    "--moe-token-dispatcher-type": "alltoall",
    "--mtp-num-layers": 2,
    "--mtp-use-repeated-layer": True,
    "--seq-length": 2048,
    "--max-position-embeddings": 2048,
    "--micro-batch-size": 2,
    "--bf16": True,
    "--enable-experimental": True,
}
MLA = {
    # gpt3_mcore_te_tp2_pp2_mla's model flags
    "--num-layers": 4,
    "--hidden-size": 512,
    "--num-attention-heads": 8,
    "--multi-latent-attention": True,
    "--q-lora-rank": 192,
    "--kv-lora-rank": 64,
    "--qk-head-dim": 16,
    "--qk-pos-emb-head-dim": 8,
    "--v-head-dim": 16,
    "--seq-length": 1024,
    "--max-position-embeddings": 1024,
    "--micro-batch-size": 4,
    "--tensor-model-parallel-size": 2,
    "--pipeline-model-parallel-size": 2,
    "--sequence-parallel": True,
}


def _refusal(flags: dict[str, Any]) -> InputError:
    with pytest.raises(InputError) as err:
        parse_megatron_args(flags)
    return err.value


def test_a_hybrid_pattern_is_the_stack() -> None:
    """Nine symbols 'M-M-M-M*-' four times, then 'M-M-M-M-': 44 layers (no --num-layers
    given), attention at 7, 16, 25 and 34, Mamba-2 and an MLP alternating elsewhere."""
    g = megatron_geometry(parse_megatron_args(HYBRID_MR))
    assert g.layers == 44
    attention = [7, 16, 25, 34]
    mamba = [i for q in range(4) for i in (9 * q, 9 * q + 2, 9 * q + 4, 9 * q + 6)]
    mamba += [36, 38, 40, 42]
    mlp = [i for i in range(44) if i not in attention and i not in mamba]
    assert [i for i, m in enumerate(g.mixers) if m == "attention"] == attention
    assert [i for i, m in enumerate(g.mixers) if m == "mamba"] == mamba
    assert [i for i, f in enumerate(g.mlps) if f == "dense"] == mlp
    assert all(g.mlps[i] == "none" for i in attention + mamba)
    assert all(g.mixers[i] == "none" for i in mlp)
    # transformer_config.py: mamba_head_dim 64, mamba_num_groups 8, mamba_state_dim 128;
    # no --mamba-num-heads: 2 x 1024 / 64 = 32 heads (MambaMixer's expand=2)
    assert (g.mamba_heads, g.mamba_head_dim, g.mamba_groups, g.mamba_state_dim) == (32, 64, 8, 128)
    assert (g.mamba_conv_kernel, g.mamba_chunk) == (4, 128)
    assert (g.q_heads, g.kv_groups, g.head_dim) == (16, 8, 64)
    assert g.ffn == 4 * 1024 and g.mtp_depths == 0


def test_the_pipes_are_the_pipeline_stages() -> None:
    """hybrid_mr_mcore_te_tp1_pp4: four segments of eleven layers on four stages; eight
    segments on PP 4 are two virtual stages each, in segment order."""
    four = "M-M-M-M*-M-|M-M-M*-M-M-|M-M*-M-M-M-|M*-M-M-M-M-"
    args = parse_megatron_args(
        {**HYBRID_MR, "--hybrid-layer-pattern": four, "--pipeline-model-parallel-size": 4}
    )
    assert args.num_layers == 44
    assert stage_layer_counts(args) == (11, 11, 11, 11)
    assert virtual_pipeline_size(args) is None
    eight = "M-|M-|M*|M-|M-M-|M|M-|M*-"
    args = parse_megatron_args(
        {**HYBRID_MR, "--hybrid-layer-pattern": eight, "--pipeline-model-parallel-size": 4}
    )
    assert stage_layer_counts(args) == (2, 2, 2, 2, 4, 1, 2, 3)
    assert virtual_pipeline_size(args) == 2


def test_a_pattern_s_mtp_depths_share_one_layer_set() -> None:
    """'MEMEM*EMEMEM*E/*E/*E': 14 layers, then two MTP depths of attention and an MoE
    block; --mtp-use-repeated-layer: one set of weights for both."""
    g = megatron_geometry(parse_megatron_args(LIGHTNING_1N4G))
    main = "MEMEM*EMEMEM*E"
    assert g.mixers == tuple({"M": "mamba", "E": "none", "*": "attention"}[c] for c in main)
    assert g.mlps == tuple("moe" if c == "E" else "none" for c in main)
    assert (g.mtp_mixers, g.mtp_mlps) == (("attention", "none"), ("none", "moe"))
    assert (g.mtp_depths, g.mtp_shared, g.mtp_layers) == (2, True, 2)
    assert (g.mamba_heads, g.mamba_head_dim, g.mamba_groups) == (16, 64, 8)
    assert (g.num_experts, g.moe_top_k, g.expert_ffn, g.shared_expert_ffn) == (32, 4, 512, 1024)
    assert g.router_scoring == "sigmoid" and not g.gated_mlp and g.positions == "none"
    assert g.ffn == 0  # no '-' layer
    assert any("use_fused_weighted_squared_relu" in p for p in g.unpriced_parts)


def test_the_pattern_s_depths_override_mtp_num_layers() -> None:
    """arguments.py:864-879: the pattern's '/' count wins over --mtp-num-layers."""
    args = parse_megatron_args({**LIGHTNING_1N4G, "--mtp-num-layers": 5})
    assert args.mtp_num_layers == 2


def test_the_deprecated_patterns_are_forwarded() -> None:
    """--hybrid-override-pattern is --hybrid-layer-pattern (arguments.py:743-755); a
    legacy --mtp-hybrid-override-pattern is repeated --mtp-num-layers times after '/'
    (arguments.py:774-785)."""
    flags = {k: v for k, v in HYBRID_MR.items() if k != "--hybrid-layer-pattern"}
    args = parse_megatron_args({**flags, "--hybrid-override-pattern": "M*-"})
    assert (args.hybrid_layer_pattern, args.num_layers) == ("M*-", 3)
    legacy = {
        **flags,
        "--hybrid-layer-pattern": "M*-",
        "--mtp-hybrid-override-pattern": "*-",
        "--mtp-num-layers": 3,
        "--position-embedding-type": "none",
    }
    g = megatron_geometry(parse_megatron_args(legacy))
    assert (g.mtp_mixers, g.mtp_mlps, g.mtp_depths) == (("attention", "none"), ("none", "dense"), 3)


def test_latent_attention_shapes() -> None:
    """--q-lora-rank 192, --kv-lora-rank 64, --qk-head-dim 16, --qk-pos-emb-head-dim 8,
    --v-head-dim 16: heads of 16 + 8, every head its own KV."""
    g = megatron_geometry(parse_megatron_args(MLA))
    assert g.is_mla and (g.q_lora_rank, g.kv_lora_rank) == (192, 64)
    assert (g.qk_nope_head_dim, g.qk_rope_head_dim, g.v_head_dim) == (16, 8, 16)
    assert (g.head_dim, g.kv_groups, g.q_heads) == (24, 8, 8)


def test_latent_attention_takes_megatron_s_defaults() -> None:
    """arguments.py:3548-3557: --q-lora-rank None (a plain query projection),
    --kv-lora-rank 32, --qk-head-dim 128, --qk-pos-emb-head-dim 64, --v-head-dim 128."""
    flags = {k: v for k, v in MLA.items() if "lora" not in k and "head-dim" not in k}
    g = megatron_geometry(parse_megatron_args(flags))
    assert (g.q_lora_rank, g.kv_lora_rank, g.qk_nope_head_dim) == (0, 32, 128)
    assert (g.qk_rope_head_dim, g.v_head_dim, g.head_dim) == (64, 128, 192)


def test_a_plus_in_the_pattern_is_latent_attention() -> None:
    """arguments.py:919-923: '+' turns --multi-latent-attention on."""
    flags = {k: v for k, v in HYBRID_MR.items() if "query" not in k}
    args = parse_megatron_args({**flags, "--hybrid-layer-pattern": "M+-"})
    g = megatron_geometry(args)
    assert args.multi_latent_attention and g.is_mla
    assert g.mixers == ("mamba", "attention", "none")


@pytest.mark.parametrize(
    ("text", "layers"),
    [
        ("([0]*3+[1]*13)", (0, 0, 0) + (1,) * 13),
        ("[1,0,1,0]", (1, 0, 1, 0)),
        ("([1]*3+[0]*1)*3", (1, 1, 1, 0) * 3),
        ("3*[1]+[0]", (1, 1, 1, 0)),
        ("2", 2),
    ],
)
def test_moe_layer_freq_expressions(text: str, layers: object) -> None:
    """The list expressions of moe_freq_type's docstring (arguments.py:327-341), read
    without eval."""
    assert parse_layer_freq(text) == layers


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("[__import__('os')]", "Invalid pattern"),
        ("__import__", "must be an integer or a list expression"),
        ("[1]*[2]", "two lists cannot be multiplied"),
        ("[1]+1", "a list and an integer cannot be added"),
        ("[1,2]", "every layer must be 0 (dense) or 1 (MoE)"),
        ("([1]", "a parenthesis is not closed"),
    ],
)
def test_moe_layer_freq_refuses_what_it_cannot_read(text: str, why: str) -> None:
    with pytest.raises(InputError) as err:
        parse_layer_freq(text)
    assert why in err.value.reason


def test_dense_layers_before_the_moe_layers() -> None:
    """--moe-layer-freq ([0]*3+[1]*5) over 8 layers: three dense MLPs of
    --ffn-hidden-size, then five MoE blocks of --moe-ffn-hidden-size (the DeepSeek
    proxy cases' split); --moe-layer-freq 2: MoE on the even layers
    (gpt_layer_specs.py:647-650)."""
    flags = {
        **BASE,
        "--num-layers": 8,
        "--ffn-hidden-size": 2048,
        "--num-experts": 8,
        "--moe-ffn-hidden-size": 1024,
        "--moe-layer-freq": "([0]*3+[1]*5)",
    }
    g = megatron_geometry(parse_megatron_args(flags))
    assert g.mlps == ("dense",) * 3 + ("moe",) * 5
    assert (g.ffn, g.expert_ffn) == (2048, 1024)
    g = megatron_geometry(parse_megatron_args({**flags, "--moe-layer-freq": 2}))
    assert g.mlps == ("moe", "dense") * 4


def test_a_gpt_s_mtp_layer_is_its_last_layer_s_kind() -> None:
    """--mtp-num-layers 2: two depths of one transformer layer each, the decoder's last
    layer's spec (gpt_builders.py:56-84): an MoE layer after '([0]*3+[1]*5)'."""
    flags = {
        **BASE,
        "--num-layers": 8,
        "--num-experts": 8,
        "--moe-layer-freq": "([0]*3+[1]*5)",
        "--position-embedding-type": "rope",
        "--mtp-num-layers": 2,
    }
    g = megatron_geometry(parse_megatron_args(flags))
    assert (g.mtp_mixers, g.mtp_mlps, g.mtp_depths, g.mtp_shared) == (
        ("attention",),
        ("moe",),
        2,
        False,
    )


@pytest.mark.parametrize(
    ("changes", "value", "reason"),
    [
        (
            {"--hybrid-layer-pattern": "M-M-M", "--pipeline-model-parallel-size": 2},
            "--num-layers 5",
            "does not split evenly over 2 pipeline stages",
        ),
        (
            {"--hybrid-layer-pattern": "M-|M-|M-", "--pipeline-model-parallel-size": 2},
            "--hybrid-layer-pattern with 3 segments",
            "must be evenly divisible by --pipeline-model-parallel-size (2)",
        ),
        (
            {
                "--hybrid-layer-pattern": "M-|M-",
                "--pipeline-model-parallel-size": 2,
                "--decoder-first-pipeline-num-layers": 1,
            },
            "--decoder-first-pipeline-num-layers",
            "the pipeline stages are its '|' segments",
        ),
        (
            {"--hybrid-layer-pattern": "M-", "--hybrid-override-pattern": "M-"},
            "--hybrid-layer-pattern --hybrid-override-pattern",
            "cannot both be specified",
        ),
        ({"--hybrid-layer-pattern": "ME"}, "--hybrid-layer-pattern ME", "need --num-experts"),
        (
            {"--hybrid-layer-pattern": "M-/*-/M-"},
            "--hybrid-layer-pattern M-/*-/M-",
            "every MTP depth's pattern must be the same",
        ),
        (
            {"--hybrid-layer-pattern": "M*-/+-"},
            "--hybrid-layer-pattern M*-/+-",
            "one attention variant",
        ),
        (
            {"--spec": "my.module my_spec", "--num-layers": 2},
            "--spec my.module my_spec",
            "a layer spec of the user's",
        ),
        (
            {"--hybrid-layer-pattern": "M-", "--mamba-num-groups": 3},
            "--mamba-num-groups 3",
            "nheads (32) must be evenly divisible by ngroups",
        ),
    ],
)
def test_a_hybrid_run_megatron_rejects_is_refused_with_its_reason(
    changes: dict[str, Any], value: str, reason: str
) -> None:
    flags = {k: v for k, v in HYBRID_MR.items() if k != "--hybrid-layer-pattern"}
    err = _refusal({**flags, **changes})
    assert value in str(err.value)
    assert reason in err.reason


@pytest.mark.parametrize(
    ("changes", "value", "reason"),
    [
        (
            {"--mtp-num-layers": 1},
            "--mtp-num-layers 1",
            "not supported with learned_absolute position embedding type",
        ),
        (
            {"--group-query-attention": True, "--num-query-groups": 2},
            "--multi-latent-attention --group-query-attention",
            "mutually exclusive",
        ),
    ],
)
def test_a_latent_or_mtp_run_megatron_rejects_is_refused(
    changes: dict[str, Any], value: str, reason: str
) -> None:
    err = _refusal({**MLA, **changes})
    assert value in str(err.value) and reason in err.reason


@pytest.mark.parametrize(
    ("changes", "value", "reason"),
    [
        (
            {"--moe-router-score-function": "softmax"},
            "--moe-router-enable-expert-bias",
            "only supports 'sigmoid' and 'sqrtsoftplus'",
        ),
        (
            {"--moe-router-score-function": "sqrtsoftplus"},
            "--moe-router-score-function sqrtsoftplus",
            "changes memory cpmem does not price",
        ),
        (
            {"--moe-router-enable-expert-bias": False, "--moe-router-group-topk": 1},
            "--moe-router-group-topk 1",
            "keeps a [tokens, experts] mask for backward",
        ),
        (
            {"--disable-bias-linear": False, "--no-bias-gelu-fusion": True},
            "--use-fused-weighted-squared-relu with linear biases",
            "Bias is not supported with fused weighted squared relu",
        ),
    ],
)
def test_a_router_megatron_rejects_or_cpmem_does_not_price_is_refused(
    changes: dict[str, Any], value: str, reason: str
) -> None:
    flags = {**LIGHTNING_1N4G, **changes}
    flags = {k: v for k, v in flags.items() if v is not False}  # False: the flag left out
    err = _refusal(flags)
    assert value in str(err.value) and reason in err.reason


def test_every_problem_of_a_run_is_named_at_once() -> None:
    """A sparse-attention symbol, a refused Mamba-2 path and a Flextron flag: one
    refusal naming all three."""
    err = _refusal(
        {
            **HYBRID_MR,
            "--hybrid-layer-pattern": "MD-",
            "--disable-mamba-mem-eff-path": True,
            "--flextron": True,
        }
    )
    assert "3 arguments are refused" in err.reason
    assert "DeepSeek sparse attention" in err.reason
    assert "the Mamba-2 mixer's unfused path" in err.reason
    assert "is Flextron's" in err.reason and "not a training cpmem prices" in err.reason


def test_gated_deltanet_layers_take_the_linear_shapes() -> None:
    """'G' is a Gated DeltaNet mixer of the --linear-* shapes (transformer_config.py:
    370-382 defaults: conv 4, key heads 16 of 128, value heads 32 of 128)."""
    g = megatron_geometry(parse_megatron_args({**HYBRID_MR, "--hybrid-layer-pattern": "G*-"}))
    assert g.mixers == ("gdn", "attention", "none") and g.mlps == ("none", "none", "dense")
    assert (g.gdn_key_heads, g.gdn_key_dim, g.gdn_value_heads, g.gdn_value_dim) == (
        16,
        128,
        32,
        128,
    )
    assert g.gdn_conv_kernel == 4
    g = megatron_geometry(
        parse_megatron_args(
            {**HYBRID_MR, "--hybrid-layer-pattern": "G-", "--linear-num-value-heads": 16}
        )
    )
    assert g.gdn_value_heads == 16
