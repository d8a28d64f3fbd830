"""The router's padding for FP8 at the door (``cpmem.megatron.fp8_rules``,
``router_padding_problems``): Megatron-LM's ``TransformerConfig`` rules on
``--moe-router-padding-for-quantization`` and its alias ``--moe-router-padding-for-fp8``
(transformer_config.py:2203-2221 at 4828d651), and under FP8 on MoE layers the refusal:
each source rank pads its routing map, so the padded rows cross the dispatch, which the
experts' own padding (priced) does not."""

from __future__ import annotations

import pytest

from cpmem.errors import InputError
from cpmem.megatron.args import parse_megatron_args
from tests.unit.megatron_lm.tiny import FLAGS

FP8 = {"--fp8-format": "hybrid", "--fp8-recipe": "tensorwise"}
MOE = {
    "--num-experts": 8,
    "--moe-grouped-gemm": True,
    "--moe-token-dispatcher-type": "alltoall",
}


def _reason(flags: dict[str, object]) -> str:
    with pytest.raises(InputError) as err:
        parse_megatron_args({**FLAGS, **flags})
    return err.value.reason


@pytest.mark.parametrize(
    "flag", ["--moe-router-padding-for-quantization", "--moe-router-padding-for-fp8"]
)
def test_without_fp8_megatron_rejects_it(flag: str) -> None:
    # transformer_config.py:2211-2215: fp8/fp4 must be specified
    assert "fp8/fp4 must be specified" in _reason({**MOE, flag: True})


def test_under_the_default_allgather_dispatcher_megatron_rejects_it() -> None:
    # transformer_config.py:2217-2221; the dispatcher's default is allgather (:891)
    said = _reason({**FP8, "--moe-router-padding-for-fp8": True})
    assert "allgather and alltoall_seq dispatcher does not support" in said


def test_under_fp8_on_moe_layers_it_is_refused_with_what_it_pads() -> None:
    said = _reason({**FP8, **MOE, "--moe-router-padding-for-quantization": True})
    assert "pad_routing_map" in said and "changes memory cpmem does not price" in said


def test_beside_a_dense_model_it_changes_nothing() -> None:
    flags = {**FLAGS, **FP8, "--moe-token-dispatcher-type": "alltoall"}
    args = parse_megatron_args({**flags, "--moe-router-padding-for-fp8": True})
    assert "--moe-router-padding-for-fp8" in args.ignored
