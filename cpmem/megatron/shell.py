"""A bash launch script read, not run: the variables it sets, what it exports and the
commands it would run (``read_script``).

The statements a launch script is made of are read as bash runs them: assignments
(scalars, ``NAME=( ... )`` arrays, ``+=``), ``export``/``declare``/``unset``, ``if`` /
``elif`` / ``else``, ``case``, ``&&`` / ``||``, ``{ ...; }`` groups and pipelines.
A test (``[ ]``, ``[[ ]]``, ``test``) is decided where its words are known
(``-z``, ``-n``, ``=``, ``==``, ``!=``, the integer comparisons, ``!``); one that reads a
value the script leaves to its caller, or a file on the machine (``-f``, ``-d``), is not
decided: where no branch sets anything the statement is passed over (it only echoes,
creates directories or exits), else every branch is read and what differs between them is
named by the test's unknowns (``Word.unset``). ``while``/``until`` loops that do not run
(a ``while [[ $# -gt 0 ]]`` over the script's own arguments: it is read with none) and
loops that set nothing are passed over; one that sets variables, ``eval`` and ``read``
are problems, named. A ``source``d file is not read: a variable the script then leaves
unset is named with it (what the file may set); one the script sets itself is read as
the script sets it (a sourced file that overrides it is not seen). Every other command (``mkdir``, ``echo``, ``torchrun``...)
is recorded with its expanded words for the caller (``cpmem.megatron.launch``) to pick
the training command from. Nothing is executed.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field

from cpmem.megatron.shell_words import ASSIGNMENT, Expander, Token, Word, joined, lex

Unknown = tuple[str, ...]
Status = bool | Unknown
"""A command's exit status: True (success), False, or the unknowns it depends on."""


@dataclass(frozen=True)
class Command:
    """A simple command as the script would run it: its words, expanded, the variables
    assigned before it (its own environment) and its line."""

    words: tuple[Word, ...]
    env: tuple[tuple[str, Word], ...]
    line: int
    unset: tuple[str, ...] = ()  # the undecided tests it runs under


@dataclass
class Node:
    kind: str  # simple, andor, pipeline, if, case, loop, group, function
    line: int
    words: list[Token] = field(default_factory=list)
    parts: list[list[Node]] = field(default_factory=list)
    ops: list[str] = field(default_factory=list)
    patterns: list[list[str]] = field(default_factory=list)


SETTERS = frozenset({"export", "declare", "typeset", "local", "readonly", "unset"})
SOURCE = frozenset({"source", "."})
PROBLEM_COMMANDS = {
    "eval": "runs text as commands, which cpmem does not read",
    "read": "reads a variable from its input, which cpmem does not know",
}
STOP = frozenset({"then", "elif", "else", "fi", "do", "done", "esac", "}"})


class _Parser:
    def __init__(self, tokens: list[Token]) -> None:
        self.toks = tokens
        self.pos = 0

    def peek(self) -> Token | None:
        return self.toks[self.pos] if self.pos < len(self.toks) else None

    def take(self) -> Token:
        tok = self.toks[self.pos]
        self.pos += 1
        return tok

    def at_word(self, *texts: str) -> bool:
        tok = self.peek()
        return tok is not None and tok.kind == "word" and tok.text in texts

    def expect(self, text: str) -> None:
        self._separators()
        tok = self.peek()
        if tok is None or tok.text != text:
            got = "the end" if tok is None else repr(tok.text)
            line = self.toks[-1].line if tok is None else tok.line
            raise SyntaxError(f"line {line}: expected '{text}', found {got}")
        self.take()

    def _separators(self) -> None:
        while (tok := self.peek()) is not None and (
            tok.kind == "newline" or (tok.kind == "op" and tok.text in (";", "&"))
        ):
            self.take()

    def statements(self, stop: frozenset[str] = STOP) -> list[Node]:
        out: list[Node] = []
        while True:
            self._separators()
            tok = self.peek()
            if tok is None or (tok.kind == "word" and tok.text in stop):
                return out
            if tok.kind == "op" and tok.text in (")", ";;"):
                return out
            out.append(self.and_or())

    def and_or(self) -> Node:
        first = self.pipeline()
        node = Node("andor", first.line, parts=[[first]])
        while (tok := self.peek()) is not None and tok.kind == "op" and tok.text in ("&&", "||"):
            node.ops.append(self.take().text)
            while (t := self.peek()) is not None and t.kind == "newline":
                self.take()
            node.parts.append([self.pipeline()])
        return node if node.ops else first

    def pipeline(self) -> Node:
        negate = self.at_word("!")
        if negate:
            self.take()
        first = self.command()
        node = Node("pipeline", first.line, parts=[[first]], ops=["!"] if negate else [])
        while (tok := self.peek()) is not None and tok.kind == "op" and tok.text == "|":
            self.take()
            node.parts.append([self.command()])
        return node if (len(node.parts) > 1 or negate) else first

    def command(self) -> Node:
        tok = self.peek()
        if tok is None:
            raise SyntaxError("a command was expected at the end")
        line = tok.line
        if tok.kind == "word" and tok.text == "if":
            self.take()
            node = Node("if", line)
            while True:
                cond = self.statements(frozenset({"then"}))
                self.expect("then")
                node.parts += [cond, self.statements()]
                self._separators()
                if self.at_word("elif"):
                    self.take()
                    continue
                if self.at_word("else"):
                    self.take()
                    node.parts.append(self.statements())
                self.expect("fi")
                return node
        if tok.kind == "word" and tok.text == "case":
            self.take()
            node = Node("case", line, words=[self.take()])
            self.expect("in")
            while True:
                self._separators()
                if self.at_word("esac"):
                    self.take()
                    return node
                if (t := self.peek()) is not None and t.text == "(":
                    self.take()
                pats: list[str] = []
                while (t := self.take()).text != ")":
                    if t.kind == "word":
                        pats.append(t.text)
                node.patterns.append(pats)
                node.parts.append(self.statements(frozenset({"esac"})))
                if (t := self.peek()) is not None and t.text == ";;":
                    self.take()
        if tok.kind == "word" and tok.text in ("while", "until", "for", "select"):
            self.take()
            node = Node("loop", line, words=[tok])
            if tok.text in ("for", "select"):
                while not self.at_word("do"):
                    t = self.take()
                    if t.kind == "word":
                        node.words.append(t)
                node.parts.append([])
            else:
                node.parts.append(self.statements(frozenset({"do"})))
            self.expect("do")
            node.parts.append(self.statements())
            self.expect("done")
            return node
        if tok.kind == "word" and tok.text == "{":
            self.take()
            body = self.statements()
            self.expect("}")
            return Node("group", line, parts=[body])
        if tok.kind == "op" and tok.text == "(":
            self.take()
            body = self.statements()
            self.expect(")")
            return Node("group", line, parts=[body])
        if tok.kind == "word" and tok.text == "function":
            self.take()
        nxt = self.toks[self.pos + 1 : self.pos + 3]
        if (
            tok.kind == "word"
            and len(nxt) == 2
            and [t.text for t in nxt] == ["(", ")"]
            and re.fullmatch(r"[\w.-]+", tok.text)
        ):
            self.pos += 3
            self._separators()
            definition = self.command()
            return Node("function", line, words=[tok], parts=[[definition]])
        node = Node("simple", line)
        while (t := self.peek()) is not None:
            if t.kind in ("word", "array"):
                node.words.append(self.take())
            elif t.kind == "op" and t.text in ("<", ">", ">>", ">&", "&>", "<<"):
                self.take()
                if (f := self.peek()) is not None and f.kind == "word" and t.text != "<<":
                    self.take()  # a redirection's target: not a word of the command
            else:
                break
        return node


def mutates(nodes: list[Node]) -> bool:
    """Whether running ``nodes`` could set a variable or run a command other than the
    ones a launch script runs for their output (echo, mkdir, exit...): an assignment, a
    setter, a command with ``.py`` or a launcher in it, ``source``/``eval``/``read``."""
    for node in nodes:
        if node.kind == "simple":
            for k, t in enumerate(node.words):
                if t.kind == "array" or (k == 0 and ASSIGNMENT.fullmatch(t.text)):
                    return True
                if k == 0 and (t.text in SETTERS or t.text in PROBLEM_COMMANDS or t.text in SOURCE):
                    return True
                if ".py" in t.text or "torchrun" in t.text or "torch.distributed" in t.text:
                    return True
        if any(mutates(part) for part in node.parts):
            return True
    return False


@dataclass
class ShellState:
    """What the script has set so far: variables (each a tuple of words; an array's
    elements or a scalar's one word), which are arrays, what is exported, the commands
    run, the problems met, whether it has exited."""

    values: dict[str, tuple[Word, ...]] = field(default_factory=dict)
    arrays: set[str] = field(default_factory=set)
    exported: set[str] = field(default_factory=set)
    commands: list[Command] = field(default_factory=list)
    problems: list[tuple[str, str]] = field(default_factory=list)
    exited: bool = False
    sourced: list[str] = field(default_factory=list)  # files sourced, not read

    def copy(self) -> ShellState:
        return ShellState(
            dict(self.values),
            set(self.arrays),
            set(self.exported),
            list(self.commands),
            list(self.problems),
            self.exited,
            list(self.sourced),
        )


def _tagged(word: Word, unknown: Unknown) -> Word:
    """``word`` as set under an undecided test: every piece names the test too."""

    def more(names: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(dict.fromkeys(names + unknown))

    return Word(word.text, more(word.unset), tuple((t, more(n)) for t, n in word.parts))


def _merged(values: list[tuple[Word, ...] | None], unknown: Unknown) -> tuple[Word, ...] | None:
    """One variable's values after branches the script could take: what they share,
    then each branch's own words named by the undecided test."""
    if all(v == values[0] for v in values):
        return values[0]
    present = [v or () for v in values]
    common = 0
    while all(len(v) > common and v[common] == present[0][common] for v in present):
        common += 1
    out = list(present[0][:common])
    for v in present:
        for w in v[common:]:
            tagged = _tagged(w, unknown)
            if tagged not in out:
                out.append(tagged)
    return tuple(out)


def _combine(op: str, unknown: Unknown, result: Status) -> Status:
    """``unknown && result`` or ``unknown || result``, three-valued."""
    if op == "||" and result is True:
        return True
    if op == "&&" and result is False:
        return False
    return unknown + result if isinstance(result, tuple) else unknown


class _Runner:
    def __init__(self, state: ShellState, script_name: str, depth: int = 0) -> None:
        self.state = state
        self.expander = Expander(self.lookup, script_name, self._set, state.sourced)
        self.script_name = script_name
        self.functions: dict[str, Node] = {}
        self.depth = depth
        self.under: Unknown = ()

    def lookup(self, name: str) -> tuple[Word, ...] | None:
        return self.state.values.get(name)

    def _set(self, name: str, value: Word) -> None:
        self.state.values[name] = (value,)

    def fork(self) -> _Runner:
        other = _Runner(self.state.copy(), self.script_name, self.depth)
        other.functions = self.functions
        other.under = self.under
        return other

    def merge(self, branches: list[_Runner], unknown: Unknown) -> None:
        live = [b.state for b in branches if not b.state.exited]
        if not live:
            self.state.exited = True
            return
        names = set().union(*(s.values for s in live))
        for name in names:
            merged = _merged([s.values.get(name) for s in live], unknown)
            if merged is None:
                self.state.values.pop(name, None)
            else:
                self.state.values[name] = merged
        self.state.arrays = set().union(*(s.arrays for s in live))
        self.state.exported = set().union(*(s.exported for s in live))
        for s in live:
            for cmd in s.commands:
                if cmd not in self.state.commands:
                    self.state.commands.append(cmd)
            for p in s.problems:
                if p not in self.state.problems:
                    self.state.problems.append(p)

    # -- statements ---------------------------------------------------------------
    def run(self, nodes: list[Node]) -> Status:
        status: Status = True
        for node in nodes:
            if self.state.exited:
                break
            status = self.node(node)
        return status

    def node(self, node: Node) -> Status:
        kind = node.kind
        if kind == "simple":
            return self.simple(node)
        if kind == "group":
            return self.run(node.parts[0])
        if kind == "function":
            self.functions[node.words[0].text] = node.parts[0][0]
            return True
        if kind == "pipeline":
            status: Status = True
            for part in node.parts:
                status = self.run(part)
            if node.ops == ["!"]:
                return (not status) if isinstance(status, bool) else status
            return status
        if kind == "andor":
            status = self.run(node.parts[0])
            for op, part in zip(node.ops, node.parts[1:], strict=True):
                if status is (op == "||"):
                    continue  # && after a failure, || after a success: not run
                if isinstance(status, bool):
                    status = self.run(part)
                elif not mutates(part):  # a test, or an echo/exit: its status, no effect
                    status = _combine(op, status, self.fork().run(part))
                else:
                    taken = self.fork()
                    taken.under = self.under + status
                    result = taken.run(part)
                    self.merge([taken, self.fork()], status)
                    status = _combine(op, status, result)
            return status
        if kind == "if":
            return self.if_(node.parts, node.line)
        if kind == "case":
            return self.case(node)
        return self.loop(node)

    def if_(self, parts: list[list[Node]], line: int) -> Status:
        for k in range(0, len(parts) - 1, 2):
            cond, body = parts[k], parts[k + 1]
            status = self.run(cond)
            if status is True:
                return self.run(body)
            if status is False:
                continue
            rest = parts[k + 2 :]
            if not mutates(body) and not any(mutates(p) for p in rest):
                return True
            taken, other = self.fork(), self.fork()
            taken.under = other.under = self.under + status
            taken.run(body)
            other.if_(rest, line)
            self.merge([taken, other], status)
            return True
        if len(parts) % 2:
            return self.run(parts[-1])
        return True

    def case(self, node: Node) -> Status:
        subject = self.expander.expand(node.words[0].text, split=False)[0]
        if subject.unset:
            bodies = [b for b in node.parts if mutates(b)]
            if not bodies:
                return True
            branches = []
            for body in bodies:
                b = self.fork()
                b.under = self.under + subject.unset
                b.run(body)
                branches.append(b)
            self.merge(branches, subject.unset)
            return True
        for pats, body in zip(node.patterns, node.parts, strict=True):
            for pat in pats:
                text = self.expander.expand(pat, split=False)[0].text
                if fnmatch.fnmatchcase(subject.text, text):
                    return self.run(body)
        return True

    def loop(self, node: Node) -> Status:
        head, cond, body = node.words[0].text, node.parts[0], node.parts[1]
        if head in ("while", "until"):
            status = self.run(cond)
            if status is (head == "until"):
                return True  # the loop's body never runs
        if not mutates(body):
            return True
        self.state.problems.append(
            (
                f"line {node.line}: {head} ...",
                "is a loop that sets variables, which cpmem does not run",
            )
        )
        return True

    # -- one command --------------------------------------------------------------
    def assign(self, tok: Token, export: bool = False) -> None:
        if tok.kind == "array":
            name, op = tok.text.rstrip("+="), ("+=" if tok.text.endswith("+=") else "=")
            words = tuple(w for item in tok.items for w in self.expander.expand(item))
            old = self.state.values.get(name, ()) if op == "+=" else ()
            self.state.values[name] = old + words
            self.state.arrays.add(name)
        else:
            m = ASSIGNMENT.fullmatch(tok.text)
            if m is None:
                if export and re.fullmatch(r"[A-Za-z_]\w*", tok.text):
                    self.state.exported.add(tok.text)
                return
            name, op, raw = m.groups()
            value = self.expander.expand(raw, split=False)[0]
            if self.under:
                value = _tagged(value, self.under)
            if op == "+=" and name in self.state.arrays:
                self.state.values[name] = (*self.state.values.get(name, ()), value)
            elif op == "+=":
                before = self.state.values.get(name, (Word(""),))[0]
                self.state.values[name] = (joined([*before.pieces(), *value.pieces()]),)
            else:
                self.state.values[name] = (value,)
                self.state.arrays.discard(name)
        if export:
            self.state.exported.add(tok.text.split("=")[0].rstrip("+"))

    def simple(self, node: Node) -> Status:
        toks = node.words
        k = 0
        prefix: list[Token] = []
        while k < len(toks) and (toks[k].kind == "array" or ASSIGNMENT.fullmatch(toks[k].text)):
            prefix.append(toks[k])
            k += 1
        if k == len(toks):
            for tok in prefix:
                self.assign(tok)
            return True
        head = toks[k].text
        if head in SETTERS:
            for tok in toks[k + 1 :]:
                if tok.text.startswith("-"):
                    continue
                if head == "unset":
                    self.state.values.pop(tok.text, None)
                    self.state.exported.discard(tok.text)
                else:
                    exported = head == "export" or (
                        head == "declare" and "-x" in [t.text for t in toks]
                    )
                    self.assign(tok, export=exported)
            return True
        if head in SOURCE:  # not read: what it sets stays unknown, named with the file
            shown = " ".join(t.text for t in toks[k + 1 :]) or head
            self.state.sourced.append(shown)
            return True
        if head in PROBLEM_COMMANDS:
            shown = " ".join(t.text for t in toks[k:])
            self.state.problems.append((f"line {node.line}: {shown}", PROBLEM_COMMANDS[head]))
            return True
        if head in ("[", "[[", "test"):
            return self.test([w for t in toks[k + 1 :] for w in self.expander.expand(t.text)], head)
        if head in ("true", ":"):
            for tok in toks[k + 1 :]:  # ``: ${X:=default}`` sets X
                self.expander.expand(tok.text)
            return True
        if head == "false":
            return False
        if head == "exit":
            self.state.exited = True
            return True
        if head in self.functions and self.depth < 16:
            inner = _Runner(self.state, self.script_name, self.depth + 1)
            inner.functions, inner.under = self.functions, self.under
            return inner.run([self.functions[head]])
        env = tuple(
            (m.group(1), self.expander.expand(m.group(3), split=False)[0])
            for tok in prefix
            if (m := ASSIGNMENT.fullmatch(tok.text))
        )
        words = tuple(w for t in toks[k:] for w in self.expander.expand(t.text))
        self.state.commands.append(Command(words, env, node.line, self.under))
        return True

    def test(self, words: list[Word], head: str) -> Status:
        """A ``[``/``[[``/``test`` command decided where its words are known."""
        if head in ("[", "[[") and words and words[-1].text in ("]", "]]"):
            words = words[:-1]
        negate = False
        while words and words[0].text == "!":
            negate, words = not negate, words[1:]
        unknown = tuple(u for w in words for u in w.unset)
        texts = [w.text for w in words]
        result: Status
        if unknown:
            result = unknown
        elif len(texts) == 2 and texts[0] in ("-z", "-n"):
            result = (texts[1] == "") == (texts[0] == "-z")
        elif len(texts) == 1:
            result = texts[0] != ""
        elif len(texts) == 2 and texts[0] in ("-f", "-d", "-e", "-s", "-r", "-w", "-x"):
            result = (f"[ {texts[0]} {texts[1]} ] (a file on the machine that runs it)",)
        elif len(texts) == 3 and texts[1] in ("=", "==", "!="):
            same = fnmatch.fnmatchcase(texts[0], texts[2]) if head == "[[" else texts[0] == texts[2]
            result = same == (texts[1] != "!=")
        elif len(texts) == 3 and texts[1] in ("-eq", "-ne", "-gt", "-ge", "-lt", "-le"):
            try:
                a, b = int(texts[0]), int(texts[2])
            except ValueError:
                return (f"[ {' '.join(texts)} ] (not integers)",)
            result = {
                "-eq": a == b,
                "-ne": a != b,
                "-gt": a > b,
                "-ge": a >= b,
                "-lt": a < b,
                "-le": a <= b,
            }[texts[1]]
        else:
            result = (f"[ {' '.join(texts)} ] (a test cpmem does not read)",)
        if negate and isinstance(result, bool):
            return not result
        return result


def read_script(text: str, script_name: str = "script.sh") -> ShellState:
    """What ``text`` sets, exports and runs, read statement by statement (nothing run).

    Raises ``SyntaxError`` where the text is not a script cpmem can read."""
    parser = _Parser(lex(text))
    try:
        nodes = parser.statements(frozenset())
    except IndexError:
        raise SyntaxError("the script ends inside a statement") from None
    if (left := parser.peek()) is not None:
        raise SyntaxError(f"line {left.line}: '{left.text}' is not where bash allows it")
    state = ShellState()
    _Runner(state, script_name).run(nodes)
    return state
