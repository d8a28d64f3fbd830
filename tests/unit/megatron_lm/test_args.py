"""Reading Megatron-LM's arguments: ``model_config.yaml`` and flags files, switches,
Megatron-LM's defaults, and the three flag tables (priced, ignored, refused).

Expected values: Megatron-LM's own source at the recordings' snapshot (``d98e8a64``,
``megatron/training/arguments.py`` and ``megatron/core/transformer/
transformer_config.py``; the lines are cited where a default is checked) and the
functional tests' own ``model_config.yaml`` files kept in ``golden/megatron/cases``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from cpmem.errors import InputError
from cpmem.megatron.args import (
    FIELD_NAMES,
    IGNORED,
    PRICED,
    REFUSED,
    MegatronArgs,
    parse_megatron_args,
    read_megatron_args,
)
from megatron_lm.tiny import run_of

GOLDEN_CASES = Path(__file__).resolve().parents[3] / "golden" / "megatron" / "cases"
REQUIRED = {
    "--num-layers": 12,
    "--hidden-size": 512,
    "--num-attention-heads": 8,
    "--seq-length": 1024,
    "--max-position-embeddings": 1024,
    "--micro-batch-size": 4,
}


def _parse(**extra: Any) -> MegatronArgs:
    """The required flags plus ``extra`` (keyword ``disable_bias_linear`` is
    ``--disable-bias-linear``)."""
    flags: dict[str, object] = dict(REQUIRED)
    flags.update({"--" + k.replace("_", "-"): v for k, v in extra.items()})
    return parse_megatron_args(flags)


def _write_yaml(tmp_path: Path, model_args: dict[str, object], env: object = None) -> Path:
    doc: dict[str, object] = {"MODEL_ARGS": model_args, "TEST_TYPE": "regular"}
    if env is not None:
        doc["ENV_VARS"] = env
    path = tmp_path / "model_config.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


# --- reading the two file forms ---------------------------------------------------------


def test_a_model_config_yaml_gives_its_model_args_and_env(tmp_path: Path) -> None:
    path = _write_yaml(
        tmp_path,
        {
            **REQUIRED,
            "--tensor-model-parallel-size": 2,
            "--bf16": True,
            "--hidden-dropout": 0.0,
            "--log-interval": 1,
        },
        env={"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "CUDA_DEVICE_MAX_CONNECTIONS": 1},
    )
    args = read_megatron_args(path)
    assert (args.num_layers, args.hidden_size, args.num_attention_heads) == (12, 512, 8)
    assert (args.seq_length, args.max_position_embeddings, args.micro_batch_size) == (
        1024,
        1024,
        4,
    )
    assert args.tensor_model_parallel_size == 2
    assert args.bf16 is True
    assert args.hidden_dropout == 0.0
    # the environment is kept as text, as a shell exports it
    assert args.env == {"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    assert args.ignored == ("--log-interval",)
    assert "--bf16" in args.given and "--log-interval" not in args.given


def test_a_flags_file_with_its_launcher_continuations_and_comments(tmp_path: Path) -> None:
    path = tmp_path / "run.sh"
    path.write_text(
        "# the tiny GPT\n"
        "python pretrain_gpt.py \\\n"
        "    --num-layers 12 --hidden-size 512 \\\n"
        "    --num-attention-heads 8 \\\n"
        "    # the sequence\n"
        "    --seq-length=2048 --max-position-embeddings 2048 \\\n"
        "    --micro-batch-size 2 --global-batch-size 16 \\\n"
        "    --bf16 --disable-bias-linear --hidden-dropout 0.05 \\\n"
        "    --save /tmp/ckpt\n",
        encoding="utf-8",
    )
    args = read_megatron_args(path)
    assert (args.num_layers, args.hidden_size, args.num_attention_heads) == (12, 512, 8)
    assert (args.seq_length, args.max_position_embeddings) == (2048, 2048)
    assert (args.micro_batch_size, args.global_batch_size) == (2, 16)
    assert args.bf16 is True and args.add_bias_linear is False
    assert args.hidden_dropout == 0.05
    assert args.ignored == ("--save",)
    assert args.env == {}


def test_a_value_with_no_flag_before_it_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "flags.txt"
    path.write_text("12 --num-layers 12", encoding="utf-8")
    with pytest.raises(InputError) as err:
        read_megatron_args(path)
    assert (err.value.field, err.value.value) == ("megatron_args", "12")


def test_a_switch_followed_by_a_value_in_a_flags_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "flags.txt"
    path.write_text("--num-layers 12 --bf16 stray", encoding="utf-8")
    with pytest.raises(InputError) as err:
        read_megatron_args(path)
    assert (err.value.field, err.value.value) == ("megatron_args", "--bf16 stray")
    assert "is a switch" in err.value.reason


def test_a_yaml_file_without_model_args_or_unreadable_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "model_config.yaml"
    path.write_text("ENV_VARS: {}\nTEST_TYPE: regular\n", encoding="utf-8")
    with pytest.raises(InputError) as err:
        read_megatron_args(path)
    assert err.value.field == "megatron_args" and "MODEL_ARGS" in err.value.reason
    with pytest.raises(InputError) as err:
        read_megatron_args(tmp_path / "absent.yaml")
    assert err.value.field == "megatron_args" and "cannot be read" in err.value.reason


# --- switches ---------------------------------------------------------------------------


def test_store_true_switches_turn_their_field_on() -> None:
    assert _parse().bf16 is False and _parse(bf16=True).bf16 is True
    assert _parse(swiglu=None).swiglu is True  # a switch alone in a flags file
    assert _parse(use_distributed_optimizer=True).use_distributed_optimizer is True


def test_store_false_switches_turn_their_field_off() -> None:
    # transformer_config.py:212: add_bias_linear=True, flag --disable-bias-linear
    assert _parse().add_bias_linear is True
    assert _parse(disable_bias_linear=True).add_bias_linear is False
    # arguments.py:2944: --no-gradient-accumulation-fusion, store_false
    assert _parse().gradient_accumulation_fusion is True
    assert _parse(no_gradient_accumulation_fusion=True).gradient_accumulation_fusion is False


def test_a_switch_set_false_in_yaml_is_not_passed() -> None:
    # a YAML ``--flag: false`` means the launcher leaves the flag out
    assert _parse(disable_bias_linear=False).add_bias_linear is True
    assert _parse(bf16=False).bf16 is False
    assert "--bf16" not in _parse(bf16=False).given


def test_recompute_activations_means_selective_recompute() -> None:
    # arguments.py:607-608: if args.recompute_activations: granularity = 'selective'
    assert _parse().recompute_granularity is None
    assert _parse(recompute_activations=True).recompute_granularity == "selective"


def test_recompute_activations_wins_whatever_the_flag_order() -> None:
    flags: dict[str, object] = {
        **REQUIRED,
        "--recompute-activations": True,
        "--recompute-granularity": "full",
        "--recompute-method": "uniform",
    }
    assert parse_megatron_args(flags).recompute_granularity == "selective"


# --- Megatron-LM's defaults -------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "megatron_default"),
    [
        # transformer_config.py:188: hidden_dropout: float = 0.1
        ("hidden_dropout", 0.1),
        # transformer_config.py:191: attention_dropout: float = 0.1
        ("attention_dropout", 0.1),
        # arguments.py:2441: --make-vocab-size-divisible-by, type=int, default=128
        ("make_vocab_size_divisible_by", 128),
        # transformer_config.py:256: normalization: Literal[...] = "LayerNorm"
        ("normalization", "LayerNorm"),
        # transformer_config.py:212-214: add_bias_linear: bool = field(default=True, ...)
        ("add_bias_linear", True),
        # arguments.py:2397: --position-embedding-type, default='learned_absolute'
        ("position_embedding_type", "learned_absolute"),
        # arguments.py:2460: --untie-embeddings-and-output-weights, action='store_true'
        ("untie_embeddings_and_output_weights", False),
        # transformer_config.py:151: attention_backend: AttnBackend = AttnBackend.auto
        ("attention_backend", "auto"),
        # arguments.py:3067: --attention-softmax-in-fp32, action='store_true'
        ("attention_softmax_in_fp32", False),
    ],
)
def test_an_argument_not_given_takes_megatron_lms_default(
    name: str, megatron_default: object
) -> None:
    assert getattr(_parse(), name) == megatron_default


# --- refused, unknown, ignored, required, types -----------------------------------------


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--fp8-format", "hybrid"),
        ("--moe-expert-capacity-factor", 1.5),
        ("--recompute-modules", "core_attn"),
    ],
)
def test_a_refused_flag_is_named_in_the_error(flag: str, value: object) -> None:
    assert flag in REFUSED
    with pytest.raises(InputError) as err:
        parse_megatron_args({**REQUIRED, flag: value})
    assert err.value.field == "megatron_args"
    assert err.value.value == f"{flag} {value}"
    assert REFUSED[flag] in err.value.reason


def test_a_refused_switch_is_named_without_a_value() -> None:
    with pytest.raises(InputError) as err:
        parse_megatron_args({**REQUIRED, "--fp8": True})
    assert (err.value.field, err.value.value) == ("megatron_args", "--fp8")


def test_an_unknown_flag_is_refused() -> None:
    flag = "--accumulate-allreduce-grads-in-fp32"  # a real Megatron-LM flag cpmem lacks
    assert flag not in PRICED and flag not in IGNORED and flag not in REFUSED
    with pytest.raises(InputError) as err:
        parse_megatron_args({**REQUIRED, flag: True})
    assert (err.value.field, err.value.value) == ("megatron_args", flag)
    assert "not an argument cpmem knows" in err.value.reason
    with pytest.raises(InputError):
        parse_megatron_args({**REQUIRED, "--no-such-flag": 3})


def test_ignored_flags_land_in_ignored_and_change_nothing_priced() -> None:
    plain = parse_megatron_args(REQUIRED)
    noisy = parse_megatron_args(
        {**REQUIRED, "--train-iters": 50, "--lr": 1.5e-4, "--log-interval": 1, "--save": "x"}
    )
    assert noisy.ignored == ("--log-interval", "--lr", "--save", "--train-iters")
    assert plain.ignored == ()
    assert noisy == plain  # the priced fields only (env, ignored, given: compare=False)


@pytest.mark.parametrize(
    "missing", ["--num-layers", "--hidden-size", "--num-attention-heads", "--seq-length"]
)
def test_a_missing_required_flag_is_refused(missing: str) -> None:
    flags = {k: v for k, v in REQUIRED.items() if k != missing}
    with pytest.raises(InputError) as err:
        parse_megatron_args(flags)
    assert (err.value.field, err.value.value) == ("megatron_args", missing)


def test_a_missing_micro_batch_size_is_refused() -> None:
    flags = {k: v for k, v in REQUIRED.items() if k != "--micro-batch-size"}
    with pytest.raises(InputError) as err:
        parse_megatron_args(flags)
    assert err.value.value == "--micro-batch-size"


def test_a_missing_max_position_embeddings_is_refused() -> None:
    flags = {k: v for k, v in REQUIRED.items() if k != "--max-position-embeddings"}
    with pytest.raises(InputError):  # refused when read or when the run is described
        run_of(parse_megatron_args(flags))


def test_fewer_positions_than_the_sequence_are_refused() -> None:
    with pytest.raises(InputError):  # refused when read or when the run is described
        run_of(parse_megatron_args({**REQUIRED, "--max-position-embeddings": 512}))


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--num-layers", "twelve", "must be an integer"),
        ("--num-layers", 12.5, "must be an integer"),
        ("--num-layers", True, "must be an integer"),
        ("--hidden-dropout", "abc", "must be a number"),
        ("--bf16", "yes", "is a switch"),
        ("--seq-length", None, "needs a value"),
    ],
)
def test_a_value_of_the_wrong_type_is_refused(flag: str, value: object, says: str) -> None:
    with pytest.raises(InputError) as err:
        parse_megatron_args({**REQUIRED, flag: value})
    assert err.value.field == "megatron_args" and flag in str(err.value.value)
    assert says in err.value.reason


def test_numbers_written_as_yaml_floats_or_text_are_read() -> None:
    args = _parse(num_layers=24.0, hidden_dropout="0.2", global_batch_size="64")
    assert (args.num_layers, args.hidden_dropout, args.global_batch_size) == (24, 0.2, 64)


# --- the tables against the real test cases ---------------------------------------------


def test_the_tables_are_disjoint_and_every_priced_field_exists() -> None:
    priced = set(PRICED)
    assert not priced & IGNORED and not priced & set(REFUSED) and not IGNORED & set(REFUSED)
    assert {name for name, _ in PRICED.values()} <= FIELD_NAMES


def test_every_flag_of_every_gpt_case_is_in_exactly_one_table() -> None:
    configs = sorted(GOLDEN_CASES.glob("gpt/*/model_config.yaml"))
    assert len(configs) > 100
    seen: set[str] = set()
    for path in configs:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        seen.update(str(flag) for flag in doc["MODEL_ARGS"])
    misplaced = {
        flag: [flag in PRICED, flag in IGNORED, flag in REFUSED]
        for flag in seen
        if (flag in PRICED) + (flag in IGNORED) + (flag in REFUSED) != 1
    }
    assert misplaced == {}
    assert len(seen) > 100


def test_every_gpt_case_is_read_or_refused_by_a_refused_flag() -> None:
    """No case stops on an unknown flag: each is priced or refused with REFUSED's reason."""
    refused: dict[str, str] = {}
    for path in sorted(GOLDEN_CASES.glob("gpt/*/model_config.yaml")):
        try:
            read_megatron_args(path)
        except InputError as exc:
            refused[path.parent.name] = str(exc.value).split()[0]
    assert refused and set(refused.values()) <= set(REFUSED)
