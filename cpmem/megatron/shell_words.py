"""The words of a bash launch script, as cpmem reads them without running anything.

``lex`` cuts a script into tokens as bash does (quotes, ``\\`` line continuations,
``#`` comments, operators, here-documents skipped, ``NAME=( ... )`` array assignments);
``Expander`` turns a raw word into the words bash would hand a command: ``$NAME``,
``${NAME}``, the defaults ``${NAME:-x}`` / ``${NAME-x}`` / ``${NAME:=x}`` / ``${NAME:+x}``,
arrays (``${A[@]}``, ``"${A[@]}"``, ``${A[N]}``), ``$((...))`` integer arithmetic, quotes,
and the splitting of unquoted expansions on blanks. No file name is globbed: a launch
script's patterns (``[0]*3+[1]*58``) are values, not paths.

A value the script does not give (a positional argument such as ``$2``, a variable
set only by its caller, a command's output ``$(...)``) is not guessed: its word keeps the
expansion as written and names it in ``Word.unset``, so a priced flag built from it is
refused with the variable named (``cpmem.megatron.launch``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from cpmem.errors import InputError

OPERATORS = (";;", "&&", "||", ">>", "<<", ">&", "&>", ";", "&", "|", "(", ")", "<", ">")
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
EMPTY_ALL = re.compile(r'"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\[@\]\}|@|\{@\})"')
ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\+?=)(.*)", re.DOTALL)


@dataclass(frozen=True)
class Word:
    """One word as bash hands it to a command; ``unset`` names what it was built from
    that the script leaves to its caller (empty: the word is fully known)."""

    text: str
    unset: tuple[str, ...] = ()
    parts: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """A value built from pieces (an assignment's), each with its own unknowns: split
    later, each word keeps only its own pieces' (empty: one piece, the whole word)."""

    def pieces(self) -> tuple[tuple[str, tuple[str, ...]], ...]:
        return self.parts or ((self.text, self.unset),)


@dataclass(frozen=True)
class Token:
    """A lexed token: ``word`` (its raw text), ``op``, ``newline``, or ``array`` (a
    ``NAME=(...)`` / ``NAME+=(...)`` assignment: ``text`` is ``NAME=`` or ``NAME+=``,
    ``items`` the raw element words)."""

    kind: str
    text: str
    line: int
    items: tuple[str, ...] = ()


def _skip_balanced(text: str, i: int, open_: str, close: str) -> int:
    """The index after the ``close`` matching the ``open_`` just before ``i``, quotes
    respected."""
    depth = 1
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "'":
            i = text.index("'", i + 1) + 1 if "'" in text[i + 1 :] else len(text)
            continue
        if c == '"':
            i = _skip_double(text, i + 1)
            continue
        if c == open_:
            depth += 1
        elif c == close:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise InputError("megatron_args", text[:60], f"has an unclosed '{open_}'")


def _skip_double(text: str, i: int) -> int:
    """The index after the closing ``"`` of a double-quoted string starting at ``i``."""
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == '"':
            return i + 1
        if c == "$" and text[i + 1 : i + 2] in ("(", "{"):
            open_ = text[i + 1]
            i = _skip_balanced(text, i + 2, open_, ")" if open_ == "(" else "}")
            continue
        if c == "`":
            end = text.find("`", i + 1)
            if end < 0:
                raise InputError("megatron_args", text[i : i + 60], "has an unclosed '`'")
            i = end + 1
            continue
        i += 1
    raise InputError("megatron_args", text[:60], "has an unclosed '\"'")


def _read_word(text: str, i: int) -> int:
    """The index after the word starting at ``i``."""
    while i < len(text):
        c = text[i]
        if c in " \t\r\n;&|<>()":
            return i
        if c == "\\":
            i += 2
        elif c == "'":
            end = text.find("'", i + 1)
            if end < 0:
                raise InputError("megatron_args", text[i : i + 60], 'has an unclosed "\'"')
            i = end + 1
        elif c == '"':
            i = _skip_double(text, i + 1)
        elif c == "`":
            end = text.find("`", i + 1)
            if end < 0:
                raise InputError("megatron_args", text[i : i + 60], "has an unclosed '`'")
            i = end + 1
        elif c == "$" and text[i + 1 : i + 2] in ("(", "{"):
            open_ = text[i + 1]
            i = _skip_balanced(text, i + 2, open_, ")" if open_ == "(" else "}")
        else:
            i += 1
    return i


def _skip_blank(text: str, i: int, newlines: bool) -> int:
    """Past blanks, ``\\`` continuations and comments (and newlines where asked). A line
    that is only a comment inside a continued command is passed over with its newline:
    the command goes on after it (bash would end the command there and fail on the next
    line; a flags file's commented-out flag means this)."""
    continued = False
    while i < len(text):
        c = text[i]
        if c == "\\" and text[i + 1 : i + 2] == "\n":
            i += 2
            continued = True
        elif c in " \t\r" or (newlines and c == "\n"):
            i += 1
        elif c == "#":
            end = text.find("\n", i)
            end = len(text) if end < 0 else end
            line_start = text.rfind("\n", 0, i) + 1
            if continued and not text[line_start:i].strip() and end < len(text):
                i = end + 1  # a whole-line comment inside a continued command
                continue
            i = end
        else:
            return i
    return i


def lex(text: str) -> list[Token]:
    """The script's tokens, in order."""
    tokens: list[Token] = []
    heredocs: list[tuple[str, bool]] = []
    i, line = 0, 1
    while True:
        i = _skip_blank(text, i, newlines=False)
        if i >= len(text):
            return tokens
        line = text.count("\n", 0, i) + 1
        c = text[i]
        if c == "\n":
            tokens.append(Token("newline", "\n", line))
            i += 1
            for delimiter, strip in heredocs:  # the here-documents' bodies: not read
                while i < len(text):
                    end = text.find("\n", i)
                    end = len(text) if end < 0 else end
                    body_line = text[i:end]
                    i = end + 1
                    if (body_line.lstrip("\t") if strip else body_line) == delimiter:
                        break
            heredocs = []
            continue
        op = next((o for o in OPERATORS if text.startswith(o, i)), None)
        if op is not None:
            i += len(op)
            if op == "<<":
                strip = text.startswith("-", i)
                i = _skip_blank(text, i + (1 if strip else 0), newlines=False)
                end = _read_word(text, i)
                heredocs.append((text[i:end].strip("'\""), strip))
                i = end
            tokens.append(Token("op", op, line))
            continue
        end = _read_word(text, i)
        raw = text[i:end]
        if raw.isdigit() and text[end : end + 1] in ("<", ">"):
            i = end  # a redirection's file descriptor (2>&1), not a word
            continue
        if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*\+?=", raw) and text[end : end + 1] == "(":
            items: list[str] = []
            j = end + 1
            while True:
                j = _skip_blank(text, j, newlines=True)
                if j >= len(text):
                    raise InputError("megatron_args", raw + "(", "has an unclosed '('")
                if text[j] == ")":
                    break
                k = _read_word(text, j)
                if k == j:
                    raise InputError("megatron_args", text[j : j + 40], "is not an array item")
                items.append(text[j:k])
                j = k
            tokens.append(Token("array", raw, line, tuple(items)))
            i = j + 1
            continue
        tokens.append(Token("word", raw, line))
        i = end


Lookup = Callable[[str], "tuple[Word, ...] | None"]
"""A variable's value by name: its words (a scalar: one), None where unset."""


def ordinal(name: str, sourced: tuple[str, ...] = ()) -> str:
    """How a variable the script leaves to its caller is named in a refusal (with the
    files it sources, which may set it and are not read)."""
    if name.isdigit():
        return f"${name} (the script's argument {name}, left to its caller)"
    if sourced:
        return f"${name} (not set in the script; left to its caller or to {', '.join(sourced)})"
    return f"${name} (not set in the script: left to its caller)"


class Expander:
    """Expands raw words against the script's variables (``lookup``)."""

    def __init__(
        self,
        lookup: Lookup,
        script_name: str = "script.sh",
        assign: Callable[[str, Word], None] | None = None,
        sourced: list[str] | None = None,
    ) -> None:
        self.lookup = lookup
        self.script_name = script_name
        self.assign = assign  # ``${NAME:=x}`` sets NAME
        self.sourced = sourced if sourced is not None else []  # files sourced so far

    def unset(self, name: str) -> str:
        return ordinal(name, tuple(self.sourced))

    # -- one parameter ------------------------------------------------------------
    def _param(self, body: str, raw: str) -> tuple[list[Word], bool]:
        """``${body}``'s words and whether it is an array's ``[@]``/``[*]`` (each
        element its own word)."""
        if body in ("#",):
            return [Word("0")], False
        if body in ("@", "*"):
            return [], True  # the script is read with no arguments
        if body == "0":
            return [Word(self.script_name)], False
        m = re.fullmatch(
            r"([A-Za-z_][A-Za-z0-9_]*|\d+)(\[(@|\*|\d+)\])?(?:(:?[-=+?])(.*))?", body, re.DOTALL
        )
        if m is None:
            return [Word(raw, (f"{raw} (an expansion cpmem does not read)",))], False
        name, _, index, op, operand = m.groups()
        value = self.lookup(name)
        every = index in ("@", "*")
        if value is not None and index is not None and not every:
            value = value[int(index) : int(index) + 1] or None
        elif value is not None and not every:
            value = value[:1]
        empty = value is None or (
            op is not None and op.startswith(":") and "".join(w.text for w in value) == ""
        )
        if op is not None and op.endswith("+"):
            if value is None and name not in ("#",):
                return [Word(raw, (self.unset(name),))], False
            return ([] if empty else self.expand(operand, split=False)), False
        if op is not None and op[-1] in "-=" and empty:
            words = self.expand(operand, split=False) if operand else [Word("")]
            if op.endswith("=") and self.assign is not None:
                self.assign(name, words[0])
            return words, False
        if value is None:
            return [Word(raw, (self.unset(name),))], False
        if op is not None and op.endswith("?") and empty:
            return [Word(raw, (f"{raw} (the script stops when it is unset)",))], False
        if every:  # an array's elements: named by their own variables
            return list(value), every
        return [_named(name, w) for w in value], every

    # -- arithmetic ---------------------------------------------------------------
    def arithmetic(self, expr: str, raw: str) -> Word:
        """``$((expr))``: an integer, or the expression named where it reads a value
        the script does not give."""
        words = self.expand(expr, split=False)
        unset = tuple(u for w in words for u in w.unset)
        if unset:
            return Word(_shown(raw), unset)
        text = "".join(w.text for w in words)
        try:
            return Word(str(_Arith(text, self.lookup).value()))
        except _ArithUnset as exc:
            return Word(_shown(raw), (self.unset(str(exc)),))
        except _ArithError as exc:
            return Word(_shown(raw), (f"{raw} ({exc})",))

    # -- a whole word -------------------------------------------------------------
    def expand(self, raw: str, split: bool = True) -> list[Word]:
        """``raw`` as the words bash hands a command (``split``) or as one value (an
        assignment's: no splitting, array elements joined by a blank)."""
        fields: list[list[tuple[str, tuple[str, ...]]]] = [[]]
        started = [False]

        def add(text: str, names: tuple[str, ...] = ()) -> None:
            fields[-1].append((text, names))
            started[-1] = True

        def new_field() -> None:
            if started[-1]:
                fields.append([])
                started.append(False)

        def add_expansion(words: list[Word], quoted: bool, every: bool) -> None:
            for k, w in enumerate(words):
                if k and every and split and quoted:
                    fields.append([])  # "${A[@]}": each element its own word
                    started.append(False)
                elif k:  # unquoted elements split anyway; a value joins them by a blank
                    if split:
                        new_field()
                    else:
                        add(" ")
                for text, names in w.pieces():
                    if quoted or not split:
                        add(text, names)
                        continue
                    if text == "" and names:
                        add(text, names)
                    for piece in re.split(r"(\s+)", text):
                        if piece.isspace():
                            new_field()
                        elif piece:
                            add(piece, names)

        def expansion(i: int, quoted: bool) -> int:
            """Expand the ``$...`` at ``i``; the index after it."""
            nxt = raw[i + 1 : i + 2]
            if raw.startswith("$((", i):
                end = _skip_balanced(raw, i + 3, "(", ")")
                if raw[end : end + 1] == ")":
                    add_expansion(
                        [self.arithmetic(raw[i + 3 : end - 1], raw[i : end + 1])], True, False
                    )
                    return end + 1
            if nxt == "(":
                end = _skip_balanced(raw, i + 2, "(", ")")
                text = raw[i:end]
                add(_shown(text), (f"{text} (a command's output)",))
                return end
            if nxt == "{":
                end = _skip_balanced(raw, i + 2, "{", "}")
                words, every = self._param(raw[i + 2 : end - 1], raw[i:end])
                add_expansion(words, quoted, every)
                return end
            m = NAME.match(raw, i + 1)
            if m is not None:
                words, _ = self._param(m.group(0), raw[i : m.end()])
                add_expansion(words, quoted, False)
                return m.end()
            if nxt.isdigit() or nxt in ("#", "@", "*"):
                words, every = self._param(nxt, raw[i : i + 2])
                add_expansion(words, quoted, every)
                return i + 2
            if nxt in ("$", "?", "!", "-"):
                add(raw[i : i + 2], (f"{raw[i : i + 2]} (a shell value known when it runs)",))
                return i + 2
            add("$")
            return i + 1

        i = 0
        while i < len(raw):
            c = raw[i]
            if c == "\\":
                add(raw[i + 1 : i + 2])
                i += 2
            elif c == "'":
                end = _closing(raw, "'", i)
                add(raw[i + 1 : end])
                i = end + 1
            elif c == '"' and (m := EMPTY_ALL.match(raw, i)) and not self.lookup(m.group(1) or "@"):
                i = m.end()  # "${A[@]}" of an empty array: no word at all
            elif c == '"':
                started[-1] = True
                i += 1
                while i < len(raw) and raw[i] != '"':
                    if raw[i] == "\\" and raw[i + 1 : i + 2] == "\n":
                        i += 2  # a continuation line inside the quotes
                    elif raw[i] == "\\" and raw[i + 1 : i + 2] in ('"', "\\", "$", "`"):
                        add(raw[i + 1])
                        i += 2
                    elif raw[i] == "$":
                        i = expansion(i, quoted=True)
                    elif raw[i] == "`":
                        end = _closing(raw, "`", i)
                        add(raw[i : end + 1], (f"{raw[i : end + 1]} (a command's output)",))
                        i = end + 1
                    else:
                        add(raw[i])
                        i += 1
                i += 1
            elif c == "$":
                i = expansion(i, quoted=False)
            elif c == "`":
                end = _closing(raw, "`", i)
                add(raw[i : end + 1], (f"{raw[i : end + 1]} (a command's output)",))
                i = end + 1
            else:
                add(c)
                i += 1
        out = [joined(f) for f, s in zip(fields, started, strict=True) if s]
        if not split:
            return [joined([piece for w in out for piece in w.pieces()])]
        return out


def joined(pieces: list[tuple[str, tuple[str, ...]]]) -> Word:
    """One word of pieces: its text, every piece's unknowns, and the pieces where some
    are unknown (kept so a later split names each word's own)."""
    text = "".join(t for t, _ in pieces)
    unset = tuple(dict.fromkeys(u for _, names in pieces for u in names))
    if not unset:
        return Word(text)
    return Word(text, unset, tuple(pieces) if len(pieces) > 1 else ())


def _closing(raw: str, quote: str, i: int) -> int:
    """The index of the ``quote`` closing the one at ``i``."""
    end = raw.find(quote, i + 1)
    if end < 0:
        raise InputError("megatron_args", raw[i : i + 60], f"has an unclosed '{quote}'")
    return end


def _shown(raw: str) -> str:
    """An expansion kept as written in place of its unknown value, in one word."""
    return re.sub(r"\s+", "", raw)


def _named(name: str, word: Word) -> Word:
    """A variable's word, its unknown parts named through the variable."""
    if not word.unset:
        return word

    def through(names: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(u if u.startswith(f"${name} ") else f"${name} = {u}" for u in names)

    return Word(word.text, through(word.unset), tuple((t, through(n)) for t, n in word.parts))


class _ArithError(ValueError):
    pass


class _ArithUnset(ValueError):
    """A name in an integer expression that the script does not set."""


class _Arith:
    """An integer expression of ``$((...))``: + - * / % ** ( ), unary signs, numbers
    and variable names (their integer values)."""

    def __init__(self, text: str, lookup: Lookup) -> None:
        self.tokens = re.findall(r"\d+|[A-Za-z_][A-Za-z0-9_]*|\*\*|[-+*/%()]|\S", text)
        self.pos = 0
        self.lookup = lookup

    def _peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def _take(self) -> str:
        tok = self._peek()
        if tok is None:
            raise _ArithError("an incomplete integer expression")
        self.pos += 1
        return tok

    def value(self) -> int:
        out = self._sum()
        if self._peek() is not None:
            raise _ArithError(f"'{self._peek()}' is not read in an integer expression")
        return out

    def _sum(self) -> int:
        out = self._product()
        while self._peek() in ("+", "-"):
            out = out + self._product() if self._take() == "+" else out - self._product()
        return out

    def _product(self) -> int:
        out = self._power()
        while self._peek() in ("*", "/", "%"):
            op, rhs = self._take(), self._power()
            if op != "*" and rhs == 0:
                raise _ArithError("a division by zero")
            if op == "*":
                out *= rhs
            else:  # bash truncates toward zero
                q = abs(out) // abs(rhs) * (1 if (out >= 0) == (rhs >= 0) else -1)
                out = q if op == "/" else out - q * rhs
        return out

    def _power(self) -> int:
        base = self._unary()
        if self._peek() == "**":
            self._take()
            return int(base ** self._power())
        return base

    def _unary(self) -> int:
        tok = self._take()
        if tok in ("+", "-"):
            v = self._unary()
            return -v if tok == "-" else v
        if tok == "(":
            v = self._sum()
            if self._take() != ")":
                raise _ArithError("an unclosed '('")
            return v
        if tok.isdigit():
            return int(tok)
        if NAME.fullmatch(tok):
            value = self.lookup(tok)
            if value is None:  # bash would read 0: cpmem names it instead
                raise _ArithUnset(tok)
            text = value[0].text.strip() if value else ""
            if not re.fullmatch(r"-?\d+", text):
                raise _ArithError(f"{tok}={text!r} is not an integer")
            return int(text)
        raise _ArithError(f"'{tok}' is not read in an integer expression")
