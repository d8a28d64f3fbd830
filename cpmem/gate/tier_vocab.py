"""The tier's assumption on tokenizer vocabularies it cannot read: a functional test whose
``--tokenizer-model`` names a file the snapshot does not hold is priced with the
vocabulary its published source gives, where one does. The assumption is the tier's
(the recordings' arguments are read as written everywhere else), shown in
``golden/reports/megatron.md``.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

TOKENIZER_VOCABULARIES: dict[str, tuple[int, str]] = {
    "nemotron_2_256k.model": (
        256_000,
        "Nemotron-4 15B technical report (arXiv 2402.16819): its SentencePiece tokenizer's "
        "vocabulary is 256,000, a multiple of 128 x TP 8 (Megatron-LM pads nothing)",
    ),
}
"""Tokenizer file name -> (vocabulary, its source)."""


def tier_vocab(model_config: Path) -> int | None:
    """The vocabulary the tier assumes for a case's ``model_config.yaml``, None where its
    ``--tokenizer-model`` is not one ``TOKENIZER_VOCABULARIES`` names (or the file does
    not read: the arguments' reader names that)."""
    import yaml

    try:
        doc = yaml.safe_load(model_config.read_text())
    except (OSError, yaml.YAMLError):
        return None
    model_args = doc.get("MODEL_ARGS") if isinstance(doc, dict) else None
    if not isinstance(model_args, dict):
        return None
    model = model_args.get("--tokenizer-model")
    if not isinstance(model, str):
        return None
    known = TOKENIZER_VOCABULARIES.get(PurePosixPath(model).name)
    return None if known is None else known[0]
