"""The FP8 step setting (``cpmem.step.fp8``): its text, and every combination it is not
priced for refused with each reason at once (the reasons read from the module's sources:
FP8 GEMMs from compute capability 8.9, MXFP8 on 10 and 11)."""

from __future__ import annotations

import pytest

from cpmem.api import describe_step
from cpmem.errors import InputError
from cpmem.step.fp8 import FP32, LATENT_SP, Fp8, fp8_problems, recompute_problems
from cpmem.step.recompute import Recompute

FULL = {"runtime": "megatron-lm", "training": "full"}


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("tensorwise:param-gather", Fp8("tensorwise", True)),
        ("Delayed", Fp8("delayed", False)),
        ("delayed:param-gather", Fp8("delayed", True, 1)),  # Megatron-LM's default history
        ("delayed:history=1024:param-gather", Fp8("delayed", True, 1024)),
        ("none", None),
        (None, None),
    ],
)
def test_the_setting_reads_recipe_and_param_gather(text: str | None, parsed: Fp8 | None) -> None:
    assert Fp8.parse(text) == parsed


@pytest.mark.parametrize(
    "text",
    ["tensorwise:gather", "tensorwise:history=16", "delayed:history=0", "delayed:history=x"],
)
def test_a_malformed_setting_names_the_field(text: str) -> None:
    # a history belongs to delayed scaling alone, a whole number of steps from 1
    with pytest.raises(InputError) as err:
        Fp8.parse(text)
    assert (err.value.field, err.value.value) == ("fp8", text)


def test_the_label_names_a_history_other_than_megatrons_default() -> None:
    assert Fp8("delayed", True, 1024).label == "delayed:param-gather:history=1024"
    assert Fp8("delayed", True).label == "delayed:param-gather"
    assert Fp8.parse(Fp8("delayed", True, 1024).label) == Fp8("delayed", True, 1024)


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("tensorwise:param-gather", Fp8("tensorwise", True)),
        ("delayed:param-gather:history=1024", Fp8("delayed", True, 1024)),
        # without param-gather: bf16 weights beside TE's cached FP8 copies
        ("tensorwise", Fp8("tensorwise", False)),
        ("delayed", Fp8("delayed", False)),
    ],
)
def test_the_priced_recipes_price_on_a_dense_model(text: str, parsed: Fp8) -> None:
    step = describe_step("qwen3-1.7b", [4096], fp8=text, **FULL)
    assert step.settings.fp8 == parsed


def test_every_reason_is_named_at_once() -> None:
    with pytest.raises(InputError) as err:
        describe_step("qwen3-1.7b", [4096], fp8="mxfp8:param-gather", device="a100-80gb")
    reason = err.value.reason
    assert err.value.field == "fp8" and err.value.value == "mxfp8:param-gather"
    for part in (
        "MXFP8 on compute capability 10 and 11 only (quantization.py:162-168",
        "full training (--training full) only",
        "compute capability 8.9 or later",
    ):
        assert part in reason


def test_other_layer_kinds_and_recompute_are_refused() -> None:
    with pytest.raises(InputError) as err:
        describe_step(
            "qwen3.5-35b-a3b", [4096], fp8="delayed:param-gather", recompute="full", **FULL
        )
    assert "not ['gdn']" in err.value.reason
    assert "full recompute with the delayed recipe" in err.value.reason


@pytest.mark.parametrize(
    ("recipe", "modules", "said"),
    [
        ("tensorwise", "core_attn,moe_act,layernorm", None),
        ("blockwise", "moe_act", None),
        # Megatron-LM 4828d651 transformer_layer.py:821-833, moe_layer.py:510-518, :685-695:
        # te_checkpoint under FP8; TE b9d690e0 distributed.py:336-400 saves its inputs alone
        ("tensorwise", "mlp", None),
        ("blockwise", "core_attn,moe", None),
        ("mxfp8", "shared_experts,moe_act", None),
        # TE quantization.py:761-786: the amax history and scale copied, delayed only
        ("delayed", "mlp", "copy_forward_fp8_meta_tensors_for_recompute"),
        ("delayed", "moe,shared_experts", "['moe', 'shared_experts'] with the delayed"),
        # its FP8 saved set is latent attention's, not priced under FP8 yet
        ("tensorwise", "mla_up_proj", "when FP8 on latent attention is"),
        # TE b9d690e0 grouped_linear.py:431-443: save_original_input (megatron-core's fc2
        # under moe_act recompute) raises under delayed scaling's Float8Quantizer
        ("delayed", "moe_act", "DelayedScaling recipe is not supported"),
        ("delayed", "core_attn", None),
    ],
)
def test_selective_recompute_of_the_priced_modules_is_priced(
    recipe: str, modules: str, said: str | None
) -> None:
    problems = recompute_problems(Fp8(recipe), Recompute.parse("selective", modules))
    if said is None:
        assert problems == []
    else:
        assert len(problems) == 1 and said in problems[0]


def test_a_te_checkpoint_beside_bf16_layers_is_refused() -> None:
    """A bf16 layer's checkpointed module rebuilds its bf16 saved set, priced as FP8's."""
    fp8 = Fp8("tensorwise", bf16_layers=(0,))
    assert recompute_problems(fp8, Recompute.parse("selective", "core_attn,moe_act")) == []
    (problem,) = recompute_problems(fp8, Recompute.parse("selective", "mlp"))
    assert "['mlp'] with layers kept in bf16" in problem


def test_tp_comm_overlap_needs_sequence_parallelism() -> None:
    with pytest.raises(InputError) as err:
        describe_step("qwen3-1.7b", [4096], tp_comm_overlap=True, **FULL)
    assert err.value.field == "tp_comm_overlap"
    step = describe_step("qwen3-1.7b", [4096], tp=2, tp_comm_overlap=True, **FULL)
    assert step.settings.tp_comm_overlap


@pytest.mark.parametrize(
    ("given", "reason"),
    [
        ({"fsdp": "optim_grads"}, "priced under the optim_grads_params strategy only"),
        ({"optimizer": "muon"}, "beside Muon's layer-wise buffers are not priced"),
    ],
)
def test_fp8_parameters_in_other_buffers_are_refused(given: dict[str, str], reason: str) -> None:
    """The uint8 buffer, transposes and scale inverses are priced in megatron-core's DDP
    buffers and Megatron FSDP's under optim_grads_params; Megatron FSDP's other strategies
    and Muon keep their parameters in buffers of their own."""
    with pytest.raises(InputError) as err:
        describe_step("qwen3-1.7b", [4096], fp8="tensorwise:param-gather", dp=4, **FULL, **given)
    assert err.value.field == "fp8"
    assert reason in err.value.reason


@pytest.mark.parametrize(
    "fp8",
    ["tensorwise", "delayed", "blockwise:param-gather", "tensorwise:param-gather:bf16-layers=0"],
)
def test_megatron_fsdps_fp8_weights_are_priced_for_gathered_tensorwise_and_delayed_only(
    fp8: str,
) -> None:
    """Megatron FSDP's static memory lays out uint8 shards with one scale inverse each
    (``cpmem.pricing.fsdp``); the terms priced in DDP's buffers for the other FP8 modes (TE's
    cached copies without param-gather, blockwise's columnwise copies and scales, bf16
    layers) are not laid out there, so those modes are refused under FSDP rather than priced
    without them."""
    with pytest.raises(InputError) as err:
        describe_step("qwen3-1.7b", [4096], fp8=fp8, fsdp="optim_grads_params", dp=4, **FULL)
    assert err.value.field == "fp8"
    assert "priced with param-gather under the tensorwise and delayed recipes" in err.value.reason
    step = describe_step(
        "qwen3-1.7b", [4096], fp8="delayed:param-gather", fsdp="optim_grads_params", dp=4, **FULL
    )
    assert step.settings.fp8 is not None


FACTS = {
    "training": "full",
    "kinds": ("attention", "dense"),
    "transformer_te": True,
    "dtype_bytes": 2,
}


@pytest.mark.parametrize(
    ("recipe", "major", "refused"),
    [
        # TE b9d690e0 quantization.py:162-168, _compute_mxfp8_support: False below (10, 0),
        # True from (10, 0), False again from (12, 0) ("not supported on 12.0+ yet")
        ("mxfp8", 9, True),
        ("mxfp8", 10, False),
        ("mxfp8", 11, False),
        ("mxfp8", 12, True),
        # quantization.py:178-185: block scaling from 9.0, as every FP8 recipe's major 9
        ("blockwise", 9, False),
        ("tensorwise", 12, False),
    ],
)
def test_each_recipe_runs_where_transformer_engine_supports_it(
    recipe: str, major: int, refused: bool
) -> None:
    problems = fp8_problems(Fp8(recipe, True), compute_capability=major, **FACTS)  # type: ignore[arg-type]
    said = any("MXFP8 on compute capability 10 and 11 only" in p for p in problems)
    assert said == refused
    if refused:
        assert any(p.endswith(f"; this device: {major}") for p in problems)


def test_the_bf16_layers_read_label_and_slice() -> None:
    parsed = Fp8.parse("blockwise:bf16-layers=11,0")
    assert parsed == Fp8("blockwise", False, bf16_layers=(0, 11))
    assert parsed.label == "blockwise:bf16-layers=0,11"
    assert Fp8.parse(parsed.label) == parsed
    # a pipeline chunk of layers 6..11 holds the last one, renumbered from 0
    assert parsed.sliced(6, 12).bf16_layers == (5,)
    assert parsed.sliced(1, 11).bf16_layers == ()
    assert not parsed.in_fp8(11) and parsed.in_fp8(5)
    with pytest.raises(InputError):
        Fp8.parse("tensorwise:bf16-layers=first")


def test_bf16_layers_outside_the_stack_and_under_delayed_scaling_are_refused() -> None:
    with pytest.raises(InputError) as err:
        describe_step("qwen3-1.7b", [4096], fp8="delayed:bf16-layers=0,40", **FULL)
    # qwen3-1.7b has 28 layers; megatron-core's TransformerConfig rejects delayed scaling
    # with layers in bf16 (transformer_config.py:1335-1336 at 4828d651)
    assert "must lie in the 28 layers" in err.value.reason
    assert "Delayed scaling does not support first / last layer in BF16" in err.value.reason
    step = describe_step("qwen3-1.7b", [4096], fp8="tensorwise:bf16-layers=0,27", **FULL)
    assert step.settings.fp8 is not None and step.settings.fp8.bf16_layers == (0, 27)


@pytest.mark.parametrize(
    ("fp8", "said"),
    [
        (Fp8("tensorwise"), None),
        (Fp8("blockwise", bf16_layers=(0,)), "a recomputed layer's working set"),
        # TE b9d690e0 quantization.py:761-786: the recompute's state copies, delayed only
        (Fp8("delayed"), "copy_forward_fp8_meta_tensors_for_recompute"),
    ],
)
def test_full_recompute_is_priced_where_nothing_beyond_the_widths_is_kept(
    fp8: Fp8, said: str | None
) -> None:
    problems = recompute_problems(fp8, Recompute.parse("full"))
    assert problems == [] if said is None else (len(problems) == 1 and said in problems[0])


def test_moe_layers_need_the_grouped_experts() -> None:
    # TEGroupedMLP's GroupedLinear (one module of E/EP GEMMs) is what is priced
    kinds = ("attention", "moe")
    said = "priced for TEGroupedMLP (--moe-grouped-gemm)"
    facts = {**FACTS, "kinds": kinds, "compute_capability": 9}
    assert any(said in p for p in fp8_problems(Fp8("tensorwise"), grouped_gemm=False, **facts))  # type: ignore[arg-type]
    assert fp8_problems(Fp8("tensorwise"), grouped_gemm=True, **facts) == []  # type: ignore[arg-type]


def test_latent_attention_is_priced_where_sp_splits_no_rank_s_tokens() -> None:
    """FP8 on latent attention's linears (``cpmem.pricing.kinds.fp8.latent_fp8_width``) is
    laid out on a rank whose tokens SP does not split; under SP (TP > 1) its down
    projections run on the sequence shard and its up projections on gathered rows, refused
    by name."""
    facts = {**FACTS, "kinds": ("attention", "moe"), "compute_capability": 9}
    assert fp8_problems(Fp8("tensorwise", True), latent=True, **facts) == []  # type: ignore[arg-type]
    split = fp8_problems(Fp8("tensorwise", True), latent=True, sequence_split=True, **facts)  # type: ignore[arg-type]
    assert split == [LATENT_SP]
    assert fp8_problems(Fp8("tensorwise", True), sequence_split=True, **facts) == []  # type: ignore[arg-type]


def test_moe_layers_are_priced_in_megatron_fsdps_buffers() -> None:
    """The routed experts' FP8 weights are a uint8 bucket of their own in Megatron FSDP,
    sharded over the expert data-parallel group (``cpmem.pricing.fsdp_units``): an MoE
    stack under optim_grads_params with tensorwise param-gather is priced."""
    facts = {**FACTS, "kinds": ("attention", "dense", "moe"), "compute_capability": 10}
    gathered = Fp8("tensorwise", True)
    assert fp8_problems(gathered, fsdp="optim_grads_params", **facts) == []  # type: ignore[arg-type]


def test_fp32_parameters_are_refused_with_what_they_change() -> None:
    # no --bf16 / --fp16: 4-byte parameters and activations
    facts = {**FACTS, "dtype_bytes": 4, "compute_capability": 9}
    problems = fp8_problems(Fp8("tensorwise", True), **facts)  # type: ignore[arg-type]
    assert problems == [FP32]
    assert "fp32 activations" in FP32 and "fp32 copy" in FP32
