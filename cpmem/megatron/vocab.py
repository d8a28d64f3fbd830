"""The vocabulary a Megatron-LM GPT run builds its embedding and output layer for,
before padding, as Megatron-LM's tokenizer reports it at the snapshot.

``pretrain_gpt.py`` builds the tokenizer in ``set_global_variables``; where
``--no-pad-vocab-size`` is not given, ``build_tokenizer`` sets ``padded_vocab_size`` to
the tokenizer's ``vocab_size`` padded (``megatron/core/tokenizers/utils/
build_tokenizer.py:112-128, 149-152``), and ``gpt_config_from_args`` builds the model
with it (``megatron/training/argument_utils.py:472-480``). Under ``--no-pad-vocab-size`` the model is built for
``--vocab-size``, padded by the same rule. The padding itself (a multiple of
``--make-vocab-size-divisible-by`` x TP) stays with the pricing.

What each tokenizer reports (``build_tokenizer.py:26-140`` and the libraries under
``megatron/core/tokenizers/text/libraries``):

- ``GPT2BPETokenizer`` (``pretrain_gpt.py``'s default, ``args_defaults``, pretrain_gpt.py:527): the GPT-2 BPE
  files' 50,257 tokens; ``--vocab-size`` is not passed to it;
- ``NullTokenizer``: ``--vocab-size`` exactly (``null_tokenizer.py:16-19``; its EOD is
  the last id, no token is added), and it cannot be built without it;
- ``TikTokenizer``: ``--vocab-size``, else ``DEFAULT_TIKTOKEN_MAX_VOCAB`` = 2**17
  (``tiktoken_tokenizer.py:24, 86, 127``);
- every other tokenizer (HuggingFace, SentencePiece, BERT's WordPiece, multimodal,
  SFT): its files' size (``len(tokenizer)``, ``huggingface_tokenizer.py:343-345``);
  Megatron-LM does not read ``--vocab-size`` for them. cpmem reads it from a
  ``tokenizer.json`` or a SentencePiece model that ``--tokenizer-model`` names on this
  machine (``tokenizer_files.py``); ``--vocab-size`` given states it. A hub name
  (``meta-llama/...``) is not looked up: a published ``config.json``'s ``vocab_size`` is
  the embedding's rows, which can exceed the tokenizer's length (Qwen's 151,936 rows
  for fewer tokens), so it is not the size Megatron-LM pads.
"""

from __future__ import annotations

from cpmem.errors import InputError
from cpmem.megatron.fields import MegatronArgs
from cpmem.megatron.tokenizer_files import tokenizer_files_size

GPT2_BPE_VOCAB = 50_257
"""GPT-2's BPE vocabulary (its ``vocab.json``: 50,000 merges, 256 bytes, the EOD)."""
TIKTOKEN_DEFAULT_VOCAB = 2**17
"""``DEFAULT_TIKTOKEN_MAX_VOCAB`` (``tiktoken_tokenizer.py:24``)."""
DEFAULT_TOKENIZER = "GPT2BPETokenizer"
"""``pretrain_gpt.py``'s ``args_defaults={'tokenizer_type': 'GPT2BPETokenizer'}``."""


def tokenizer_type(args: MegatronArgs) -> str:
    """The tokenizer the run builds: ``--tokenizer-type``, else pretrain_gpt.py's."""
    return args.tokenizer_type or DEFAULT_TOKENIZER


def resolved_vocab_size(args: MegatronArgs) -> int:
    """The vocabulary before padding, as the run's tokenizer reports it.

    Refused (``InputError`` on ``megatron_args``) where it cannot be known: a tokenizer
    whose size comes from its files, without ``--vocab-size`` stating it; a
    ``NullTokenizer`` or ``--no-pad-vocab-size`` run without ``--vocab-size``."""
    kind = tokenizer_type(args)
    if not args.pad_vocab_size:
        if args.vocab_size is None:
            raise InputError(
                "megatron_args",
                "--no-pad-vocab-size",
                "needs --vocab-size: the model is built for it (argument_utils.py:476-480: "
                "'Either --padded-vocab-size or --vocab-size must be specified')",
            )
        return args.vocab_size
    if kind == "GPT2BPETokenizer":
        return GPT2_BPE_VOCAB
    if kind == "NullTokenizer":
        if args.vocab_size is None:
            raise InputError(
                "megatron_args",
                "--tokenizer-type NullTokenizer",
                "needs --vocab-size (NullTokenizer(vocab_size), null_tokenizer.py:16)",
            )
        return args.vocab_size
    if kind == "TikTokenizer":
        return TIKTOKEN_DEFAULT_VOCAB if args.vocab_size is None else args.vocab_size
    if args.vocab_size is not None:
        return args.vocab_size
    model = args.flag_values.get("--tokenizer-model")
    shown = f"--tokenizer-type {kind}"
    named = "" if model is None else f" (--tokenizer-model {model})"
    ask = (
        "give --vocab-size with that size (Megatron-LM itself does not read --vocab-size "
        "for this tokenizer; it pads the files' size)"
    )
    left = args.left_to_caller.get("--tokenizer-model")
    if left:
        raise InputError(
            "megatron_args",
            shown,
            f"its vocabulary is its tokenizer's size{named}, and the tokenizer is left to "
            f"the script's caller ({'; '.join(left)}): {ask}",
        )
    size = None if not isinstance(model, str) else tokenizer_files_size(kind, model)
    if size is None:
        raise InputError(
            "megatron_args",
            shown,
            # the files are not on this machine (or not a kind cpmem reads): the wording
            # the kept Megatron-LM report tabulates for the release cases
            f"its vocabulary is the size of its tokenizer files (len(tokenizer)), which "
            f"cpmem does not read: {ask}",
        )
    return size
