"""The vocabulary before padding as Megatron-LM's tokenizer reports it at the snapshot
(``cpmem.megatron.vocab.resolved_vocab_size``); one that cannot be known is refused.

Expected values: ``megatron/core/tokenizers`` at d98e8a64 -- GPT-2's BPE files hold
50,257 tokens (50,000 merges + 256 byte tokens + the end-of-text token); NullTokenizer
reports ``vocab_size`` as given (``null_tokenizer.py:16-19``, no EOD token added);
TikTokenizer ``--vocab-size``, else ``DEFAULT_TIKTOKEN_MAX_VOCAB = 2**17``
(``tiktoken_tokenizer.py:24``).
"""

from __future__ import annotations

import pytest

from cpmem.errors import InputError
from cpmem.megatron.args import MegatronArgs, parse_megatron_args
from cpmem.megatron.vocab import resolved_vocab_size
from tests.unit.megatron_lm.tiny import SMALL

BASE = SMALL


def _read(**flags: object) -> MegatronArgs:
    return parse_megatron_args(
        {**BASE, **{"--" + k.replace("_", "-"): v for k, v in flags.items()}}
    )


def test_pretrain_gpts_default_tokenizer_is_gpt2s_bpe() -> None:
    assert resolved_vocab_size(_read()) == 50_000 + 256 + 1
    assert resolved_vocab_size(_read(tokenizer_type="GPT2BPETokenizer")) == 50_257
    # GPT2BPETokenizer is not given --vocab-size (build_tokenizer.py:37-50): its files' size
    assert resolved_vocab_size(_read(vocab_size=32_000)) == 50_257


def test_the_null_tokenizer_reports_vocab_size_as_given() -> None:
    assert resolved_vocab_size(_read(tokenizer_type="NullTokenizer", vocab_size=50_257)) == 50_257
    assert resolved_vocab_size(_read(tokenizer_type="NullTokenizer", vocab_size=1000)) == 1000


def test_the_null_tokenizer_without_vocab_size_is_refused() -> None:
    with pytest.raises(InputError) as err:
        _read(tokenizer_type="NullTokenizer")
    assert err.value.value == "--tokenizer-type NullTokenizer"
    assert "needs --vocab-size" in err.value.reason


def test_tiktoken_defaults_to_two_to_the_seventeen() -> None:
    assert resolved_vocab_size(_read(tokenizer_type="TikTokenizer")) == 131_072
    assert resolved_vocab_size(_read(tokenizer_type="TikTokenizer", vocab_size=128_256)) == 128_256


@pytest.mark.parametrize(
    "kind",
    ["HuggingFaceTokenizer", "SentencePieceTokenizer", "Llama2Tokenizer", "BertWordPieceCase"],
)
def test_a_vocabulary_from_tokenizer_files_is_refused_without_vocab_size(kind: str) -> None:
    with pytest.raises(InputError) as err:
        _read(tokenizer_type=kind, tokenizer_model="/models/tokenizer")
    assert err.value.field == "megatron_args"
    assert err.value.value == f"--tokenizer-type {kind}"
    assert "give --vocab-size" in err.value.reason
    assert resolved_vocab_size(_read(tokenizer_type=kind, vocab_size=151_936)) == 151_936


def test_no_pad_vocab_size_builds_the_model_for_vocab_size() -> None:
    # argument_utils.py:474-480: without the tokenizer's padded size, --vocab-size
    assert resolved_vocab_size(_read(no_pad_vocab_size=True, vocab_size=1234)) == 1234
    with pytest.raises(InputError) as err:
        _read(no_pad_vocab_size=True)
    assert err.value.value == "--no-pad-vocab-size"
