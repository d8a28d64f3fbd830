"""A tokenizer's size read from its files (``cpmem.megatron.tokenizer_files``) and used
for the run's vocabulary (``cpmem.megatron.vocab``); a size cpmem cannot read is refused
naming ``--vocab-size``.

The files are built here by hand, so each expected size is counted from what was
written: a ``tokenizer.json`` whose distinct tokens are listed, and a SentencePiece
``ModelProto`` with a known number of ``pieces`` entries (protobuf field 1, wire type 2:
key byte ``0x0A``) beside a trainer spec (field 2: ``0x12``) that is not a piece.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cpmem.errors import InputError
from cpmem.megatron.args import MegatronArgs, parse_megatron_args
from cpmem.megatron.tokenizer_files import hf_tokenizer_size, sentencepiece_size
from cpmem.megatron.vocab import resolved_vocab_size
from tests.unit.megatron_lm.tiny import SMALL

BASE = SMALL


def _tokenizer_json(folder: Path) -> Path:
    """Five model tokens; three added tokens, one of them ("a") already in the vocabulary:
    seven distinct tokens, as ``len(AutoTokenizer)`` counts them."""
    folder.mkdir(parents=True, exist_ok=True)
    doc = {
        "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "c": 2, "ab": 3, "bc": 4}},
        "added_tokens": [
            {"id": 5, "content": "<s>"},
            {"id": 6, "content": "</s>"},
            {"id": 0, "content": "a"},
        ],
    }
    path = folder / "tokenizer.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def _sentencepiece(path: Path, pieces: int) -> Path:
    piece = b"\x0a\x03\x0a\x01x"  # field 1, 3 bytes: a SentencePiece with piece "x"
    trainer = b"\x12\x02\x08\x01"  # field 2, 2 bytes: a trainer spec
    path.write_bytes(trainer + piece * pieces)
    return path


def _read(**flags: object) -> MegatronArgs:
    return parse_megatron_args({**BASE, **flags})


def test_a_tokenizer_json_counts_its_distinct_tokens(tmp_path: Path) -> None:
    path = _tokenizer_json(tmp_path / "tok")
    assert hf_tokenizer_size(path) == 7
    assert hf_tokenizer_size(path.parent) == 7  # the folder that holds it


def test_a_folders_tokenizer_config_adds_its_new_tokens(tmp_path: Path) -> None:
    """``added_tokens_decoder`` lists "<pad>" (new) and "</s>", "b" (already held): one
    more distinct token than the seven of ``tokenizer.json``. Read from the folder only,
    as ``from_pretrained`` does; the file alone keeps seven."""
    path = _tokenizer_json(tmp_path / "tok")
    decoder = {
        "1": {"content": "b", "special": False},
        "6": {"content": "</s>", "special": True},
        "7": {"content": "<pad>", "special": True},
    }
    config = path.parent / "tokenizer_config.json"
    config.write_text(json.dumps({"added_tokens_decoder": decoder}), encoding="utf-8")
    assert hf_tokenizer_size(path.parent) == 8
    assert hf_tokenizer_size(path) == 7
    config.write_text(json.dumps({"added_tokens_decoder": {"7": {"id": 7}}}), encoding="utf-8")
    with pytest.raises(InputError) as err:
        hf_tokenizer_size(path.parent)
    assert err.value.value == str(config)
    assert "tokenizer_config.json" in err.value.reason


def test_a_sentencepiece_model_counts_its_pieces(tmp_path: Path) -> None:
    assert sentencepiece_size(_sentencepiece(tmp_path / "t.model", 11)) == 11


def test_a_broken_sentencepiece_model_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.model"
    path.write_bytes(b"\x0a\x09\x0a")  # a piece whose length runs past the end
    with pytest.raises(InputError) as err:
        sentencepiece_size(path)
    assert "not a SentencePiece model" in err.value.reason


def test_the_runs_vocabulary_is_its_local_tokenizers_size(tmp_path: Path) -> None:
    folder = _tokenizer_json(tmp_path / "tok").parent
    args = _read(**{"--tokenizer-type": "HuggingFaceTokenizer", "--tokenizer-model": str(folder)})
    assert resolved_vocab_size(args) == 7
    model = _sentencepiece(tmp_path / "t.model", 11)
    args = _read(**{"--tokenizer-type": "Llama2Tokenizer", "--tokenizer-model": str(model)})
    assert resolved_vocab_size(args) == 11


def test_a_hub_name_is_not_looked_up_and_asks_for_vocab_size() -> None:
    with pytest.raises(InputError) as err:
        _read(**{"--tokenizer-type": "HuggingFaceTokenizer", "--tokenizer-model": "org/model"})
    assert err.value.value == "--tokenizer-type HuggingFaceTokenizer"
    assert "give --vocab-size" in err.value.reason
