"""Megatron FSDP's arguments (``cpmem.megatron.fsdp_rules``): what the step takes from
them, each value refused with its reason, and the recordings' refusals naming only what
is still not priced (read by hand from their ``model_config.yaml``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cpmem.api import describe_megatron
from cpmem.errors import InputError
from cpmem.megatron.args import parse_megatron_args, read_megatron_args
from cpmem.megatron.fsdp_rules import fsdp_grad_element_size, fsdp_strategy
from cpmem.step.fp8 import FP32
from tests.unit.megatron_lm.tiny import FLAGS

ROOT = Path(__file__).resolve().parents[3]
CASES = ROOT / "golden/megatron/cases"
BASE = {
    **FLAGS,
    "--bf16": True,
    "--use-megatron-fsdp": True,
    "--ckpt-format": "fsdp_dtensor",
}


def _refused(flags: dict[str, object]) -> InputError:
    with pytest.raises(InputError) as err:
        parse_megatron_args({**BASE, **flags})
    return err.value


def test_the_step_takes_the_strategy_and_the_gradient_dtype() -> None:
    args = parse_megatron_args(BASE)
    # --data-parallel-sharding-strategy's default (arguments.py), the gradient buffer in
    # the parameters' bf16 under --megatron-fsdp-main-grads-dtype auto
    assert (fsdp_strategy(args), fsdp_grad_element_size(args)) == ("optim_grads_params", 2)
    args = parse_megatron_args(
        {
            **BASE,
            "--data-parallel-sharding-strategy": "optim",
            "--megatron-fsdp-main-grads-dtype": "fp32",
        }
    )
    assert (fsdp_strategy(args), fsdp_grad_element_size(args)) == ("optim", 4)
    no_fsdp = {k: v for k, v in BASE.items() if k not in ("--use-megatron-fsdp", "--ckpt-format")}
    assert fsdp_strategy(parse_megatron_args(no_fsdp)) == "none"


@pytest.mark.parametrize(
    ("flags", "value", "says"),
    [
        (
            {"--megatron-fsdp-main-params-dtype": "bf16"},
            "--megatron-fsdp-main-params-dtype bf16",
            "main weights and optimizer states in another dtype than fp32",
        ),
        (
            {"--megatron-fsdp-grad-comm-dtype": "fp32"},  # bf16 gradients reduced in fp32
            "--megatron-fsdp-grad-comm-dtype fp32",
            "gradients reduced in another dtype than their buffer's",
        ),
        (
            {"--megatron-fsdp-version": 2},
            "--megatron-fsdp-version 2",
            "Megatron FSDP v2",
        ),
        (
            # the depth's eh_proj a TE linear, an FP8 weight in no unit
            {
                "--mtp-num-layers": 1,
                "--position-embedding-type": "rope",
                "--fp8-format": "hybrid",
                "--fp8-param-gather": True,
            },
            "--use-megatron-fsdp with --mtp-num-layers and --fp8-param-gather",
            "of an MTP depth's FP8 eh_proj outside every unit",
        ),
        (
            {"--megatron-fsdp-max-pool-double-buffer": True},
            "--megatron-fsdp-max-pool-double-buffer",
            "Megatron FSDP's double buffers: two units' gathered weights",
        ),
    ],
)
def test_each_unpriced_value_is_refused_with_its_reason(
    flags: dict[str, object], value: str, says: str
) -> None:
    err = _refused(flags)
    assert value in err.value and says in err.reason


def test_mtp_depths_pass_the_door() -> None:
    """A GPT MTP depth's buckets are laid out (``cpmem.pricing.fsdp_units``)."""
    args = parse_megatron_args({**BASE, "--mtp-num-layers": 1, "--position-embedding-type": "rope"})
    assert args.mtp_num_layers == 1 and fsdp_strategy(args) == "optim_grads_params"


def test_a_matching_grad_comm_dtype_is_read() -> None:
    args = parse_megatron_args(
        {
            **BASE,
            "--megatron-fsdp-main-grads-dtype": "fp32",
            "--megatron-fsdp-grad-comm-dtype": "fp32",
        }
    )
    assert fsdp_grad_element_size(args) == 4


def test_the_ep_overlap_proxy_passes_the_door() -> None:
    # Megatron FSDP of its MoE and latent-attention layers is priced, and so is its
    # --delay-wgrad-compute under the combined 1F1B schedule (cpmem.pricing.delayed_wgrad)
    args = read_megatron_args(
        CASES / "moe/deepseek_proxy_fsdp_ep2_fsdp2_ep_overlap" / "model_config.yaml"
    )
    assert args.use_megatron_fsdp and args.overlap_moe_expert_parallel_comm
    assert args.delay_wgrad_compute


def test_fp8_with_megatron_fsdp_or_muon_is_named_at_the_door() -> None:
    """FP8's uint8 buffer, transposes and scale inverses are priced in megatron-core's DDP
    buffers and Megatron FSDP's under optim_grads_params: a tensorwise FP8 run under another
    strategy, or beside Muon, is refused with that reason, listed with the run's other
    problems."""
    fp8 = {"--fp8-format": "hybrid", "--fp8-recipe": "tensorwise", "--fp8-param-gather": True}
    parse_megatron_args({**BASE, **fp8})  # optim_grads_params, the default: read
    zero2 = {**BASE, **fp8, "--data-parallel-sharding-strategy": "optim_grads"}
    with pytest.raises(InputError) as err:
        parse_megatron_args(zero2)
    assert (
        err.value.value == "--fp8-format hybrid with --data-parallel-sharding-strategy optim_grads"
    )
    no_fsdp = {k: v for k, v in BASE.items() if k not in ("--use-megatron-fsdp", "--ckpt-format")}
    with pytest.raises(InputError) as err:
        parse_megatron_args({**no_fsdp, **fp8, "--optimizer": "muon"})
    assert err.value.value == "--fp8-format hybrid with --optimizer muon"
    assert "Muon's buffers" in err.value.reason


@pytest.mark.parametrize(
    "case", ["moe/deepseek_proxy_fsdp_ep2_fsdp2", "moe/deepseek_proxy_fsdp_ep2_fsdp2_1node"]
)
def test_the_gb200_proxies_are_refused_for_their_fp32_parameters_alone(case: str) -> None:
    # the door reads them (Megatron FSDP of their layers and FP8 in its buffers priced);
    # FP8 on their MoE layers in Megatron FSDP's buffers and on their latent attention
    # (TP 1: SP splits nothing) is priced, so the step refuses their fp32 parameters
    # (no --bf16) alone, cpmem.step.fp8
    args = read_megatron_args(CASES / case / "model_config.yaml")
    with pytest.raises(InputError) as err:
        describe_megatron(args, world_size=8 if case.endswith("fsdp2") else 4, device="gb200")
    assert err.value.field == "fp8"
    assert err.value.reason == FP32
