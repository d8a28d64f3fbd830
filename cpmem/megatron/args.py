"""Megatron-LM's own arguments, read as a Megatron user writes them.

A run is described by the flags of ``pretrain_gpt.py``: a functional test's
``model_config.yaml`` (its ``MODEL_ARGS`` mapping, and the ``ENV_VARS`` it launches
with), a text file of flags (``--num-layers 12 --bf16 ...``, shell continuation lines
and ``#`` comments allowed), or the bash launch script that starts the run, or its
command line pasted in place of a file (``launch.py``: the ``pretrain_*.py`` command's
flags, what the script exports, torchrun's world; a value the script leaves to its
caller is named where a priced flag needs it). ``read_megatron_args`` returns ``MegatronArgs``
(``fields.py``): every argument cpmem prices, with Megatron-LM's default where the run
does not give it, the arguments it read and changed nothing cpmem prices (``ignored``),
every flag's value (``flag_values``) and the environment.

Every flag string of the snapshot's parser (``data/arguments.tsv``, ``snapshot.py``) is
in exactly one of three tables: ``PRICED`` (``fields.py``: the flag sets a field cpmem
prices), ``IGNORED`` (``ignored.py``) and ``REFUSED`` (``refused.py``), each with its
reason. A refused flag given at its snapshot default, or at a value ``HARMLESS_VALUES``
names, is read as ignored: the run is the one without it. A flag the snapshot's parser does not know is
refused (argparse would reject it). Then ``check_megatron_args`` (``rules.py``) holds the
combinations Megatron-LM rejects and the values cpmem does not price, the pipeline's
split (``layout.py``) and the vocabulary (``vocab.py``). A run is refused by one
``InputError`` on ``megatron_args`` naming every refused or unknown flag and every
broken rule, each with its reason.

Some priced flags leave every term as the default's, by the source: the CP comm type
(p2p, a2a, a2a+p2p keep the same elements for backward; the exchanged chunks are
transient), the overlap flags (the reduce-scatter and all-gather run in place in the
buffers), the fused cross entropy (the same fp32 copy kept), squared ReLU (the same
widths as GeLU).

Defaults are Megatron-LM's at the recordings' snapshot (``golden/megatron/README.md``;
``megatron/training/arguments.py`` and the config dataclasses its
``ArgumentGroupFactory`` turns into flags, ``megatron/core/transformer/
transformer_config.py``); each default in ``fields.py`` names its source line.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cpmem.errors import InputError
from cpmem.megatron.fields import FIELD_NAMES, PRICED, ArgValue, MegatronArgs
from cpmem.megatron.hybrid_pattern import MTP_SEPARATOR, HybridPattern, parse_hybrid_pattern
from cpmem.megatron.ignored import IGNORED, IGNORED_REASONS
from cpmem.megatron.launch import is_script, read_launch
from cpmem.megatron.layer_freq import parse_layer_freq
from cpmem.megatron.refused import FOREIGN, HARMLESS_VALUES, HARMLESS_WITH, REFUSED
from cpmem.megatron.rules import Problem, refusal, rule_problems
from cpmem.megatron.snapshot import arguments as snapshot_arguments
from cpmem.megatron.snapshot import is_default, snapshot
from cpmem.megatron.vocab import DEFAULT_TOKENIZER, GPT2_BPE_VOCAB
from cpmem.megatron.windows import parse_window_size

__all__ = [
    "ENV_PRICED",
    "FIELD_NAMES",
    "IGNORED",
    "IGNORED_REASONS",
    "PRICED",
    "REFUSED",
    "MegatronArgs",
    "parse_megatron_args",
    "read_megatron_args",
]

ENV_PRICED = (
    "CUBLAS_WORKSPACE_CONFIG",
    "PYTORCH_CUDA_ALLOC_CONF",
    "NVTE_FUSED_ATTN",
    "NVTE_FLASH_ATTN",
)

NOT_TRAINING_MODES = {
    "inference": "a Megatron-LM inference test case (its own script and arguments)",
    "rl": "a Megatron-LM reinforcement-learning test case (train_rl.py)",
}
"""A functional test's ``MODE`` that is not a ``pretrain_gpt.py`` training run."""

REQUIRED = (
    "num_layers",
    "hidden_size",
    "num_attention_heads",
    "seq_length",
    "micro_batch_size",
    "max_position_embeddings",
)
"""validate_args: num_layers, hidden_size, num_attention_heads, max_position_embeddings
(arguments.py:1314-1317), micro_batch_size (arguments.py:695); pretrain_gpt's data
builds [micro-batch, seq-length] samples."""


def _shown(flag: str, value: object) -> str:
    """The flag as written: a switch alone, else with its value."""
    return f"{flag} {'' if value is None or value is True else value}".strip()


def _text(value: object) -> str:
    """A value as the functional tests' launcher passes it: a YAML list, or text wrapped
    in [ ], becomes its items separated by spaces (_run_training.sh:141-145)."""
    if isinstance(value, list):
        return " ".join(str(v) for v in value)
    text = str(value).strip()
    if len(text) > 1 and text[0] == "[" and text[-1] == "]":
        return text[1:-1].strip()
    return text


def _convert(flag: str, kind: str, value: object) -> ArgValue | tuple[int, ...] | None:
    """A flag's value as the field's type; ``value`` None means the flag stood alone."""
    if kind in ("bool", "not", "selective"):
        if value is None or value is True:
            present = True
        elif value is False:
            present = False
        else:
            raise InputError(
                "megatron_args",
                _shown(flag, value),
                "is a switch: give it alone (or true/false in YAML)",
            )
        if kind == "bool":
            return present
        if kind == "not":
            return not present
        return "selective" if present else None
    if value is None:
        raise InputError("megatron_args", flag, "needs a value")
    if kind == "raw":  # a pattern: its brackets and spaces are its own
        return str(value).strip()
    if kind == "freq":  # moe_freq_type: an integer or a list expression, as written
        raw = value if isinstance(value, str) else _text(value)
        return parse_layer_freq(str(raw), flag)
    if kind == "window":
        return parse_window_size(flag, _text(value))
    text = _text(value)
    try:
        if kind == "int":
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(float(text)) if isinstance(value, float) else int(text)
        if kind == "float":
            return float(text)
    except ValueError:
        raise InputError(
            "megatron_args",
            _shown(flag, value),
            f"must be {'an integer' if kind == 'int' else 'a number'}",
        ) from None
    return text


def _value(flag: str, value: object) -> ArgValue:
    """A flag's value kept in ``flag_values``: True for a switch, else its text."""
    arg = snapshot_arguments().get(flag)
    if value is None or value is True or (arg is not None and arg.switch):
        return True
    return _text(value)


def _tokens_to_mapping(text: str) -> dict[str, object]:
    """``--flag value`` / ``--flag`` tokens of a flags file as a mapping (value None: a
    switch). Backslash line continuations and ``#`` comments are allowed."""
    tokens = shlex.split(text.replace("\\\n", " "), comments=True)
    out: dict[str, object] = {}
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if not tok.startswith("--"):
            if tok.endswith(".py") or tok in ("python", "python3", "torchrun"):
                i += 1  # the launcher and script before the flags
                continue
            raise InputError(
                "megatron_args", tok, "is not a --flag (a value with no flag before it)"
            )
        name, eq, inline = tok.partition("=")
        if eq:
            out[name] = inline
            i += 1
            continue
        nxt = tokens[i + 1] if i + 1 < len(tokens) else None
        if nxt is not None and (not nxt.startswith("--")):
            vals = [nxt]
            j = i + 2
            while j < len(tokens) and not tokens[j].startswith("--"):
                vals.append(tokens[j])  # a multi-valued flag (e.g. --hierarchical-...)
                j += 1
            out[name] = " ".join(vals)
            i = j
        else:
            out[name] = None
            i += 1
    return out


def _unknown_reason(flag: str) -> str:
    if flag in FOREIGN:
        return FOREIGN[flag]
    commit = snapshot().commit[:8]
    family = ""
    if flag.startswith("--retro"):
        family = "; it is Retro's (a model family cpmem does not price)"
    return (
        f"is not an argument of Megatron-LM's pretrain_gpt.py at {commit} (argparse would "
        f"reject it){family}"
    )


def _left_to_caller(
    flag: str, value: object, unset: tuple[str, ...], flag_values: dict[str, ArgValue]
) -> Problem | None:
    """A flag whose value a launch script leaves to its caller: refused naming what it
    is built from where the flag is priced (or refused), else read as ignored."""
    if flag in IGNORED:
        flag_values[flag] = _value(flag, value)
        return None
    if flag in PRICED or flag in REFUSED:
        return (
            _shown(flag, value),
            f"its value is left to the script's caller ({'; '.join(unset)}): set it in the "
            "script, or give the flag's value",
        )
    return (_shown(flag, value), _unknown_reason(flag))


def _read_flag(
    flag: str,
    value: object,
    values: dict[str, Any],
    flag_values: dict[str, ArgValue],
    ignored: list[str],
    given: list[str],
    unset: tuple[str, ...] = (),
    run: Mapping[str, object] | None = None,
) -> Problem | None:
    """Read one flag into ``values`` (priced fields) and ``flag_values``; a refusal is
    returned, not raised. ``unset``: what a launch script left to its caller in the
    value (``_left_to_caller``)."""
    if not flag.startswith("--"):
        return (flag, "is not a --flag")
    if unset:
        problem = _left_to_caller(flag, value, unset, flag_values)
        if problem is None:
            ignored.append(flag)
        return problem
    arg = snapshot_arguments().get(flag)
    if value is False and (flag in PRICED or (arg is not None and arg.switch)):
        return None  # ``--flag: false`` in YAML: the launcher leaves the flag out
    if flag in PRICED:
        name, kind = PRICED[flag]
        try:
            converted = _convert(flag, kind, value)
        except InputError as exc:
            return (str(exc.value), exc.reason)
        flag_values[flag] = True if kind in ("bool", "not", "selective") else _text(value)
        given.append(flag)
        if kind == "selective":
            values["__recompute_activations"] = True  # applied last, whatever the order
        else:
            values[name] = converted
        return None
    if flag in IGNORED:
        ignored.append(flag)
        flag_values[flag] = _value(flag, value)
        return None
    if flag in REFUSED:
        harmless = HARMLESS_VALUES.get(flag, ())
        beside = HARMLESS_WITH.get(flag)
        if (
            is_default(flag, value)
            or (value is not None and _text(value) in harmless)
            or (beside is not None and beside(run or {}))
        ):
            ignored.append(flag)
            flag_values[flag] = _value(flag, value)
            return None
        flag_values[flag] = _value(flag, value)
        return (_shown(flag, value), REFUSED[flag])
    return (_shown(flag, value), _unknown_reason(flag))


def parse_megatron_args(
    model_args: Mapping[str, object],
    env: Mapping[str, object] | None = None,
    *,
    unknown: Mapping[str, tuple[str, ...]] | None = None,
    problems: list[Problem] | None = None,
    world_size: int | None = None,
) -> MegatronArgs:
    """``MODEL_ARGS`` (flag -> value; value None or true for a switch) as ``MegatronArgs``.

    ``unknown``: the flags whose value a launch script leaves to its caller, with what
    each is built from; ``problems``: the launch's own, listed first; ``world_size``: the
    launch's (or the caller's) world. Refused with one ``InputError`` (field
    ``megatron_args``) naming every refused or unknown flag, every missing required one
    and every rule of ``rules.py`` the run breaks, each with its reason."""
    values: dict[str, Any] = {}
    flag_values: dict[str, ArgValue] = {}
    ignored: list[str] = []
    given: list[str] = []
    problems = list(problems or [])
    unknown = unknown or {}
    unread = False  # a priced flag whose value did not convert: its field is missing
    left: dict[str, tuple[str, ...]] = {}
    for raw_flag, value in model_args.items():
        flag = str(raw_flag).strip()
        unset = unknown.get(flag, ())
        if unset:
            left[flag] = unset
        problem = _read_flag(flag, value, values, flag_values, ignored, given, unset, model_args)
        if problem is not None:
            problems.append(problem)
            unread = unread or flag in PRICED
    hybrid = _hybrid_values(values, problems)
    if values.pop("__recompute_activations", False):
        # ``--recompute-activations`` makes the granularity selective whatever else is
        # given (arguments.py:607-608)
        values["recompute_granularity"] = "selective"
    left_priced = {PRICED[f][0] for f in left if f in PRICED}
    missing = [name for name in REQUIRED if name not in values and name not in left_priced]
    if hybrid:  # the pattern gives the layers, or its problems say why it cannot
        missing = [name for name in missing if name != "num_layers"]
    problems += [
        ("--" + name.replace("_", "-"), "is required (Megatron-LM has no default for it)")
        for name in missing
    ]
    if values.get("num_experts") == 0:
        values["num_experts"] = None  # a dense model (arguments.py:1648-1649)
    if values.get("group_query_attention") and values.get("num_query_groups") is None:
        # --num-query-groups' default under --group-query-attention (transformer_config.
        # py:175; argument_utils.py core_transformer_config_from_args passes it)
        values["num_query_groups"] = 1
    complete = all(name in values for name in REQUIRED)  # a left-to-caller one is not
    if not missing and complete:
        env_map = {str(k): str(v) for k, v in (env or {}).items()}
        args = MegatronArgs(
            **values,
            env=env_map,
            ignored=tuple(sorted(ignored)),
            given=tuple(given),
            flag_values=flag_values,
            left_to_caller=left,
            world_size=world_size,
        )
        if not unread:
            problems += rule_problems(args)
        if not problems:
            return args
    raise refusal(problems)


def _hybrid_values(values: dict[str, Any], problems: list[Problem]) -> bool:
    """What ``validate_args`` derives from a hybrid pattern (arguments.py:743-923), into
    ``values``: the deprecated ``--hybrid-override-pattern`` forwarded to
    ``--hybrid-layer-pattern``; a legacy ``--mtp-hybrid-override-pattern`` repeated as the
    pattern's ``/`` depths under ``--mtp-num-layers``; the layer count (the pattern's
    always overrides ``--num-layers``), the MTP depths (the pattern's override
    ``--mtp-num-layers``) and latent attention (a ``+`` turns it on). Whether a pattern
    was given; its problems go to ``problems``."""
    override = values.get("hybrid_override_pattern")
    if override is not None and values.get("hybrid_layer_pattern") is None:
        values["hybrid_layer_pattern"] = values.pop("hybrid_override_pattern")
    text = values.get("hybrid_layer_pattern")
    legacy, depths = values.get("mtp_hybrid_override_pattern"), values.get("mtp_num_layers")
    if legacy is not None and depths and (text is None or MTP_SEPARATOR not in text):
        text = (text or "") + MTP_SEPARATOR + MTP_SEPARATOR.join([legacy] * depths)
        values["hybrid_layer_pattern"] = text
        values["mtp_hybrid_override_pattern"] = None
    if text is None:
        return False
    parsed = parse_hybrid_pattern(text)
    if not isinstance(parsed, HybridPattern):
        problems.append((f"--hybrid-layer-pattern {text}", "; ".join(parsed)))
        values.pop("num_layers", None)
        return True
    values["num_layers"] = len(parsed.main)
    if parsed.depths:
        values["mtp_num_layers"] = parsed.depths
    if "+" in text:
        values["multi_latent_attention"] = True
    return True


def is_pasted(source: str | Path) -> bool:
    """Whether ``source`` is a command line or flags pasted in place of a file: a string
    with a blank in it that names no file and reads as a command (``is_script``) or as
    flags (it starts with ``--``); any other string is a path."""
    if not isinstance(source, str) or not any(c.isspace() for c in source.strip()):
        return False
    try:
        if Path(source).is_file():
            return False
    except OSError:  # longer than a file name can be
        pass
    return source.lstrip().startswith("--") or is_script(source)


def _source_text(source: str | Path) -> tuple[str, Path]:
    """The text of ``source``: a file's, or ``source`` itself where it is pasted."""
    if is_pasted(source):
        return str(source), Path("command line")
    path = Path(source)
    try:
        return path.read_text(encoding="utf-8"), path
    except OSError as exc:
        raise InputError("megatron_args", str(source), f"cannot be read: {exc.strerror}") from None


def read_megatron_args(
    source: str | Path,
    *,
    vocab_size: int | None = None,
    world_size: int | None = None,
    require_world: bool = False,
    replace_flags: Mapping[str, str] | None = None,
) -> MegatronArgs:
    """A functional test's ``model_config.yaml`` (``MODEL_ARGS`` and ``ENV_VARS``), a
    text file of ``pretrain_gpt.py`` flags, a launch script or a command line
    (``launch.py``: its ``pretrain_*.py`` arguments, exports and torchrun world), as
    ``MegatronArgs``.

    ``vocab_size`` replaces the arguments' ``--vocab-size``; ``world_size`` the launch's
    world; ``replace_flags`` (flag -> value) the arguments' own (the layout given beside
    them), before any rule is checked. ``require_world``: a run whose world neither the launch nor ``world_size``
    gives is refused, that problem listed with every other."""
    text, path = _source_text(source)
    env: Mapping[str, object]
    unknown: dict[str, tuple[str, ...]] = {}
    problems: list[Problem] = []
    world, reason = None, f"{path.name} gives no world size"
    if path.suffix in (".yaml", ".yml") or "MODEL_ARGS:" in text:
        mapping, env = _yaml_args(text, source)
    elif is_script(text):
        launch = read_launch(text, path.name)
        mapping, env, unknown, problems = (
            dict(launch.flags),
            launch.env,
            launch.unknown,
            launch.problems,
        )
        world, reason = launch.world_size, launch.world_reason or reason
        problems += [
            (f"{name}", f"is exported with a value left to the script's caller ({'; '.join(u)})")
            for name, u in launch.env_unknown.items()
            if name in ENV_PRICED
        ]
        if not launch.script:  # no training command: its problems say why
            raise refusal(problems)
    else:
        mapping, env = dict(_tokens_to_mapping(text)), {}
    replaced = dict(replace_flags or {})
    if vocab_size is not None:
        replaced["--vocab-size"] = str(vocab_size)
        problems += _unread_vocab(mapping, vocab_size)
    if "--num-virtual-stages-per-pipeline-rank" in replaced:
        # a virtual pipeline size given replaces the run's layers per virtual stage too
        mapping.pop("--num-layers-per-virtual-pipeline-stage", None)
    for flag, value in replaced.items():
        mapping[flag] = value
        unknown.pop(flag, None)
    if world_size is not None:
        world = world_size
    elif require_world and world is None:
        problems.append(("--world-size", f"is needed: {reason}; give --world-size N"))
    return parse_megatron_args(mapping, env, unknown=unknown, problems=problems, world_size=world)


def _unread_vocab(mapping: Mapping[str, object], vocab_size: int) -> list[Problem]:
    """A vocabulary given beside a run whose tokenizer does not read it: GPT-2's BPE
    reports its files' size whatever ``--vocab-size`` says (``vocab.py``)."""
    kind = mapping.get("--tokenizer-type") or DEFAULT_TOKENIZER
    if kind == DEFAULT_TOKENIZER and "--no-pad-vocab-size" not in mapping:
        return [
            (
                f"--vocab-size {vocab_size}",
                f"the run's {kind} reports the GPT-2 files' {GPT2_BPE_VOCAB:,} tokens; "
                "Megatron-LM does not read --vocab-size for it",
            )
        ]
    return []


def _yaml_args(text: str, source: str | Path) -> tuple[dict[str, object], dict[str, object]]:
    """A functional test's ``MODEL_ARGS`` and ``ENV_VARS``."""
    import yaml

    try:
        doc = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as exc:
        raise InputError("megatron_args", str(source), f"is not valid YAML: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("MODEL_ARGS"), dict):
        raise InputError("megatron_args", str(source), "has no MODEL_ARGS mapping")
    mode = str(doc.get("MODE", "")).strip()
    if mode in NOT_TRAINING_MODES:
        raise InputError(
            "megatron_args",
            f"MODE: {mode}",
            f"is {NOT_TRAINING_MODES[mode]}, not a pretrain_gpt.py training run",
        )
    env = doc.get("ENV_VARS") or {}
    if not isinstance(env, dict):
        raise InputError("megatron_args", str(source), "ENV_VARS is not a mapping")
    return dict(doc["MODEL_ARGS"]), dict(env)
