"""``cpmem/megatron/data/arguments.tsv``: every flag of the snapshot's ``pretrain_gpt.py``
parser, read by ``cpmem.megatron.snapshot``.

Expected values: Megatron-LM at d98e8a64, ``megatron/training/arguments.py`` and the
config dataclasses ``ArgumentGroupFactory`` turns into flags (``argument_utils.py``:
a store_false flag for a True-default bool, named ``--no-X`` and ``--disable-X``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cpmem.megatron.snapshot import arguments, is_default, snapshot

README = Path(__file__).resolve().parents[3] / "golden" / "megatron" / "README.md"


def test_the_snapshot_is_the_recordings_commit() -> None:
    found = re.search(r"commit `([0-9a-f]{40})`", README.read_text(encoding="utf-8"))
    assert found is not None
    assert snapshot().commit == found.group(1)


def test_every_row_names_a_source_file_the_header_pins() -> None:
    files = snapshot().files
    assert all(re.fullmatch(r"[0-9a-f]{40}", blob) for blob in files.values())
    for arg in arguments().values():
        assert arg.source.split(":")[0] in files, arg.flag
        if arg.config:
            assert arg.config_source.split(":")[0] in files, arg.flag


def test_a_flag_written_by_hand_in_arguments_py() -> None:
    # arguments.py:2441: group.add_argument('--make-vocab-size-divisible-by', type=int,
    # default=128, ...)
    arg = arguments()["--make-vocab-size-divisible-by"]
    assert (arg.dest, arg.action, arg.type, arg.default) == (
        "make_vocab_size_divisible_by",
        "store",
        "int",
        128,
    )
    assert arg.source == "megatron/training/arguments.py:2441" and arg.config == ""


def test_flags_generated_from_the_config_dataclasses() -> None:
    # transformer_config.py:65: num_layers: int = field(default=0, metadata={"argparse_meta":
    # {"default": None}}): the flag's default is the metadata's None
    layers = arguments()["--num-layers"]
    assert layers.config == "TransformerConfig.num_layers" and layers.default is None
    # a True-default bool: store_false under --no-X and --disable-X (argument_utils.py)
    for flag in ("--no-pad-vocab-size", "--disable-pad-vocab-size"):
        arg = arguments()[flag]
        assert (arg.dest, arg.action, arg.default) == ("pad_vocab_size", "store_false", True)
        assert arg.config == "TokenizerConfig.pad_vocab_size"
    # an enum field: its members by name (transformer_config.py:151)
    backend = arguments()["--attention-backend"]
    assert backend.type == "AttnBackend" and backend.default == "auto"
    assert backend.choices is not None and set(backend.choices) >= {"flash", "fused", "unfused"}


def test_the_optional_groups_are_marked_by_origin() -> None:
    # pretrain_gpt.py passes add_modelopt_args where ModelOpt is installed; the Kitchen
    # group exists where NVIDIA Kitchen is (arguments.py:3741-3768)
    assert arguments()["--export-te-mcore-model"].origin == "modelopt"
    assert arguments()["--kitchen-recipe-number"].origin == "kitchen"
    assert arguments()["--num-layers"].origin == "megatron"


@pytest.mark.parametrize(
    ("flag", "value", "default"),
    [
        ("--optimizer", "adam", True),
        ("--optimizer", "sgd", False),
        ("--hidden-dropout", "0.10", True),
        ("--hidden-dropout", 0.1, True),
        ("--hidden-dropout", 0.2, False),
        ("--cp-comm-type", "p2p", True),  # nargs='+', default ['p2p']
        ("--cp-comm-type", ["p2p"], True),
        ("--cp-comm-type", "p2p a2a", False),
        ("--fp8-format", "e4m3", False),  # default None
        ("--sequence-parallel", True, False),  # a switch given is never its default
        ("--num-layers", "twelve", False),  # not an int
        ("--no-such-flag", 1, False),
    ],
)
def test_is_default(flag: str, value: object, default: bool) -> None:
    assert is_default(flag, value) is default
