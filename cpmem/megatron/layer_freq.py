"""``--moe-layer-freq`` as Megatron-LM reads it, without evaluating it.

Megatron-LM's ``moe_freq_type`` (``megatron/training/arguments.py:327-350``) takes an
integer N (one MoE layer every N layers, from the first: ``get_gpt_decoder_block_spec``,
``gpt_layer_specs.py:647-650``), or, where the text holds a ``[``, a Python list
expression of one 0 (dense) or 1 (MoE) per layer, which ``_eval_pattern``
(``arguments.py:245-253``) admits only if every character is a digit, a comma, a bracket,
a parenthesis, ``+`` or ``*``, then hands to ``eval``: ``([0]*3+[1]*29)``, ``[1,0,1,0]``,
``([1]*3+[0]*1)*3``.

``parse_layer_freq`` reads that grammar with Python's meaning (lists concatenated by
``+`` and repeated by ``*`` with an integer on either side; integers added and
multiplied) and nothing else: no name, call or other operator can be written in it.
"""

from __future__ import annotations

import re

from cpmem.errors import InputError

ALLOWED = re.compile(r"[^,\d\[\]\(\)\+\*]")
"""Megatron-LM's ``_eval_pattern`` check: any other character is refused."""

Value = int | list[int]


def parse_layer_freq(text: str, flag: str = "--moe-layer-freq") -> int | tuple[int, ...]:
    """A ``moe_freq_type`` value (``--moe-layer-freq``, ``--window-attn-skip-freq``): an
    integer, or the per-layer tuple of 0s and 1s its list expression makes. Raises
    ``InputError`` (field ``megatron_args``) naming ``flag`` and the value where
    Megatron-LM would raise, or where the expression is not a list of 0s and 1s
    (``get_gpt_decoder_block_spec``'s "Invalid layer pattern"; ``is_layer_window_attention``
    reads each entry as a truth value, and cpmem accepts only 0 and 1 there too)."""
    text = text.strip()
    shown = f"{flag} {text}"
    if "[" not in text:
        try:
            return int(text)
        except ValueError:
            raise InputError(
                "megatron_args", shown, "must be an integer or a list expression"
            ) from None
    if ALLOWED.search(text):
        raise InputError(
            "megatron_args",
            shown,
            "Invalid pattern: only digits, commas, brackets, parentheses, + and * are "
            "allowed (arguments.py:245-253)",
        )
    parser = _Parser(text, shown)
    value = parser.expression()
    parser.end()
    if not isinstance(value, list):
        raise InputError("megatron_args", shown, "does not make a list of layers")
    if any(v not in (0, 1) for v in value):
        raise InputError(
            "megatron_args",
            shown,
            "every layer must be 0 (dense) or 1 (MoE) (gpt_layer_specs.py:665-671)"
            if flag == "--moe-layer-freq"
            else "every layer must be 0 (full attention) or 1 (windowed) "
            "(transformer/utils.py:541-542)",
        )
    return tuple(value)


class _Parser:
    """A recursive-descent reader of the expression grammar
    ``expr := term ('+' term)*``, ``term := atom ('*' atom)*``,
    ``atom := integer | '[' [expr (',' expr)* [',']] ']' | '(' expr ')'``."""

    def __init__(self, text: str, shown: str) -> None:
        self.text, self.shown, self.at = text, shown, 0

    def _fail(self, why: str) -> InputError:
        return InputError("megatron_args", self.shown, f"is not a valid list expression: {why}")

    def _peek(self) -> str:
        return self.text[self.at] if self.at < len(self.text) else ""

    def _take(self, char: str) -> bool:
        if self._peek() == char:
            self.at += 1
            return True
        return False

    def end(self) -> None:
        if self.at != len(self.text):
            raise self._fail(f"unexpected {self._peek()!r} at character {self.at}")

    def expression(self) -> Value:
        value = self._term()
        while self._take("+"):
            right = self._term()
            if isinstance(value, list) != isinstance(right, list):
                raise self._fail("a list and an integer cannot be added")
            value = value + right  # type: ignore[operator]
        return value

    def _term(self) -> Value:
        value = self._atom()
        while self._take("*"):
            right = self._atom()
            if isinstance(value, list) and isinstance(right, list):
                raise self._fail("two lists cannot be multiplied")
            value = value * right  # type: ignore[operator]
        return value

    def _atom(self) -> Value:
        if self._take("("):
            value = self.expression()
            if not self._take(")"):
                raise self._fail("a parenthesis is not closed")
            return value
        if self._take("["):
            items: list[int] = []
            while not self._take("]"):
                item = self.expression()
                if isinstance(item, list):
                    raise self._fail("a list inside a list is not a layer")
                items.append(item)
                if not self._take(",") and self._peek() != "]":
                    raise self._fail("list items must be separated by commas")
            return items
        start = self.at
        while self._peek().isdigit():
            self.at += 1
        if start == self.at:
            raise self._fail(f"expected a number at character {start}")
        return int(self.text[start : self.at])
