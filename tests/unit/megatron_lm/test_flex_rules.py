"""The flex token dispatcher at the door (``cpmem.megatron.flex_rules``): its HybridEP
backend priced at expert TP 1 with an fp32 router, dropless; the DeepEP and NCCL EP
backends, and HybridEP's other terms, refused with the tensors they would keep."""

from __future__ import annotations

import pytest

from cpmem.errors import InputError
from cpmem.megatron.args import MegatronArgs, parse_megatron_args
from cpmem.megatron.flex_rules import flex_dispatcher
from tests.unit.megatron_lm.tiny import FLAGS

BASE = {
    **FLAGS,
    "--num-experts": 8,
    "--disable-bias-linear": True,
    "--moe-token-dispatcher-type": "flex",
    "--moe-router-dtype": "fp32",
}
HYBRIDEP = {**BASE, "--moe-flex-dispatcher-backend": "hybridep"}


def _refusal(flags: dict[str, object]) -> InputError:
    with pytest.raises(InputError) as err:
        parse_megatron_args(flags)
    assert err.value.field == "megatron_args"
    return err.value


def test_hybridep_at_expert_tp_1_with_an_fp32_router_is_read_as_hybridep() -> None:
    args: MegatronArgs = parse_megatron_args(HYBRIDEP)
    assert flex_dispatcher(args) == "hybridep"
    assert (
        flex_dispatcher(
            parse_megatron_args({**HYBRIDEP, "--moe-token-dispatcher-type": "alltoall"})
        )
        == "alltoall"
    )


def test_the_default_backend_deepep_is_refused_naming_its_handle() -> None:
    """megatron-core's default backend is DeepEP (transformer_config.py:898)."""
    err = _refusal(BASE)
    assert err.value == "--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep"
    assert "is_token_in_rank" in err.reason and "hybridep" in err.reason


def test_ncclep_is_refused_naming_its_receive_buffer() -> None:
    err = _refusal({**BASE, "--moe-flex-dispatcher-backend": "ncclep"})
    assert "receive buffer" in err.reason


@pytest.mark.parametrize(
    ("flags", "value", "says"),
    [
        (
            {"--tensor-model-parallel-size": 2, "--expert-tensor-parallel-size": 2},
            "with --expert-tensor-parallel-size 2",
            "expanded over the expert-TP group",
        ),
        ({"--moe-router-dtype": None}, "without --moe-router-dtype fp32", "fp32 copy"),
        (
            {"--moe-expert-capacity-factor": 1.0},
            "with --moe-expert-capacity-factor 1",
            "sized to the capacity",
        ),
    ],
)
def test_hybridep_s_unchecked_terms_are_refused(
    flags: dict[str, object], value: str, says: str
) -> None:
    given = {k: v for k, v in {**HYBRIDEP, **flags}.items() if v is not None}
    err = _refusal(given)
    assert value in err.value
    assert says in err.reason


def test_padding_uneven_inputs_is_refused_as_a_flag() -> None:
    """``--moe-hybridep-pad-uneven-dispatch-inputs`` pads the tokens, map and probabilities
    (token_dispatcher.py:1068-1094,1145-1149)."""
    err = _refusal({**HYBRIDEP, "--moe-hybridep-pad-uneven-dispatch-inputs": True})
    assert "padded copy" in err.reason
