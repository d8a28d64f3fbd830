"""Refused flags read as ignored beside the arguments that make them change nothing
(``cpmem.megatron.refused.HARMLESS_WITH``), and flags read only by code a priced run
never reaches (``ignored.py``), each against the snapshot's source:

- ``--accumulate-allreduce-grads-in-fp32`` under ``--bf16``: validate_args sets the
  field itself (False with ``--grad-reduce-in-bf16``, else True), arguments.py:1204-1216;
  under ``--fp16`` it keeps fp32 main gradients, which the fp16 run does not have.
- ``--no-position-embedding``: RuntimeError unless the embedding is rope
  (arguments.py:1633-1634); ``add_position_embedding`` is read nowhere else.
- ``--enable-gpt-oss``: read only by ModelOpt's builder (post_training/model_builder.py:
  298); ``--init-model-with-meta-device``: only by Megatron FSDP (mcore_fsdp_adapter.py).
"""

from __future__ import annotations

import pytest

from cpmem.errors import InputError
from cpmem.megatron.args import MegatronArgs, parse_megatron_args
from tests.unit.megatron_lm.tiny import SMALL

BASE = SMALL


def _read(**flags: object) -> MegatronArgs:
    return parse_megatron_args({**BASE, **flags})


@pytest.mark.parametrize("reduce_in_bf16", [False, True])
def test_accumulating_in_fp32_under_bf16_is_the_same_run(reduce_in_bf16: bool) -> None:
    extra: dict[str, object] = {"--grad-reduce-in-bf16": None} if reduce_in_bf16 else {}
    with_flag = _read(**{"--bf16": None, "--accumulate-allreduce-grads-in-fp32": None, **extra})
    without = _read(**{"--bf16": None, **extra})
    assert with_flag == without
    assert "--accumulate-allreduce-grads-in-fp32" in with_flag.ignored


def test_accumulating_in_fp32_under_fp16_is_refused() -> None:
    with pytest.raises(InputError) as err:
        _read(**{"--fp16": None, "--accumulate-allreduce-grads-in-fp32": None})
    assert err.value.value == "--accumulate-allreduce-grads-in-fp32"


def test_no_position_embedding_beside_rope_changes_nothing() -> None:
    args = _read(**{"--position-embedding-type": "rope", "--no-position-embedding": None})
    assert args == _read(**{"--position-embedding-type": "rope"})
    assert "--no-position-embedding" in args.ignored


def test_no_position_embedding_without_rope_is_megatrons_runtime_error() -> None:
    with pytest.raises(InputError) as err:
        _read(**{"--no-position-embedding": None})
    assert err.value.value == "--no-position-embedding"
    assert "Megatron-LM rejects it" in err.value.reason
    assert "--no-position-embedding is deprecated, use --position-embedding-type" in (
        err.value.reason
    )


@pytest.mark.parametrize("flag", ["--enable-gpt-oss", "--init-model-with-meta-device"])
def test_flags_a_priced_run_never_reads_are_ignored(flag: str) -> None:
    args = _read(**{flag: None})
    assert args == _read() and flag in args.ignored
