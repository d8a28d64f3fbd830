"""A tokenizer's size read from its files on this machine, as Megatron-LM's tokenizer
reports it at the snapshot (``vocab_size``, before padding).

- ``HuggingFaceTokenizer``: ``len(tokenizer)`` (``huggingface_tokenizer.py:343-345``)
  of ``AutoTokenizer.from_pretrained(path)``; a fast tokenizer's length is the number of
  distinct tokens of its ``tokenizer.json``: the model's vocabulary and the added tokens
  (``get_vocab(with_added_tokens=True)``), one entry per token string. Loaded from a
  folder, the tokens its ``tokenizer_config.json`` lists in ``added_tokens_decoder`` are
  added too (``from_pretrained`` passes them to the tokenizer, which adds those it does
  not hold), so they count where they are new. Megatron-LM adds
  none of its own where ``--tokenizer-special-tokens`` is not given (refused): the
  bos/cls and eos/sep it copies are the tokenizer's own (``huggingface_tokenizer.py:
  131-192``).
- ``SentencePieceTokenizer``, ``GPTSentencePieceTokenizer``, ``Llama2Tokenizer``: the
  model's piece count (``get_piece_size()``, ``sentencepiece_tokenizer.py:65-66``), the
  repeated ``pieces`` field (number 1) of its ``ModelProto`` file.

A path that does not exist, or holds neither file, gives no size (None): the caller
refuses it naming ``--vocab-size``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from cpmem.errors import InputError

HF_TOKENIZERS = ("HuggingFaceTokenizer",)
SP_TOKENIZERS = ("SentencePieceTokenizer", "GPTSentencePieceTokenizer", "Llama2Tokenizer")


def hf_tokenizer_size(path: Path) -> int | None:
    """The distinct tokens of ``tokenizer.json`` (``path`` the file or its folder), with
    a folder's ``tokenizer_config.json`` added tokens."""
    file = path / "tokenizer.json" if path.is_dir() else path
    if file.name != "tokenizer.json" or not file.is_file():
        return None
    try:
        doc = json.loads(file.read_text(encoding="utf-8"))
        vocab = doc["model"]["vocab"]
        # BPE / WordPiece / WordLevel: token -> id; Unigram: [token, score] pairs
        tokens = set(vocab) if isinstance(vocab, dict) else {str(entry[0]) for entry in vocab}
        tokens |= {str(added["content"]) for added in doc.get("added_tokens") or []}
    except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
        raise InputError(
            "megatron_args", str(file), f"is not a tokenizer.json cpmem can read ({exc})"
        ) from None
    if path.is_dir():
        tokens |= _config_added_tokens(path / "tokenizer_config.json")
    return len(tokens)


def _config_added_tokens(file: Path) -> set[str]:
    """The contents of ``added_tokens_decoder`` (id -> token entries) in a
    ``tokenizer_config.json``; none where the folder has no such file."""
    if not file.is_file():
        return set()
    try:
        decoder = json.loads(file.read_text(encoding="utf-8")).get("added_tokens_decoder") or {}
        return {str(entry["content"]) for entry in decoder.values()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InputError(
            "megatron_args", str(file), f"is not a tokenizer_config.json cpmem can read ({exc})"
        ) from None


def _varint(data: Sequence[int], i: int) -> tuple[int, int]:
    """The protobuf varint at ``data[i]`` (the file's bytes) and the index after it."""
    out, shift = 0, 0
    while True:
        if i >= len(data):
            raise ValueError("a truncated varint")
        byte = data[i]
        out |= (byte & 0x7F) << shift
        i += 1
        if not byte & 0x80:
            return out, i
        shift += 7


def sentencepiece_size(path: Path) -> int | None:
    """The pieces of a SentencePiece model file (field 1 of its ``ModelProto``)."""
    if not path.is_file():
        return None
    data = path.read_bytes()
    pieces, i = 0, 0
    try:
        while i < len(data):
            key, i = _varint(data, i)
            number, wire = key >> 3, key & 7
            if wire == 0:
                _, i = _varint(data, i)
            elif wire == 1:
                i += 8
            elif wire == 5:
                i += 4
            elif wire == 2:
                length, i = _varint(data, i)
                i += length
                pieces += number == 1
            else:
                raise ValueError(f"wire type {wire}")
        if i != len(data):
            raise ValueError("a field runs past the end")
    except ValueError as exc:
        raise InputError(
            "megatron_args", str(path), f"is not a SentencePiece model cpmem can read ({exc})"
        ) from None
    return pieces


def tokenizer_files_size(kind: str, model: str) -> int | None:
    """The size ``kind`` reports for ``--tokenizer-model model``, where its files are
    on this machine; None where they are not (or ``kind`` reads others)."""
    path = Path(model).expanduser()
    if kind in HF_TOKENIZERS:
        return hf_tokenizer_size(path)
    if kind in SP_TOKENIZERS:
        return sentencepiece_size(path)
    return None
