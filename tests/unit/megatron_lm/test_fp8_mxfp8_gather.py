"""MXFP8 parameters gathered (``--fp8-recipe mxfp8 --fp8-param-gather``) and the gradient
buffer reused for their all-gather (``--reuse-grad-buf-for-mxfp8-param-ag``) at the door
(``cpmem.megatron.fp8_rules.mxfp8_gather_problems``) and in the static memory
(``cpmem.pricing.static``, ``cpmem.pricing.fp8_static.MXFP8_GATHERED``).

Hand figures: the tiny GPT (12 layers, hidden 512, FFN 2,048) on one B200 without the
distributed optimizer, where megatron-core makes no parameter buffer
(param_and_grad_buffer.py:1123-1130 at 4828d651): the FP8 weights are QKV [1,536, 512],
proj [512, 512], fc1 [2,048, 512] and fc2 [512, 2,048], 12 x 512^2 = 3,145,728 elements a
layer, 37,748,736 on the stage. Without ``--fp8-param-gather`` each is a bf16 parameter
(2 B) beside Transformer Engine's cached MXFP8 copy (rowwise data 1 B, in
``fp8_weight_cache``); with it the parameter is the MXFP8 tensor itself, its rowwise
data 1 B an element in ``weights``, and no bf16 copy: ``weights`` loses 1 B an element
and the cache goes; the columnwise copies and the scales are the same tensors either way.
"""

from __future__ import annotations

from typing import Any

import pytest

from cpmem.errors import InputError
from cpmem.megatron.args import parse_megatron_args
from tests.unit.megatron_lm.tiny import FLAGS, static_of, tiny

FP8_ELEMENTS = 12 * 12 * 512 * 512
MXFP8 = {"--fp8-format": "e4m3", "--fp8-recipe": "mxfp8", "--fp8-param-gather": True}
REUSE = "--reuse-grad-buf-for-mxfp8-param-ag"


def _refusal(flags: dict[str, object]) -> InputError:
    with pytest.raises(InputError) as err:
        parse_megatron_args({**FLAGS, **flags})
    return err.value


def test_without_the_distributed_optimizer_gathered_mxfp8_weights_replace_the_bf16_ones() -> None:
    def static(**changes: Any) -> dict[str, int]:
        args = tiny(fp8="e4m3", fp8_recipe="mxfp8", **changes)
        return static_of(args, world_size=1, device="b200")

    cached, gathered = static(), static(fp8_param_gather=True)
    assert gathered["weights"] == cached["weights"] - FP8_ELEMENTS
    assert cached.pop("fp8_weight_cache") == FP8_ELEMENTS
    cached.pop("weights"), gathered.pop("weights")
    assert gathered == cached


def test_under_the_distributed_optimizer_the_reuse_is_needed() -> None:
    err = _refusal({**MXFP8, "--use-distributed-optimizer": True})
    assert "replace_raw_data raises NotImplementedError for an MXFP8Tensor" in err.reason
    args = parse_megatron_args({**FLAGS, **MXFP8, "--use-distributed-optimizer": True, REUSE: True})
    assert args.reuse_grad_buf_for_mxfp8_param_ag


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        # distributed_data_parallel_config.py:253-254
        ({REUSE: True, "--use-distributed-optimizer": True}, "Reuse grad buffer only when"),
        # optimizer_config.py:424-428
        (
            {
                **MXFP8,
                REUSE: True,
                "--use-distributed-optimizer": True,
                "--overlap-param-gather-with-optimizer-step": True,
            },
            "overlap_param_gather_with_optimizer_step is not supported",
        ),
        # optimizer.py:731-735: only DistributedOptimizer copies into the parameter buffer
        ({**MXFP8, REUSE: True}, "only the distributed optimizer defines"),
        # param_and_grad_buffer.py:279-300: the mapped FP8 weights zeroed after the gather
        (
            {
                **MXFP8,
                "--fp8-recipe": "tensorwise",
                REUSE: True,
                "--use-distributed-optimizer": True,
            },
            "into which the other recipes' FP8 weights are mapped",
        ),
    ],
)
def test_what_megatron_lm_cannot_run_is_refused(flags: dict[str, object], said: str) -> None:
    assert said in _refusal(flags).reason
