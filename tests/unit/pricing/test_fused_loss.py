"""Megatron's fused cross entropy as its container's PyTorch compiles it
(``cpmem.step.torch_build``, ``cpmem.pricing.head.fused_loss_bytes``), counted by hand on
the tiny GPT with ``--cross-entropy-loss-fusion`` at TP2 PP2 (Megatron-LM's
``gpt3_mcore_te_tp2_pp2_cross_entropy_loss_fusion`` case): micro-batch 4 of 1,024 tokens,
GPT-2's 50,257-entry vocabulary padded to a multiple of 128 x 2 = 256 (50,432), 25,216
columns a TP rank.
"""

from __future__ import annotations

import pytest
from megatron_lm.tiny import step_of, tiny

from cpmem.errors import InputError
from cpmem.pricing.head import head_bytes
from cpmem.step.attention_backend import DEFAULT_CONTAINER
from cpmem.step.backend_choice import NAMED_CONTAINERS, container_for_image
from cpmem.step.describe import describe_step
from cpmem.step.torch_build import TORCH_BUILDS, TorchBuild, torch_build

TOKENS = 4 * 1024
V_SHARD = 50_432 // 2
FP32_LOGITS = 4 * TOKENS * V_SHARD  # one fp32 [tokens, V/t] buffer: 413,138,944 B


def _heads(container: str) -> tuple[object, object]:
    fused = step_of(tiny(**_run(True)), container=container, attention_backend="fused")
    plain = step_of(tiny(**_run(False)), container=container, attention_backend="fused")
    return head_bytes(fused, TOKENS), head_bytes(plain, TOKENS)


def _run(fusion: bool) -> dict[str, object]:
    return {
        "tensor_model_parallel_size": 2,
        "pipeline_model_parallel_size": 2,
        "cross_entropy_loss_fusion": fusion,
    }


@pytest.mark.parametrize(
    ("container", "forward", "backward"),
    [
        ("dev", 0, 1),  # PyTorch >= 2.6: the compiled backward's copy of the softmax
        ("ngc-24.10", 1, 2),  # 2.5: and the first launch's device clone, both ways
        ("ngc-24.01", 2, 2),  # 2.2: and the forward's exp into a second buffer
    ],
)
def test_the_fused_loss_holds_fp32_logit_buffers_beyond_the_unfused_one(
    container: str, forward: int, backward: int
) -> None:
    fused, plain = _heads(container)
    assert fused.kept == plain.kept  # the same fp32 softmax kept until backward
    assert fused.forward - plain.forward == forward * FP32_LOGITS
    assert fused.backward - plain.backward == backward * FP32_LOGITS


def test_the_unfused_loss_is_the_same_in_every_container() -> None:
    assert _heads("dev")[1] == _heads("ngc-24.01")[1] == _heads("ngc-24.10")[1]


def test_the_run_is_priced_in_the_container_asked_whatever_the_backend() -> None:
    step = step_of(tiny(**_run(True)), container="ngc-24.10", attention_backend="fused")
    assert step.settings.runtime.container == "ngc-24.10"
    hf = describe_step("qwen3-1.7b", lengths=[512], head="fused", container="ngc-24.01")
    assert hf.settings.runtime.container == "ngc-24.01"


def test_an_unknown_container_is_refused_naming_it() -> None:
    with pytest.raises(InputError, match=r"container.*bogus"):
        step_of(tiny(**_run(True)), container="bogus", attention_backend="fused")


def test_every_named_container_has_a_pytorch_build() -> None:
    assert set(TORCH_BUILDS) == set(NAMED_CONTAINERS)
    with pytest.raises(InputError, match="container"):
        torch_build("ngc-23.01")


def test_the_ngc_images_map_to_their_pytorch() -> None:
    """NGC's release notes: 24.01 ships 2.2.0a0+81ea7a4, 24.10 2.5.0a0+e000cf0ad9, 25.01
    2.6.0a0+ecf3bae40a (every later image newer)."""
    assert torch_build(container_for_image("nvcr.io/nvidia/pytorch:24.01-py3")).version == (2, 2)
    assert torch_build(container_for_image("nvcr.io/nvidia/pytorch:24.10-py3")).version == (2, 5)
    for image in ("25.03", "25.09", "26.04"):
        build = torch_build(container_for_image(f"nvcr.io/nvidia/pytorch:{image}-py3"))
        assert build.version >= (2, 6)
    assert NAMED_CONTAINERS["ngc-24.10"] == DEFAULT_CONTAINER  # TE's pick as after it


@pytest.mark.parametrize(
    ("version", "copy", "in_place", "clones"),
    [
        ((2, 2), True, False, True),  # CPU inductor 2.2: forward 10 B, backward 10 B
        ((2, 5), True, True, True),  # clone_args without a host copy before 2.6
        ((2, 6), True, True, False),  # copy_args_to_cpu_if_needed from 2.6.0
        ((2, 13), True, True, False),
    ],
)
def test_what_each_pytorch_does_with_the_compiled_loss(
    version: tuple[int, int], copy: bool, in_place: bool, clones: bool
) -> None:
    build = TorchBuild(version, "test")
    assert build.compiled_backward_copy is copy
    assert build.compiled_forward_in_place is in_place
    assert build.autotune_clones_on_device is clones
