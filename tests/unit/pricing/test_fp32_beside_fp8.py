"""fp32 parameters beside FP8 (neither ``--bf16`` nor ``--fp16``): what cpmem prices of it
already, each figure counted by hand from the source lines named.

- Megatron FSDP's gradient buffer (``cpmem.pricing.fsdp.fsdp_gradient_bytes``): under
  ``--megatron-fsdp-main-grads-dtype auto`` an FP8 group's gradients are bf16 whatever the
  parameters' dtype (``_resolve_group_grad_dtype``, param_and_grad_buffer.py:2306-2316 at
  4828d651), the other groups' the parameters' dtype; the optimizer steps each shard's
  gradient ``.to(param.dtype)`` of its fp32 main weight (:3369-3373): a 4 B copy of a
  2-byte gradient, none of a 4-byte one.
- The LM head's logits (``cpmem.pricing.head``): ``.float()`` of fp32 logits is the tensor
  itself (tensor_parallel/cross_entropy.py:25), its softmax built in it in place (:42,
  :62), and its gradient built in the saved softmax (:88-116): no second logits buffer.
"""

from __future__ import annotations

from megatron_lm.tiny import step_of, tiny

from cpmem.pricing.fsdp import FsdpStatic, fsdp_gradient_bytes
from cpmem.pricing.head import head_bytes
from cpmem.step.trainer import Optimizer

# a rank's shard: 1,000 gradient elements, 600 of them FP8 buckets'; 900 stepped (the
# real ones), 500 of them FP8
HELD = FsdpStatic(
    weights=400,
    gradients=1_000,
    main_weights=1_000,
    stepped=900,
    fp8_gradients=600,
    fp8_stepped=500,
)


def test_fp8_gradients_are_bf16_beside_fp32_parameters_with_an_fp32_copy() -> None:
    opt = Optimizer(fsdp="optim_grads_params", grad_bytes=4)
    # 400 fp32 + 600 bf16 gradients; 500 FP8 stepped elements copied to fp32
    assert fsdp_gradient_bytes(HELD, opt, param_bytes=4) == (4 * 400 + 2 * 600, 4 * 500)


def test_bf16_parameters_copy_every_stepped_gradient_to_fp32() -> None:
    opt = Optimizer(fsdp="optim_grads_params", grad_bytes=2)
    assert fsdp_gradient_bytes(HELD, opt, param_bytes=2) == (2 * 1_000, 4 * 900)


def test_fp32_gradients_beside_bf16_parameters_are_stepped_as_they_are() -> None:
    # --megatron-fsdp-main-grads-dtype fp32: every group's buffer fp32, no copy
    opt = Optimizer(fsdp="optim_grads_params", grad_bytes=4)
    assert fsdp_gradient_bytes(HELD, opt, param_bytes=2) == (4 * 1_000, 0)


def test_fp32_logits_are_not_copied_by_the_loss() -> None:
    # the tiny GPT in fp32 at TP1 on its last rank: 4 x 1,024 tokens, hidden 512, GPT-2's
    # 50,257 entries padded to a multiple of 128: 50,304 columns
    step = step_of(tiny(bf16=False))
    tokens, hidden, vocab = 4 * 1_024, 512, 50_304
    assert step.dtype_bytes == 4
    head = head_bytes(step, tokens)
    norm_output = tokens * hidden * 4  # the head's input, read at its forward
    assert head.forward == norm_output  # no bf16 logits beside the fp32 softmax
    # backward: the fp32 gradient in the softmax's buffer, the gradient handed to the
    # last layer, and the trained output layer's input and the final norm's input
    logits = tokens * vocab * 4
    assert head.backward == logits + norm_output + 2 * norm_output
