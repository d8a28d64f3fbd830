"""A bash launch script read, not run (``cpmem.megatron.shell``): variables, arrays,
defaults, integer arithmetic, tests, ``case``, and the words a command is handed.

Expected words are bash's own for the same lines (bash 5: an unquoted expansion is split
on blanks, ``"${A[@]}"`` keeps each element one word, ``${V:-d}`` is ``d`` where ``V`` is
unset or empty, ``$((...))`` is integer arithmetic truncating toward zero), written out
by hand from the script text.
"""

from __future__ import annotations

import pytest

from cpmem.megatron.shell import read_script
from cpmem.megatron.shell_words import Word


def _run(script: str) -> list[tuple[str, ...]]:
    """The words of every command the script runs, as text."""
    return [tuple(w.text for w in c.words) for c in read_script(script).commands]


def _last(script: str) -> tuple[Word, ...]:
    return read_script(script).commands[-1].words


def test_arrays_quoted_and_unquoted() -> None:
    script = (
        "A=(\n"
        "    --num-layers 2   # a comment inside the array\n"
        '    "--fp8-format hybrid"\n'
        ")\n"
        "A+=(--bf16)\n"
        'echo "${A[@]}"\n'
        "echo ${A[@]}\n"
        "echo ${A[1]} $A\n"
        "EMPTY=()\n"
        'echo "${EMPTY[@]}" x\n'
    )
    assert _run(script) == [
        ("echo", "--num-layers", "2", "--fp8-format hybrid", "--bf16"),
        ("echo", "--num-layers", "2", "--fp8-format", "hybrid", "--bf16"),
        ("echo", "2", "--num-layers"),
        ("echo", "x"),
    ]


def test_defaults_assignments_and_exports() -> None:
    script = (
        "GPUS=${GPUS:-8}\n"
        'NODES=${NNODES:-"2"}\n'
        "EMPTY=\n"
        "X=${EMPTY:-fallback} Y=${EMPTY-kept}\n"
        ": ${Z:=7}\n"
        "export CUDA_DEVICE_MAX_CONNECTIONS=1\n"
        "echo $GPUS $NODES $X [$Y] $Z\n"
    )
    state = read_script(script)
    assert [w.text for w in state.commands[-1].words] == ["echo", "8", "2", "fallback", "[]", "7"]
    assert state.exported == {"CUDA_DEVICE_MAX_CONNECTIONS"}


def test_integer_arithmetic() -> None:
    script = (
        "GPUS_PER_NODE=8\nNUM_NODES=4\n"
        "WORLD=$(($GPUS_PER_NODE*$NUM_NODES))\n"
        "BARE=$((GPUS_PER_NODE * (NUM_NODES + 1) - 3))\n"
        "echo $WORLD $BARE $((7 / 2)) $((-7 / 2)) $((-7 % 2)) $((2 ** 10))\n"
    )
    # 8 x 4 = 32; 8 x 5 - 3 = 37; bash truncates toward zero: 3, -3, -1; 1024
    assert _run(script)[-1] == ("echo", "32", "37", "3", "-3", "-1", "1024")


def test_a_name_arithmetic_would_read_as_0_is_named_not_guessed() -> None:
    words = _last("W=$((GPUS_PER_NODE * 2))\necho $W\n")
    assert words[1].text == "$((GPUS_PER_NODE*2))"  # as written, in one word
    assert any("$GPUS_PER_NODE" in u for u in words[1].unset)


def test_values_left_to_the_caller_are_named_through_the_variables() -> None:
    script = (
        "TOKENIZER_MODEL=$2\n"
        'OPTIONS="--tokenizer-model ${TOKENIZER_MODEL} --hidden-size 64 --save $SAVE_DIR"\n'
        "echo ${OPTIONS}\n"
    )
    words = {w.text: w.unset for w in _last(script)}
    assert words["--hidden-size"] == () and words["64"] == ()
    assert words["$2"] == (
        "$OPTIONS = $TOKENIZER_MODEL = $2 (the script's argument 2, left to its caller)",
    )
    assert words["$SAVE_DIR"] == (
        "$OPTIONS = $SAVE_DIR (not set in the script: left to its caller)",
    )


def test_continuations_comments_and_here_documents() -> None:
    script = (
        "#!/bin/bash\n"
        "cat <<EOF\n"
        "--num-layers 99 (a here-document's body: not a command)\n"
        "EOF\n"
        'OPTS=" \\\n'
        "    --num-layers 2 \\\n"
        '    --hidden-size 64"\n'
        "python pretrain_gpt.py \\\n"
        "    --a 1 \\\n"
        "    # a commented-out flag inside the command\n"
        "    ${OPTS} 2>&1 | tee log.txt\n"
    )
    assert _run(script) == [
        ("cat",),
        ("python", "pretrain_gpt.py", "--a", "1", "--num-layers", "2", "--hidden-size", "64"),
        ("tee", "log.txt"),
    ]


def test_tests_if_elif_else_and_and_or() -> None:
    script = (
        'DTYPE="fp8"\nTOK=${3:-"MOCK"}\nA=()\n'
        'if [[ "$DTYPE" == "bf16" ]]; then\n  A+=(one)\n'
        'elif [ "$DTYPE" = "fp8" ] && [ -n "$DTYPE" ]; then\n  A+=(two)\n'
        "else\n  A+=(three)\nfi\n"
        'if [[ "$TOK" == "MOCK" ]] || [[ -z "$TOK" ]]; then A+=(mock); fi\n'
        "[ 8 -gt 4 ] && A+=(gt)\n"
        "[ 8 -lt 4 ] && A+=(lt)\n"
        "echo ${A[@]}\n"
    )
    assert _run(script)[-1] == ("echo", "two", "mock", "gt")


def test_an_undecided_test_that_only_echoes_is_passed_over() -> None:
    script = (
        'if [ ! -f "$PRETRAIN" ]; then\n  echo missing\n  exit 1\nfi\n'
        "while [[ $# -gt 0 ]]; do\n  case $1 in\n    --x) X=$2; shift 2;;\n  esac\ndone\n"
        "echo done\n"
    )
    state = read_script(script)
    assert not state.problems and not state.exited
    assert [w.text for w in state.commands[-1].words] == ["echo", "done"]


def test_an_undecided_usage_check_does_not_end_the_script() -> None:
    state = read_script('[ -z "$1" ] && { echo "usage: $0 DATA"; exit 1; }\necho go\n')
    assert not state.exited
    assert [w.text for w in state.commands[-1].words] == ["echo", "go"]


def test_an_undecided_test_that_sets_flags_names_what_it_reads() -> None:
    script = (
        "A=(--log-interval 1)\n"
        'if [ -n "${WANDB_API_KEY}" ]; then\n  A+=(--wandb-project p)\nfi\n'
        "echo ${A[@]}\n"
    )
    words = _last(script)
    assert [w.text for w in words] == ["echo", "--log-interval", "1", "--wandb-project", "p"]
    assert words[1].unset == () and words[2].unset == ()
    assert words[3].unset == ("$WANDB_API_KEY (not set in the script: left to its caller)",)


def test_case_picks_the_matching_branch() -> None:
    script = (
        'SCALE="8B"\n'
        'case "${SCALE}" in\n'
        '  "800M")\n    H=1024\n    ;;\n'
        "  8B|9B)\n    H=4096\n    ;;\n"
        "  *)\n    H=1\n    ;;\n"
        "esac\necho $H\n"
    )
    assert _run(script)[-1] == ("echo", "4096")


def test_a_sourced_file_is_named_with_what_it_may_set() -> None:
    state = read_script("source /opt/venv/bin/activate\necho $HIDDEN $1\n")
    assert not state.problems  # a venv's activation alone refuses nothing
    words = state.commands[-1].words
    assert words[1].unset == (
        "$HIDDEN (not set in the script; left to its caller or to /opt/venv/bin/activate)",
    )
    assert words[2].unset == ("$1 (the script's argument 1, left to its caller)",)


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("for i in 1 2; do X=$i; done", "a loop that sets variables"),
        ("eval X=1", "runs text as commands"),
    ],
)
def test_what_cannot_be_read_is_a_problem_named_by_line(line: str, reason: str) -> None:
    state = read_script(f"echo start\n{line}\n")
    assert len(state.problems) == 1
    value, why = state.problems[0]
    assert value.startswith("line 2: ") and reason in why
