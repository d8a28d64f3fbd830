"""Torch FSDP2's arguments (``--use-torch-fsdp2``, ``cpmem.megatron.fsdp_rules``): the step
it becomes, what Megatron-LM rejects beside it refused with Megatron-LM's own reason
(arguments.py:973-989 and 1545 at 4828d651, read by hand), and what cpmem does not price
of it refused by name."""

from __future__ import annotations

import pytest

from cpmem.errors import InputError
from cpmem.megatron.args import parse_megatron_args
from cpmem.megatron.fsdp_rules import fsdp_strategy
from tests.unit.megatron_lm.tiny import FLAGS, step_of

BASE = {
    **FLAGS,
    "--bf16": True,
    "--use-torch-fsdp2": True,
    "--no-gradient-accumulation-fusion": True,
    "--untie-embeddings-and-output-weights": True,
}


def _refused(flags: dict[str, object], drop: tuple[str, ...] = ()) -> InputError:
    given = {k: v for k, v in {**BASE, **flags}.items() if k not in drop}
    with pytest.raises(InputError) as err:
        parse_megatron_args(given)
    return err.value


def test_the_step_takes_torch_fsdp2_with_gradients_in_bf16() -> None:
    args = parse_megatron_args(BASE)
    assert fsdp_strategy(args) == "torch_fsdp2"
    opt = step_of(args, world_size=4).settings.optimizer
    # the bf16 model's gradients are reduce-scattered in bf16 (no mixed-precision policy)
    assert (opt.fsdp, opt.grad_bytes, opt.distributed) == ("torch_fsdp2", 2, False)


@pytest.mark.parametrize(
    ("flags", "drop", "value", "says"),
    [
        (
            {"--pipeline-model-parallel-size": 2},
            (),
            "--pipeline-model-parallel-size",
            "not supported with pipeline parallelism (arguments.py:976-977)",
        ),
        (
            {"--use-distributed-optimizer": True},
            (),
            "--use-distributed-optimizer",
            "not supported with MCore's distributed optimizer (arguments.py:980-981)",
        ),
        (
            {},
            ("--no-gradient-accumulation-fusion",),
            "gradient accumulation fusion",
            "not supported with gradient accumulation fusion",
        ),
        (
            {"--ckpt-format": "torch"},
            (),
            "--ckpt-format torch",
            "requires --ckpt-format torch_dist or torch_dcp (arguments.py:984-985)",
        ),
        (
            {},
            ("--untie-embeddings-and-output-weights",),
            "tied embeddings",
            "requires --untie-embeddings-and-output-weights (arguments.py:986-987)",
        ),
        (
            {"--fp16": True, "--bf16": False},
            (),
            "--fp16",
            "not supported with fp16 yet (arguments.py:988-989)",
        ),
        (
            {"--optimizer": "muon"},
            (),
            "--optimizer muon",
            "emerging optimizer does not support Torch-FSDP2 for now (arguments.py:1532, 1545)",
        ),
    ],
)
def test_what_megatron_rejects_beside_it_is_refused_with_its_reason(
    flags: dict[str, object], drop: tuple[str, ...], value: str, says: str
) -> None:
    err = _refused(flags, drop)
    assert value in err.value
    assert "Megatron-LM rejects it beside --use-torch-fsdp2: " + says in err.reason


@pytest.mark.parametrize(
    ("flags", "value", "says"),
    [
        (
            {"--torch-fsdp2-no-reshard-after-forward": True},
            "--use-torch-fsdp2 with --torch-fsdp2-no-reshard-after-forward",
            "every unit's weights kept gathered from its forward to its backward",
        ),
        (
            {"--fp8-format": "hybrid"},
            "--use-torch-fsdp2 with --fp8-format",
            "FP8 training under Torch FSDP2",
        ),
        (
            {"--use-megatron-fsdp": True},
            "--use-torch-fsdp2 with --use-megatron-fsdp",
            "Megatron FSDP's arguments validated beside Torch FSDP2",
        ),
        (
            {"--mtp-num-layers": 1, "--position-embedding-type": "rope"},
            "--use-torch-fsdp2 with --mtp-num-layers",
            "MTP depths under Torch FSDP2",
        ),
    ],
)
def test_what_cpmem_does_not_price_is_refused_by_name(
    flags: dict[str, object], value: str, says: str
) -> None:
    err = _refused(flags)
    assert value in err.value and says in err.reason
    assert "changes memory cpmem does not price" in err.reason


def test_every_problem_is_listed_at_once() -> None:
    err = _refused(
        {"--use-distributed-optimizer": True, "--torch-fsdp2-no-reshard-after-forward": True}
    )
    assert "--use-distributed-optimizer" in err.value
    assert "--torch-fsdp2-no-reshard-after-forward" in err.value
