"""A budget is a device: ``usable_bytes`` (``--budget-gib``) weighs the step's static
memory and its activations together, exactly as a device does after its reserve and
the memory outside PyTorch; a budget and a device given together are two budgets, the
smaller decides and the answer names it; the runtime's figures (``budget_bytes``, what a
running process has left after its static memory) are weighed against the activations
alone (``cpmem.admission.budget``).

The devices' usable bytes are derived here by hand from their totals (torch's figure,
``cpmem.step.device``), the runtime's 3% reserve and the 2,793,275,904 B outside
PyTorch; the step's figures come from ``estimate`` calls, independent of admission."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cpmem.admission.admission import admit
from cpmem.api import estimate, estimate_megatron
from cpmem.cli import main
from cpmem.errors import InputError
from cpmem.units import GIB

M4 = "qwen3.5-4b"
NON_TORCH = 2_793_275_904
H100_TOTAL = 81_008 * 2**20  # 84,943,044,608 B
H100_USABLE = H100_TOTAL - 2_548_291_338 - NON_TORCH  # 3% of the total: 2,548,291,338.24 B
H200_USABLE = 150_121_021_440 - 4_503_630_643 - NON_TORCH  # 142,824,114,893 B


def _whole(**options: object) -> int:
    """The step's whole-device figure as admission weighs it: static memory plus
    activations, at the larger of its first and its steady step (``estimate``)."""
    return max(
        estimate(M4, [4096], step=kind, **options).whole_device_bytes()  # type: ignore[arg-type]
        for kind in ("first", "steady")
    )


def test_the_hand_derived_usable_bytes() -> None:
    assert (H100_USABLE, H200_USABLE) == (79_601_477_366, 142_824_114_893)


def test_a_budget_weighs_the_static_memory_as_a_device_does() -> None:
    """A budget of a device's usable bytes is that device: the same action, required
    and available bytes; and the static memory counts against it."""
    on_device = admit(M4, [4096], device="h100")
    as_budget = admit(M4, [4096], usable_bytes=H100_USABLE)
    assert on_device.budget is not None and as_budget.budget is not None
    assert (on_device.budget.decided_by, as_budget.budget.decided_by) == ("device", "budget")
    for d in (on_device, as_budget):
        assert d.action == "fit"
        assert d.device_budget is not None
        static = d.device_budget.static.total
        assert d.available_bytes == H100_USABLE - static
        assert d.required_bytes + static == _whole(device="h100")
    assert (as_budget.required_bytes, as_budget.available_bytes) == (
        on_device.required_bytes,
        on_device.available_bytes,
    )
    # a budget one byte short of the step's whole-device figure refuses it
    need = _whole(device="h100")
    assert admit(M4, [4096], usable_bytes=need).action == "fit"
    assert admit(M4, [4096], usable_bytes=need - 1).action == "refuse"


def test_a_budget_above_the_activations_alone_is_no_fit() -> None:
    """What a budget compared with the activations alone would admit: a budget between
    the activations and the activations plus the static memory refuses."""
    activations = max(estimate(M4, [4096], step=k).estimate_bytes for k in ("first", "steady"))
    d = admit(M4, [4096], usable_bytes=activations + GIB)
    assert d.action == "refuse"
    assert d.required_bytes > d.available_bytes


def test_a_budget_and_a_device_the_smaller_decides() -> None:
    small = admit(M4, [4096], usable_bytes=40 * GIB, device="h100")
    large = admit(M4, [4096], usable_bytes=100 * GIB, device="h100")
    assert small.budget is not None and large.budget is not None
    assert small.budget.decided_by == "budget" and large.budget.decided_by == "device"
    usable = {"budget": 40 * GIB, "device": H100_USABLE}
    assert dict(small.budget.usable) == usable
    assert small.to_dict()["usable_bytes"] == usable and small.to_dict()["device"] == "h100"
    assert small.to_dict()["decided_by"] == "budget"
    assert large.to_dict()["decided_by"] == "device"
    assert small.device_budget is not None and large.device_budget is not None
    static = small.device_budget.static.total
    assert small.available_bytes == 40 * GIB - static
    assert large.available_bytes == H100_USABLE - static
    tie = admit(M4, [4096], usable_bytes=H100_USABLE, device="h100")
    assert tie.budget is not None and tie.budget.decided_by == "budget"


def test_the_runtime_figures_weigh_the_activations_alone() -> None:
    activations = max(estimate(M4, [4096], step=k).estimate_bytes for k in ("first", "steady"))
    d = admit(M4, [4096], budget_bytes=activations)
    assert d.budget is not None and d.budget.decided_by == "runtime"
    assert (d.action, d.required_bytes, d.available_bytes) == ("fit", activations, activations)
    assert d.device_budget is None and "whole_device" not in d.to_dict()


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"budget_bytes": GIB, "device": "h100"}, r"budget_bytes=.*a device \(h100\), not both"),
        ({"budget_bytes": GIB, "usable_bytes": GIB}, r"budget_bytes=.*a budget.*not both"),
        ({"usable_bytes": 0}, r"usable_bytes=0: must be > 0"),
        ({"usable_bytes": -1}, r"usable_bytes=-1"),
    ],
)
def test_budgets_that_cannot_be_weighed_together_are_refused(
    options: dict[str, object], needle: str
) -> None:
    with pytest.raises(InputError, match=needle):
        admit(M4, [4096], **options)  # type: ignore[arg-type]


LLAMA3_8B = """\
--num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32
--group-query-attention --num-query-groups 8 --seq-length 8192
--max-position-embeddings 8192 --micro-batch-size 1 --global-batch-size 128 --bf16
--swiglu --normalization RMSNorm --position-embedding-type rope
--untie-embeddings-and-output-weights --disable-bias-linear --use-distributed-optimizer
--vocab-size 128256 --tokenizer-type NullTokenizer --attention-dropout 0 --hidden-dropout 0
"""
"""Llama-3 8B's shapes as ``pretrain_gpt.py`` flags, TP 1 PP 1, one 8,192-token sequence
per micro-batch: about 56 GiB of static memory and 43 GiB of activations a rank."""


def _admit(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, object]]:
    code = main(["admit", *argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_the_megatron_door_weighs_the_static_memory_under_a_budget(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """80 GiB for a run whose peak is static memory + activations above it: refused (it
    said FIT on the activations alone); a budget above the peak fits; beside a device
    the smaller decides, whichever it is."""
    flags = tmp_path / "llama3-8b.txt"
    flags.write_text(LLAMA3_8B)
    base = ["--megatron-args", str(flags), "--world-size", "8"]
    est = estimate_megatron(flags, world_size=8)
    first = estimate_megatron(flags, world_size=8, step="first")
    assert est.static is not None
    # admission weighs the larger of the first and the steady step, static included
    peak = max(est.peak_bytes, first.peak_bytes)
    assert est.static.total > 50 * GIB and 80 * GIB < peak < 110 * GIB
    code, out = _admit([*base, "--budget-gib", "80"], capsys)
    assert (code, out["action"], out["decided_by"]) == (3, "refuse", "budget")
    whole = out["whole_device"]
    assert isinstance(whole, dict)
    assert out["required_bytes"] + whole["static_bytes"] == peak  # type: ignore[operator]
    assert out["available_bytes"] == 80 * GIB - whole["static_bytes"]  # type: ignore[operator]
    code, out = _admit([*base, "--budget-gib", "110"], capsys)
    assert (code, out["action"], out["decided_by"]) == (0, "fit", "budget")
    # beside an H100 (74.1 GiB usable) the device decides: refused
    code, out = _admit([*base, "--budget-gib", "110", "--device", "h100"], capsys)
    assert (code, out["action"], out["decided_by"]) == (3, "refuse", "device")
    assert out["usable_bytes"] == {"budget": 110 * GIB, "device": H100_USABLE}
    # beside an H200 (133 GiB usable) the budget decides
    code, out = _admit([*base, "--budget-gib", "110", "--device", "h200"], capsys)
    assert (code, out["action"], out["decided_by"]) == (0, "fit", "budget")
    main(["admit", *base, "--budget-gib", "110", "--device", "h100"])
    text = capsys.readouterr().out
    assert text.startswith("REFUSE")
    assert "decided by the device h100's 74.135 GiB" in text
    assert "the smaller beside --budget-gib 110.000 GiB" in text
